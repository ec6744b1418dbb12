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
#include <stdio.h>

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
/* Parses --aug as rt_aug_parse() does; prints a usage error on failure. */
int cli_parse_aug(const char *cmd, const char *s, struct rt_aug *a);

/*
 * Option tables. A command describes each option once, as a row of a static
 * table of struct cli_opt: its names, its argument, the field of the
 * command's config struct it fills and how, and its help. From the table
 * come getopt_long's array, the parsing and the `--help` text (so the man
 * pages and docs/COMMANDS.md, made from --help, follow it). Rules between
 * options ("--nesterov applies to --optimizer sgd only") are not rows: each
 * command checks them in code after cli_opts_parse.
 */
enum cli_opt_kind {
    CLI_TEXT,   /* no option: .help is a line of the help as it stands (a heading, a note); .name is NULL */
    CLI_HELP,   /* no argument: prints the help to stdout, and the command ends with RT_EXIT_OK */
    CLI_FLAG,   /* no argument: the int field becomes 1 */
    CLI_SET,    /* no argument: the int (or enum) field becomes .set */
    CLI_STR,    /* the const char * field points at the argument (borrowed from argv) */
    CLI_UINT,   /* a decimal integer in [.lo, .hi] (.hi 0: the field's largest) into a 32- or 64-bit field;
                 * outside it a usage error, or with CLI_CLAMP the nearest end */
    CLI_REAL,   /* a finite number in [.dlo, .dhi] (with CLI_OPEN [.dlo, .dhi)) into a float or double */
    CLI_CHOICE, /* one of .choices' names: its value into the int (or enum) field */
    CLI_PARSE,  /* .parse(arg, field), a library's parser: < 0 is a bad value, rt_errmsg() says why */
    CLI_CUSTOM, /* .custom(cmd, arg, cfg) does all, messages included (values that fill several fields) */
};

enum { CLI_CLAMP = 1, CLI_OPEN = 2 }; /* struct cli_opt .flags */

/* A CLI_CHOICE name and its value; a list ends with {NULL}. An alias is accepted but not listed in messages. */
struct cli_choice {
    const char *name;
    int value;
    int alias;
};

/* The field a row fills: .off and .size of `member` (nested members too: o.quality) in config type T. */
#define CLI_FIELD(T, member) .off = offsetof(T, member), .size = sizeof(((T *)0)->member)

struct cli_opt {
    const char *name;    /* the long name without "--"; NULL for CLI_TEXT */
    int letter;          /* the short option's letter, 0 for none */
    const char *arg;     /* the argument's name in the help; NULL: the option takes none */
    enum cli_opt_kind kind;
    size_t off, size;    /* the field, CLI_FIELD() */
    uint64_t lo, hi;     /* CLI_UINT */
    double dlo, dhi;     /* CLI_REAL */
    int set;             /* CLI_SET */
    unsigned flags;      /* CLI_CLAMP, CLI_OPEN */
    const struct cli_choice *choices;                         /* CLI_CHOICE */
    int (*parse)(const char *arg, void *field);               /* CLI_PARSE */
    int (*custom)(const char *cmd, const char *arg, void *cfg); /* CLI_CUSTOM: 0, or RT_EXIT_USAGE after
                                                                 * cli_usage_error */
    /* One of cli_run_rows: name, argument and parsing are that row's, the field is in the command's struct
     * cli_run_opts (struct cli_cmd .run_off); the help is this row's. */
    const struct cli_opt *shared;
    const char *(*help_fn)(void); /* words the program knows (rt_model_names) that begin the help, or NULL */
    /* The description: a newline in it starts a line at the description's column; one at the start puts
     * the description on the line below the option's name. */
    const char *help;
};

/* A command's table and the help around it. */
struct cli_cmd {
    const char *name;            /* "pack": messages begin "ringtrain pack: " */
    const char *head;            /* the help above the rows: the usage line, what the command does, "Options:" */
    const char *tail;            /* the help below them: the examples */
    const struct cli_opt *opts;
    size_t nopts;
    int col;                     /* the column descriptions start at */
    int letters;                 /* options without a letter line up with those that have one: "      --size" */
    size_t run_off;              /* offsetof the command's struct cli_run_opts in its config, for .shared rows */
    int help_on_error;           /* an unknown option prints the whole help to stderr, not one line */
};

/* The row every command ends its options with (or puts where its help lists it). */
#define CLI_HELP_ROW {.name = "help", .letter = 'h', .kind = CLI_HELP, .help = "print this help"}

#define CLI_OPTS_MAX 96 /* rows of a table that are options */
#define CLI_PARSED (-1) /* cli_opts_parse: every option read, the command goes on */

/*
 * Parses argv's options (argv[0] is the command's name) into cfg by c's
 * table; getopt_long leaves the operands from argv[optind] on. Returns
 * CLI_PARSED; or, for the command to return: RT_EXIT_OK after --help printed
 * the help, RT_EXIT_USAGE after a message naming the option and what it
 * allows. Not thread-safe (getopt_long's state).
 */
int cli_opts_parse(const struct cli_cmd *c, int argc, char **argv, void *cfg);
/* Prints c's help to f. */
void cli_opts_help(const struct cli_cmd *c, FILE *f);
/*
 * The options `train` and `eval` share, parsed in one place: a command's
 * table names one as a row {CLI_SHARED(CLI_O_x), .help = ...} (name,
 * argument and parsing are cli_run_rows' row x, the field is in the
 * command's struct cli_run_opts at struct cli_cmd .run_off).
 */
enum {
    CLI_O_DATA = 1000, CLI_O_MODEL, CLI_O_BATCH, CLI_O_WORKERS, CLI_O_THREADS, CLI_O_DEVICE, CLI_O_JSON, CLI_O_TF32,
    CLI_O_DETERM
};
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
/* The same options as table rows, indexed by CLI_O_x - CLI_O_DATA: a row of a command's table names one,
 * {CLI_SHARED(CLI_O_MODEL), .help = ...}, and writes its own help. */
extern const struct cli_opt cli_run_rows[];
#define CLI_SHARED(o) .shared = &cli_run_rows[(o) - CLI_O_DATA]
/* --shuffle's choices (enum rt_shuffle), for train's and loadbench's rows. */
extern const struct cli_choice cli_shuffle_choices[];

/* Prints the library's last error as "error: ..." and returns RT_EXIT_FAIL. */
int cli_fail(void);

#endif
