/*
 * report.c - `ringtrain report` (see report.h): reads what runs wrote and
 * tells the files apart by their content; page.c draws and writes the page.
 *
 * What a file is comes from its JSON, never from its name:
 *   - an object with "traceEvents": a --trace file (one step drawn as a timeline);
 *   - "profile_comparison": bench/gpu_vs_pytorch.sh --only profile's comparison of the op profiles;
 *   - "command": "commbench": commbench --json;
 *   - "settings" and "rows": bench/scaling.sh --json;
 *   - "checkpoint_id": a checkpoint's state.json;
 *   - "stages" and "scaling": loadbench --json;
 *   - "model" and "world_size" (and no "epoch"): train --json's summary;
 *   - objects with "epoch" and "train_loss", one per line: --metrics.
 * A file that is not JSON as a whole is read line by line: JSON Lines, or a
 * run's captured output, whose last JSON line is the summary (train --json,
 * loadbench --json print theirs last). A directory is one run: its files and
 * the state.json of a checkpoint directory inside it; files it holds that are
 * none of the above (a dataset's manifest, the report itself) are passed over.
 *
 * Runs are labelled by the options in which their command lines differ
 * ("--lr 0.05"), or by their argument when no command line was written.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/common.h"
#include "tools/report/internal.h"

static void timeline_free(struct timeline *tl);

struct rt_report *rt_report_new(const char *title)
{
    struct rt_report *r = calloc(1, sizeof(*r));
    if (r)
        snprintf(r->title, sizeof(r->title), "%s", title && *title ? title : "ringtrain report");
    return r;
}

void rt_report_free(struct rt_report *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->nrun; i++) {
        json_decref(r->run[i].records);
        json_decref(r->run[i].summary);
        json_decref(r->run[i].state);
    }
    for (int i = 0; i < r->nload; i++)
        json_decref(r->loadbench[i].j);
    for (int i = 0; i < r->ncomm; i++)
        json_decref(r->commbench[i].j);
    for (int i = 0; i < r->nscal; i++)
        json_decref(r->scaling[i].j);
    for (int i = 0; i < r->nprof; i++)
        json_decref(r->profcmp[i].j);
    for (int i = 0; i < r->ntrace; i++)
        timeline_free(r->trace[i]);
    free(r);
}

/* ---- reading ---------------------------------------------------------------------------- */

double rt_report_num(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

double rt_report_path_num(const json_t *o, const char *path)
{
    char key[128];
    const json_t *v = o;
    while (*path && v) {
        size_t n = strcspn(path, ".[");
        if (n >= sizeof(key))
            return NAN;
        memcpy(key, path, n);
        key[n] = 0;
        if (n)
            v = json_object_get(v, key);
        path += n;
        if (*path == '[') {
            v = json_array_get(v, (size_t)strtoul(path + 1, NULL, 10));
            path = strchr(path, ']');
            if (!path)
                return NAN;
            path++;
        }
        if (*path == '.')
            path++;
    }
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static int is_record(const json_t *o) { return json_is_object(o) && json_object_get(o, "epoch") && json_object_get(o, "train_loss"); }

enum kind { K_NONE, K_RECORDS, K_SUMMARY, K_STATE, K_LOADBENCH, K_COMMBENCH, K_SCALING, K_TRACE, K_PROFCMP };

static enum kind kind_of(const json_t *o)
{
    if (!json_is_object(o))
        return K_NONE;
    if (json_object_get(o, "traceEvents"))
        return K_TRACE;
    if (json_object_get(o, "profile_comparison") && json_is_array(json_object_get(o, "pairs")))
        return K_PROFCMP;
    const char *cmd = json_string_value(json_object_get(o, "command"));
    if (cmd && strcmp(cmd, "commbench") == 0)
        return K_COMMBENCH;
    if (json_object_get(o, "settings") && json_is_array(json_object_get(o, "rows")))
        return K_SCALING;
    if (json_object_get(o, "checkpoint_id"))
        return K_STATE;
    if (json_object_get(o, "stages") && json_is_array(json_object_get(o, "scaling")))
        return K_LOADBENCH;
    if (is_record(o))
        return K_RECORDS;
    if (json_object_get(o, "model") && json_object_get(o, "world_size"))
        return K_SUMMARY;
    return K_NONE;
}

/* What one file holds: records (an array), or one object of another kind. */
struct found {
    enum kind kind;
    json_t *j;
};

/* Reads PATH; a trace is recognised from its first bytes without reading it whole. */
static int read_file(const char *path, struct found *out)
{
    memset(out, 0, sizeof(*out));
    FILE *f = fopen(path, "rb");
    if (!f) {
        const int e = errno;
        return rt_errf(-e, "%s: %s", path, strerror(e));
    }
    char head[64] = "";
    size_t got = fread(head, 1, sizeof(head) - 1, f);
    fclose(f);
    head[got] = 0;
    const char *h = head + strspn(head, " \t\r\n");
    if (strncmp(h, "{\"traceEvents\"", 14) == 0) {
        out->kind = K_TRACE;
        return 0;
    }
    uint8_t *buf;
    size_t n;
    const int rc = rt_file_read(path, &buf, &n);
    if (rc < 0)
        return rc;
    json_t *whole = json_loadb((const char *)buf, n, 0, NULL);
    if (whole) {
        free(buf);
        out->kind = kind_of(whole);
        if (out->kind == K_RECORDS) {
            out->j = json_array();
            json_array_append_new(out->j, whole);
        } else if (out->kind == K_NONE) {
            json_decref(whole);
        } else {
            out->j = whole;
        }
        return 0;
    }
    /* Line by line: epoch records, or the last JSON object of captured output. */
    json_t *recs = json_array(), *last = NULL;
    char *save = NULL;
    for (char *line = strtok_r((char *)buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        line += strspn(line, " \t\r");
        if (*line != '{')
            continue;
        json_t *o = json_loads(line, 0, NULL);
        if (!o)
            continue;
        if (is_record(o)) {
            json_array_append_new(recs, o);
        } else {
            json_decref(last);
            last = o;
        }
    }
    free(buf);
    if (json_array_size(recs) > 0) {
        out->kind = K_RECORDS;
        out->j = recs;
        json_decref(last);
    } else {
        json_decref(recs);
        out->kind = last ? kind_of(last) : K_NONE;
        if (out->kind == K_NONE || out->kind == K_RECORDS || out->kind == K_TRACE)
            json_decref(last), out->kind = K_NONE;
        else
            out->j = last;
    }
    return 0;
}

static int by_epoch(const void *a, const void *b)
{
    const double x = rt_report_num(*(json_t *const *)a, "epoch"), y = rt_report_num(*(json_t *const *)b, "epoch");
    return x < y ? -1 : x > y;
}

/* The records sorted by epoch, a later record of an epoch replacing an earlier one (a resumed run). */
static json_t *tidy_records(json_t *in)
{
    const size_t n = json_array_size(in);
    json_t **v = calloc(n ? n : 1, sizeof(*v));
    if (!v)
        return json_incref(in);
    for (size_t i = 0; i < n; i++)
        v[i] = json_array_get(in, i);
    /* A stable sort keeps the file's order within an epoch: the last one wins. */
    for (size_t i = 1; i < n; i++)
        for (size_t k = i; k > 0 && by_epoch(&v[k - 1], &v[k]) > 0; k--) {
            json_t *t = v[k];
            v[k] = v[k - 1];
            v[k - 1] = t;
        }
    json_t *out = json_array();
    for (size_t i = 0; i < n; i++)
        if (i + 1 == n || rt_report_num(v[i], "epoch") != rt_report_num(v[i + 1], "epoch"))
            json_array_append(out, v[i]);
    free(v);
    return out;
}

/* ---- a --trace file: its typical step ------------------------------------------------------ */

enum { TRACE_MAX_BYTES = 256 << 20 };

/* The events of a trace file; NULL (with *DOC NULL) when it cannot be read or is past 256 MB (left to Perfetto). */
static const json_t *trace_load(const char *path, json_t **doc)
{
    struct stat st;
    *doc = NULL;
    if (stat(path, &st) < 0 || st.st_size > TRACE_MAX_BYTES)
        return NULL;
    *doc = json_load_file(path, 0, NULL);
    return json_object_get(*doc, "traceEvents");
}

/* The lowest rank (pid) with a span: rank 0's, but in a --trace-split part. */
static int trace_rank(const json_t *ev)
{
    int pid = INT32_MAX;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        const json_t *e = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        if (ph && *ph == 'X')
            pid = RT_MIN(pid, (int)json_integer_value(json_object_get(e, "pid")));
    }
    return pid;
}

struct step_span {
    double dur;
    size_t at; /* the event's place in the file */
    const json_t *e;
};

static int by_length(const void *a, const void *b)
{
    const struct step_span *x = a, *y = b;
    if (x->dur != y->dur)
        return x->dur < y->dur ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* Rank PID's step of median length (of equal lengths, the first in the file): spans of category "step" named
 * "step N". Their count in *NSTEPS; NULL when there is none. */
static const json_t *trace_median_step(const json_t *ev, int pid, int *nsteps)
{
    struct step_span *steps = calloc(json_array_size(ev) + 1, sizeof(*steps));
    int n = 0;
    for (size_t i = 0; steps && i < json_array_size(ev); i++) {
        const json_t *e = json_array_get(ev, i);
        const char *cat = json_string_value(json_object_get(e, "cat"));
        const char *nm = json_string_value(json_object_get(e, "name"));
        if (cat && nm && strcmp(cat, "step") == 0 && strncmp(nm, "step ", 5) == 0 &&
            json_integer_value(json_object_get(e, "pid")) == pid)
            steps[n++] = (struct step_span){rt_report_num(e, "dur"), i, e};
    }
    const json_t *pick = NULL;
    if (n) {
        qsort(steps, (size_t)n, sizeof(*steps), by_length);
        int m = n / 2;
        while (m > 0 && steps[m - 1].dur == steps[m].dur)
            m--;
        pick = steps[m].e;
    }
    free(steps);
    *nsteps = n;
    return pick;
}

/* String V kept alive in TL (it outlives the trace's document), or NULL when V is no string. */
static const char *keep(struct timeline *tl, const json_t *v)
{
    if (!json_is_string(v) || json_array_append(tl->strings, (json_t *)v) < 0)
        return NULL;
    return json_string_value(v);
}

/* Rank PID's spans within [w0, w1), clipped to it, a row per thread (tids[row], the trace's order of first
 * appearance) and a category per "cat" (at most TL_MAX_ROWS and TL_MAX_CATS: the rest left out). */
static void trace_spans(struct timeline *tl, const json_t *ev, int pid, double w0, double w1, int *tids)
{
    for (size_t i = 0; tl->sp && i < json_array_size(ev); i++) {
        const json_t *e = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        if (!ph || *ph != 'X' || json_integer_value(json_object_get(e, "pid")) != pid)
            continue;
        const double ts = rt_report_num(e, "ts"), d = rt_report_num(e, "dur");
        if (!(ts < w1 && ts + d > w0) || tl->nsp >= TL_MAX_SPANS)
            continue;
        const int tid = (int)json_integer_value(json_object_get(e, "tid"));
        int row = -1;
        for (int k = 0; k < tl->nrow; k++)
            if (tids[k] == tid)
                row = k;
        if (row < 0 && tl->nrow < TL_MAX_ROWS)
            tids[row = tl->nrow++] = tid;
        const char *cat = json_string_value(json_object_get(e, "cat"));
        int ci = -1;
        for (int k = 0; k < tl->ncat; k++)
            if (cat && strcmp(tl->cat_label[k], cat) == 0)
                ci = k;
        if (ci < 0 && cat && tl->ncat < TL_MAX_CATS && keep(tl, json_object_get(e, "cat")))
            tl->cat_label[ci = tl->ncat++] = cat;
        if (row < 0 || ci < 0)
            continue;
        tl->sp[tl->nsp++] = (struct chart_span){row, ci, fmax(ts, w0) - w0, fmin(ts + d, w1) - w0,
                                                keep(tl, json_object_get(e, "name"))};
    }
}

/* The names the trace gives rank PID ("process_name") and its threads ("thread_name", into ROWL), and the
 * threads' "thread_sort_index" (into SORT, which starts as the tids). */
static void trace_names(struct timeline *tl, const json_t *ev, int pid, const int *tids, int *sort,
                        const char **rowl)
{
    for (size_t i = 0; i < json_array_size(ev); i++) {
        const json_t *e = json_array_get(ev, i);
        const char *nm = json_string_value(json_object_get(e, "name"));
        if (!nm || json_integer_value(json_object_get(e, "pid")) != pid)
            continue;
        const int tid = (int)json_integer_value(json_object_get(e, "tid"));
        const json_t *args = json_object_get(e, "args");
        const char *proc = strcmp(nm, "process_name") == 0 ? keep(tl, json_object_get(args, "name")) : NULL;
        if (proc)
            tl->proc = proc;
        for (int k = 0; k < tl->nrow; k++)
            if (tids[k] == tid) {
                if (strcmp(nm, "thread_name") == 0)
                    rowl[k] = keep(tl, json_object_get(args, "name"));
                else if (strcmp(nm, "thread_sort_index") == 0)
                    sort[k] = (int)json_integer_value(json_object_get(args, "sort_index"));
            }
    }
}

static int by_row_start(const void *a, const void *b)
{
    const struct chart_span *x = a, *y = b;
    if (x->row != y->row)
        return x->row - y->row;
    if (x->t0 != y->t0)
        return x->t0 < y->t0 ? -1 : 1;
    return (y->t1 - y->t0) < (x->t1 - x->t0) ? -1 : (y->t1 - y->t0) > (x->t1 - x->t0);
}

/* The rows in the threads' sort order (a stable sort), labelled by their names or "thread TID"; the spans
 * renumbered to them and sorted by row, then start, the longer first. */
static void trace_rows_order(struct timeline *tl, const int *tids, const int *sort, const char *const *rowl)
{
    int order[TL_MAX_ROWS], rank_of[TL_MAX_ROWS];
    for (int k = 0; k < tl->nrow; k++)
        order[k] = k;
    for (int a = 1; a < tl->nrow; a++)
        for (int k = a; k > 0 && sort[order[k - 1]] > sort[order[k]]; k--) {
            const int t = order[k];
            order[k] = order[k - 1], order[k - 1] = t;
        }
    for (int k = 0; k < tl->nrow; k++) {
        rank_of[order[k]] = k;
        snprintf(tl->thread_no[k], sizeof(tl->thread_no[k]), "thread %d", tids[order[k]]);
        tl->row_label[k] = rowl[order[k]] ? rowl[order[k]] : tl->thread_no[k];
    }
    for (int i = 0; i < tl->nsp; i++)
        tl->sp[i].row = rank_of[tl->sp[i].row];
    if (tl->sp)
        qsort(tl->sp, (size_t)tl->nsp, sizeof(*tl->sp), by_row_start);
}

/* TL's step from its file (TL->src): the rank's step of median length, every span of the rank's threads within a
 * window around it. A file that cannot be read, or has no step, leaves nsteps or nsp 0: nothing to draw. */
static void trace_read(struct timeline *tl)
{
    json_t *doc;
    const json_t *ev = trace_load(tl->src, &doc);
    const int pid = trace_rank(ev);
    const json_t *step = trace_median_step(ev, pid, &tl->nsteps);
    if (step) {
        const double ts = rt_report_num(step, "ts");
        tl->step_us = rt_report_num(step, "dur");
        const double w0 = ts - 0.04 * tl->step_us, w1 = ts + 1.04 * tl->step_us;
        tl->t1 = w1 - w0;
        tl->step_name = keep(tl, json_object_get(step, "name"));
        snprintf(tl->rank_name, sizeof(tl->rank_name), "rank %d", pid); /* the trace's pid is the rank */
        tl->proc = tl->rank_name;
        int tids[TL_MAX_ROWS], sort[TL_MAX_ROWS];
        const char *rowl[TL_MAX_ROWS] = {0};
        tl->sp = calloc(TL_MAX_SPANS, sizeof(*tl->sp));
        trace_spans(tl, ev, pid, w0, w1, tids);
        for (int k = 0; k < tl->nrow; k++)
            sort[k] = tids[k];
        trace_names(tl, ev, pid, tids, sort, rowl);
        trace_rows_order(tl, tids, sort, rowl);
    }
    json_decref(doc);
}

static void timeline_free(struct timeline *tl)
{
    if (!tl)
        return;
    free(tl->sp);
    json_decref(tl->strings);
    free(tl);
}

/* A --trace file PATH: its step read now (a file that gives none is drawn as nothing, and still counted). */
static int add_trace(struct rt_report *r, const char *path)
{
    if (r->ntrace >= MAX_BENCH)
        return rt_errf(-E2BIG, "%s: more than %d trace files", path, MAX_BENCH);
    struct timeline *tl = calloc(1, sizeof(*tl));
    if (!tl || !(tl->strings = json_array())) {
        free(tl);
        return rt_errf(-ENOMEM, "%s: out of memory", path);
    }
    snprintf(tl->src, sizeof(tl->src), "%s", path);
    trace_read(tl);
    r->trace[r->ntrace++] = tl;
    return 0;
}

/* A new run named SRC into *OUT; -E2BIG past MAX_RUNS. */
static int new_run(struct rt_report *r, const char *src, struct run **out)
{
    if (r->nrun >= MAX_RUNS)
        return rt_errf(-E2BIG, "more than %d runs: a page compares at most %d", MAX_RUNS, MAX_RUNS);
    struct run *u = &r->run[r->nrun++];
    memset(u, 0, sizeof(*u));
    snprintf(u->src, sizeof(u->src), "%s", src);
    *out = u;
    return 0;
}

static int add_bench(struct bench *list, int *n, const char *src, json_t *j, const char *what)
{
    if (*n >= MAX_BENCH) {
        json_decref(j);
        return rt_errf(-E2BIG, "%s: more than %d %s outputs", src, MAX_BENCH, what);
    }
    snprintf(list[*n].src, sizeof(list[*n].src), "%s", src);
    list[(*n)++].j = j;
    return 0;
}

int rt_report_add_train(struct rt_report *r, const char *label, json_t *records, json_t *summary, json_t *state)
{
    if (!json_is_array(records) && !summary && !state)
        return rt_errf(-EINVAL, "a run needs epoch records, a summary or a checkpoint's state");
    struct run *u = NULL;
    const int rc = new_run(r, label ? label : "this run", &u);
    if (rc < 0)
        return rc;
    if (label) {
        snprintf(u->label, sizeof(u->label), "%s", label);
        u->labelled = 1;
    }
    u->records = json_is_array(records) ? tidy_records(records) : json_array();
    u->summary = json_incref(summary);
    u->state = json_incref(state);
    return 0;
}

/* Files of one run (FILES: one path per element) put together; bench outputs go to their own sections. */
static int add_files(struct rt_report *r, const char *src, char **files, int n, int from_dir)
{
    json_t *recs = NULL, *summary = NULL, *state = NULL;
    const char *recs_from = NULL, *trace = NULL;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        struct found fd;
        if ((rc = read_file(files[i], &fd)) < 0)
            break;
        switch (fd.kind) {
        case K_NONE:
            if (!from_dir)
                rc = rt_errf(-EINVAL,
                             "%s: not a file ringtrain writes (--metrics, --json, state.json, loadbench/commbench "
                             "--json, bench/scaling.sh --json, --trace, bench/gpu_vs_pytorch.sh's profile comparison)",
                             files[i]);
            break;
        case K_TRACE:
            trace = files[i];
            rc = add_trace(r, files[i]);
            break;
        case K_RECORDS:
            if (recs) {
                rc = rt_errf(-EINVAL, "%s and %s: two metrics files in one run (name each as a run of its own)",
                             recs_from, files[i]);
                json_decref(fd.j);
            } else {
                recs = fd.j, recs_from = files[i];
            }
            break;
        case K_SUMMARY:
            json_decref(summary);
            summary = fd.j;
            break;
        case K_STATE:
            json_decref(state);
            state = fd.j;
            break;
        case K_LOADBENCH: rc = add_bench(r->loadbench, &r->nload, files[i], fd.j, "loadbench"); break;
        case K_COMMBENCH: rc = add_bench(r->commbench, &r->ncomm, files[i], fd.j, "commbench"); break;
        case K_SCALING: rc = add_bench(r->scaling, &r->nscal, files[i], fd.j, "scaling"); break;
        case K_PROFCMP: rc = add_bench(r->profcmp, &r->nprof, files[i], fd.j, "profile comparison"); break;
        }
    }
    if (rc == 0 && (recs || summary || state)) {
        struct run *u = NULL;
        if ((rc = new_run(r, src, &u)) == 0) {
            u->records = recs ? tidy_records(recs) : json_array();
            u->summary = json_incref(summary);
            u->state = json_incref(state);
            if (trace)
                snprintf(u->trace, sizeof(u->trace), "%s", trace);
        }
    }
    json_decref(recs);
    json_decref(summary);
    json_decref(state);
    return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A directory's candidate files (sorted), and state.json of each directory inside it. */
static int list_dir(const char *dir, char ***out, int *n)
{
    DIR *d = opendir(dir);
    if (!d) {
        const int e = errno;
        return rt_errf(-e, "%s: %s", dir, strerror(e));
    }
    char **v = NULL;
    int cnt = 0, cap = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) && rc == 0) {
        if (e->d_name[0] == '.')
            continue;
        char p[4096];
        struct stat st;
        if (snprintf(p, sizeof(p), "%s/%s", dir, e->d_name) >= (int)sizeof(p) || stat(p, &st) < 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            snprintf(p, sizeof(p), "%s/%s/state.json", dir, e->d_name);
            if (stat(p, &st) < 0 || !S_ISREG(st.st_mode))
                continue;
        } else {
            const char *dot = strrchr(e->d_name, '.');
            if (!S_ISREG(st.st_mode) || !dot ||
                (strcmp(dot, ".json") && strcmp(dot, ".jsonl") && strcmp(dot, ".out") && strcmp(dot, ".log") &&
                 strcmp(dot, ".txt")))
                continue;
        }
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            char **nv = realloc(v, (size_t)cap * sizeof(*v));
            if (!nv) {
                rc = rt_errf(-ENOMEM, "%s: out of memory", dir);
                break;
            }
            v = nv;
        }
        if (!(v[cnt] = strdup(p)))
            rc = rt_errf(-ENOMEM, "%s: out of memory", dir);
        else
            cnt++;
    }
    closedir(d);
    qsort(v, (size_t)cnt, sizeof(*v), cmp_str);
    *out = v;
    *n = cnt;
    return rc;
}

int rt_report_inputs(const struct rt_report *r)
{
    return r->nrun + r->nload + r->ncomm + r->nscal + r->ntrace + r->nprof;
}

int rt_report_add_path(struct rt_report *r, const char *arg)
{
    char *copy = strdup(arg);
    char **files = NULL;
    int n = 0, rc = 0;
    if (!copy)
        return rt_errf(-ENOMEM, "out of memory");
    struct stat st;
    if (!strchr(arg, ',') && stat(arg, &st) == 0 && S_ISDIR(st.st_mode)) {
        rc = list_dir(arg, &files, &n);
        if (rc == 0 && n == 0)
            rc = rt_errf(-ENOENT, "%s: no file ringtrain wrote in it", arg);
        const int before = rt_report_inputs(r);
        if (rc == 0)
            rc = add_files(r, arg, files, n, 1);
        if (rc == 0 && rt_report_inputs(r) == before)
            rc = rt_errf(-ENOENT, "%s: holds no --metrics file, --json summary, checkpoint state.json or benchmark "
                                  "output", arg);
    } else {
        /* One file, or files joined with commas (a checkpoint directory among them gives its state.json). */
        char *save = NULL;
        for (char *p = strtok_r(copy, ",", &save); p && rc == 0; p = strtok_r(NULL, ",", &save)) {
            char path[4096];
            snprintf(path, sizeof(path), "%s", p);
            if (stat(p, &st) < 0) {
                const int e = errno;
                rc = rt_errf(-e, "%s: %s", p, strerror(e));
                break;
            }
            if (S_ISDIR(st.st_mode) && snprintf(path, sizeof(path), "%s/state.json", p) < (int)sizeof(path) &&
                stat(path, &st) < 0) {
                rc = rt_errf(-EISDIR,
                             "%s: a directory in a comma list must be a checkpoint directory (no state.json)", p);
                break;
            }
            char **nv = realloc(files, (size_t)(n + 1) * sizeof(*files));
            if (!nv || !(nv[n] = strdup(path))) {
                files = nv ? nv : files;
                rc = rt_errf(-ENOMEM, "out of memory");
                break;
            }
            files = nv;
            n++;
        }
        if (rc == 0)
            rc = add_files(r, arg, files, n, 0);
    }
    for (int i = 0; i < n; i++)
        free(files[i]);
    free(files);
    free(copy);
    return rc;
}

/* ---- labels: the options in which the runs differ -------------------------------------- */

const json_t *rt_report_run_command(const struct run *u)
{
    const json_t *c = json_object_get(u->summary, "command");
    if (!json_is_array(c))
        c = json_object_get(u->state, "command");
    return json_is_array(c) ? c : NULL;
}

/* The value of option OPT (with its dashes) in a command line, "" for a flag, NULL when not given. */
static const char *option_value(const json_t *cmd, const char *opt, char *buf, size_t len)
{
    const char *found = NULL;
    const size_t ol = strlen(opt);
    for (size_t i = 0; i < json_array_size(cmd); i++) {
        const char *a = json_string_value(json_array_get(cmd, i));
        if (!a || strncmp(a, opt, ol) != 0)
            continue;
        if (a[ol] == '=') {
            snprintf(buf, len, "%s", a + ol + 1);
            found = buf;
        } else if (a[ol] == 0) {
            const char *nx = json_string_value(json_array_get(cmd, i + 1));
            snprintf(buf, len, "%s", nx && strncmp(nx, "--", 2) != 0 ? nx : "");
            found = buf;
        }
    }
    return found;
}

/* Options that name where output goes or how it is shown: never what tells two runs apart. */
static int output_option(const char *opt, size_t len)
{
    static const char *const out[] = {"--metrics", "--checkpoint-dir", "--json", "--report", "--trace",
                                      "--trace-steps", "--trace-mb", "--trace-split", "--no-progress", "--resume"};
    for (size_t i = 0; i < sizeof(out) / sizeof(out[0]); i++)
        if (strlen(out[i]) == len && strncmp(out[i], opt, len) == 0)
            return 1;
    return 0;
}

void rt_report_make_labels(struct rt_report *r)
{
    /* Every option any run names. */
    const char *opts[256];
    int nopt = 0;
    for (int i = 0; i < r->nrun; i++) {
        const json_t *c = rt_report_run_command(&r->run[i]);
        for (size_t k = 0; c && k < json_array_size(c); k++) {
            const char *a = json_string_value(json_array_get(c, k));
            if (!a || strncmp(a, "--", 2) != 0 || a[2] == 0)
                continue;
            const size_t l = strcspn(a, "=");
            if (output_option(a, l))
                continue;
            int seen = 0;
            for (int o = 0; o < nopt && !seen; o++)
                seen = strlen(opts[o]) == l && strncmp(opts[o], a, l) == 0;
            if (!seen && nopt < 256) {
                char *s = strndup(a, l);
                if (s)
                    opts[nopt++] = s;
            }
        }
    }
    for (int i = 0; i < r->nrun; i++) {
        struct run *u = &r->run[i];
        if (u->labelled)
            continue;
        const json_t *c = rt_report_run_command(u);
        char lab[sizeof(u->label)] = "";
        for (int o = 0; c && o < nopt && r->nrun > 1; o++) {
            char mine[128], other[128];
            const char *m = option_value(c, opts[o], mine, sizeof(mine));
            int differs = 0;
            for (int k = 0; k < r->nrun && !differs; k++) {
                const json_t *ck = rt_report_run_command(&r->run[k]);
                const char *t = ck ? option_value(ck, opts[o], other, sizeof(other)) : NULL;
                differs = ck && ((!m) != (!t) || (m && t && strcmp(m, t) != 0));
            }
            if (!differs)
                continue;
            const size_t l = strlen(lab);
            if (m)
                snprintf(lab + l, sizeof(lab) - l, "%s%s%s%s", l ? " " : "", opts[o], *m ? " " : "", m);
            else
                snprintf(lab + l, sizeof(lab) - l, "%sno %s", l ? " " : "", opts[o]);
        }
        if (!lab[0]) {
            const char *model = json_string_value(json_object_get(u->summary, "model"));
            if (!model)
                model = json_string_value(json_object_get(u->state, "model"));
            if (r->nrun == 1 && model)
                snprintf(lab, sizeof(lab), "%s", model);
            else
                snprintf(lab, sizeof(lab), "%s", u->src);
        }
        snprintf(u->label, sizeof(u->label), "%s", lab);
    }
    for (int o = 0; o < nopt; o++)
        free((char *)opts[o]);
}
