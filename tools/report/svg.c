/*
 * svg.c - the report's charts as inline SVG (see svg.h). Sizes are in CSS
 * pixels of a 600-wide chart; the page scales it to its column. Text is the
 * browser's sans-serif at 11 px, so no font travels with the page.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "tools/report/svg.h"

/* ---- the text buffer ---------------------------------------------------------------- */

static int reserve(struct sbuf *b, size_t more)
{
    if (b->oom)
        return -1;
    if (b->n + more + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void rt_report_buf_printf(struct sbuf *b, const char *fmt, ...)
           {
               va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0 || reserve(b, (size_t)n) < 0)
        return;
    if ((size_t)n < sizeof(small)) {
        memcpy(b->p + b->n, small, (size_t)n + 1);
    } else {
        va_start(ap, fmt);
        vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->n += (size_t)n;
}

void rt_report_buf_puts(struct sbuf *b, const char *s)
           {
               size_t n = strlen(s);
    if (reserve(b, n) < 0)
        return;
    memcpy(b->p + b->n, s, n + 1);
    b->n += n;
}

void rt_report_buf_esc(struct sbuf *b, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': rt_report_buf_puts(b, "&amp;"); break;
        case '<': rt_report_buf_puts(b, "&lt;"); break;
        case '>': rt_report_buf_puts(b, "&gt;"); break;
        case '"': rt_report_buf_puts(b, "&quot;"); break;
        case '\'': rt_report_buf_puts(b, "&#39;"); break;
        default:
            if (reserve(b, 1) == 0) {
                b->p[b->n++] = *s;
                b->p[b->n] = 0;
            }
        }
    }
}

void rt_report_buf_free(struct sbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* ---- numbers on axes ---------------------------------------------------------------- */

void rt_report_fmt_num(double v, char *buf, size_t len)
{
    const double a = fabs(v);
    if (a >= 1e9)
        snprintf(buf, len, "%gG", v / 1e9);
    else if (a >= 1e6)
        snprintf(buf, len, "%gM", v / 1e6);
    else if (a >= 1e4)
        snprintf(buf, len, "%gk", v / 1e3);
    else
        snprintf(buf, len, "%g", fabs(v) < 1e-12 ? 0.0 : v);
}

void rt_report_fmt_pct(double v, char *buf, size_t len)
{
    snprintf(buf, len, "%g%%", round(v * 1000.0) / 10.0);
}

void rt_report_fmt_bytes(double v, char *buf, size_t len)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%g %s", v, unit[u]);
}

const char *rt_report_color(int i)
{
    static const char *const palette[CHART_COLORS] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                                      "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"};
    return palette[((i % CHART_COLORS) + CHART_COLORS) % CHART_COLORS];
}

/* A step of 1, 2 or 5 times a power of ten near range / n. */
static double nice_step(double range, int n)
{
    if (!(range > 0))
        return 1.0;
    const double raw = range / n, p = pow(10.0, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * p;
}

/* ---- the frame every chart shares ---------------------------------------------------- */

enum { ML = 64, MR = 18, MT = 34, PLOT_H = 230, LEG_ROW = 16 };

struct legend_item {
    const char *label, *color;
    int dashed, box;
};

/* Legend rows below the x label; returns their height. */
static int legend_height(const struct legend_item *it, int n)
{
    if (n <= 1)
        return 0;
    int rows = 1, x = ML;
    for (int i = 0; i < n; i++) {
        const int w = 30 + (int)(strlen(it[i].label) * 7.0);
        if (x + w > CHART_W - MR && x > ML) {
            rows++;
            x = ML;
        }
        x += w;
    }
    return rows * LEG_ROW + 6;
}

static void legend_draw(struct sbuf *b, const struct legend_item *it, int n, int y0)
{
    if (n <= 1)
        return;
    rt_report_buf_puts(b, "<g class=\"legend\">");
    int x = ML, y = y0 + 12;
    for (int i = 0; i < n; i++) {
        const int w = 30 + (int)(strlen(it[i].label) * 7.0);
        if (x + w > CHART_W - MR && x > ML) {
            y += LEG_ROW;
            x = ML;
        }
        if (it[i].box)
            rt_report_buf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"10\" fill=\"%s\"/>", x, y - 9,
                                 it[i].color);
        else
            rt_report_buf_printf(b,
                                 "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>",
                                 x, y - 4, x + 18, y - 4, it[i].color, it[i].dashed ? " stroke-dasharray=\"5 3\"" : "");
        rt_report_buf_printf(b, "<text x=\"%d\" y=\"%d\">", x + 22, y);
        rt_report_buf_esc(b, it[i].label);
        rt_report_buf_puts(b, "</text>");
        x += w;
    }
    rt_report_buf_puts(b, "</g>");
}

static void frame_open(struct sbuf *b, const char *name, const char *title, int h)
{
    rt_report_buf_puts(b, "<figure class=\"chart\" id=\"chart-");
    rt_report_buf_esc(b, name);
    rt_report_buf_printf(b, "\"><svg class=\"plot\" width=\"%d\" height=\"%d\" "
                            "viewBox=\"0 0 %d %d\" role=\"img\"><title>",
                         CHART_W, h, CHART_W, h);
    rt_report_buf_esc(b, title);
    rt_report_buf_printf(b, "</title><rect class=\"bg\" x=\"0.5\" y=\"0.5\" width=\"%d\" height=\"%d\"/>"
                            "<text class=\"title\" x=\"%d\" y=\"20\">",
                         CHART_W - 1, h - 1, ML);
    rt_report_buf_esc(b, title);
    rt_report_buf_puts(b, "</text>");
}

static void frame_close(struct sbuf *b, const char *caption)
{
    rt_report_buf_puts(b, "</svg><figcaption>");
    rt_report_buf_esc(b, caption ? caption : "");
    rt_report_buf_puts(b, "</figcaption></figure>\n");
}

static void ylabel_draw(struct sbuf *b, const char *label)
{
    rt_report_buf_printf(
        b, "<text class=\"axis-label\" transform=\"translate(14 %d) rotate(-90)\" text-anchor=\"middle\">",
        MT + PLOT_H / 2);
    rt_report_buf_esc(b, label);
    rt_report_buf_puts(b, "</text>");
}

/* ---- lines ----------------------------------------------------------------------------- */

struct axis {
    double v0, v1; /* the domain, in values */
    int log;
    double p0, p1; /* pixels */
};

static double axis_t(const struct axis *a, double v) { return a->log ? log10(v) : v; }

static double axis_px(const struct axis *a, double v)
{
    const double t0 = axis_t(a, a->v0), t1 = axis_t(a, a->v1);
    return a->p0 + (axis_t(a, v) - t0) / (t1 - t0) * (a->p1 - a->p0);
}

/* Ticks of a log axis: powers of 2 (k doubling each step) or of 10, at most 9. */
static int log_ticks(double lo, double hi, int base2, double *t, int max)
{
    int n = 0;
    if (base2) {
        const int e0 = (int)ceil(log2(lo) - 1e-9), e1 = (int)floor(log2(hi) + 1e-9);
        int step = 1;
        while ((e1 - e0) / step + 1 > 9)
            step++;
        for (int e = e0; e <= e1 && n < max; e += step)
            t[n++] = ldexp(1.0, e);
    } else {
        const int e0 = (int)ceil(log10(lo) - 1e-9), e1 = (int)floor(log10(hi) + 1e-9);
        for (int e = e0; e <= e1 && n < max; e++)
            t[n++] = pow(10.0, e);
    }
    return n;
}

/* Whether a point is drawn: finite, and above 0 on a log axis. */
static int point_shown(const struct chart_line *c, double x, double y)
{
    return isfinite(x) && isfinite(y) && (!c->xlog || x > 0) && (!c->ylog || y > 0);
}

/* The data's extent with what the chart asks for (0, a least top, the marker in view); never empty. */
static void line_domain(const struct chart_line *c, double *xmin, double *xmax, double *ymin, double *ymax)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int s = 0; s < c->ns; s++)
        for (int i = 0; i < c->s[s].n; i++) {
            const double x = c->s[s].x[i], y = c->s[s].y[i];
            if (!point_shown(c, x, y))
                continue;
            x0 = fmin(x0, x), x1 = fmax(x1, x), y0 = fmin(y0, y), y1 = fmax(y1, y);
        }
    if (!(x0 <= x1))
        x0 = 0, x1 = 1, y0 = 0, y1 = 1;
    if (c->yzero)
        y0 = fmin(y0, 0.0), y1 = fmax(y1, 0.0);
    if (isfinite(c->mark_x) && (!c->xlog || c->mark_x > 0)) /* the marker is always in view */
        x0 = fmin(x0, c->mark_x), x1 = fmax(x1, c->mark_x);
    if (c->ymax_at_least > 0)
        y1 = fmax(y1, c->ymax_at_least);
    if (!c->xlog && !(x1 > x0))
        x0 -= c->xint ? 1.0 : 0.5, x1 += c->xint ? 1.0 : 0.5;
    if (c->xlog && !(x1 > x0))
        x0 /= 2.0, x1 *= 2.0;
    *xmin = x0, *xmax = x1, *ymin = y0, *ymax = y1;
}

/* The x ticks: the chart's own, else powers of 2 on a log axis, else a nice step (whole on an integer axis). */
static int line_xticks(const struct chart_line *c, double xmin, double xmax, double *xt, int max)
{
    int n = 0;
    if (c->xticks) {
        for (int i = 0; i < c->nxticks && n < max; i++)
            xt[n++] = c->xticks[i];
    } else if (c->xlog) {
        n = log_ticks(xmin, xmax, 1, xt, max);
    } else {
        double st = nice_step(xmax - xmin, 6);
        if (c->xint)
            st = fmax(1.0, round(st));
        for (double v = ceil(xmin / st - 1e-9) * st; v <= xmax + 1e-9 * st && n < max; v += st)
            xt[n++] = v;
    }
    return n;
}

/* The y ticks, the range widened to them: to whole decades on a log axis, to whole steps on a linear one. */
static int line_yticks(const struct chart_line *c, double *ymin, double *ymax, double *yt, int max)
{
    int n = 0;
    if (c->ylog) {
        if (!(*ymax > *ymin))
            *ymin /= 2.0, *ymax *= 2.0;
        *ymin = pow(10.0, floor(log10(*ymin))), *ymax = pow(10.0, ceil(log10(*ymax)));
        return log_ticks(*ymin, *ymax, 0, yt, max);
    }
    if (!(*ymax > *ymin)) {
        const double d = *ymax != 0 ? fabs(*ymax) * 0.1 : 1.0;
        *ymin -= d, *ymax += d;
        if (c->yzero && *ymin < 0 && *ymax - d >= 0)
            *ymin = 0;
    }
    const double st = nice_step(*ymax - *ymin, 5);
    *ymin = floor(*ymin / st + 1e-9) * st, *ymax = ceil(*ymax / st - 1e-9) * st;
    for (double v = *ymin; v <= *ymax + 1e-9 * st && n < max; v += st)
        yt[n++] = v;
    return n;
}

/* Opens a chart's plot area: the group whose data- attributes map values (x0..x1, y0..y1; log10 on a log axis)
 * to pixels (px0..px1, py0..py1), so that a reader of the page (tests/report_view.py) can read a mark back as a
 * value. Every chart opens one. */
static void area_open(struct sbuf *b, double x0, double x1, double y0, double y1, double px0, double px1, double py0,
                      double py1, int xlog, int ylog)
{
    rt_report_buf_printf(b, "<g class=\"area\" data-x0=\"%.17g\" data-x1=\"%.17g\" data-y0=\"%.17g\" "
                            "data-y1=\"%.17g\" data-px0=\"%g\" data-px1=\"%g\" data-py0=\"%g\" data-py1=\"%g\" "
                            "data-xlog=\"%d\" data-ylog=\"%d\">",
                         x0, x1, y0, y1, px0, px1, py0, py1, xlog, ylog);
}

enum { LINE_TICKS = 64 };

/* A line chart's axes: the mappings, the ticks and how their values are written. */
struct line_axes {
    struct axis x, y;
    double xt[LINE_TICKS], yt[LINE_TICKS];
    int nxt, nyt;
    chart_fmt xf, yf;
};

/* The chart's axes from its series (see struct chart_line). */
static void line_axes_make(const struct chart_line *c, struct line_axes *a)
{
    double xmin, xmax, ymin, ymax;
    line_domain(c, &xmin, &xmax, &ymin, &ymax);
    a->nxt = line_xticks(c, xmin, xmax, a->xt, LINE_TICKS);
    a->nyt = line_yticks(c, &ymin, &ymax, a->yt, LINE_TICKS);
    a->x = (struct axis){xmin, xmax, c->xlog, ML, CHART_W - MR};
    a->y = (struct axis){ymin, ymax, c->ylog, MT + PLOT_H, MT};
    a->xf = c->xfmt ? c->xfmt : rt_report_fmt_num;
    a->yf = c->yfmt ? c->yfmt : rt_report_fmt_num;
}

/* Whether x tick V lies outside the x range (an explicit tick may). */
static int xtick_out(const struct line_axes *a, double v)
{
    return v < a->x.v0 - 1e-9 * fabs(a->x.v0) || v > a->x.v1 + 1e-9 * fabs(a->x.v1);
}

/* The grid, the ticks' labels, the axes' box and both axis labels. */
static void line_axes_draw(struct sbuf *b, const struct chart_line *c, const struct line_axes *a)
{
    char t[48];
    rt_report_buf_puts(b, "<g class=\"grid\">");
    for (int i = 0; i < a->nyt; i++) {
        const double py = axis_px(&a->y, a->yt[i]);
        rt_report_buf_printf(b, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\"/>", ML, py, CHART_W - MR, py);
    }
    for (int i = 0; i < a->nxt; i++) {
        if (xtick_out(a, a->xt[i]))
            continue;
        const double px = axis_px(&a->x, a->xt[i]);
        rt_report_buf_printf(b, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>", px, MT, px, MT + PLOT_H);
    }
    rt_report_buf_puts(b, "</g><g class=\"ticks\">");
    for (int i = 0; i < a->nyt; i++) {
        a->yf(a->yt[i], t, sizeof(t));
        rt_report_buf_printf(b, "<text x=\"%d\" y=\"%.2f\" text-anchor=\"end\">", ML - 6,
                             axis_px(&a->y, a->yt[i]) + 4);
        rt_report_buf_esc(b, t);
        rt_report_buf_puts(b, "</text>");
    }
    for (int i = 0; i < a->nxt; i++) {
        if (xtick_out(a, a->xt[i]))
            continue;
        a->xf(a->xt[i], t, sizeof(t));
        rt_report_buf_printf(b, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">", axis_px(&a->x, a->xt[i]),
                             MT + PLOT_H + 16);
        rt_report_buf_esc(b, t);
        rt_report_buf_puts(b, "</text>");
    }
    rt_report_buf_puts(b, "</g>");
    rt_report_buf_printf(b, "<rect class=\"axes\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>", ML, MT,
                         CHART_W - MR - ML, PLOT_H);
    rt_report_buf_printf(b, "<text class=\"axis-label\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">",
                         (ML + CHART_W - MR) / 2, MT + PLOT_H + 36);
    rt_report_buf_esc(b, c->xlabel);
    rt_report_buf_puts(b, "</text>");
    ylabel_draw(b, c->ylabel);
}

/* The vertical marker and its label, when it falls in the x range. */
static void line_mark_draw(struct sbuf *b, const struct chart_line *c, const struct axis *ax)
{
    if (!(isfinite(c->mark_x) && c->mark_x >= ax->v0 && c->mark_x <= ax->v1))
        return;
    const double px = axis_px(ax, c->mark_x);
    rt_report_buf_printf(b, "<g class=\"mark\"><line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>"
                            "<text x=\"%.2f\" y=\"%d\"%s>",
                         px, MT, px, MT + PLOT_H, px + (px > CHART_W / 2 ? -4 : 4), MT + 12,
                         px > CHART_W / 2 ? " text-anchor=\"end\"" : "");
    rt_report_buf_esc(b, c->mark_label ? c->mark_label : "");
    rt_report_buf_puts(b, "</text></g>");
}

/* One series: <g class="series"> with its polyline and, unless thin, a dot with a tooltip at each point. */
static void line_series_draw(struct sbuf *b, const struct chart_line *c, const struct chart_series *se,
                             const struct line_axes *a)
{
    const char *col = rt_report_color(se->color);
    rt_report_buf_printf(b, "<g class=\"series\" data-run=\"%d\" data-key=\"", se->run);
    rt_report_buf_esc(b, se->key);
    rt_report_buf_puts(b, "\" data-label=\"");
    rt_report_buf_esc(b, se->label);
    rt_report_buf_printf(b, "\"><polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"", col,
                         se->thin ? "1" : "2", se->dashed ? " stroke-dasharray=\"5 3\"" : "");
    int first = 1;
    for (int i = 0; i < se->n; i++) {
        const double x = se->x[i], y = se->y[i];
        if (!point_shown(c, x, y))
            continue;
        rt_report_buf_printf(b, "%s%.2f,%.2f", first ? "" : " ", axis_px(&a->x, x), axis_px(&a->y, y));
        first = 0;
    }
    rt_report_buf_puts(b, "\"/>");
    for (int i = 0; i < se->n && !se->thin; i++) {
        const double x = se->x[i], y = se->y[i];
        if (!point_shown(c, x, y))
            continue;
        char xs[48], ys[48];
        a->xf(x, xs, sizeof(xs));
        a->yf(y, ys, sizeof(ys));
        rt_report_buf_printf(b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2.8\" fill=\"%s\"><title>", axis_px(&a->x, x),
                             axis_px(&a->y, y), col);
        rt_report_buf_esc(b, se->label);
        rt_report_buf_printf(b, ": %s at %s (%.6g)</title></circle>", ys, xs, y);
    }
    rt_report_buf_puts(b, "</g>");
}

void rt_report_chart_line(struct sbuf *b, const struct chart_line *c)
{
    struct line_axes a;
    line_axes_make(c, &a);
    struct legend_item leg[64];
    int nleg = 0;
    for (int s = 0; s < c->ns && nleg < 64; s++)
        if (c->s[s].legend)
            leg[nleg++] = (struct legend_item){c->s[s].label, rt_report_color(c->s[s].color), c->s[s].dashed, 0};
    const int h = MT + PLOT_H + 48 + legend_height(leg, nleg);
    frame_open(b, c->name, c->title, h);
    line_axes_draw(b, c, &a);
    /* The plot area and its mapping: X = log10(x) on a log axis. */
    area_open(b, a.x.v0, a.x.v1, a.y.v0, a.y.v1, a.x.p0, a.x.p1, a.y.p0, a.y.p1, c->xlog, c->ylog);
    line_mark_draw(b, c, &a.x);
    for (int s = 0; s < c->ns; s++)
        line_series_draw(b, c, &c->s[s], &a);
    rt_report_buf_puts(b, "</g>");
    legend_draw(b, leg, nleg, MT + PLOT_H + 44);
    frame_close(b, c->caption);
}

/* ---- bars ------------------------------------------------------------------------------ */

/* The tallest stack: each category's positive segments summed. */
static double bars_top(const struct chart_bars *c)
{
    double top = 0;
    for (int k = 0; k < c->ncat; k++) {
        double sum = 0;
        for (int s = 0; s < c->nseg; s++) {
            const double v = c->v[k * c->nseg + s];
            if (isfinite(v) && v > 0)
                sum += v;
        }
        top = fmax(top, sum);
    }
    return top;
}

/* The value axis from 0 to ymax in steps of st: its grid, its ticks' labels and the axes' box. */
static void bars_axis_draw(struct sbuf *b, const struct axis *ay, double ymax, double st, chart_fmt yf)
{
    char t[48];
    rt_report_buf_puts(b, "<g class=\"grid\">");
    for (double v = 0; v <= ymax + 1e-9 * st; v += st)
        rt_report_buf_printf(b, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\"/>", ML, axis_px(ay, v),
                             CHART_W - MR, axis_px(ay, v));
    rt_report_buf_puts(b, "</g><g class=\"ticks\">");
    for (double v = 0; v <= ymax + 1e-9 * st; v += st) {
        yf(v, t, sizeof(t));
        rt_report_buf_printf(b, "<text x=\"%d\" y=\"%.2f\" text-anchor=\"end\">", ML - 6, axis_px(ay, v) + 4);
        rt_report_buf_esc(b, t);
        rt_report_buf_puts(b, "</text>");
    }
    rt_report_buf_puts(b, "</g>");
    rt_report_buf_printf(b, "<rect class=\"axes\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>", ML, MT,
                         CHART_W - MR - ML, PLOT_H);
}

/* Category K's segments stacked from 0, bw wide around cx; a negative value is drawn as 0 high. */
static void bars_stack_draw(struct sbuf *b, const struct chart_bars *c, int k, double cx, double bw,
                            const struct axis *ay, chart_fmt yf)
{
    double base = 0;
    for (int s = 0; s < c->nseg; s++) {
        const double v = c->v[k * c->nseg + s];
        if (!isfinite(v))
            continue;
        const double vv = v > 0 ? v : 0, y0 = axis_px(ay, base), y1 = axis_px(ay, base + vv);
        char vs[48];
        yf(v, vs, sizeof(vs));
        rt_report_buf_printf(b, "<rect class=\"bar\" data-run=\"%d\" data-x=\"%g\" data-key=\"", c->cat_run[k],
                             c->cat_x[k]);
        rt_report_buf_esc(b, c->seg_key[k * c->nseg + s]);
        rt_report_buf_printf(b, "\" data-value=\"%.9g\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
                                "fill=\"%s\"><title>",
                             v, cx - bw / 2, y1, bw, y0 - y1, rt_report_color(s));
        rt_report_buf_esc(b, c->cat_label[k]);
        rt_report_buf_puts(b, " ");
        rt_report_buf_esc(b, c->seg_label[s]);
        rt_report_buf_printf(b, ": %s (%.6g)</title></rect>", vs, v);
        base += vv;
    }
}

/* Under the categories, each run of equal group labels: a line over its slots and the label, cut to fit. */
static void bars_groups_draw(struct sbuf *b, const struct chart_bars *c, double slot)
{
    for (int k = 0; k < c->ncat;) {
        int e = k + 1;
        while (e < c->ncat && strcmp(c->group_label[e], c->group_label[k]) == 0)
            e++;
        const double x0 = ML + slot * k + 2, x1 = ML + slot * e - 2;
        rt_report_buf_printf(b, "<g class=\"group\"><line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>"
                                "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">",
                             x0, MT + PLOT_H + 20, x1, MT + PLOT_H + 20, (x0 + x1) / 2, MT + PLOT_H + 33);
        char g[160];
        const size_t fit = (size_t)fmax(3.0, (x1 - x0) / 6.5);
        snprintf(g, sizeof(g), "%s", c->group_label[k]);
        if (strlen(g) > fit && fit >= 4)
            snprintf(g + fit - 3, sizeof(g) - (fit - 3), "...");
        rt_report_buf_esc(b, g);
        rt_report_buf_puts(b, "</text></g>");
        k = e;
    }
}

void rt_report_chart_bars(struct sbuf *b, const struct chart_bars *c)
{
    const double top = bars_top(c);
    const double st = nice_step(top > 0 ? top : 1.0, 5), ymax = ceil((top > 0 ? top : 1.0) / st - 1e-9) * st;
    const struct axis ay = {0, ymax, 0, MT + PLOT_H, MT};

    struct legend_item leg[32];
    int nleg = 0;
    for (int s = 0; s < c->nseg && nleg < 32; s++)
        leg[nleg++] = (struct legend_item){c->seg_label[s], rt_report_color(s), 0, 1};
    const int groups = c->group_label != NULL;
    const int h = MT + PLOT_H + 30 + (groups ? 16 : 0) + legend_height(leg, nleg);
    frame_open(b, c->name, c->title, h);
    chart_fmt yf = c->yfmt ? c->yfmt : rt_report_fmt_num;
    bars_axis_draw(b, &ay, ymax, st, yf);
    ylabel_draw(b, c->ylabel);

    const double slot = (double)(CHART_W - MR - ML) / (c->ncat > 0 ? c->ncat : 1);
    const double bw = fmin(slot * 0.72, 48.0);
    const int every = c->ncat > 16 ? (c->ncat + 15) / 16 : 1;
    area_open(b, 0, c->ncat, 0, ymax, ML, CHART_W - MR, ay.p0, ay.p1, 0, 0);
    for (int k = 0; k < c->ncat; k++) {
        const double cx = ML + slot * (k + 0.5);
        bars_stack_draw(b, c, k, cx, bw, &ay, yf);
        if (k % every == 0) {
            rt_report_buf_printf(b, "<text class=\"cat\" x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">", cx,
                                 MT + PLOT_H + 15);
            rt_report_buf_esc(b, c->cat_label[k]);
            rt_report_buf_puts(b, "</text>");
        }
    }
    rt_report_buf_puts(b, "</g>");
    if (groups)
        bars_groups_draw(b, c, slot);
    legend_draw(b, leg, nleg, MT + PLOT_H + 26 + (groups ? 16 : 0));
    frame_close(b, c->caption);
}

/* ---- horizontal bars ----------------------------------------------------------------------- */

/* The labels' column on the left and the values' on the right of the bars. */
enum { HB_LEFT = 118, HB_RIGHT = 96, HB_BAR = 13, HB_GAP = 7 };

/* Series S's bar of category K at its place in the group, with a tooltip and its value printed after it. */
static void hbar_draw(struct sbuf *b, const struct chart_hbars *c, int k, int s, const struct axis *ax)
{
    const double v = c->v[k * c->nser + s];
    if (!isfinite(v))
        return;
    const int px0 = HB_LEFT, group = c->nser * HB_BAR + HB_GAP;
    const double w = axis_px(ax, v > 0 ? v : 0) - px0, y = MT + HB_GAP + k * group + s * HB_BAR;
    char vs[64];
    snprintf(vs, sizeof(vs), "%.4g", v); /* the value itself, not a tick's rounding */
    if (c->share && isfinite(c->share[k * c->nser + s]))
        rt_appendf(vs, sizeof(vs), " (%.0f%%)", 100 * c->share[k * c->nser + s]);
    rt_report_buf_printf(b, "<rect class=\"hbar\" data-run=\"%d\" data-cat=\"%d\" data-key=\"", c->run, k);
    rt_report_buf_esc(b, c->key[k * c->nser + s]);
    rt_report_buf_printf(b, "\" data-value=\"%.9g\" x=\"%d\" y=\"%.2f\" width=\"%.2f\" height=\"%d\" fill=\"%s\">",
                         v, px0, y + 1, w, HB_BAR - 2, rt_report_color(c->ser_color ? c->ser_color[s] : s));
    rt_report_buf_puts(b, "<title>");
    rt_report_buf_esc(b, c->cat_label[k]);
    if (c->nser > 1) {
        rt_report_buf_puts(b, ", ");
        rt_report_buf_esc(b, c->ser_label[s]);
    }
    rt_report_buf_puts(b, ": ");
    rt_report_buf_esc(b, vs);
    rt_report_buf_printf(b, "</title></rect><text class=\"value\" x=\"%.2f\" y=\"%.2f\">", px0 + w + 4,
                         y + HB_BAR - 3);
    rt_report_buf_esc(b, vs);
    rt_report_buf_puts(b, "</text>");
}

void rt_report_chart_hbars(struct sbuf *b, const struct chart_hbars *c)
{
    double top = 0;
    for (int i = 0; i < c->ncat * c->nser; i++)
        if (isfinite(c->v[i]))
            top = fmax(top, c->v[i]);
    const double st = nice_step(top > 0 ? top : 1.0, 5), xmax = ceil((top > 0 ? top : 1.0) / st - 1e-9) * st;
    const int px0 = HB_LEFT, px1 = CHART_W - HB_RIGHT, group = c->nser * HB_BAR + HB_GAP;
    const int plot_h = RT_MAX(c->ncat, 1) * group + HB_GAP;
    const struct axis ax = {0, xmax, 0, px0, px1};

    struct legend_item leg[16];
    int nleg = 0;
    for (int s = 0; s < c->nser && nleg < 16; s++)
        leg[nleg++] = (struct legend_item){c->ser_label[s], rt_report_color(c->ser_color ? c->ser_color[s] : s), 0, 1};
    const int h = MT + plot_h + 40 + legend_height(leg, nleg);
    frame_open(b, c->name, c->title, h);
    chart_fmt xf = c->xfmt ? c->xfmt : rt_report_fmt_num;
    char t[64];
    rt_report_buf_puts(b, "<g class=\"grid\">");
    for (double v = 0; v <= xmax + 1e-9 * st; v += st)
        rt_report_buf_printf(b, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>", axis_px(&ax, v), MT,
                             axis_px(&ax, v), MT + plot_h);
    rt_report_buf_puts(b, "</g><g class=\"ticks\">");
    for (double v = 0; v <= xmax + 1e-9 * st; v += st) {
        xf(v, t, sizeof(t));
        rt_report_buf_printf(b, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">", axis_px(&ax, v), MT + plot_h + 15);
        rt_report_buf_esc(b, t);
        rt_report_buf_puts(b, "</text>");
    }
    for (int k = 0; k < c->ncat; k++) {
        rt_report_buf_printf(b, "<text class=\"cat\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">", px0 - 6,
                             MT + HB_GAP + k * group + c->nser * HB_BAR / 2.0 + 4);
        rt_report_buf_esc(b, c->cat_label[k]);
        rt_report_buf_puts(b, "</text>");
    }
    rt_report_buf_puts(b, "</g>");
    rt_report_buf_printf(b, "<rect class=\"axes\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>", px0, MT, px1 - px0,
                         plot_h);
    rt_report_buf_printf(b, "<text class=\"axis-label\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (px0 + px1) / 2,
                         MT + plot_h + 32);
    rt_report_buf_esc(b, c->xlabel);
    rt_report_buf_puts(b, "</text>");
    area_open(b, 0, xmax, 0, RT_MAX(c->ncat, 1), px0, px1, MT + plot_h, MT, 0, 0);
    for (int k = 0; k < c->ncat; k++)
        for (int s = 0; s < c->nser; s++)
            hbar_draw(b, c, k, s, &ax);
    rt_report_buf_puts(b, "</g>");
    legend_draw(b, leg, nleg, MT + plot_h + 38);
    frame_close(b, c->caption);
}

/* ---- a timeline -------------------------------------------------------------------------- */

enum { TL_LEFT = 150, TL_ROW = 20, TL_DEPTH = 8 };

void rt_report_chart_timeline(struct sbuf *b, const struct chart_timeline *c)
{
    struct legend_item leg[CHART_COLORS];
    int nleg = 0;
    for (int k = 0; k < c->ncat && nleg < CHART_COLORS; k++)
        leg[nleg++] = (struct legend_item){c->cat_label[k], rt_report_color(k), 0, 1};
    const int plot_h = c->nrow * TL_ROW, h = MT + plot_h + 48 + legend_height(leg, nleg);
    frame_open(b, c->name, c->title, h);
    const double ms = c->t1 / 1000.0, st = nice_step(ms, 6);
    const struct axis ax = {0, c->t1, 0, TL_LEFT, CHART_W - MR};
    rt_report_buf_puts(b, "<g class=\"grid\">");
    for (double v = 0; v <= ms + 1e-9 * st; v += st)
        rt_report_buf_printf(b, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>", axis_px(&ax, v * 1000.0), MT,
                             axis_px(&ax, v * 1000.0), MT + plot_h);
    rt_report_buf_puts(b, "</g><g class=\"ticks\">");
    char t[48];
    for (double v = 0; v <= ms + 1e-9 * st; v += st) {
        rt_report_fmt_num(v, t, sizeof(t));
        rt_report_buf_printf(b, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">", axis_px(&ax, v * 1000.0),
                             MT + plot_h + 16);
        rt_report_buf_esc(b, t);
        rt_report_buf_puts(b, "</text>");
    }
    for (int r = 0; r < c->nrow; r++) {
        rt_report_buf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">", TL_LEFT - 6, MT + r * TL_ROW + 14);
        rt_report_buf_esc(b, c->row_label[r]);
        rt_report_buf_puts(b, "</text>");
    }
    rt_report_buf_puts(b, "</g>");
    rt_report_buf_printf(b, "<rect class=\"axes\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>", TL_LEFT, MT,
                         CHART_W - MR - TL_LEFT, plot_h);
    rt_report_buf_printf(
        b, "<text class=\"axis-label\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">ms from the window's start</text>",
        (TL_LEFT + CHART_W - MR) / 2, MT + plot_h + 36);
    /* x: microseconds from the window's start; y: rows from the top (row r spans r to r + 1). */
    area_open(b, 0, c->t1, c->nrow, 0, TL_LEFT, CHART_W - MR, MT + plot_h, MT, 0, 0);
    /* Nesting depth per row: the spans still open when each starts. */
    double open[TL_DEPTH];
    int depth = 0, row = -1;
    for (int i = 0; i < c->nsp; i++) {
        const struct chart_span *s = &c->sp[i];
        if (s->row != row)
            row = s->row, depth = 0;
        while (depth > 0 && open[depth - 1] <= s->t0)
            depth--;
        const int d = RT_MIN(depth, TL_DEPTH - 1);
        if (depth < TL_DEPTH)
            open[depth++] = s->t1;
        const double x0 = axis_px(&ax, s->t0), x1 = axis_px(&ax, s->t1), hh = fmax(4.0, 16.0 - 3.0 * d);
        const double y = MT + s->row * TL_ROW + 2 + (16.0 - hh) / 2;
        rt_report_buf_printf(
            b,
            "<rect class=\"span\" data-row=\"%d\" data-t0=\"%.17g\" data-t1=\"%.17g\" x=\"%.2f\" y=\"%.2f\" "
            "width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>",
            s->row, s->t0, s->t1, x0, y, fmax(x1 - x0, 0.6), hh, rt_report_color(s->cat));
        rt_report_buf_esc(b, s->name);
        rt_report_buf_printf(b, " (%s): %.3f ms</title></rect>", c->cat_label[s->cat], (s->t1 - s->t0) / 1000.0);
    }
    rt_report_buf_puts(b, "</g>");
    legend_draw(b, leg, nleg, MT + plot_h + 44);
    frame_close(b, c->caption);
}
