/*
 * resolve.c - rank discovery: rank and world size from the MPI launcher, the
 * Slurm task variables or torchrun-style variables, in that order, with every
 * other source that is set checked against the chosen one. Pure: the
 * environment comes through a callback and nothing else is read.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/common.h"

const char *rt_rank_source_name(enum rt_rank_source s)
{
    switch (s) {
    case RT_RANKS_MPI: return "MPI";
    case RT_RANKS_SLURM: return "Slurm";
    case RT_RANKS_TORCHRUN: return "torchrun-style variables";
    case RT_RANKS_NONE: break;
    }
    return "none (one process)";
}

/* A variable as a non-negative int: 1 and *v when set and valid, 0 when
 * unset, -EINVAL (rt_errmsg() set) when malformed. */
static int env_int(const char *(*get)(void *, const char *), void *ctx, const char *name, int *v)
{
    const char *s = get(ctx, name);
    if (!s)
        return 0;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (!*s || *end || errno || x < 0 || x > INT_MAX)
        return rt_errf(-EINVAL, "%s=\"%s\" is not a non-negative integer", name, s);
    *v = (int)x;
    return 1;
}

/* One source's view: rank/world (have = 0 when the source is not set). */
struct view {
    int mpi;                    /* the MPI launcher's view, not variables */
    int have, rank, world, local, have_local, local_world, have_local_world;
    const char *rank_var, *world_var, *local_var;
};

/* One source's rank and world variables into *v. Returns 0 (v->have says
 * whether they were set), or -EINVAL (rt_errmsg() set) when one is malformed,
 * set without its partner, or the rank is not below the world. */
static int read_pair(const char *(*get)(void *, const char *), void *ctx, const char *rank_var,
                     const char *world_var, struct view *v)
{
    int hr = env_int(get, ctx, rank_var, &v->rank);
    int hw = env_int(get, ctx, world_var, &v->world);
    if (hr < 0 || hw < 0)
        return -EINVAL;
    v->rank_var = rank_var;
    v->world_var = world_var;
    if (!hr && !hw)
        return 0;
    if (!hr || !hw)
        return rt_errf(-EINVAL, "%s is set but %s is not: set both, or neither", hr ? rank_var : world_var,
                       hr ? world_var : rank_var);
    if (v->world < 1 || v->rank >= v->world)
        return rt_errf(-EINVAL, "%s=%d with %s=%d: the rank must be below the world size", rank_var, v->rank,
                       world_var, v->world);
    v->have = 1;
    return 0;
}

/* "RANK=1 WORLD_SIZE=2", or "mpirun: rank 1 of 2" for the MPI launcher. */
static void describe(const struct view *v, char *buf, size_t len)
{
    if (v->mpi)
        snprintf(buf, len, "%s: rank %d of %d", v->rank_var, v->rank, v->world);
    else
        snprintf(buf, len, "%s=%d %s=%d", v->rank_var, v->rank, v->world_var, v->world);
}

static int disagree(const struct view *a, const struct view *b)
{
    if (a->rank == b->rank && a->world == b->world)
        return 0;
    char x[96], y[96];
    describe(a, x, sizeof(x));
    describe(b, y, sizeof(y));
    return rt_errf(-EINVAL, "the launch settings disagree: %s, but %s; unset the stale variables (a job script "
                            "exporting another launcher's?)",
                   x, y);
}

int rt_comm_resolve(const char *(*get)(void *ctx, const char *name), void *ctx, const struct rt_launch_view *lv,
                    struct rt_rank_info *out)
{
    memset(out, 0, sizeof(*out));
    struct view mpi = {0}, slurm = {0}, torch = {0};
    if (lv && lv->mpi) {
        /* The launcher by name: mpirun's daemons set OMPI_COMM_WORLD_*; srun sets its step id (and, with
         * --mpi=pmix, the PMIx rank) in each task. */
        const char *by = lv->mpirun                                           ? "mpirun"
                         : get(ctx, "SLURM_STEP_ID") && get(ctx, "PMIX_RANK") ? "srun --mpi=pmix"
                         : get(ctx, "SLURM_STEP_ID")                          ? "srun"
                                                                              : "the MPI launcher";
        mpi = (struct view){.mpi = 1, .have = 1, .rank = lv->rank, .world = lv->world, .rank_var = by,
                            .world_var = ""};
        if (lv->world < 1 || lv->rank < 0 || lv->rank >= lv->world)
            return rt_errf(-EINVAL, "MPI reports rank %d of %d", lv->rank, lv->world);
    }
    /* Under mpirun, SLURM_PROCID and friends belong to the daemons mpirun
     * started with srun (one per node), not to the ranks. */
    int slurm_ours = !(lv && lv->mpi && lv->mpirun);
    if (slurm_ours) {
        const char *world_var = get(ctx, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
        if (get(ctx, "SLURM_PROCID") && read_pair(get, ctx, "SLURM_PROCID", world_var, &slurm) < 0)
            return -EINVAL;
        int h = env_int(get, ctx, "SLURM_LOCALID", &slurm.local);
        if (h < 0)
            return -EINVAL;
        slurm.have_local = h && slurm.have;
        slurm.local_var = "SLURM_LOCALID";
    }
    if (read_pair(get, ctx, "RANK", "WORLD_SIZE", &torch) < 0)
        return -EINVAL;
    int h = env_int(get, ctx, "LOCAL_RANK", &torch.local);
    int hw = env_int(get, ctx, "LOCAL_WORLD_SIZE", &torch.local_world);
    if (h < 0 || hw < 0)
        return -EINVAL;
    torch.have_local = h && torch.have;
    torch.have_local_world = hw && torch.have;
    torch.local_var = "LOCAL_RANK";
    if (torch.have_local_world && torch.have_local && torch.local >= torch.local_world)
        return rt_errf(-EINVAL, "LOCAL_RANK=%d with LOCAL_WORLD_SIZE=%d: the local rank must be below it",
                       torch.local, torch.local_world);

    const struct view *win = mpi.have ? &mpi : slurm.have ? &slurm : torch.have ? &torch : NULL;
    const struct view *all[] = {&mpi, &slurm, &torch};
    for (int i = 0; win && i < 3; i++)
        if (all[i] != win && all[i]->have && disagree(win, all[i]) < 0)
            return -EINVAL;
    if (slurm.have_local && torch.have_local && slurm.local != torch.local)
        return rt_errf(-EINVAL, "the launch variables disagree: SLURM_LOCALID=%d but LOCAL_RANK=%d", slurm.local,
                       torch.local);

    out->rank = win ? win->rank : 0;
    out->world = win ? win->world : 1;
    out->source = win == &mpi ? RT_RANKS_MPI : win == &slurm ? RT_RANKS_SLURM : win == &torch ? RT_RANKS_TORCHRUN
                                                                                             : RT_RANKS_NONE;
    out->mpi = mpi.have;
    out->local_rank = slurm.have_local ? slurm.local : torch.have_local ? torch.local : 0;
    out->local_world = torch.have_local_world ? torch.local_world : 1;
    out->nodes = 1;
    if (win && win->mpi)
        snprintf(out->vars, sizeof(out->vars), "%s", win->rank_var);
    else if (win)
        snprintf(out->vars, sizeof(out->vars), "%s/%s", win->rank_var, win->world_var);
    else
        snprintf(out->vars, sizeof(out->vars), "no launcher variables");
    int cpus = 0;
    if (env_int(get, ctx, "SLURM_CPUS_PER_TASK", &cpus) < 0)
        return -EINVAL;
    out->cpus_per_task = cpus;
    const char *job = get(ctx, "SLURM_JOB_ID");
    snprintf(out->job_id, sizeof(out->job_id), "%s", job ? job : "");
    return 0;
}
