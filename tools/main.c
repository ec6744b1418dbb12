/*
 * main.c - the `ringtrain` command: dispatches to a subcommand and prints the
 * overall help. Each subcommand lives in its own cmd_*.c file.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "loader/loader.h"
#include "tools/cli.h"

struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

static const struct subcommand subcommands[] = {
    {"synth", cmd_synth, "write a learnable synthetic CIFAR-10/100 or MNIST dataset in the original file layout"},
    {"pack", cmd_pack, "pack CIFAR, MNIST or an image folder into zstd/JPEG shards + manifest"},
    {"verify", cmd_verify, "check every shard of a packed dataset against its manifest and checksums"},
    {"inspect", cmd_inspect, "print a packed dataset's summary, or one record (and write it as an image)"},
    {"loadbench", cmd_loadbench, "run the loader and ring with no compute: images/s, stage shares, verdict"},
    {"train", cmd_train, "train a model (mnist-net, resnet18, resnet50, resnet9, wrn-D-K) on a packed dataset"},
    {"eval", cmd_eval, "loss and accuracy of a checkpoint on a dataset's test split"},
    {"commbench", cmd_commbench, "all-reduce bandwidth over message sizes (MPI on CPUs, NCCL on GPUs), checked"},
    {"report", cmd_report, "one HTML page of charts from runs' metrics, summaries and benchmark outputs"},
    {"trace", cmd_trace, "merge the per-rank trace files of train --trace into one Chrome trace"},
    {"ranks", cmd_ranks, "print the rank table a job launched the same way (mpirun, srun) would use"},
    {"stage", cmd_stage, "copy a packed dataset to node-local storage, checksummed and resumable"},
    {"version", cmd_version, "print the version, backends and library versions"},
};

static void print_help(FILE *f)
{
    fprintf(f, "Usage: ringtrain <command> [options]\n"
               "  or:  ringtrain --help | --version\n\n"
               "Data-parallel training of image classifiers: datasets packed into checksummed shards, a\n"
               "loader and batch ring that feed the model, training on CPUs or GPUs across MPI ranks.\n\n"
               "Commands:\n");
    for (size_t i = 0; i < RT_ARRAY_LEN(subcommands); i++)
        fprintf(f, "  %-10s  %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(f, "\n`ringtrain <command> --help` (or `man ringtrain-<command>`) describes each command's options.\n\n"
               "Options:\n"
               "  -h, --help     print this help (also `ringtrain help`)\n"
               "  -V, --version  print the version, backends and library versions (as `ringtrain version`)\n\n"
               "Examples:\n"
               "  $ ringtrain synth --out data/src\n"
               "  $ ringtrain pack data/src --out data/cifar10\n"
               "  $ ringtrain verify data/cifar10\n"
               "  $ ringtrain train --data data/cifar10\n");
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "ringtrain %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see `ringtrain %s --help`)\n", cmd);
    return RT_EXIT_USAGE;
}

int cli_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out)
{
    char *end;
    if (!s || !*s || *s == '-')
        return cli_usage_error(cmd, "%s needs a non-negative integer, got '%s'", opt, s ? s : "");
    unsigned long long v = strtoull(s, &end, 10);
    if (*end)
        return cli_usage_error(cmd, "%s needs a non-negative integer, got '%s'", opt, s);
    *out = v;
    return 0;
}

int cli_fail(void)
{
    fprintf(stderr, "error: %s\n", rt_errmsg());
    return RT_EXIT_FAIL;
}

int cli_parse_aug(const char *cmd, const char *s, struct rt_aug *a)
{
    return rt_aug_parse(s, a) < 0 ? cli_usage_error(cmd, "--aug: %s", rt_errmsg()) : 0;
}

/*
 * The compute threads are one OpenMP team (our kernels and OpenBLAS). By
 * default libgomp spins idle threads for a while after each parallel region;
 * when the cores are shared -- the loader's threads, other jobs on a node --
 * a spinning thread takes the core a working one needs, and on two busy
 * cores that made training several times slower. libgomp reads its policy
 * once, before main(), so `train` and `eval` re-execute themselves once
 * with OMP_WAIT_POLICY=passive unless the user chose a policy, or asked for
 * one compute thread. (Setting the variable from the executable's
 * pre-initialiser does not work: libc's own initialiser, which runs after
 * it and before libgomp's, resets the environment to the one exec passed.)
 */
static void set_wait_policy(int argc, char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv("RINGTRAIN_REEXEC"))
        return;
    /* One compute thread makes no team, so nothing spins: no second start (it loads every library again,
     * which with a hundred ranks on a node costs seconds). The last --threads counts, as getopt takes it. */
    const char *threads = NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--"))
            break;
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = argv[++i];
        else if (!strncmp(argv[i], "--threads=", 10))
            threads = argv[i] + 10;
    }
    if (threads && !strcmp(threads, "1"))
        return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    setenv("RINGTRAIN_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);
    /* No /proc: carry on with the default policy. */
}

int main(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "train") || !strcmp(argv[1], "eval")))
        set_wait_policy(argc, argv);
    if (argc < 2) {
        print_help(stderr);
        return RT_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_help(stdout);
        return RT_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V"))
        return cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < RT_ARRAY_LEN(subcommands); i++)
        if (!strcmp(argv[1], subcommands[i].name))
            return subcommands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ringtrain: unknown command '%s'\n\n", argv[1]);
    print_help(stderr);
    return RT_EXIT_USAGE;
}
