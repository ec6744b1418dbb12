/*
 * test_gpu_preflight.c - rt_gpu_preflight(), the choice of a rank's GPU, as a
 * table: the GPUs the process sees, its place among the node's ranks, the
 * launcher's variables, and what must come out -- the device, the return
 * code, and words the note or the error must (and must not) contain. Pure:
 * no GPU, no MPI. Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "comm/comm.h"
#include "common/common.h"

/* A fake environment: "NAME=value" entries, NULL-terminated. */
static const char *env_get(void *ctx, const char *name)
{
    size_t n = strlen(name);
    for (const char *const *e = ctx; *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

struct pcase {
    const char *what;
    int visible, local_rank, local_size;
    const char *env[8];
    int rc;              /* 0, -ENODEV or -EINVAL */
    int device;          /* expected on rc 0; -1 on errors */
    const char *has[3];  /* in the note (rc 0) or the error message */
    int note_empty;      /* rc 0: 1 if no note may be written */
};

static const struct pcase cases[] = {
    {"mpirun, all 4 GPUs visible to each of 4 ranks", 4, 2, 4, {NULL}, 0, 2, {NULL}, 1},
    {"mpirun, 8 GPUs, 2 ranks: spare GPUs are no error", 8, 1, 2, {NULL}, 0, 1, {NULL}, 1},
    {"one rank, one GPU", 1, 0, 1, {NULL}, 0, 0, {NULL}, 1},
    {"srun --gpus-per-node=4, no binding: every task sees all",
     4,
     3,
     4,
     {"SLURM_JOB_ID=77", "SLURM_STEP_GPUS=0,1,2,3", "CUDA_VISIBLE_DEVICES=0,1,2,3", NULL},
     0,
     3,
     {NULL},
     1},
    {"srun --gpus-per-task=1: one GPU per task, note names the fix",
     1,
     1,
     4,
     {"SLURM_JOB_ID=77", "SLURM_GPUS_PER_TASK=1", "SLURM_STEP_GPUS=0,1,2,3", "CUDA_VISIBLE_DEVICES=1", NULL},
     0,
     0,
     {"--gres-flags=allow-task-sharing", "peer-to-peer", "--gpus-per-task=1"},
     0},
    {"srun --gpu-bind=single:1: note, bound by --gpu-bind",
     1,
     0,
     2,
     {"SLURM_JOB_ID=78", "SLURM_GPU_BIND=single:1", "CUDA_VISIBLE_DEVICES=0", NULL},
     0,
     0,
     {"allow-task-sharing", "--gpu-bind=single:1", "--gpu-bind=none"},
     0},
    {"srun --tres-bind=gres/gpu:verbose,closest",
     1,
     1,
     2,
     {"SLURM_JOB_ID=78", "SLURM_TRES_BIND=gres/gpu:verbose,closest", "CUDA_VISIBLE_DEVICES=1", NULL},
     0,
     0,
     {"allow-task-sharing", "--tres-bind=gres/gpu:verbose,closest"},
     0},
    {"Slurm isolation seen only through SLURM_STEP_GPUS wider than the view",
     1,
     2,
     4,
     {"SLURM_JOB_ID=79", "SLURM_STEP_GPUS=4,5,6,7", "CUDA_VISIBLE_DEVICES=0", NULL},
     0,
     0,
     {"allow-task-sharing", "GPUs 4,5,6,7 on this node"},
     0},
    {"Slurm job, one GPU per rank, no binding variables: still Slurm's binding",
     1,
     1,
     2,
     {"SLURM_JOB_ID=83", "CUDA_VISIBLE_DEVICES=1", NULL},
     0,
     0,
     {"allow-task-sharing", "one GPU under Slurm job 83"},
     0},
    {"--gpus-per-task=1 with allow-task-sharing already given: no note",
     1,
     1,
     4,
     {"SLURM_JOB_ID=77", "SLURM_GPUS_PER_TASK=1", "SLURM_GRES_FLAGS=allow-task-sharing", "SLURM_STEP_GPUS=0,1,2,3",
      "CUDA_VISIBLE_DEVICES=1", NULL},
     0,
     0,
     {NULL},
     1},
    {"--gpus-per-task=1 with one task per node: nothing to share, no note",
     1,
     0,
     1,
     {"SLURM_JOB_ID=77", "SLURM_GPUS_PER_TASK=1", "CUDA_VISIBLE_DEVICES=3", NULL},
     0,
     0,
     {NULL},
     1},
    {"--gpu-bind=none under Slurm, GPUs per node: rank by local rank",
     2,
     1,
     2,
     {"SLURM_JOB_ID=80", "SLURM_GPU_BIND=none", "SLURM_STEP_GPUS=0,1", "CUDA_VISIBLE_DEVICES=0,1", NULL},
     0,
     1,
     {NULL},
     1},
    {"--gpus-per-task=2: first of the task's own two",
     2,
     1,
     2,
     {"SLURM_JOB_ID=81", "SLURM_GPUS_PER_TASK=2", "SLURM_STEP_GPUS=0,1,2,3", "CUDA_VISIBLE_DEVICES=2,3", NULL},
     0,
     0,
     {"GPUs Slurm bound", "allow-task-sharing"},
     0},
    {"none visible: refused", 0, 0, 2, {"CUDA_VISIBLE_DEVICES=", NULL}, -ENODEV, -1, {"sees no GPU", "\"\""}, 1},
    {"none visible in a Slurm job without GPUs: says how to ask",
     0,
     0,
     1,
     {"SLURM_JOB_ID=82", NULL},
     -ENODEV,
     -1,
     {"--gpus-per-node", "82"},
     1},
    {"2 GPUs for 4 ranks: refused", 2, 3, 4, {NULL}, -ENODEV, -1, {"4 ranks", "2 GPUs", "--ntasks-per-node=2"}, 1},
    {"1 GPU, no CUDA_VISIBLE_DEVICES, 2 ranks: they would share it",
     1,
     1,
     2,
     {NULL},
     -ENODEV,
     -1,
     {"2 ranks", "1 GPU is visible", "a GPU of its own"},
     1},
    {"CUDA_VISIBLE_DEVICES set by hand, one GPU per rank, no Slurm",
     1,
     1,
     2,
     {"CUDA_VISIBLE_DEVICES=1", NULL},
     0,
     0,
     {NULL},
     1},
    {"CUDA_VISIBLE_DEVICES=2,3 set by hand for 2 ranks",
     2,
     1,
     2,
     {"CUDA_VISIBLE_DEVICES=2,3", NULL},
     0,
     1,
     {NULL},
     1},
    {"CUDA_VISIBLE_DEVICES=0 by hand on 3 ranks: device 0 (NCCL refuses a shared GPU)",
     1,
     2,
     3,
     {"CUDA_VISIBLE_DEVICES=0", NULL},
     0,
     0,
     {NULL},
     1},
    {"local rank out of range", 4, 4, 4, {NULL}, -EINVAL, -1, {"local rank 4 of 4"}, 1},
    {"no ranks on the node", 4, 0, 0, {NULL}, -EINVAL, -1, {"local rank 0 of 0"}, 1},
};

int main(void)
{
    int n = 0;
    for (size_t i = 0; i < RT_ARRAY_LEN(cases); i++) {
        const struct pcase *k = &cases[i];
        char note[1024];
        memset(note, 'x', sizeof(note));
        int device = 12345;
        rt_errclear();
        int rc = rt_gpu_preflight(k->visible, k->local_rank, k->local_size, env_get, (void *)k->env, &device,
                                  note, sizeof(note));
        n++;
        CHECKF(rc == k->rc, "%s: rc %d, expected %d (%s)", k->what, rc, k->rc, rt_errmsg());
        CHECKF(device == k->device, "%s: device %d, expected %d", k->what, device, k->device);
        const char *text = rc == 0 ? note : rt_errmsg();
        for (int j = 0; j < 3 && k->has[j]; j++)
            CHECKF(strstr(text, k->has[j]) != NULL, "%s: '%s' lacks '%s'", k->what, text, k->has[j]);
        if (rc == 0 && k->note_empty)
            CHECKF(note[0] == 0, "%s: unexpected note '%s'", k->what, note);
        if (rc == 0 && !k->note_empty)
            CHECKF(strlen(note) > 100, "%s: note too short: '%s'", k->what, note);
        if (rc < 0)
            CHECKF(note[0] == 0, "%s: note '%.40s' set on an error", k->what, note);
        printf("%-90.90s rc %3d device %2d%s\n", k->what, rc, device, rc == 0 && note[0] ? "  (note)" : "");
    }

    /* A small buffer truncates the note, never overruns it. */
    const char *iso[] = {"SLURM_JOB_ID=1", "SLURM_GPUS_PER_TASK=1", "CUDA_VISIBLE_DEVICES=0", NULL};
    char small[17];
    memset(small, 'x', sizeof(small));
    int device = -5;
    CHECK(rt_gpu_preflight(1, 0, 2, env_get, (void *)iso, &device, small, 16) == 0);
    CHECK(device == 0 && strlen(small) == 15 && small[16] == 'x');
    /* No note buffer at all is fine. */
    CHECK(rt_gpu_preflight(1, 0, 2, env_get, (void *)iso, &device, NULL, 0) == 0 && device == 0);

    printf("test_gpu_preflight: %d cases\n", n);
    return check_result();
}
