/*
 * cmd_ranks.c - `ringtrain ranks`: what `train` would see of the launch,
 * without training: the rank and world size, where they came from, and the
 * rank table (host, pid, node, local rank, CPUs, default threads). Run it
 * with the same mpirun/srun line as the job to check the launch.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "common/common.h"
#include "tools/cli.h"

int cmd_ranks(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("Usage: ringtrain ranks\n"
                   "  or:  mpirun -np N ringtrain ranks\n\n"
                   "Prints the rank table a training job launched the same way would use: rank and world\n"
                   "size (from MPI, then Slurm, then torchrun-style variables), nodes, local ranks, CPUs and\n"
                   "default compute threads per rank.\n\n"
                   "Options:\n"
                   "  -h, --help  print this help\n\n"
                   "Examples:\n"
                   "  $ mpirun -np 4 ringtrain ranks\n"
                   "  $ srun --mpi=pmix -N 2 --ntasks-per-node=4 ringtrain ranks\n");
            return RT_EXIT_OK;
        }
        return cli_usage_error("ranks", "unexpected argument '%s'", argv[i]);
    }
    struct rt_comm *c;
    if (rt_comm_create(NULL, &c) < 0)
        return cli_fail();
    const struct rt_rank_info *ri = rt_comm_info(c);
    if (ri->rank == 0) {
        printf("world %d: %d node%s, %d rank%s on this node; ranks from %s (%s); collectives: %s\n", ri->world,
               ri->nodes, ri->nodes == 1 ? "" : "s", ri->local_world, ri->local_world == 1 ? "" : "s",
               rt_rank_source_name(ri->source), ri->vars, rt_comm_backend(c));
        if (ri->job_id[0])
            printf("Slurm job %s%s\n", ri->job_id, ri->cpus_per_task ? "" : " (no --cpus-per-task)");
    }
    rt_comm_print_ranks(c, stdout, rt_comm_default_threads(c), "cpu");
    fflush(stdout);
    rt_comm_destroy(c);
    return RT_EXIT_OK;
}
