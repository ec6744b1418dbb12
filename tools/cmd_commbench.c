/*
 * cmd_commbench.c - `ringtrain commbench`: nccl-tests' all_reduce_perf for
 * this stack. The options in, the measurement of tools/commbench/
 * (commbench.h: the two paths training all-reduces on, every size checked),
 * and nccl-tests' table out: time per iteration averaged over iterations and
 * ranks, algbw = size / time, busbw = algbw * 2(n-1)/n, and #wrong, the
 * elements whose sum came back wrong; then whether a gradient bucket of
 * --bucket-mb reaches the bandwidth the link gives at any size, and --json.
 * A wrong element anywhere makes the exit code 1.
 *
 * The planted fault of tests/test_commbench.sh (RINGTRAIN_TEST_COMMBENCH_CORRUPT)
 * is read here, once, into the library's config. Only rank 0 prints.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "common/common.h"
#include "tools/cli.h"
#include "tools/commbench/commbench.h"

/* What the command line asks for: the library's config, and what only the command uses. */
struct cb_options {
    struct commbench_config bench;
    const char *json;                /* NULL: none; "-": the last line of stdout */
};

/* One run of the command: the options, the measurement, where rank 0 writes the JSON. */
struct cb_state {
    const struct cb_options *opt;
    const struct commbench_config *cfg;
    struct rt_comm *c;
    struct commbench *bench;
    const struct commbench_info *in;
    FILE *json;                      /* rank 0 with --json FILE */
};

static void cb_help(void)
{
    printf("Usage: ringtrain commbench [options]\n"
           "  or:  mpirun -np N ringtrain commbench [options]\n\n"
           "Measures the all-reduce (sum of floats, in place) as nccl-tests' all_reduce_perf does, on the\n"
           "paths training uses, over message sizes from --min-bytes to --max-bytes: warm-up iterations,\n"
           "then timed ones. time: per iteration, averaged over the iterations, then over the ranks\n"
           "(maxtime: the slowest rank's); algbw = size / time; busbw = algbw * 2(n-1)/n, what each\n"
           "rank's link carries (0 for one rank). Every size is checked: rank r holds (r%%16+1)*(i%%7+1)\n"
           "at element i, whose sum is exact in floats; after the last timed iteration every element is\n"
           "compared and #wrong counts the wrong ones over all ranks (any: exit 1). The last line says\n"
           "whether a gradient bucket of --bucket-mb reaches %.0f%% of the best busbw measured. Only rank 0\n"
           "prints. Alone it is one rank; under mpirun -np N (or srun --mpi=pmix), N ranks.\n\n"
           "Options:\n"
           "  --path P          comm, bucketer or both (default both). comm: rt_comm_allreduce, host memory,\n"
           "                    MPI through the comm thread (what validation metrics use). bucketer: the\n"
           "                    gradient bucketer with one bucket of the message size: begin, ready, finish\n"
           "                    (what gradients use; it also OR-s the step's control word, as every step does)\n"
           "  --device D        auto (default: the GPU when there is one and NCCL loads), cpu or cuda:\n"
           "                    where the bucketer's buffer lives; on cuda it all-reduces device memory\n"
           "                    through NCCL, one GPU per rank. The comm path is host memory either way.\n"
           "  --min-bytes S     smallest message (default 1K); sizes take K, M, G (powers of 1024)\n"
           "  --max-bytes S     largest message (default 256M, at most 4G)\n"
           "  --factor F        each size is F times the one before (default 2)\n"
           "  --warmup N        untimed iterations per size (default 5)\n"
           "  --iters N         timed iterations per size (default 20)\n"
           "  --bucket-mb MB    the gradient bucket size to judge, in MiB (default 25, as train's\n"
           "                    --bucket-cap-mb); measured as a size of its own when inside the range\n"
           "  --json [FILE]     the header and one object per path and size as JSON, to FILE, or as the\n"
           "                    last line of stdout (times in us, bandwidths in GB/s)\n"
           "  -h, --help        print this help\n\n"
           "Examples:\n"
           "  $ ringtrain commbench --max-bytes 1M\n"
           "  $ mpirun -np 2 ringtrain commbench --path bucketer --json bench.json\n",
           100 * COMMBENCH_REACH);
}

/* ---- options ----------------------------------------------------------------------------- */

static int parse_bytes(const char *opt, const char *s, uint64_t *out)
{
    uint64_t v;
    if (rt_parse_size(s, &v) < 0 || v < sizeof(float) || v > COMMBENCH_MAX_BYTES)
        return cli_usage_error("commbench", "%s needs a size from 4 to 4G such as 1K, 25M or 256M, got '%s'", opt, s);
    *out = v / sizeof(float) * sizeof(float); /* whole floats, as nccl-tests rounds to its element type */
    return 0;
}

static int parse_count(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (cli_parse_u64("commbench", opt, s, out))
        return RT_EXIT_USAGE;
    if (*out < lo || *out > hi)
        return cli_usage_error("commbench", "%s must be in %" PRIu64 "..%" PRIu64, opt, lo, hi);
    return 0;
}

/* Returns 0, RT_EXIT_OK + 1 for --help (printed), or RT_EXIT_USAGE (printed). */
static int parse_options(int argc, char **argv, struct cb_options *o)
{
    enum { O_MIN = 256, O_MAX, O_FACTOR, O_WARMUP, O_ITERS, O_PATH, O_DEVICE, O_BUCKET, O_JSON, O_HELP };
    static const struct option opts[] = {
        {"min-bytes", required_argument, NULL, O_MIN},   {"max-bytes", required_argument, NULL, O_MAX},
        {"factor", required_argument, NULL, O_FACTOR},   {"warmup", required_argument, NULL, O_WARMUP},
        {"iters", required_argument, NULL, O_ITERS},     {"path", required_argument, NULL, O_PATH},
        {"device", required_argument, NULL, O_DEVICE},   {"bucket-mb", required_argument, NULL, O_BUCKET},
        {"json", optional_argument, NULL, O_JSON},       {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0}};
    *o = (struct cb_options){.json = NULL};
    commbench_config_default(&o->bench);
    struct commbench_config *c = &o->bench;
    double bucket_mb = 25;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case O_MIN:
            if (parse_bytes("--min-bytes", optarg, &c->min_bytes))
                return RT_EXIT_USAGE;
            break;
        case O_MAX:
            if (parse_bytes("--max-bytes", optarg, &c->max_bytes))
                return RT_EXIT_USAGE;
            break;
        case O_FACTOR:
            if (parse_count("--factor", optarg, 2, 1024, &c->factor))
                return RT_EXIT_USAGE;
            break;
        case O_WARMUP:
            if (parse_count("--warmup", optarg, 0, 1000000, &c->warmup))
                return RT_EXIT_USAGE;
            break;
        case O_ITERS:
            if (parse_count("--iters", optarg, 1, 1000000, &c->iters))
                return RT_EXIT_USAGE;
            break;
        case O_PATH:
            if (!strcmp(optarg, "comm"))
                c->paths = 1u << COMMBENCH_COMM;
            else if (!strcmp(optarg, "bucketer"))
                c->paths = 1u << COMMBENCH_BUCKETER;
            else if (!strcmp(optarg, "both"))
                c->paths = (1u << COMMBENCH_COMM) | (1u << COMMBENCH_BUCKETER);
            else
                return cli_usage_error("commbench", "--path must be comm, bucketer or both, not '%s'", optarg);
            break;
        case O_DEVICE:
            if (train_device_parse(optarg, &c->device) < 0)
                return cli_usage_error("commbench", "%s", rt_errmsg());
            break;
        case O_BUCKET: {
            char *end;
            bucket_mb = strtod(optarg, &end);
            if (!*optarg || *end || !(bucket_mb > 0) || bucket_mb > 4096)
                return cli_usage_error("commbench", "--bucket-mb needs MiB in (0, 4096], got '%s'", optarg);
            break;
        }
        case O_JSON:
            /* `--json FILE` as well as `--json=FILE`: the command takes no other argument, so a word after
             * --json that is not an option is its file ("-": stdout). */
            if (!optarg && optind < argc && (argv[optind][0] != '-' || !strcmp(argv[optind], "-")))
                optarg = argv[optind++];
            o->json = optarg ? optarg : "-";
            break;
        case 'h':
        case O_HELP: cb_help(); return RT_EXIT_OK + 1;
        default: return cli_usage_error("commbench", "unknown option");
        }
    }
    if (optind < argc)
        return cli_usage_error("commbench", "unexpected argument '%s'", argv[optind]);
    if (c->min_bytes > c->max_bytes)
        return cli_usage_error("commbench", "--min-bytes (%" PRIu64 ") is above --max-bytes (%" PRIu64 ")",
                               c->min_bytes, c->max_bytes);
    c->bucket_bytes = (uint64_t)(bucket_mb * 1048576.0) / sizeof(float) * sizeof(float);
    if (c->bucket_bytes < sizeof(float))
        return cli_usage_error("commbench", "--bucket-mb %g is less than one float", bucket_mb);
    /* The planted fault of the test (tests/test_commbench.sh): read once, here; the library has no getenv. */
    commbench_faults_from_env(&c->faults);
    return 0;
}

/* ---- printing ---------------------------------------------------------------------------- */

/* nccl-tests' time field: fewer decimals as the time grows, seven columns. */
static void time_text(double us, char *buf, size_t len)
{
    if (us >= 10000.0)
        snprintf(buf, len, "%7.0f", us);
    else if (us >= 100.0)
        snprintf(buf, len, "%7.1f", us);
    else
        snprintf(buf, len, "%7.2f", us);
}

static const char *path_what(const struct cb_state *R, enum commbench_path p)
{
    if (p == COMMBENCH_COMM)
        return "rt_comm_allreduce -- host memory, MPI through the comm thread (validation metrics)";
    return R->in->nccl ? "the gradient bucketer, one bucket -- device memory, NCCL on its comm stream (gradients)"
                       : "the gradient bucketer, one bucket -- host memory, MPI through the comm thread (gradients)";
}

/* The header, on rank 0; the rank table is collective. */
static void print_header(const struct cb_state *R)
{
    const struct commbench_config *cfg = R->cfg;
    const struct commbench_info *in = R->in;
    char *table = NULL;
    size_t table_len = 0;
    FILE *mem = in->rank == 0 ? open_memstream(&table, &table_len) : NULL;
    rt_comm_print_rank_summary(R->c, mem ? mem : stdout, 1, in->nccl ? "cuda" : "cpu", 16);
    if (mem)
        fclose(mem);
    if (in->rank != 0)
        return;
    printf("# ringtrain commbench: all_reduce, sum of float, in place\n");
    printf("# ranks %d hosts %d (%s) minBytes %" PRIu64 " maxBytes %" PRIu64 " step: %" PRIu64
           "(factor) warmup iters: %" PRIu64 " iters: %" PRIu64 " validation: 1\n",
           in->world, in->nhosts, in->hosts, cfg->min_bytes, cfg->max_bytes, cfg->factor, cfg->warmup, cfg->iters);
    printf("# collectives: %s; CPU: %s\n", in->collectives, in->cpu);
    if (in->nccl)
        printf("# GPU: %s; %s\n", in->gpu, in->nccl_line);
    else
        printf("# GPU: none used (the bucketer reduces host memory over MPI)\n");
    printf("#\n# Using ranks\n");
    for (char *line = table, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        printf("# %s\n", line);
    }
    free(table);
    if (in->world == 1)
        printf("# one rank: nothing crosses a link, busbw is 0 (run it under mpirun -np N or srun)%s\n",
               in->nccl ? "" : "; over MPI the all-reduce\n# of one rank returns at once: time is the call's overhead");
    fflush(stdout);
}

static void print_table_head(const struct cb_state *R, enum commbench_path p)
{
    if (R->in->rank != 0)
        return;
    printf("#\n# path %s: %s\n", commbench_path_name(p), path_what(R, p));
    printf("#%72s\n", "in-place");
    printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s\n", "size", "count", "type", "redop", "root", "time",
           "algbw", "busbw", "#wrong", "maxtime");
    printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
           "(GB/s)", "", "(us)");
    fflush(stdout);
}

static void print_row(const struct cb_state *R, const struct commbench_row *r)
{
    if (R->in->rank != 0)
        return;
    char t[32], mt[32];
    time_text(r->time_us, t, sizeof(t));
    time_text(r->max_time_us, mt, sizeof(mt));
    printf("%12" PRIu64 "  %12" PRIu64 "  %8s  %6s  %6d  %7s  %6.2f  %6.2f  %6" PRIu64 "  %7s\n", r->bytes,
           r->bytes / sizeof(float), "float", "sum", -1, t, r->algbw, r->busbw, r->wrong, mt);
    fflush(stdout);
}

/* The mean busbw of the rows on path p. */
static double avg_busbw(const struct commbench_row *rows, int n, enum commbench_path p)
{
    double s = 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (rows[i].path == p) {
            s += rows[i].busbw;
            k++;
        }
    return k ? s / k : 0;
}

static uint64_t total_wrong(const struct commbench_row *rows, int n)
{
    uint64_t w = 0;
    for (int i = 0; i < n; i++)
        w += rows[i].wrong;
    return w;
}

static void print_verdict(const struct cb_state *R, const struct commbench_verdict *v)
{
    const struct commbench_config *cfg = R->cfg;
    const double mib = (double)cfg->bucket_bytes / 1048576.0;
    const char *path = commbench_path_name(v->path);
    if (R->in->rank != 0)
        return;
    printf("#\n");
    if (R->in->world == 1)
        printf("# bucket %g MiB: one rank, no link to measure (busbw is 0 at every size); run it under mpirun -np N "
               "or srun to see whether it reaches the link's bandwidth\n",
               mib);
    else if (!v->measured)
        printf("# bucket %g MiB (%" PRIu64 " B): not measured, outside --min-bytes..--max-bytes; the best busbw on "
               "the %s path was %.2f GB/s at %" PRIu64 " B\n",
               mib, cfg->bucket_bytes, path, v->best, v->best_bytes);
    else if (v->reaches)
        printf("# bucket %g MiB (%" PRIu64 " B, %s path): busbw %.2f GB/s = %.0f%% of the best measured, %.2f GB/s "
               "at %" PRIu64 " B: yes, a %g MiB bucket reaches the link's bandwidth here\n",
               mib, cfg->bucket_bytes, path, v->busbw, 100 * v->fraction, v->best, v->best_bytes, mib);
    else {
        char hint[160] = "";
        if (v->lo > cfg->bucket_bytes)
            snprintf(hint, sizeof(hint), "; larger buckets would: --bucket-cap-mb %g", (double)v->lo / 1048576.0);
        printf("# bucket %g MiB (%" PRIu64 " B, %s path): busbw %.2f GB/s = %.0f%% of the best measured, %.2f GB/s "
               "at %" PRIu64 " B: no, a %g MiB bucket does not reach the link's bandwidth here (%.0f%% of it or more "
               "at %" PRIu64 "..%" PRIu64 " B%s)\n",
               mib, cfg->bucket_bytes, path, v->busbw, 100 * v->fraction, v->best, v->best_bytes, mib,
               100 * COMMBENCH_REACH, v->lo, v->hi, hint);
    }
    fflush(stdout);
}

/* The JSON document: the header's facts, one object per path and size, the averages and the verdict. */
static int write_json(const struct cb_state *R, const struct commbench_row *rows, int n,
                      const struct commbench_verdict *v)
{
    const struct commbench_config *cfg = R->cfg;
    const struct commbench_info *in = R->in;
    json_t *o = json_object(), *res = json_array(), *hosts = json_array(), *avg = json_object(),
           *bucket = json_object();
    char list[sizeof(in->hosts)];
    snprintf(list, sizeof(list), "%s", in->hosts);
    for (char *save = NULL, *h = strtok_r(list, ",", &save); h; h = strtok_r(NULL, ",", &save))
        json_array_append_new(hosts, json_string(h));
    json_object_set_new(o, "command", json_string("commbench"));
    json_object_set_new(o, "collective", json_string("all_reduce"));
    json_object_set_new(o, "type", json_string("float"));
    json_object_set_new(o, "redop", json_string("sum"));
    json_object_set_new(o, "in_place", json_true());
    json_object_set_new(o, "ranks", json_integer(in->world));
    json_object_set_new(o, "hosts", json_integer(in->nhosts));
    json_object_set_new(o, "host_names", hosts);
    json_object_set_new(o, "collectives", json_string(in->collectives));
    json_object_set_new(o, "cpu", json_string(in->cpu));
    json_object_set_new(o, "device", json_string(in->nccl ? "cuda" : "cpu"));
    json_object_set_new(o, "gpu", in->nccl ? json_string(in->gpu) : json_null());
    json_object_set_new(o, "nccl", in->nccl ? json_string(in->nccl_line) : json_null());
    json_object_set_new(o, "min_bytes", json_integer((json_int_t)cfg->min_bytes));
    json_object_set_new(o, "max_bytes", json_integer((json_int_t)cfg->max_bytes));
    json_object_set_new(o, "factor", json_integer((json_int_t)cfg->factor));
    json_object_set_new(o, "warmup", json_integer((json_int_t)cfg->warmup));
    json_object_set_new(o, "iters", json_integer((json_int_t)cfg->iters));
    for (int i = 0; i < n; i++) {
        const struct commbench_row *r = &rows[i];
        json_t *e = json_object();
        json_object_set_new(e, "path", json_string(commbench_path_name(r->path)));
        json_object_set_new(e, "backend", json_string(r->path == COMMBENCH_BUCKETER && in->nccl ? "NCCL" : "MPI"));
        json_object_set_new(e, "size", json_integer((json_int_t)r->bytes));
        json_object_set_new(e, "count", json_integer((json_int_t)(r->bytes / sizeof(float))));
        json_object_set_new(e, "time_us", json_real(r->time_us));
        json_object_set_new(e, "max_time_us", json_real(r->max_time_us));
        json_object_set_new(e, "algbw", json_real(r->algbw));
        json_object_set_new(e, "busbw", json_real(r->busbw));
        json_object_set_new(e, "wrong", json_integer((json_int_t)r->wrong));
        json_array_append_new(res, e);
    }
    json_object_set_new(o, "results", res);
    for (int p = 0; p < COMMBENCH_NPATHS; p++)
        if (cfg->paths & (1u << p))
            json_object_set_new(avg, commbench_path_name((enum commbench_path)p),
                                json_real(avg_busbw(rows, n, (enum commbench_path)p)));
    json_object_set_new(o, "avg_busbw", avg);
    json_object_set_new(bucket, "bytes", json_integer((json_int_t)cfg->bucket_bytes));
    json_object_set_new(bucket, "path", json_string(commbench_path_name(v->path)));
    json_object_set_new(bucket, "measured", json_boolean(v->measured));
    json_object_set_new(bucket, "busbw", v->measured ? json_real(v->busbw) : json_null());
    json_object_set_new(bucket, "best_busbw", json_real(v->best));
    json_object_set_new(bucket, "best_size", json_integer((json_int_t)v->best_bytes));
    json_object_set_new(bucket, "fraction", v->measured && v->best > 0 ? json_real(v->fraction) : json_null());
    json_object_set_new(bucket, "reaches", json_boolean(v->reaches));
    json_object_set_new(o, "bucket", bucket);
    json_object_set_new(o, "wrong", json_integer((json_int_t)total_wrong(rows, n)));

    FILE *f = R->json ? R->json : stdout;
    int rc = json_dumpf(o, f, JSON_COMPACT) == 0 && fputc('\n', f) != EOF && fflush(f) == 0 ? 0 : -EIO;
    json_decref(o);
    if (rc < 0)
        return rt_errf(rc, "--json %s: cannot write", R->opt->json);
    return 0;
}

/* ---- the run ----------------------------------------------------------------------------- */

/* Every path over every size, printed as it goes. Returns 0 or -errno; *wrong: the wrong elements. */
static int cb_run(struct cb_state *R, uint64_t *wrong)
{
    const struct commbench_config *cfg = R->cfg;
    uint64_t sizes[COMMBENCH_MAX_SIZES];
    const int ns = commbench_sizes(cfg, sizes);
    struct commbench_row rows[COMMBENCH_NPATHS * COMMBENCH_MAX_SIZES];
    int n = 0;
    print_header(R);
    for (int p = 0; p < COMMBENCH_NPATHS; p++) {
        if (!(cfg->paths & (1u << p)))
            continue;
        print_table_head(R, (enum commbench_path)p);
        const int first = n;
        for (int i = 0; i < ns; i++, n++) {
            int rc = commbench_measure(R->bench, (enum commbench_path)p, sizes[i], &rows[n]);
            if (rc < 0)
                return rc;
            print_row(R, &rows[n]);
        }
        const uint64_t w = total_wrong(rows + first, n - first);
        if (R->in->rank == 0) {
            printf("# Wrong values         : %" PRIu64 " %s\n", w, w ? "FAILED" : "OK");
            printf("# Avg bus bandwidth    : %g (%s)\n", avg_busbw(rows + first, n - first, (enum commbench_path)p),
                   commbench_path_name((enum commbench_path)p));
        }
    }
    struct commbench_verdict v;
    commbench_verdict(cfg, rows, n, &v);
    print_verdict(R, &v);
    *wrong = total_wrong(rows, n);
    if (R->in->rank == 0 && *wrong) {
        fflush(stdout);
        fprintf(stderr, "error: %" PRIu64 " element%s of the all-reduce came back wrong (#wrong above)\n", *wrong,
                *wrong == 1 ? "" : "s");
    }
    return R->in->rank == 0 && R->opt->json ? write_json(R, rows, n, &v) : 0;
}

int cmd_commbench(int argc, char **argv)
{
    struct cb_options opt;
    int rc = parse_options(argc, argv, &opt);
    if (rc)
        return rc == RT_EXIT_OK + 1 ? RT_EXIT_OK : rc;

    struct rt_comm *c;
    if (rt_comm_create(NULL, &c) < 0)
        return cli_fail();
    const struct rt_rank_info *ri = rt_comm_info(c);
    struct cb_state R = {.opt = &opt, .cfg = &opt.bench, .c = c};
    uint64_t wrong = 0;
    /* Before the set-up, so that a --json nobody can write fails at once, on every rank. */
    if (ri->rank == 0 && opt.json && strcmp(opt.json, "-") && !(R.json = fopen(opt.json, "w")))
        rc = rt_errf(-errno, "--json %s: %s", opt.json, strerror(errno));
    rc = commbench_agree(c, rc);
    if (rc == 0)
        rc = commbench_open(c, &opt.bench, &R.bench);
    if (rc == 0) {
        R.in = commbench_info(R.bench);
        rc = cb_run(&R, &wrong);
    }
    /* A write error of rank 0's JSON is the only failure one rank can have here alone; agree on it so that
     * every rank exits with the same code. */
    rc = commbench_agree(c, rc);
    if (rc == -ECANCELED && ri->rank == 0)
        fprintf(stderr, "error: %s\n", rt_errmsg());
    else if (rc < 0 && rc != -ECANCELED && ri->world > 1)
        fprintf(stderr, "error: [%d/%d] %s\n", ri->rank, ri->world, rt_errmsg());
    else if (rc < 0 && rc != -ECANCELED)
        fprintf(stderr, "error: %s\n", rt_errmsg());
    if (R.json)
        fclose(R.json);
    commbench_close(R.bench);
    rt_comm_destroy(c);
    return rc < 0 || wrong ? RT_EXIT_FAIL : RT_EXIT_OK;
}
