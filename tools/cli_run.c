/*
 * cli_run.c - the options `ringtrain train` and `ringtrain eval` share
 * (CLI_O_x in cli.h), parsed in one place so that the two commands cannot
 * come to read them differently: one row each in cli_run_rows, which both
 * commands' tables point at (.shared).
 */
#include "common/common.h"
#include "loader/loader.h"
#include "tools/cli.h"

static int parse_device(const char *arg, void *field) { return train_device_parse(arg, field); }

/* --tf32 and --deterministic: on (the default, 0) or off (1 in no_tf32, nondeterministic). */
static const struct cli_choice on_off[] = {{"on", 0, 0}, {"off", 1, 0}, {NULL, 0, 0}};

const struct cli_choice cli_shuffle_choices[] = {
    {"exact", RT_SHUFFLE_EXACT, 0}, {"window", RT_SHUFFLE_WINDOW, 0}, {"none", RT_SHUFFLE_NONE, 0}, {NULL, 0, 0}};

#define RUN(o) [(o) - CLI_O_DATA]
#define F(member) CLI_FIELD(struct cli_run_opts, member)
const struct cli_opt cli_run_rows[] = {
    RUN(CLI_O_DATA) = {.name = "data", .arg = "DIR", .kind = CLI_STR, F(data)},
    RUN(CLI_O_MODEL) = {.name = "model", .arg = "NAME", .kind = CLI_STR, F(model)},
    RUN(CLI_O_BATCH) = {.name = "batch-size", .arg = "N", .kind = CLI_UINT, F(batch), .lo = 1, .hi = 65536},
    RUN(CLI_O_WORKERS) = {.name = "workers", .arg = "N", .kind = CLI_UINT, F(workers), .hi = 256, .flags = CLI_CLAMP},
    RUN(CLI_O_THREADS) = {.name = "threads", .arg = "N", .kind = CLI_UINT, F(threads), .hi = 1024,
                          .flags = CLI_CLAMP},
    RUN(CLI_O_DEVICE) = {.name = "device", .arg = "D", .kind = CLI_PARSE, F(device), .parse = parse_device},
    RUN(CLI_O_JSON) = {.name = "json", .kind = CLI_FLAG, F(json)},
    RUN(CLI_O_TF32) = {.name = "tf32", .arg = "on|off", .kind = CLI_CHOICE, F(no_tf32), .choices = on_off},
    RUN(CLI_O_DETERM) = {.name = "deterministic", .arg = "on|off", .kind = CLI_CHOICE, F(nondeterministic),
                         .choices = on_off},
};
#undef F
#undef RUN

