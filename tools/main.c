/*
 * main.c - the `ringtrain` command: dispatches to a subcommand and prints the
 * overall help. Each subcommand lives in its own cmd_*.c file.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
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
    {"stage", cmd_stage, "copy a packed dataset to node-local storage, checksummed and resumable"},
    {"version", cmd_version, "print the version, backends and library versions"},
};

static void print_help(FILE *f)
{
    fprintf(f, "usage: ringtrain <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < RT_ARRAY_LEN(subcommands); i++)
        fprintf(f, "  %-10s %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(f, "\n`ringtrain <command> --help` describes each command's options.\n"
               "Quick start: ringtrain synth --out data/src && ringtrain pack data/src --out data/cifar10 &&\n"
               "             ringtrain verify data/cifar10 && ringtrain loadbench data/cifar10\n");
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

int main(int argc, char **argv)
{
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
