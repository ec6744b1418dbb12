/*
 * page.c - the report's page: the runs' table, the charts of each section
 * (training, the step profile and a traced step, GPU, input pipeline,
 * all-reduce, scaling) and the configuration table, from what report.c read;
 * and rt_report_write(), which composes it and writes it. A section with
 * nothing to draw is left out.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "rt_buildinfo.h"
#include "tools/report/internal.h"

/* ---- the charts ------------------------------------------------------------------------ */

/* Series of a key over epochs, the arrays kept until the chart is drawn. */
struct plot {
    struct chart_series s[256];
    double *mem[256];
    char keys[256][48], labels[256][200];
    int n;
};

static void plot_free(struct plot *p)
{
    for (int i = 0; i < p->n; i++)
        free(p->mem[i]);
    p->n = 0;
}

/* Adds run U's KEY over its epochs; 1 when it has a point. */
static int plot_add(struct plot *p, const struct run *u, int run, const char *key, const char *label, int color,
                    int dashed, int thin, int legend)
{
    if (p->n >= 256)
        return 0;
    const size_t n = json_array_size(u->records);
    double *m = calloc(2 * (n ? n : 1), sizeof(double));
    if (!m)
        return 0;
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *o = json_array_get(u->records, i);
        const double x = rt_report_num(o, "epoch"), y = rt_report_path_num(o, key);
        if (isfinite(x) && isfinite(y))
            m[k] = x, m[n + k] = y, k++;
    }
    if (!k) {
        free(m);
        return 0;
    }
    memmove(m + k, m + n, (size_t)k * sizeof(double));
    const int i = p->n++;
    p->mem[i] = m;
    snprintf(p->keys[i], sizeof(p->keys[i]), "%s", key);
    snprintf(p->labels[i], sizeof(p->labels[i]), "%s", label);
    p->s[i] = (struct chart_series){p->labels[i], run, p->keys[i], k, m, m + k, color, dashed, thin, legend};
    return 1;
}

static void line_epochs(struct sbuf *b, struct plot *p, const char *name, const char *title, const char *ylabel,
                        chart_fmt yf, int yzero, const char *caption)
{
    if (p->n > 0) {
        struct chart_line c = {.name = name, .title = title, .xlabel = "epoch", .ylabel = ylabel, .xint = 1,
                               .yfmt = yf, .yzero = yzero, .s = p->s, .ns = p->n, .mark_x = NAN, .caption = caption};
        rt_report_chart_line(b, &c);
    }
    plot_free(p);
}

static void lab2(char *buf, size_t len, const struct rt_report *r, const struct run *u, const char *what)
{
    if (r->nrun > 1)
        snprintf(buf, len, "%s, %s", u->label, what);
    else
        snprintf(buf, len, "%s", what);
}

/* Each run's KEY_TRAIN (solid) and KEY_VAL (dashed): a run's colour when several, else train blue, val red. */
static void train_val(struct plot *p, const struct rt_report *r, const char *key_train, const char *key_val)
{
    char l[240];
    const int multi = r->nrun > 1;
    for (int i = 0; i < r->nrun; i++) {
        const struct run *u = &r->run[i];
        lab2(l, sizeof(l), r, u, "train");
        plot_add(p, u, i, key_train, l, multi ? i : 0, 0, 0, 1);
        lab2(l, sizeof(l), r, u, "validation");
        plot_add(p, u, i, key_val, l, multi ? i : 1, 1, 0, 1);
    }
}

static void training_charts(struct sbuf *b, struct rt_report *r, struct plot *p)
{
    char l[240];
    const int multi = r->nrun > 1;
    train_val(p, r, "train_loss", "val_loss");
    line_epochs(b, p, "loss", "Loss", "loss", NULL, 0,
                "Mean cross-entropy over each epoch's training batches (solid) and on the validation split after it (dashed).");
    train_val(p, r, "train_acc", "val_acc");
    line_epochs(b, p, "accuracy", "Accuracy", "top-1 accuracy", rt_report_fmt_pct, 0,
                "Top-1 accuracy on the epoch's training batches (solid, as augmented) and on the validation split (dashed).");

    /* Images/s: each rank's line where the records have them, else the run's. */
    int ranks_max = 0;
    for (int i = 0; i < r->nrun; i++) {
        const struct run *u = &r->run[i];
        int nr = 0;
        for (size_t e = 0; e < json_array_size(u->records); e++)
            nr = RT_MAX(nr, (int)json_array_size(json_object_get(json_array_get(u->records, e), "rank_images_per_s")));
        ranks_max = RT_MAX(ranks_max, nr);
        if (nr == 0) {
            lab2(l, sizeof(l), r, u, "all ranks");
            plot_add(p, u, i, "images_per_s", l, i, 0, 0, 1);
            continue;
        }
        for (int k = 0; k < nr; k++) {
            char key[48];
            snprintf(key, sizeof(key), "rank_images_per_s[%d]", k);
            if (nr <= 16) {
                char what[40];
                snprintf(what, sizeof(what), "rank %d", k);
                lab2(l, sizeof(l), r, u, what);
                plot_add(p, u, i, key, l, multi ? i : k, multi && k > 0, 0, !multi || k == 0);
            } else {
                snprintf(l, sizeof(l), "%s%s%d ranks", multi ? u->label : "", multi ? ", " : "", nr);
                plot_add(p, u, i, key, l, i, 0, 1, k == 0);
            }
        }
    }
    char cap[400];
    snprintf(cap, sizeof(cap), "%s",
             ranks_max > 0 ? "Images per second each rank trained at over each epoch (its own images over its own "
                             "epoch time); the run's rate is their sum."
                           : "Images per second over each epoch, all ranks together.");
    line_epochs(b, p, "throughput", ranks_max > 0 ? "Images/s per rank" : "Images/s", "images/s", NULL, 1, cap);

    for (int i = 0; i < r->nrun; i++)
        plot_add(p, &r->run[i], i, "lr", multi ? r->run[i].label : "learning rate", i, 0, 0, multi);
    line_epochs(b, p, "lr", "Learning rate", "learning rate", NULL, 1,
                "The learning rate at each epoch's last step (the schedule's value).");
    for (int i = 0; i < r->nrun; i++)
        plot_add(p, &r->run[i], i, "loss_scale", multi ? r->run[i].label : "loss scale", i, 0, 0, multi);
    line_epochs(b, p, "loss-scale", "fp16 loss scale", "loss scale", NULL, 0,
                "The dynamic loss scale at each epoch's end (fp16 mixed precision): it halves on an overflow and "
                "grows after a run of good steps.");
}

static const char *const phase_key[] = {"data", "copy", "forward", "backward", "comm", "optimizer", "rest"};
static const char *const phase_name[] = {"data wait", "copy", "forward", "backward", "exposed comm", "optimizer", "rest"};
enum { NPHASE = 7 };

static void verdict_text(const struct rt_report *r, char *buf, size_t len)
{
    buf[0] = 0;
    for (int i = 0; i < r->nrun; i++) {
        const json_t *v = json_object_get(r->run[i].summary, "verdict");
        const char *lim = json_string_value(json_object_get(v, "limit"));
        const char *ev = json_string_value(json_object_get(v, "evidence"));
        const char *ad = json_string_value(json_object_get(v, "try"));
        if (!lim)
            continue;
        const size_t l = strlen(buf);
        snprintf(buf + l, len - l, "%s%s%sLimited by %s: %s.%s%s", l ? " " : "", r->nrun > 1 ? r->run[i].label : "",
                 r->nrun > 1 ? ": " : "", lim, ev ? ev : "", ad && *ad ? " Try: " : "", ad ? ad : "");
    }
}

static void profile_chart(struct sbuf *b, struct rt_report *r, const char *pct)
{
    int ncat = 0;
    for (int i = 0; i < r->nrun; i++)
        for (size_t e = 0; e < json_array_size(r->run[i].records); e++)
            ncat += json_is_object(json_object_get(json_array_get(r->run[i].records, e), "profile"));
    if (!ncat)
        return;
    char (*cat)[24] = calloc((size_t)ncat, sizeof(*cat));
    char (*keys)[40] = calloc((size_t)ncat * NPHASE, sizeof(*keys));
    const char **catl = calloc((size_t)ncat, sizeof(*catl)), **grp = calloc((size_t)ncat, sizeof(*grp));
    const char **keyp = calloc((size_t)ncat * NPHASE, sizeof(*keyp));
    int *run = calloc((size_t)ncat, sizeof(*run));
    double *x = calloc((size_t)ncat, sizeof(*x)), *v = calloc((size_t)ncat * NPHASE, sizeof(*v));
    if (cat && keys && catl && grp && keyp && run && x && v) {
        int k = 0;
        for (int i = 0; i < r->nrun; i++)
            for (size_t e = 0; e < json_array_size(r->run[i].records); e++) {
                const json_t *o = json_array_get(r->run[i].records, e);
                if (!json_is_object(json_object_get(o, "profile")))
                    continue;
                x[k] = rt_report_num(o, "epoch");
                run[k] = i;
                snprintf(cat[k], sizeof(cat[k]), "%g", x[k]);
                catl[k] = cat[k];
                grp[k] = r->run[i].label;
                for (int s = 0; s < NPHASE; s++) {
                    snprintf(keys[k * NPHASE + s], sizeof(keys[0]), "profile.phases.%s.%s_ms", phase_key[s], pct);
                    keyp[k * NPHASE + s] = keys[k * NPHASE + s];
                    v[k * NPHASE + s] = rt_report_path_num(o, keys[k * NPHASE + s]);
                }
                k++;
            }
        char title[64], caption[1400], verdict[1100];
        snprintf(title, sizeof(title), "Step profile, %s per epoch (rank 0)", pct);
        verdict_text(r, verdict, sizeof(verdict));
        snprintf(caption, sizeof(caption),
                 "Each phase's %s over rank 0's optimizer steps of the epoch, stacked (the %ss do not add up to "
                 "the step's exactly). %s",
                 pct, pct, verdict[0] ? verdict : "No --json summary given: no verdict.");
        char name[32];
        snprintf(name, sizeof(name), "profile-%s", pct);
        struct chart_bars c = {.name = name, .title = title, .ylabel = "ms per step", .ncat = ncat, .nseg = NPHASE,
                               .cat_label = catl, .group_label = r->nrun > 1 ? grp : NULL, .cat_run = run,
                               .cat_x = x, .seg_label = phase_name, .seg_key = keyp, .v = v, .caption = caption};
        rt_report_chart_bars(b, &c);
    }
    free(cat), free(keys), free(catl), free(grp), free(keyp), free(run), free(x), free(v);
}

static void gpu_charts(struct sbuf *b, struct rt_report *r, struct plot *p)
{
    static const char *const key[] = {"gpu_util_pct", "gpu_mem_used_gib", "gpu_power_w"};
    static const char *const name[] = {"gpu-util", "gpu-mem", "gpu-power"};
    static const char *const title[] = {"GPU utilisation", "GPU memory used", "GPU power"};
    static const char *const ylab[] = {"% of time busy (mean)", "GiB (peak)", "W (mean)"};
    for (int g = 0; g < 3; g++) {
        for (int i = 0; i < r->nrun; i++)
            plot_add(p, &r->run[i], i, key[g], r->nrun > 1 ? r->run[i].label : title[g], i, 0, 0, r->nrun > 1);
        line_epochs(b, p, name[g], title[g], ylab[g], NULL, 1,
                    "From NVML on rank 0's GPU, sampled through each epoch.");
    }
}

static void loadbench_charts(struct sbuf *b, struct rt_report *r)
{
    if (!r->nload)
        return;
    struct chart_series s[MAX_BENCH];
    double xs[MAX_BENCH][64], ys[MAX_BENCH][64], ticks[64];
    int nt = 0;
    for (int i = 0; i < r->nload; i++) {
        const json_t *sc = json_object_get(r->loadbench[i].j, "scaling");
        int n = 0;
        for (size_t k = 0; k < json_array_size(sc) && n < 64; k++) {
            const json_t *o = json_array_get(sc, k);
            xs[i][n] = rt_report_num(o, "workers"), ys[i][n] = rt_report_num(o, "images_per_s");
            int seen = 0;
            for (int t = 0; t < nt; t++)
                seen |= ticks[t] == xs[i][n];
            if (!seen && nt < 64)
                ticks[nt++] = xs[i][n];
            n++;
        }
        s[i] = (struct chart_series){r->loadbench[i].src, i, "scaling[].images_per_s", n, xs[i], ys[i], i, 0, 0,
                                     r->nload > 1};
    }
    struct chart_line c = {.name = "loadbench-workers", .title = "Input pipeline: images/s against workers",
                           .xlabel = "decode/augment workers", .ylabel = "images/s", .xint = 1, .xticks = ticks,
                           .nxticks = nt, .yzero = 1, .s = s, .ns = r->nload, .mark_x = NAN,
                           .caption = "ringtrain loadbench: the loader and batch ring with no compute; images/s "
                                      "over the whole run at each worker count."};
    rt_report_chart_line(b, &c);

    /* Stage shares of the last worker count, one group of bars per file. */
    static const char *const st[] = {"io", "checksum", "decompress", "decode", "augment", "slot_wait", "ring_wait", "idle"};
    static const char *const shown[] = {"io", "checksum", "decompress", "decode", "augment", "slot wait", "ring wait",
                                        "idle"};
    enum { NST = 8 };
    const int ncat = r->nload * NST;
    const char **catl = calloc((size_t)ncat, sizeof(*catl)), **grp = calloc((size_t)ncat, sizeof(*grp));
    const char **keyp = calloc((size_t)ncat, sizeof(*keyp));
    char (*keys)[48] = calloc((size_t)ncat, sizeof(*keys));
    int *run = calloc((size_t)ncat, sizeof(*run));
    double *x = calloc((size_t)ncat, sizeof(*x)), *v = calloc((size_t)ncat, sizeof(*v));
    if (catl && grp && keyp && keys && run && x && v) {
        for (int i = 0; i < r->nload; i++)
            for (int k = 0; k < NST; k++) {
                const int c2 = i * NST + k;
                catl[c2] = shown[k];
                grp[c2] = r->loadbench[i].src;
                run[c2] = i;
                x[c2] = k;
                snprintf(keys[c2], sizeof(keys[0]), "stages.%s.share", st[k]);
                keyp[c2] = keys[c2];
                v[c2] = rt_report_path_num(r->loadbench[i].j, keys[c2]);
            }
        static const char *const seg[] = {"share of worker time"};
        char cap[300];
        snprintf(cap, sizeof(cap),
                 "Where the workers' time went at %g workers: busy in each stage, waiting for a free slot or for the "
                 "ring, or idle. The largest busy stage is what to speed up.",
                 rt_report_num(r->loadbench[r->nload - 1].j, "workers"));
        struct chart_bars cb = {.name = "loadbench-stages", .title = "Input pipeline: stage shares",
                                .ylabel = "share of worker time", .ncat = ncat, .nseg = 1, .cat_label = catl,
                                .group_label = r->nload > 1 ? grp : NULL, .cat_run = run, .cat_x = x,
                                .seg_label = seg, .seg_key = keyp, .v = v, .yfmt = rt_report_fmt_pct, .caption = cap};
        rt_report_chart_bars(b, &cb);
    }
    free(catl), free(grp), free(keyp), free(keys), free(run), free(x), free(v);
}

static void commbench_chart(struct sbuf *b, struct rt_report *r)
{
    if (!r->ncomm)
        return;
    enum { PTS = 64, SER = 32 };
    static double xs[SER][PTS], ys[SER][PTS];
    static char lab[SER][160], key[SER][48];
    struct chart_series s[SER];
    int ns = 0;
    double mark = NAN;
    char mark_label[64] = "";
    for (int i = 0; i < r->ncomm; i++) {
        const json_t *j = r->commbench[i].j, *res = json_object_get(j, "results");
        const char *paths[4];
        int np = 0;
        for (size_t k = 0; k < json_array_size(res); k++) {
            const char *p = json_string_value(json_object_get(json_array_get(res, k), "path"));
            int seen = 0;
            for (int q = 0; q < np; q++)
                seen |= p && strcmp(paths[q], p) == 0;
            if (p && !seen && np < 4)
                paths[np++] = p;
        }
        for (int q = 0; q < np && ns < SER; q++) {
            int n = 0;
            for (size_t k = 0; k < json_array_size(res) && n < PTS; k++) {
                const json_t *o = json_array_get(res, k);
                const char *p = json_string_value(json_object_get(o, "path"));
                if (p && strcmp(p, paths[q]) == 0)
                    xs[ns][n] = rt_report_num(o, "size"), ys[ns][n] = rt_report_num(o, "busbw"), n++;
            }
            snprintf(lab[ns], sizeof(lab[ns]), "%s%s%s (%g ranks)", r->ncomm > 1 ? r->commbench[i].src : "",
                     r->ncomm > 1 ? ": " : "", paths[q], rt_report_num(j, "ranks"));
            snprintf(key[ns], sizeof(key[ns]), "results[path=%s].busbw", paths[q]);
            s[ns] = (struct chart_series){lab[ns], i, key[ns], n, xs[ns], ys[ns], ns, 0, 0, 1};
            ns++;
        }
        const double bk = rt_report_path_num(j, "bucket.bytes");
        if (isfinite(bk) && !isfinite(mark)) {
            mark = bk;
            char sz[32];
            rt_report_fmt_bytes(bk, sz, sizeof(sz));
            snprintf(mark_label, sizeof(mark_label), "bucket %s", sz);
        }
    }
    struct chart_line c = {.name = "commbench-busbw", .title = "All-reduce bus bandwidth against message size",
                           .xlabel = "message size", .ylabel = "busbw (GB/s)", .xlog = 1, .xfmt = rt_report_fmt_bytes,
                           .yzero = 1, .s = s, .ns = ns, .mark_x = mark, .mark_label = mark_label,
                           .caption = "ringtrain commbench: bus bandwidth as nccl-tests defines it (algbw x 2(n-1)/n "
                                      "for all-reduce) for each path; the dashed line is the gradient bucket size "
                                      "training uses."};
    rt_report_chart_line(b, &c);
}

static void scaling_charts(struct sbuf *b, struct rt_report *r)
{
    if (!r->nscal)
        return;
    enum { PTS = 64, SER = 16 };
    static double xs[SER][PTS], ys[SER][PTS], ideal_x[PTS], ideal_y[PTS];
    static char lab[SER][160];
    static const char *const modes[] = {"overlap", "no-overlap"};
    for (int what = 0; what < 2; what++) {
        struct chart_series s[SER + 1];
        int ns = 0, ni = 0;
        double ticks[PTS];
        int nt = 0;
        for (int i = 0; i < r->nscal; i++) {
            const json_t *rows = json_object_get(r->scaling[i].j, "rows");
            for (int m = 0; m < 2 && ns < SER; m++) {
                int n = 0;
                for (size_t k = 0; k < json_array_size(rows) && n < PTS; k++) {
                    const json_t *row = json_array_get(rows, k), *c = json_object_get(row, modes[m]);
                    const double x = rt_report_num(row, "ranks"), y = rt_report_num(c, what ? "efficiency" : "speedup");
                    if (!isfinite(x) || !isfinite(y))
                        continue;
                    xs[ns][n] = x, ys[ns][n] = y, n++;
                    int seen = 0;
                    for (int t = 0; t < nt; t++)
                        seen |= ticks[t] == x;
                    if (!seen && nt < PTS)
                        ticks[nt++] = x;
                }
                if (!n)
                    continue;
                snprintf(lab[ns], sizeof(lab[ns]), "%s%s%s", r->nscal > 1 ? r->scaling[i].src : "",
                         r->nscal > 1 ? ": " : "", m ? "all-reduce after backward (--no-overlap)" : "all-reduce overlapped");
                s[ns] = (struct chart_series){lab[ns], i, what ? (m ? "rows[].no-overlap.efficiency" : "rows[].overlap.efficiency")
                                                               : (m ? "rows[].no-overlap.speedup" : "rows[].overlap.speedup"),
                                              n, xs[ns], ys[ns], ns, m, 0, 1};
                ns++;
            }
        }
        if (!ns)
            return;
        /* The ideal: speedup N / N0, efficiency 1. */
        double n0 = INFINITY;
        for (int t = 0; t < nt; t++)
            n0 = fmin(n0, ticks[t]);
        for (int t = 0; t < nt; t++) {
            double lo = INFINITY;
            for (int q = 0; q < nt; q++)
                if (ticks[q] > (t ? ideal_x[t - 1] : -1.0))
                    lo = fmin(lo, ticks[q]);
            ideal_x[t] = lo, ideal_y[t] = what ? 1.0 : lo / n0;
            ni++;
        }
        s[ns++] = (struct chart_series){"ideal", 0, "ideal", ni, ideal_x, ideal_y, 9, 1, 1, 1};
        struct chart_line c = {.name = what ? "scaling-efficiency" : "scaling-speedup",
                               .title = what ? "Scaling efficiency" : "Speedup against ranks", .xlabel = "ranks",
                               .ylabel = what ? "efficiency" : "speedup", .xlog = 1, .xticks = ticks, .nxticks = nt,
                               .yfmt = what ? rt_report_fmt_pct : NULL, .yzero = 1, .ymax_at_least = what ? 1.0 : 0,
                               .s = s, .ns = ns, .mark_x = NAN,
                               .caption = what ? "bench/scaling.sh: speedup x N0 / N (1 is perfect), medians over "
                                                 "the repeats."
                                               : "bench/scaling.sh: images/s at N ranks over images/s at the "
                                                 "smallest rank count, medians over the repeats; grey: ideal."};
        rt_report_chart_line(b, &c);
    }
}

/* ---- one step of a trace ---------------------------------------------------------------- */

/* Trace IDX's step (report.c read it: struct timeline) as a timeline chart; nothing when the file gave none. */
static void timeline_chart(struct sbuf *b, const struct timeline *tl, int idx)
{
    if (!tl->nsteps || !tl->nsp)
        return;
    char name[32], title[200], caption[900];
    snprintf(name, sizeof(name), idx ? "timeline-%d" : "timeline", idx + 1);
    snprintf(title, sizeof(title), "One optimizer step: %s of %s", tl->step_name, tl->proc);
    snprintf(caption, sizeof(caption),
             "From %s: the step of median length among the %d traced (%.2f ms), every thread of %s during it. "
             "Open the file in Perfetto (ui.perfetto.dev) or chrome://tracing for every step and rank.",
             tl->src, tl->nsteps, tl->step_us / 1000.0, tl->proc);
    struct chart_timeline c = {.name = name, .title = title, .nrow = tl->nrow, .row_label = tl->row_label,
                               .ncat = tl->ncat, .cat_label = tl->cat_label, .sp = tl->sp, .nsp = tl->nsp,
                               .t1 = tl->t1, .caption = caption};
    rt_report_chart_timeline(b, &c);
}

/* ---- tables ---------------------------------------------------------------------------- */

static void cell_num(struct sbuf *b, double v, const char *fmt)
{
    rt_report_buf_puts(b, "<td class=\"num\">");
    if (isfinite(v))
        rt_report_buf_printf(b, fmt, v);
    else
        rt_report_buf_puts(b, "&ndash;");
    rt_report_buf_puts(b, "</td>");
}

static double last_num(const struct run *u, const char *key)
{
    for (size_t i = json_array_size(u->records); i-- > 0;) {
        const double v = rt_report_path_num(json_array_get(u->records, i), key);
        if (isfinite(v))
            return v;
    }
    return NAN;
}

static void runs_table(struct sbuf *b, const struct rt_report *r)
{
    rt_report_buf_puts(b, "<table class=\"runs\" id=\"runs\"><tr><th></th><th>run</th><th>model</th><th>ranks</th>"
                          "<th>epochs</th><th>train loss</th><th>val loss</th><th>val accuracy</th><th>best</th>"
                          "<th>images/s</th><th>wall</th><th>from</th></tr>\n");
    for (int i = 0; i < r->nrun; i++) {
        const struct run *u = &r->run[i];
        const char *model = json_string_value(json_object_get(u->summary, "model"));
        if (!model)
            model = json_string_value(json_object_get(u->state, "model"));
        double ranks = rt_report_num(u->summary, "world_size");
        if (!isfinite(ranks))
            ranks = last_num(u, "world_size");
        double best = rt_report_num(u->summary, "best_val_acc");
        if (!isfinite(best))
            best = rt_report_num(u->state, "best_val_acc");
        double ips = rt_report_num(u->summary, "steady_images_per_s");
        if (!isfinite(ips))
            ips = rt_report_num(u->summary, "images_per_s");
        if (!isfinite(ips))
            ips = last_num(u, "images_per_s");
        rt_report_buf_printf(b, "<tr><td><span class=\"swatch\" style=\"background:%s\"></span></td><td>",
                             rt_report_color(i));
        rt_report_buf_esc(b, u->label);
        rt_report_buf_puts(b, "</td><td>");
        rt_report_buf_esc(b, model ? model : "");
        rt_report_buf_puts(b, "</td>");
        cell_num(b, ranks, "%g");
        cell_num(b, (double)json_array_size(u->records) > 0 ? last_num(u, "epoch") : rt_report_num(u->state, "epoch"),
                 "%g");
        cell_num(b, last_num(u, "train_loss"), "%.4f");
        cell_num(b, last_num(u, "val_loss"), "%.4f");
        const double va = last_num(u, "val_acc");
        cell_num(b, isfinite(va) ? va * 100.0 : NAN, "%.2f%%");
        cell_num(b, isfinite(best) ? best * 100.0 : NAN, "%.2f%%");
        cell_num(b, ips, "%.0f");
        cell_num(b, rt_report_num(u->summary, "time_s"), "%.1f s");
        rt_report_buf_puts(b, "<td class=\"src\">");
        rt_report_buf_esc(b, u->src);
        if (u->trace[0]) {
            rt_report_buf_puts(b, " (trace: ");
            rt_report_buf_esc(b, u->trace);
            rt_report_buf_puts(b, ", open it in Perfetto)");
        }
        rt_report_buf_puts(b, "</td></tr>\n");
    }
    rt_report_buf_puts(b, "</table>\n");
}

static const json_t *facts_of(const struct run *u)
{
    const json_t *f = json_object_get(u->summary, "facts");
    if (!json_is_array(f))
        f = json_object_get(u->state, "facts");
    return json_is_array(f) ? f : NULL;
}

static const char *fact(const json_t *facts, const char *key)
{
    for (size_t i = 0; i < json_array_size(facts); i++) {
        const json_t *p = json_array_get(facts, i);
        const char *k = json_string_value(json_array_get(p, 0));
        if (k && strcmp(k, key) == 0)
            return json_string_value(json_array_get(p, 1));
    }
    return NULL;
}

/* The banner's facts, a column per run; rows whose values differ are marked. And the command lines. */
static void config_table(struct sbuf *b, const struct rt_report *r)
{
    const char *keys[64];
    int nk = 0, any_cmd = 0;
    for (int i = 0; i < r->nrun; i++) {
        const json_t *f = facts_of(&r->run[i]);
        any_cmd |= rt_report_run_command(&r->run[i]) != NULL;
        for (size_t k = 0; k < json_array_size(f); k++) {
            const char *key = json_string_value(json_array_get(json_array_get(f, k), 0));
            int seen = 0;
            for (int q = 0; q < nk; q++)
                seen |= key && strcmp(keys[q], key) == 0;
            if (key && !seen && nk < 64)
                keys[nk++] = key;
        }
    }
    rt_report_buf_puts(b, "<h2 id=\"configuration\">Configuration</h2>\n<table class=\"config\" id=\"config\">");
    if (!nk && !any_cmd) {
        rt_report_buf_puts(b, "<tr><td>Not known: give a run's <code>train --json</code> output or its checkpoint's "
                              "<code>state.json</code> with its metrics (comma-joined, or in its directory)."
                              "</td></tr></table>\n");
        return;
    }
    rt_report_buf_puts(b, "<tr><th></th>");
    for (int i = 0; i < r->nrun; i++) {
        rt_report_buf_puts(b, "<th>");
        rt_report_buf_esc(b, r->nrun > 1 ? r->run[i].label : "as the run's banner said");
        rt_report_buf_puts(b, "</th>");
    }
    rt_report_buf_puts(b, "</tr>\n");
    for (int q = 0; q < nk; q++) {
        int differs = 0;
        const char *first = fact(facts_of(&r->run[0]), keys[q]);
        for (int i = 1; i < r->nrun; i++) {
            const char *v = fact(facts_of(&r->run[i]), keys[q]);
            differs |= (!v) != (!first) || (v && first && strcmp(v, first) != 0);
        }
        rt_report_buf_printf(b, "<tr%s><th>", differs ? " class=\"differs\"" : "");
        rt_report_buf_esc(b, keys[q]);
        rt_report_buf_puts(b, "</th>");
        for (int i = 0; i < r->nrun; i++) {
            rt_report_buf_puts(b, "<td>");
            rt_report_buf_esc(b, fact(facts_of(&r->run[i]), keys[q]));
            rt_report_buf_puts(b, "</td>");
        }
        rt_report_buf_puts(b, "</tr>\n");
    }
    if (any_cmd) {
        rt_report_buf_puts(b, "<tr><th>command</th>");
        for (int i = 0; i < r->nrun; i++) {
            const json_t *c = rt_report_run_command(&r->run[i]);
            rt_report_buf_puts(b, "<td><code>");
            for (size_t k = 0; c && k < json_array_size(c); k++) {
                const char *a = json_string_value(json_array_get(c, k));
                if (k)
                    rt_report_buf_puts(b, " ");
                rt_report_buf_esc(b, a ? a : "");
            }
            rt_report_buf_puts(b, "</code></td>");
        }
        rt_report_buf_puts(b, "</tr>\n");
    }
    rt_report_buf_puts(b, "</table>\n");
}

/* ---- the per-op profile (train --profile-ops) and the comparison with PyTorch's ---------------------------- */

/* The categories of an op profile (docs/FORMAT.md, "op_profile"), in the order they are drawn. */
static const char *const op_cat[] = {"conv_fwd", "data_grad", "weight_grad", "batchnorm", "elementwise", "pooling",
                                     "loss", "optimizer", "copies", "other", "idle"};
enum { NOPCAT = 11 };

/* "TF32 on, deterministic, fast kernels" from ringtrain's "settings" object; any other member (the bench's PyTorch
 * side: "cudnn_allow_tf32", "float32_matmul_precision", ...) as "name value"; "" when there is none. */
static void settings_text(const json_t *st, char *buf, size_t len)
{
    buf[0] = 0;
    if (!json_is_object(st))
        return;
    const json_t *t = json_object_get(st, "tf32"), *d = json_object_get(st, "deterministic");
    const char *k = json_string_value(json_object_get(st, "kernels"));
    if (json_is_boolean(t))
        rt_appendf(buf, len, "%sTF32 %s", buf[0] ? ", " : "", json_is_true(t) ? "on" : "off");
    if (json_is_boolean(d))
        rt_appendf(buf, len, "%s%s", buf[0] ? ", " : "", json_is_true(d) ? "deterministic" : "non-deterministic");
    if (k)
        rt_appendf(buf, len, "%s%s kernels", buf[0] ? ", " : "", k);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)st, key, v) {
        if (!strcmp(key, "tf32") || !strcmp(key, "deterministic") || !strcmp(key, "kernels"))
            continue;
        if (json_is_boolean(v))
            rt_appendf(buf, len, "%s%s %s", buf[0] ? ", " : "", key, json_is_true(v) ? "on" : "off");
        else if (json_is_string(v))
            rt_appendf(buf, len, "%s%s %s", buf[0] ? ", " : "", key, json_string_value(v));
        else if (json_is_number(v))
            rt_appendf(buf, len, "%s%s %g", buf[0] ? ", " : "", key, json_number_value(v));
    }
}

/* Series s of nser of a chart_hbars from op profile `op` (its "categories" and "step_ms"): each category's value,
 * its share of the step and its data-key "PREFIX.categories.CAT", at [cat * nser + s]. */
static void op_cat_bars(const json_t *op, const char *prefix, int s, int nser, double *v, double *share,
                        char (*keys)[64], const char **keyp)
{
    const double step = rt_report_num(op, "step_ms");
    const json_t *cats = json_object_get(op, "categories");
    for (int k = 0; k < NOPCAT; k++) {
        const int j = k * nser + s;
        v[j] = rt_report_num(cats, op_cat[k]);
        share[j] = step > 0 ? v[j] / step : NAN;
        snprintf(keys[j], sizeof(keys[j]), "%s.categories.%s", prefix, op_cat[k]);
        keyp[j] = keys[j];
    }
}

/* Run I's op profile (summary.op_profile) as a bar per category, ms per step. */
static void op_profile_chart(struct sbuf *b, const struct rt_report *r, int i, const json_t *op)
{
    const double step = rt_report_num(op, "step_ms");
    double v[NOPCAT], share[NOPCAT];
    char keys[NOPCAT][64];
    const char *keyp[NOPCAT];
    op_cat_bars(op, "op_profile", 0, 1, v, share, keys, keyp);
    char name[32], title[240], caption[900], set[160];
    snprintf(name, sizeof(name), i ? "ops-%d" : "ops", i);
    snprintf(title, sizeof(title), "Per-op profile%s%s: ms per step by category", r->nrun > 1 ? ", " : "",
             r->nrun > 1 ? r->run[i].label : "");
    settings_text(json_object_get(op, "settings"), set, sizeof(set));
    snprintf(caption, sizeof(caption),
             "train --profile-ops: each op's own time on rank 0's compute stream between its two marks, summed by "
             "category, ms per optimizer step (the mean over %g steps%s); the step's span on the stream is %.3f ms, "
             "and idle is what the ops leave of it: the stream waiting for the host. The marks slow the step down "
             "(two CUDA events per op on a GPU).%s%s",
             rt_report_num(op, "steps"), json_is_true(json_object_get(op, "warmup_included")) ? ", the warm-up included"
                                                                                          : " after the warm-up",
             step, set[0] ? " Settings: " : "", set);
    static const char *const ser[] = {"ms per step"};
    struct chart_hbars c = {.name = name, .title = title, .xlabel = "ms per step", .ncat = NOPCAT, .nser = 1,
                            .cat_label = op_cat, .ser_label = ser, .key = keyp, .v = v, .share = share, .run = i,
                            .caption = caption};
    rt_report_chart_hbars(b, &c);
}

/* Run I's top ops and the convolutions' algorithms, as tables under the charts. */
static void op_profile_tables(struct sbuf *b, const struct rt_report *r, int i, const json_t *op)
{
    const double step = rt_report_num(op, "step_ms");
    const json_t *ops = json_object_get(op, "ops"), *conv = json_object_get(op, "convolutions");
    rt_report_buf_printf(b, "<h3>Top ops%s", r->nrun > 1 ? ": " : "");
    if (r->nrun > 1)
        rt_report_buf_esc(b, r->run[i].label);
    rt_report_buf_printf(
        b,
        "</h3>\n<table class=\"ops\" id=\"ops-%d\"><tr><th>op</th><th>category</th><th>ms per step</th>"
        "<th>calls per step</th><th>share of the step</th></tr>\n",
        i);
    for (size_t k = 0; k < json_array_size(ops) && k < 16; k++) {
        const json_t *o = json_array_get(ops, k);
        const char *nm = json_string_value(json_object_get(o, "op"));
        const char *cat = json_string_value(json_object_get(o, "category"));
        const double ms = rt_report_num(o, "ms");
        rt_report_buf_puts(b, "<tr><td><code>");
        rt_report_buf_esc(b, nm ? nm : "?");
        rt_report_buf_puts(b, "</code></td><td>");
        rt_report_buf_esc(b, cat ? cat : "");
        rt_report_buf_puts(b, "</td>");
        cell_num(b, ms, "%.3f");
        cell_num(b, rt_report_num(o, "calls"), "%g");
        cell_num(b, step > 0 ? 100 * ms / step : NAN, "%.1f%%");
        rt_report_buf_puts(b, "</tr>\n");
    }
    rt_report_buf_puts(b, "</table>\n");
    rt_report_buf_printf(b, "<table class=\"convs\" id=\"convs-%d\"><tr><th>direction</th><th>dtype</th><th>shape</th>"
                            "<th>algorithm</th><th>ms per call</th><th>workspace</th><th>deterministic</th>"
                            "<th>tensor cores</th><th>candidates</th></tr>\n", i);
    if (!json_array_size(conv))
        rt_report_buf_puts(
            b, "<tr><td colspan=\"9\">No convolution choices: the CPU backend reports none (oneDNN picks its "
               "own); on a GPU each shape's cuDNN choice is listed here.</td></tr>\n");
    for (size_t k = 0; k < json_array_size(conv); k++) {
        const json_t *o = json_array_get(conv, k);
        static const char *const cols[] = {"dir", "dtype", "shape", "how"};
        rt_report_buf_puts(b, "<tr>");
        for (int q = 0; q < 4; q++) {
            const char *t = json_string_value(json_object_get(o, cols[q]));
            rt_report_buf_puts(b, q == 2 ? "<td><code>" : "<td>");
            rt_report_buf_esc(b, t ? t : "");
            rt_report_buf_puts(b, q == 2 ? "</code></td>" : "</td>");
        }
        cell_num(b, rt_report_num(o, "ms"), "%.4f");
        char ws[32] = "";
        const double w = rt_report_num(o, "workspace");
        if (isfinite(w))
            rt_report_fmt_bytes(w, ws, sizeof(ws));
        rt_report_buf_puts(b, "<td class=\"num\">");
        rt_report_buf_esc(b, ws);
        rt_report_buf_printf(b, "</td><td>%s</td><td>%s</td>",
                             json_is_true(json_object_get(o, "deterministic")) ? "yes" : "no",
                             json_is_true(json_object_get(o, "tensor_cores")) ? "yes" : "no");
        cell_num(b, rt_report_num(o, "candidates"), "%g");
        rt_report_buf_puts(b, "</tr>\n");
    }
    rt_report_buf_puts(b, "</table>\n");
}

/* The largest differences of a pair, "weight_grad 3.2 vs 1.1 ms": the file's "largest", else the three categories
 * that differ most. */
static void largest_text(const json_t *pair, char *buf, size_t len)
{
    buf[0] = 0;
    const json_t *lg = json_object_get(pair, "largest");
    for (size_t k = 0; k < json_array_size(lg); k++) {
        const json_t *o = json_array_get(lg, k);
        const char *cat = json_string_value(json_object_get(o, "category"));
        const double a = rt_report_num(o, "ringtrain_ms"), p = rt_report_num(o, "pytorch_ms");
        rt_appendf(buf, len, "%s%s %.3f vs %.3f ms (%+.3f)", k ? "; " : "", cat ? cat : "?", a, p, a - p);
    }
    if (buf[0])
        return;
    const json_t *ra = json_object_get(json_object_get(pair, "ringtrain"), "categories");
    const json_t *pa = json_object_get(json_object_get(pair, "pytorch"), "categories");
    int used[NOPCAT] = {0};
    for (int n = 0; n < 3; n++) {
        int best = -1;
        double bd = 0;
        for (int k = 0; k < NOPCAT; k++) {
            const double d = fabs(rt_report_num(ra, op_cat[k]) - rt_report_num(pa, op_cat[k]));
            if (!used[k] && isfinite(d) && d > bd)
                bd = d, best = k;
        }
        if (best < 0)
            break;
        used[best] = 1;
        const double a = rt_report_num(ra, op_cat[best]), p = rt_report_num(pa, op_cat[best]);
        rt_appendf(buf, len, "%s%s %.3f vs %.3f ms (%+.3f)", n ? "; " : "", op_cat[best], a, p, a - p);
    }
}

/* bench/gpu_vs_pytorch.sh --only profile's file: per pair (model, precision, batch) both sides' categories. */
static void op_compare_charts(struct sbuf *b, const struct rt_report *r, int f)
{
    const json_t *j = r->profcmp[f].j, *pairs = json_object_get(j, "pairs");
    const char *gpu = json_string_value(json_object_get(j, "gpu"));
    const char *host = json_string_value(json_object_get(j, "host"));
    for (size_t p = 0; p < json_array_size(pairs); p++) {
        const json_t *pr = json_array_get(pairs, p);
        const json_t *side[2] = {json_object_get(pr, "ringtrain"), json_object_get(pr, "pytorch")};
        const char *model = json_string_value(json_object_get(pr, "model"));
        const char *amp = json_string_value(json_object_get(pr, "amp"));
        double v[NOPCAT * 2], share[NOPCAT * 2];
        char keys[NOPCAT * 2][64], ser0[96], ser1[96];
        const char *keyp[NOPCAT * 2];
        for (int s = 0; s < 2; s++) {
            char prefix[48];
            snprintf(prefix, sizeof(prefix), "pairs[%zu].%s", p, s ? "pytorch" : "ringtrain");
            op_cat_bars(side[s], prefix, s, 2, v, share, keys, keyp);
        }
        snprintf(ser0, sizeof(ser0), "ringtrain (step %.3f ms)", rt_report_num(side[0], "step_ms"));
        snprintf(ser1, sizeof(ser1), "PyTorch (step %.3f ms)", rt_report_num(side[1], "step_ms"));
        const char *ser[2] = {ser0, ser1};
        static const int colors[2] = {0, 3};
        char name[48], title[240], caption[1600], big[600], set0[160], set1[320];
        snprintf(name, sizeof(name), "opcmp-%d-%zu", f, p);
        snprintf(title, sizeof(title), "%s, %s, batch %g: ringtrain and PyTorch, ms per step", model ? model : "?",
                 amp && strcmp(amp, "off") ? amp : "fp32", rt_report_num(pr, "batch"));
        largest_text(pr, big, sizeof(big));
        settings_text(json_object_get(side[0], "settings"), set0, sizeof(set0));
        settings_text(json_object_get(side[1], "settings"), set1, sizeof(set1));
        snprintf(caption, sizeof(caption),
                 "%s%s%s%s%s: each side's GPU time per step by category (ringtrain: --profile-ops; PyTorch: "
                 "torch.profiler's device time per aten op, summed the same way). Largest differences: %s.%s%s%s%s",
                 r->profcmp[f].src, gpu ? ", " : "", gpu ? gpu : "", host ? ", " : "", host ? host : "",
                 big[0] ? big : "none given", set0[0] ? " ringtrain: " : "", set0, set1[0] ? "; PyTorch: " : "", set1);
        struct chart_hbars c = {.name = name, .title = title, .xlabel = "ms per step", .ncat = NOPCAT, .nser = 2,
                                .cat_label = op_cat, .ser_label = ser, .ser_color = colors, .key = keyp, .v = v,
                                .share = share, .run = f, .caption = caption};
        rt_report_chart_hbars(b, &c);
    }
}

/* Each comparison pair's largest differences as one line of a table, under the charts. */
static void op_compare_table(struct sbuf *b, const struct rt_report *r)
{
    if (!r->nprof)
        return;
    rt_report_buf_puts(
        b, "<h3>ringtrain against PyTorch, per pair</h3>\n<table class=\"opcmp\" id=\"opcmp\"><tr><th>file</th>"
           "<th>model</th><th>precision</th><th>batch</th><th>ringtrain ms per step</th>"
           "<th>PyTorch ms per step</th>"
           "<th>largest differences (ringtrain vs PyTorch)</th></tr>\n");
    for (int f = 0; f < r->nprof; f++) {
        const json_t *pairs = json_object_get(r->profcmp[f].j, "pairs");
        for (size_t p = 0; p < json_array_size(pairs); p++) {
            const json_t *pr = json_array_get(pairs, p);
            const char *model = json_string_value(json_object_get(pr, "model"));
            const char *amp = json_string_value(json_object_get(pr, "amp"));
            char big[600];
            largest_text(pr, big, sizeof(big));
            rt_report_buf_puts(b, "<tr><td class=\"src\">");
            rt_report_buf_esc(b, r->profcmp[f].src);
            rt_report_buf_puts(b, "</td><td>");
            rt_report_buf_esc(b, model ? model : "");
            rt_report_buf_puts(b, "</td><td>");
            rt_report_buf_esc(b, amp ? amp : "");
            rt_report_buf_puts(b, "</td>");
            cell_num(b, rt_report_num(pr, "batch"), "%g");
            cell_num(b, rt_report_path_num(pr, "ringtrain.step_ms"), "%.3f");
            cell_num(b, rt_report_path_num(pr, "pytorch.step_ms"), "%.3f");
            rt_report_buf_puts(b, "<td>");
            rt_report_buf_esc(b, big);
            rt_report_buf_puts(b, "</td></tr>\n");
        }
    }
    rt_report_buf_puts(b, "</table>\n");
}

/* The section: each run's op profile (a chart, then its tables) and the comparisons; nothing when there is none. */
static void op_profile_section(struct sbuf *b, const struct rt_report *r)
{
    int any = r->nprof > 0;
    for (int i = 0; i < r->nrun; i++)
        any |= json_is_object(json_object_get(r->run[i].summary, "op_profile"));
    if (!any)
        return;
    rt_report_buf_puts(b, "<h2 id=\"op-profile\">Per-op profile</h2>\n<div class=\"charts\">\n");
    for (int i = 0; i < r->nrun; i++) {
        const json_t *op = json_object_get(r->run[i].summary, "op_profile");
        if (json_is_object(op))
            op_profile_chart(b, r, i, op);
    }
    for (int f = 0; f < r->nprof; f++)
        op_compare_charts(b, r, f);
    rt_report_buf_puts(b, "</div>\n");
    for (int i = 0; i < r->nrun; i++) {
        const json_t *op = json_object_get(r->run[i].summary, "op_profile");
        if (json_is_object(op))
            op_profile_tables(b, r, i, op);
    }
    op_compare_table(b, r);
}

/* ---- the page -------------------------------------------------------------------------- */

static const char style[] =
    "body{font:14px/1.45 sans-serif;margin:24px auto;max-width:1260px;padding:0 12px;color:#222;background:#fff}"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd}"
    ".meta{color:#666;margin:0 0 14px}"
    ".charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(600px,1fr));gap:14px}"
    "figure.chart{margin:0;border:1px solid #ddd;border-radius:4px;padding:6px;background:#fff}"
    "figure.chart svg{display:block;width:100%;height:auto}"
    "figcaption{font-size:12px;color:#444;padding:4px 6px 2px}"
    "svg text{font:11px sans-serif;fill:#333}svg text.title{font-size:14px;font-weight:bold}"
    "svg text.axis-label{font-size:12px}svg .bg{fill:#fff;stroke:none}"
    "svg .axes{fill:none;stroke:#888}svg .grid line{stroke:#e6e6e6}"
    "svg .mark line{stroke:#555;stroke-dasharray:4 3}svg .group line{stroke:#999}"
    "table{border-collapse:collapse;font-size:13px;margin:6px 0}th,td{border:1px solid #ddd;padding:3px 8px;"
    "text-align:left;vertical-align:top}td.num{text-align:right;font-variant-numeric:tabular-nums}"
    "tr.differs th{background:#fff3cd}td.src{font-family:monospace;font-size:12px;color:#555}"
    ".swatch{display:inline-block;width:12px;height:12px;border-radius:2px}"
    "code{font-size:12px;word-break:break-all}";

static void section(struct sbuf *b, const char *id, const char *title, size_t *mark)
{
    rt_report_buf_printf(b, "<h2 id=\"%s\">", id);
    rt_report_buf_esc(b, title);
    rt_report_buf_puts(b, "</h2>\n<div class=\"charts\">\n");
    *mark = b->n;
}

/* Ends a section; one that drew nothing is taken back out. */
static void section_end(struct sbuf *b, size_t mark, size_t start)
{
    if (b->n == mark && !b->oom) {
        b->n = start;
        b->p[b->n] = 0;
        return;
    }
    rt_report_buf_puts(b, "</div>\n");
}

/* The whole page into OUT (the caller frees it); PATH only names it in errors. 0, or -ENOMEM. */
static int compose(struct rt_report *r, struct sbuf *out, const char *path)
{
    struct sbuf b = {0};
    char when[64];
    const time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S %Z", localtime_r(&now, &tm));
    rt_report_buf_puts(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                           "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>");
    rt_report_buf_esc(&b, r->title);
    rt_report_buf_printf(&b, "</title><style>%s</style></head><body>\n<h1>", style);
    rt_report_buf_esc(&b, r->title);
    rt_report_buf_printf(&b, "</h1><p class=\"meta\">ringtrain %s, written %s from", RT_VERSION, when);
    const int count[] = {r->nrun, r->nload, r->ncomm, r->nscal, r->ntrace, r->nprof};
    static const char *const what[] = {"training run", "loadbench output", "commbench output", "scaling output",
                                       "trace", "profile comparison"};
    int shown = 0;
    for (int i = 0; i < 6; i++)
        if (count[i])
            rt_report_buf_printf(&b, "%s %d %s%s", shown++ ? "," : "", count[i], what[i], count[i] == 1 ? "" : "s");
    rt_report_buf_puts(&b, ".</p>\n");
    if (r->nrun)
        runs_table(&b, r);

    size_t start = b.n, mark;
    struct plot *plot = calloc(1, sizeof(*plot)); /* series kept until each chart is drawn */
    if (!plot)
        return rt_errf(-ENOMEM, "%s: out of memory composing the page", path);
    section(&b, "training", "Training", &mark);
    training_charts(&b, r, plot);
    section_end(&b, mark, start);
    start = b.n;
    section(&b, "step-profile", "Where the time goes: the step profile", &mark);
    profile_chart(&b, r, "p50");
    profile_chart(&b, r, "p99");
    for (int i = 0; i < r->ntrace; i++)
        timeline_chart(&b, r->trace[i], i);
    section_end(&b, mark, start);
    start = b.n;
    op_profile_section(&b, r);
    start = b.n;
    section(&b, "gpu", "GPU", &mark);
    gpu_charts(&b, r, plot);
    free(plot);
    section_end(&b, mark, start);
    start = b.n;
    section(&b, "input", "Input pipeline (loadbench)", &mark);
    loadbench_charts(&b, r);
    section_end(&b, mark, start);
    start = b.n;
    section(&b, "allreduce", "All-reduce (commbench)", &mark);
    commbench_chart(&b, r);
    section_end(&b, mark, start);
    start = b.n;
    section(&b, "scaling", "Scaling (bench/scaling.sh)", &mark);
    scaling_charts(&b, r);
    section_end(&b, mark, start);
    if (r->nrun)
        config_table(&b, r);
    rt_report_buf_puts(&b, "</body></html>\n");
    if (b.oom) {
        rt_report_buf_free(&b);
        return rt_errf(-ENOMEM, "%s: out of memory composing the page", path);
    }
    *out = b;
    return 0;
}

int rt_report_write(struct rt_report *r, const char *path)
{
    if (!rt_report_inputs(r))
        return rt_errf(-EINVAL, "nothing to report: no run or benchmark output was given");
    rt_report_make_labels(r);
    struct sbuf b = {0};
    int rc = compose(r, &b, path);
    if (rc < 0)
        return rc;
    rc = rt_file_write_atomic(path, b.p, b.n);
    rt_report_buf_free(&b);
    return rc;
}
