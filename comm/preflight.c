/*
 * preflight.c - which GPU this rank drives, decided before any CUDA context
 * or NCCL communicator exists, from the number of GPUs the process sees, its
 * place among the node's ranks and the launcher's variables. A pure function:
 * no CUDA, no MPI, no getenv() of its own, so every case is testable on a
 * machine without a GPU (tests/test_gpu_preflight.c).
 *
 * It does not open the device or check that two ranks did not pick the same
 * GPU: NCCL refuses that at communicator creation ("Duplicate GPU detected"),
 * and that error reaches the user through rt_nccl_create().
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "common/common.h"

static const char *var(const char *(*get)(void *ctx, const char *name), void *ctx, const char *name)
{
    const char *v = get(ctx, name);
    return v && *v ? v : NULL;
}

/* Entries in a comma-separated list ("0,1,2,3" is 4); 0 for NULL. */
static int list_len(const char *s)
{
    if (!s)
        return 0;
    int n = 1;
    for (; *s; s++)
        n += *s == ',';
    return n;
}

/* Whether a --gpu-bind / --tres-bind value binds tasks to GPUs: any type but
 * "none" ("verbose" alone is no type). */
static int binds_tasks(const char *v)
{
    if (!v)
        return 0;
    const char *g = strstr(v, "gres/gpu:"); /* SLURM_TRES_BIND=gres/gpu:single:1+gres/nic:... */
    if (g)
        v = g + strlen("gres/gpu:");
    else if (strstr(v, "gres/"))
        return 0; /* binds some other GRES only */
    if (!strncmp(v, "verbose", 7))
        v += v[7] == ',' ? 8 : 7;
    return *v && *v != '+' && strncmp(v, "none", 4) != 0;
}

int rt_gpu_preflight(int visible_gpus, int local_rank, int local_size,
                     const char *(*get)(void *ctx, const char *name), void *ctx, int *device, char *note,
                     size_t len)
{
    *device = -1;
    if (note && len)
        note[0] = 0;
    if (local_size < 1 || local_rank < 0 || local_rank >= local_size)
        return rt_errf(-EINVAL, "GPU placement: local rank %d of %d is not a rank of this node", local_rank,
                       local_size);
    const char *cvd = get(ctx, "CUDA_VISIBLE_DEVICES"); /* "" is meaningful here: no device */
    const char *job = var(get, ctx, "SLURM_JOB_ID");
    const char *step_gpus = var(get, ctx, "SLURM_STEP_GPUS");
    if (!step_gpus)
        step_gpus = var(get, ctx, "SLURM_JOB_GPUS");
    const char *per_task = var(get, ctx, "SLURM_GPUS_PER_TASK");
    const char *tres_task = var(get, ctx, "SLURM_TRES_PER_TASK");
    const char *gpu_bind = var(get, ctx, "SLURM_GPU_BIND");
    const char *tres_bind = var(get, ctx, "SLURM_TRES_BIND");
    const char *flags = var(get, ctx, "SLURM_GRES_FLAGS");
    char shown[96];
    snprintf(shown, sizeof(shown), "%s%s%s", cvd ? "\"" : "", cvd ? cvd : "unset", cvd ? "\"" : "");

    if (visible_gpus <= 0) {
        if (job && !step_gpus)
            return rt_errf(-ENODEV, "local rank %d sees no GPU (CUDA_VISIBLE_DEVICES=%s) and Slurm job %s has no "
                                    "GPUs on this node: ask for them (--gpus-per-node=N or --gres=gpu:N), or use "
                                    "--device cpu",
                           local_rank, shown, job);
        return rt_errf(-ENODEV, "local rank %d sees no GPU (CUDA_VISIBLE_DEVICES=%s%s%s): check the driver "
                                "(nvidia-smi) and CUDA_VISIBLE_DEVICES, or use --device cpu",
                       local_rank, shown, step_gpus ? ", SLURM_STEP_GPUS=" : "", step_gpus ? step_gpus : "");
    }

    /* Slurm's per-task GPU binding: each task is given its own GPU(s) and,
     * where cgroups constrain devices, cannot open the others. */
    char cause[160] = "";
    int sharing = flags && strstr(flags, "allow-task-sharing");
    if (job && !sharing) {
        int n_step = list_len(step_gpus);
        if (per_task)
            snprintf(cause, sizeof(cause), "--gpus-per-task=%s", per_task);
        else if (tres_task && strstr(tres_task, "gpu"))
            snprintf(cause, sizeof(cause), "--tres-per-task=%s", tres_task);
        else if (binds_tasks(gpu_bind))
            snprintf(cause, sizeof(cause), "--gpu-bind=%s", gpu_bind);
        else if (binds_tasks(tres_bind))
            snprintf(cause, sizeof(cause), "--tres-bind=%s", tres_bind);
        else if (n_step > visible_gpus)
            snprintf(cause, sizeof(cause), "the step has GPUs %s on this node, this rank sees %d", step_gpus,
                     visible_gpus);
        else if (visible_gpus == 1 && local_size > 1 && cvd && *cvd)
            snprintf(cause, sizeof(cause), "each rank sees one GPU under Slurm job %s", job);
    }
    if (cause[0]) {
        *device = 0; /* the first of the GPUs Slurm gave this task */
        if (local_size > 1 && note && len)
            snprintf(note, len,
                     "each of the %d ranks on this node sees only the GPU%s Slurm bound to it (%s; "
                     "CUDA_VISIBLE_DEVICES=%s): NCCL cannot use peer-to-peer (NVLink, PCIe P2P) between GPUs it "
                     "cannot see, so this node's GPUs exchange gradients through host memory, or NCCL fails with "
                     "an unhandled CUDA error. Launch with `srun --gres-flags=allow-task-sharing ...` (on the srun "
                     "line; Slurm 23.11 or later), which keeps each rank's binding and lets the ranks reach each "
                     "other's GPUs, or ask for GPUs per node and bind none (`--gpus-per-node=N --gpu-bind=none`)",
                     local_size, visible_gpus > 1 ? "s" : "", cause, shown);
        return 0;
    }
    if (visible_gpus >= local_size) {
        *device = local_rank; /* every rank sees the node's GPUs: one each, by local rank */
        return 0;
    }
    if (visible_gpus == 1 && cvd && *cvd) {
        /* CUDA_VISIBLE_DEVICES set outside Slurm's binding, one GPU per
         * rank (a wrapper script, say): each drives what it sees. If two
         * ranks were given the same one, NCCL says so at creation. */
        *device = 0;
        return 0;
    }
    return rt_errf(-ENODEV, "%d ranks on this node but %d GPU%s visible to local rank %d (CUDA_VISIBLE_DEVICES=%s): "
                            "NCCL needs a GPU of its own for every rank; start at most %d rank%s per node "
                            "(mpirun --map-by ppr:%d:node, srun --ntasks-per-node=%d)",
                   local_size, visible_gpus, visible_gpus == 1 ? " is" : "s are", local_rank, shown, visible_gpus,
                   visible_gpus == 1 ? "" : "s", visible_gpus, visible_gpus);
}
