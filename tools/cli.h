/*
 * cli.h - glue shared by the `ringtrain` subcommands: each one parses its own
 * options into a config struct, calls the library, and prints. No pipeline
 * logic lives in tools/.
 *
 * Exit codes: 0 success, 1 failure (the library's message is printed),
 * 2 bad usage.
 */
#ifndef RT_TOOLS_CLI_H
#define RT_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>

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

/* Prints "ringtrain <cmd>: <message>" to stderr and returns RT_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses a non-negative integer option value; prints a usage error on failure. */
int cli_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out);

struct rt_aug;
/* Parses an augmentation list: crop[=PAD], reflect, flip, alternate-flip, none. */
int cli_parse_aug(const char *cmd, const char *s, struct rt_aug *a);
/* "crop 4 zero-pad + flip" */
void cli_aug_describe(const struct rt_aug *a, char *buf, size_t len);

/* Prints the library's last error as "error: ..." and returns RT_EXIT_FAIL. */
int cli_fail(void);

#endif
