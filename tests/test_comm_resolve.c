/*
 * test_comm_resolve.c - rank discovery as a pure function: MPI, Slurm and
 * torchrun-style variables, their precedence, and the disagreements and
 * malformed values that must be refused (with the variables named).
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "comm/comm.h"
#include "common/common.h"

/* A fake environment: "NAME=value" strings, NULL-terminated. */
static const char *get(void *ctx, const char *name)
{
    const char *const *env = ctx;
    size_t n = strlen(name);
    for (; *env; env++)
        if (!strncmp(*env, name, n) && (*env)[n] == '=')
            return *env + n + 1;
    return NULL;
}

static const struct rt_launch_view no_mpi = {0};

static int resolve(const struct rt_launch_view *v, struct rt_rank_info *out, const char **env)
{
    return rt_comm_resolve(get, (void *)env, v, out);
}

int main(void)
{
    struct rt_rank_info ri;

    /* Nothing set: rank 0 of 1. */
    const char *none[] = {"HOME=/root", NULL};
    CHECK_OK(resolve(&no_mpi, &ri, none));
    CHECK(ri.rank == 0 && ri.world == 1 && ri.source == RT_RANKS_NONE && !ri.mpi);

    /* torchrun-style alone. */
    const char *torch[] = {"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", NULL};
    CHECK_OK(resolve(&no_mpi, &ri, torch));
    CHECK(ri.rank == 3 && ri.world == 4 && ri.local_rank == 1 && ri.local_world == 2);
    CHECK(ri.source == RT_RANKS_TORCHRUN);
    CHECKF(strstr(ri.vars, "RANK") != NULL, "%s", ri.vars);

    /* Slurm alone; the step's task count wins over the allocation's. */
    const char *slurm[] = {"SLURM_PROCID=5",     "SLURM_NTASKS=8",         "SLURM_LOCALID=1",
                           "SLURM_JOB_ID=12345", "SLURM_CPUS_PER_TASK=4", NULL};
    CHECK_OK(resolve(&no_mpi, &ri, slurm));
    CHECK(ri.rank == 5 && ri.world == 8 && ri.local_rank == 1 && ri.source == RT_RANKS_SLURM);
    CHECK(!strcmp(ri.job_id, "12345") && ri.cpus_per_task == 4);
    const char *slurm_step[] = {"SLURM_PROCID=1", "SLURM_NTASKS=8", "SLURM_STEP_NUM_TASKS=2", NULL};
    CHECK_OK(resolve(&no_mpi, &ri, slurm_step));
    CHECK(ri.rank == 1 && ri.world == 2);

    /* Slurm outranks torchrun; agreeing values are fine. */
    const char *both[] = {"SLURM_PROCID=2", "SLURM_NTASKS=4", "RANK=2", "WORLD_SIZE=4", NULL};
    CHECK_OK(resolve(&no_mpi, &ri, both));
    CHECK(ri.source == RT_RANKS_SLURM && ri.rank == 2);
    const char *clash[] = {"SLURM_PROCID=2", "SLURM_NTASKS=4", "RANK=1", "WORLD_SIZE=4", NULL};
    CHECK_ERR(resolve(&no_mpi, &ri, clash), "SLURM_PROCID=2");
    CHECK_ERR(resolve(&no_mpi, &ri, clash), "RANK=1");
    const char *clash_local[] = {"SLURM_PROCID=2", "SLURM_NTASKS=4", "SLURM_LOCALID=0", "RANK=2",
                                 "WORLD_SIZE=4",   "LOCAL_RANK=1",   NULL};
    CHECK_ERR(resolve(&no_mpi, &ri, clash_local), "SLURM_LOCALID=0 but LOCAL_RANK=1");

    /* MPI outranks both; srun --mpi=pmix: Slurm's values must agree. */
    struct rt_launch_view srun = {.mpi = 1, .rank = 2, .world = 4};
    CHECK_OK(resolve(&srun, &ri, both));
    CHECK(ri.source == RT_RANKS_MPI && ri.rank == 2 && ri.world == 4 && ri.mpi);
    const char *stale[] = {"SLURM_PROCID=2", "SLURM_NTASKS=3", NULL};
    CHECK_ERR(resolve(&srun, &ri, stale), "SLURM_NTASKS=3");
    CHECK_ERR(resolve(&srun, &ri, stale), "rank 2 of 4");
    CHECK_ERR(resolve(&srun, &ri, stale), "the MPI launcher: rank 2 of 4");
    /* The banner names srun when it is the launcher. */
    const char *srun_env[] = {"SLURM_PROCID=2", "SLURM_NTASKS=4", "SLURM_STEP_ID=0", "PMIX_RANK=2", NULL};
    CHECK_OK(resolve(&srun, &ri, srun_env));
    CHECK(strcmp(ri.vars, "srun --mpi=pmix") == 0);
    const char *srun_stale[] = {"SLURM_PROCID=2", "SLURM_NTASKS=3", "SLURM_STEP_ID=0", "PMIX_RANK=2", NULL};
    CHECK_ERR(resolve(&srun, &ri, srun_stale), "srun --mpi=pmix: rank 2 of 4");
    /* Under mpirun the Slurm variables are its daemons': not compared... */
    struct rt_launch_view mpirun = {.mpi = 1, .mpirun = 1, .rank = 0, .world = 2};
    CHECK_OK(resolve(&mpirun, &ri, stale));
    CHECK(ri.rank == 0 && ri.world == 2);
    /* ...but torchrun-style variables a script exported are. */
    const char *wrong_rank[] = {"RANK=1", "WORLD_SIZE=2", NULL};
    CHECK_ERR(resolve(&mpirun, &ri, wrong_rank), "disagree");
    const char *right_rank[] = {"RANK=0", "WORLD_SIZE=2", NULL};
    CHECK_OK(resolve(&mpirun, &ri, right_rank));

    /* Malformed and half-set variables. */
    const char *half[] = {"RANK=1", NULL};
    CHECK_ERR(resolve(&no_mpi, &ri, half), "RANK is set but WORLD_SIZE is not");
    const char *half2[] = {"WORLD_SIZE=2", NULL};
    CHECK_ERR(resolve(&no_mpi, &ri, half2), "WORLD_SIZE is set but RANK is not");
    const char *junk[] = {"RANK=one", "WORLD_SIZE=2", NULL};
    CHECK_ERR(resolve(&no_mpi, &ri, junk), "RANK=\"one\"");
    const char *neg[] = {"SLURM_PROCID=-1", "SLURM_NTASKS=2", NULL};
    CHECK_ERR(resolve(&no_mpi, &ri, neg), "SLURM_PROCID");
    const char *big[] = {"RANK=4", "WORLD_SIZE=4", NULL};
    CHECK_ERR(resolve(&no_mpi, &ri, big), "below the world size");
    const char *zero[] = {"RANK=0", "WORLD_SIZE=0", NULL};
    CHECK_ERR(resolve(&no_mpi, &ri, zero), "below the world size");
    const char *local[] = {"RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", NULL};
    CHECK_ERR(resolve(&no_mpi, &ri, local), "LOCAL_RANK=2");
    const char *cpus[] = {"SLURM_CPUS_PER_TASK=many", NULL};
    CHECK_ERR(resolve(&no_mpi, &ri, cpus), "SLURM_CPUS_PER_TASK");
    struct rt_launch_view bad = {.mpi = 1, .rank = 3, .world = 2};
    CHECK_ERR(resolve(&bad, &ri, none), "rank 3 of 2");
    return check_result();
}
