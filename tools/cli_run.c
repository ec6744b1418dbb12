/*
 * cli_run.c - the options `ringtrain train` and `ringtrain eval` share
 * (CLI_RUN_OPTIONS in cli.h), parsed in one place so that the two commands
 * cannot come to read them differently.
 */
#include <errno.h>
#include <string.h>

#include "common/common.h"
#include "tools/cli.h"

/* A count in [lo, hi] into *out; a usage error otherwise. */
static int parse_range(const char *cmd, const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (cli_parse_u64(cmd, opt, s, out))
        return RT_EXIT_USAGE;
    if (*out < lo || *out > hi)
        return cli_usage_error(cmd, "%s must be %llu..%llu", opt, (unsigned long long)lo, (unsigned long long)hi);
    return 0;
}

/* An on|off option: 1 in *off for "off", 0 for "on"; a usage error otherwise. */
static int parse_off(const char *cmd, const char *opt, const char *s, int *off)
{
    if (strcmp(s, "on") && strcmp(s, "off"))
        return cli_usage_error(cmd, "%s %s: expected on or off", opt, s);
    *off = !strcmp(s, "off");
    return 0;
}

int cli_run_option(const char *cmd, int ch, const char *arg, struct cli_run_opts *o)
{
    uint64_t v;
    switch (ch) {
    case CLI_O_DATA: o->data = arg; return 1;
    case CLI_O_MODEL: o->model = arg; return 1;
    case CLI_O_JSON: o->json = 1; return 1;
    case CLI_O_BATCH:
        if (parse_range(cmd, "--batch-size", arg, 1, 65536, &v))
            return RT_EXIT_USAGE;
        o->batch = (uint32_t)v;
        return 1;
    case CLI_O_WORKERS:
        if (cli_parse_u64(cmd, "--workers", arg, &v))
            return RT_EXIT_USAGE;
        o->workers = (int)RT_MIN(v, 256);
        return 1;
    case CLI_O_THREADS:
        if (cli_parse_u64(cmd, "--threads", arg, &v))
            return RT_EXIT_USAGE;
        o->threads = (int)RT_MIN(v, 1024);
        return 1;
    case CLI_O_DEVICE:
        if (train_device_parse(arg, &o->device) < 0)
            return cli_usage_error(cmd, "%s", rt_errmsg());
        return 1;
    case CLI_O_TF32: return parse_off(cmd, "--tf32", arg, &o->no_tf32) ? RT_EXIT_USAGE : 1;
    case CLI_O_DETERM: return parse_off(cmd, "--deterministic", arg, &o->nondeterministic) ? RT_EXIT_USAGE : 1;
    default: return 0;
    }
}
