/*
 * cli_opts.c - option tables (struct cli_opt in cli.h): from one table per
 * command come getopt_long's array, the parsing of every value into the
 * command's config struct, and the `--help` text, which the man pages and
 * docs/COMMANDS.md are made from. So an option, its argument, its check and
 * its help cannot drift apart. Rules between options (one that needs
 * another) are not here: each command checks them after parsing.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "tools/cli.h"

/* getopt_long's value for row i when the row has no letter: above every character. */
#define LONG_ONLY_BASE 256

/* The row that says how an option parses: a shared row's (cli_run_rows), else the row itself. */
static const struct cli_opt *rule(const struct cli_opt *o) { return o->shared ? o->shared : o; }

/* A line of the help that is no option: a heading, a note. */
static int is_text(const struct cli_opt *o) { return !o->shared && !o->name; }

/* Stores v in a field of `size` bytes (an int, an enum, a uint32_t or a uint64_t); v is in the field's range. */
static void store_int(void *field, size_t size, uint64_t v)
{
    if (size == sizeof(uint64_t)) {
        memcpy(field, &v, sizeof(v));
    } else {
        uint32_t x = (uint32_t)v;
        memcpy(field, &x, sizeof(x));
    }
}

static int parse_uint(const char *cmd, const struct cli_opt *r, const char *opt, const char *arg, void *field)
{
    const uint64_t max = r->size == sizeof(uint64_t) ? UINT64_MAX : UINT32_MAX;
    const uint64_t hi = r->hi ? r->hi : max;
    uint64_t v;
    if (cli_parse_u64(cmd, opt, arg, &v))
        return RT_EXIT_USAGE;
    if (r->flags & CLI_CLAMP)
        v = RT_MIN(RT_MAX(v, r->lo), hi);
    else if (v < r->lo && hi == max)
        return cli_usage_error(cmd, "%s must be at least %llu, not '%s'", opt, (unsigned long long)r->lo, arg);
    else if (v < r->lo || v > hi)
        return cli_usage_error(cmd, "%s must be in %llu..%llu, not '%s'", opt, (unsigned long long)r->lo,
                               (unsigned long long)hi, arg);
    store_int(field, r->size, v);
    return 0;
}

static int parse_real(const char *cmd, const struct cli_opt *r, const char *opt, const char *arg, void *field)
{
    const int open = (r->flags & CLI_OPEN) != 0;
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (!*arg || *end || errno || !isfinite(v) || v < r->dlo || v > r->dhi || (open && v == r->dhi))
        return cli_usage_error(cmd, "%s needs a number in [%g, %g%s, got '%s'", opt, r->dlo, r->dhi, open ? ")" : "]",
                               arg);
    if (r->size == sizeof(float)) {
        float f = (float)v;
        memcpy(field, &f, sizeof(f));
    } else {
        memcpy(field, &v, sizeof(v));
    }
    return 0;
}

static int parse_choice(const char *cmd, const struct cli_opt *r, const char *opt, const char *arg, void *field)
{
    const struct cli_choice *c;
    for (c = r->choices; c->name; c++)
        if (!strcmp(arg, c->name)) {
            store_int(field, r->size, (uint64_t)(int64_t)c->value);
            return 0;
        }
    /* "--fit x: expected crop, stretch or pad": the names but the aliases. */
    char list[256] = "";
    size_t n = 0, k = 0;
    for (c = r->choices; c->name; c++)
        n += !c->alias;
    for (c = r->choices; c->name; c++)
        if (!c->alias) {
            k++;
            const char *sep = k == 1 ? "" : k == n ? " or " : ", ";
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", sep, c->name);
        }
    return cli_usage_error(cmd, "%s %s: expected %s", opt, arg, list);
}

/* One row's value into the struct at base (its .shared row's rule, if any): 0, or RT_EXIT_USAGE after the
 * message. */
static int opt_apply(const char *cmd, const struct cli_opt *row, const char *arg, void *base)
{
    const struct cli_opt *r = rule(row);
    void *field = (char *)base + r->off;
    char opt[64];
    snprintf(opt, sizeof(opt), "--%s", r->name);
    switch (r->kind) {
    case CLI_FLAG: store_int(field, r->size, 1); return 0;
    case CLI_SET: store_int(field, r->size, (uint64_t)(int64_t)r->set); return 0;
    case CLI_STR: memcpy(field, &arg, sizeof(arg)); return 0;
    case CLI_UINT: return parse_uint(cmd, r, opt, arg, field);
    case CLI_REAL: return parse_real(cmd, r, opt, arg, field);
    case CLI_CHOICE: return parse_choice(cmd, r, opt, arg, field);
    case CLI_PARSE:
        if (r->parse(arg, field) < 0) {
            /* The library's message, with the option's name before it when it does not say it. */
            const char *why = rt_errmsg();
            return strncmp(why, opt, strlen(opt)) ? cli_usage_error(cmd, "%s: %s", opt, why)
                                                  : cli_usage_error(cmd, "%s", why);
        }
        return 0;
    case CLI_CUSTOM: return r->custom(cmd, arg, base);
    case CLI_TEXT:
    case CLI_HELP: break;
    }
    return cli_usage_error(cmd, "%s: no parser", opt);
}

/* Prints `text` from column `col` on, every line after the first indented to it too. */
static void put_indented(FILE *f, const char *text, int col)
{
    for (const char *p = text; *p; p++) {
        fputc(*p, f);
        if (*p == '\n')
            fprintf(f, "%*s", col, "");
    }
}

/* One option's lines: "  -o, --out DIR" (or "      --size S|HxW" beside options with letters), then the
 * description from column c->col on; on the next line when the description starts with a newline, after two
 * spaces when the name is too long for the column. */
static void help_row(const struct cli_cmd *c, const struct cli_opt *row, FILE *f)
{
    const struct cli_opt *r = rule(row);
    char left[128];
    if (r->letter)
        snprintf(left, sizeof(left), "  -%c, --%s%s%s", r->letter, r->name, r->arg ? " " : "", r->arg ? r->arg : "");
    else
        snprintf(left, sizeof(left), "  %s--%s%s%s", c->letters ? "    " : "", r->name, r->arg ? " " : "",
                 r->arg ? r->arg : "");
    const char *fn = row->help_fn ? row->help_fn() : "", *help = row->help ? row->help : "";
    const int first_on_next = (*fn ? *fn : *help) == '\n', len = (int)strlen(left);
    fputs(left, f);
    if (!first_on_next)
        fprintf(f, "%*s", len + 2 > c->col ? 2 : c->col - len, "");
    put_indented(f, fn, c->col);
    put_indented(f, help, c->col);
    fputc('\n', f);
}

void cli_opts_help(const struct cli_cmd *c, FILE *f)
{
    fputs(c->head, f);
    for (size_t i = 0; i < c->nopts; i++) {
        if (is_text(&c->opts[i]))
            fprintf(f, "%s\n", c->opts[i].help);
        else
            help_row(c, &c->opts[i], f);
    }
    fputs(c->tail, f);
}

/* getopt_long's array and short-option string for c's rows. 0, or -E2BIG when the table is larger than them. */
static int build_getopt(const struct cli_cmd *c, struct option *longs, char *shorts)
{
    size_t n = 0, s = 0;
    for (size_t i = 0; i < c->nopts; i++) {
        const struct cli_opt *r = rule(&c->opts[i]);
        if (is_text(&c->opts[i]))
            continue;
        if (n == CLI_OPTS_MAX)
            return -E2BIG;
        const int has_arg = r->arg ? required_argument : no_argument;
        longs[n++] = (struct option){r->name, has_arg, NULL, r->letter ? r->letter : LONG_ONLY_BASE + (int)i};
        if (r->letter) {
            shorts[s++] = (char)r->letter;
            if (r->arg)
                shorts[s++] = ':';
        }
    }
    longs[n] = (struct option){NULL, 0, NULL, 0};
    shorts[s] = '\0';
    return 0;
}

/* The row getopt_long's value `ch` stands for, or NULL ('?': an unknown option or a missing argument). */
static const struct cli_opt *row_of(const struct cli_cmd *c, int ch)
{
    if (ch >= LONG_ONLY_BASE && (size_t)(ch - LONG_ONLY_BASE) < c->nopts)
        return &c->opts[ch - LONG_ONLY_BASE];
    for (size_t i = 0; i < c->nopts; i++)
        if (!is_text(&c->opts[i]) && rule(&c->opts[i])->letter == ch)
            return &c->opts[i];
    return NULL;
}

int cli_opts_parse(const struct cli_cmd *c, int argc, char **argv, void *cfg)
{
    struct option longs[CLI_OPTS_MAX + 1];
    char shorts[2 * CLI_OPTS_MAX + 1];
    int ch;
    if (build_getopt(c, longs, shorts) < 0)
        return cli_usage_error(c->name, "more than %d options: raise CLI_OPTS_MAX", CLI_OPTS_MAX);
    optind = 1;
    while ((ch = getopt_long(argc, argv, shorts, longs, NULL)) != -1) {
        const struct cli_opt *row = row_of(c, ch);
        if (!row) {
            if (!c->help_on_error)
                return cli_usage_error(c->name, "unknown option");
            cli_opts_help(c, stderr);
            return RT_EXIT_USAGE;
        }
        if (row->kind == CLI_HELP) {
            cli_opts_help(c, stdout);
            return RT_EXIT_OK;
        }
        void *base = row->shared ? (char *)cfg + c->run_off : cfg;
        if (opt_apply(c->name, row, optarg, base))
            return RT_EXIT_USAGE;
    }
    return CLI_PARSED;
}
