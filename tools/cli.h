/*
 * cli.h - glue shared by the `ringtrain` subcommands (tools/cmd_*.c): each
 * one parses its own options into a config struct, calls a library, and
 * prints. No pipeline logic lives in the cmd_*.c files: `train`, `eval`
 * and `loadbench` call the pipeline driver in tools/train/ (train.h), which
 * is the only code that joins loader, ring, compute and comm; the others
 * call one stage's library.
 *
 * Exit codes: 0 success, 1 failure (the library's message is printed),
 * 2 bad usage.
 */
#ifndef RT_TOOLS_CLI_H
#define RT_TOOLS_CLI_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>

#include "tools/train/train.h"

#define RT_EXIT_OK 0
#define RT_EXIT_FAIL 1
#define RT_EXIT_USAGE 2

int cmd_synth(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_version(int argc, char **argv);
int cmd_loadbench(int argc, char **argv);
int cmd_stage(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_ranks(int argc, char **argv);
int cmd_commbench(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_report(int argc, char **argv);

/* Prints "ringtrain <cmd>: <message>" to stderr and returns RT_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses a non-negative integer option value; prints a usage error on failure. */
int cli_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out);

struct rt_aug;
/* Parses an augmentation list: crop[=PAD], reflect, flip, alternate-flip, none. */
int cli_parse_aug(const char *cmd, const char *s, struct rt_aug *a);
/* "crop 4 zero-pad + flip" */
void cli_aug_describe(const struct rt_aug *a, char *buf, size_t len);

/*
 * The options `train` and `eval` share: put CLI_RUN_OPTIONS in the
 * getopt_long table and hand every option the command does not handle
 * itself to cli_run_option(), which returns 1 (it was one of them, stored
 * in *o), 0 (not one of them), or RT_EXIT_USAGE (a bad value; the message
 * was printed).
 */
enum {
    CLI_O_DATA = 1000, CLI_O_MODEL, CLI_O_BATCH, CLI_O_WORKERS, CLI_O_THREADS, CLI_O_DEVICE, CLI_O_JSON, CLI_O_TF32,
    CLI_O_DETERM
};
#define CLI_RUN_OPTIONS                                                                                      \
    {"data", required_argument, NULL, CLI_O_DATA}, {"model", required_argument, NULL, CLI_O_MODEL},           \
        {"batch-size", required_argument, NULL, CLI_O_BATCH},                                                 \
        {"workers", required_argument, NULL, CLI_O_WORKERS},                                                  \
        {"threads", required_argument, NULL, CLI_O_THREADS},                                                  \
        {"device", required_argument, NULL, CLI_O_DEVICE}, {"json", no_argument, NULL, CLI_O_JSON},          \
        {"tf32", required_argument, NULL, CLI_O_TF32}, {"deterministic", required_argument, NULL, CLI_O_DETERM}
struct cli_run_opts {
    const char *data, *model;
    uint32_t batch;
    int workers, threads;
    enum train_device device;
    int json;
    /* How a GPU runs convolutions, zero the defaults: no_tf32 is --tf32 off (strict fp32; TF32 is the
     * default, as PyTorch's), nondeterministic --deterministic off. */
    int no_tf32, nondeterministic;
};
int cli_run_option(const char *cmd, int ch, const char *arg, struct cli_run_opts *o);

/* Prints the library's last error as "error: ..." and returns RT_EXIT_FAIL. */
int cli_fail(void);

#endif
