/*
 * svg.h - the report's text buffer and its four kinds of chart, written as
 * inline SVG: lines over a linear or logarithmic x (epochs, worker counts,
 * message sizes, ranks), bars (stacked or not), horizontal bars (the sides of
 * a comparison side by side) and a timeline of spans. Nothing here reads a
 * file or knows a metric: page.c hands in numbers, names and keys.
 *
 * Every chart carries its value-to-pixel mapping on its plot area (<g
 * class="area" data-x0 ... data-py1>) and every series its run and key, so
 * that a test can read the values back out of the drawn coordinates
 * (tests/report_view.py).
 */
#ifndef RT_TOOLS_REPORT_SVG_H
#define RT_TOOLS_REPORT_SVG_H

#include <stddef.h>

/* A growing string; on no memory it stops growing and sets oom. */
struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
};
void rt_report_buf_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void rt_report_buf_puts(struct sbuf *b, const char *s);
void rt_report_buf_esc(struct sbuf *b, const char *s); /* s with & < > " ' escaped for HTML and SVG */
void rt_report_buf_free(struct sbuf *b);

/* Formats a tick value into buf. */
typedef void (*chart_fmt)(double v, char *buf, size_t len);
void rt_report_fmt_num(double v, char *buf, size_t len);   /* 0.25, 1.5k, 2M */
void rt_report_fmt_pct(double v, char *buf, size_t len);   /* a fraction as a percentage: 0.5 -> 50% */
void rt_report_fmt_bytes(double v, char *buf, size_t len); /* 1 KiB, 64 MiB */

enum { CHART_W = 600, CHART_H = 330, CHART_COLORS = 10 };
const char *rt_report_color(int i); /* the palette, i mod CHART_COLORS */

struct chart_series {
    const char *label; /* legend text */
    int run;           /* data-run */
    const char *key;   /* data-key */
    int n;
    const double *x, *y;
    int color;         /* palette index */
    int dashed, thin;  /* thin: no markers, 1 px (many ranks) */
    int legend;        /* appears in the legend */
};

struct chart_line {
    const char *name;             /* id="chart-NAME" */
    const char *title, *xlabel, *ylabel;
    int xlog, ylog;               /* base-10 mapping; ticks at the powers of 2 or 10 */
    int xint;                     /* integer x (epochs, ranks): ticks at integers */
    const double *xticks;         /* explicit ticks (NULL: chosen) */
    int nxticks;
    chart_fmt xfmt, yfmt;         /* NULL: rt_report_fmt_num */
    int yzero;                    /* the y range includes 0 */
    double ymax_at_least;         /* the y range reaches this (0: no) */
    const struct chart_series *s;
    int ns;
    double mark_x;                /* a vertical marker at this x (NAN: none) ... */
    const char *mark_label;       /* ... and its label */
    const char *caption;          /* plain text */
};
void rt_report_chart_line(struct sbuf *b, const struct chart_line *c);

/* Bars: ncat categories left to right, each a stack of nseg segments. */
struct chart_bars {
    const char *name, *title, *ylabel;
    int ncat, nseg;
    const char *const *cat_label;  /* under each bar */
    const char *const *group_label; /* NULL, or a label per category, drawn once per run of equal labels */
    const int *cat_run;            /* data-run of each category */
    const double *cat_x;           /* data-x of each category */
    const char *const *seg_label;  /* legend */
    const char *const *seg_key;    /* data-key per category x segment: [cat * nseg + seg] */
    const double *v;               /* [cat * nseg + seg]; NAN: absent */
    chart_fmt yfmt;
    const char *caption;
};
void rt_report_chart_bars(struct sbuf *b, const struct chart_bars *c);

/*
 * Horizontal bars: ncat categories top to bottom, each a group of nser bars side by side (one per series: the
 * two sides of a comparison), the value along x from 0, printed after each bar. Each bar is <rect class="hbar"
 * data-run data-cat data-key data-value> whose drawn width is its value through the plot area's x mapping (the y
 * mapping counts categories from the bottom: category k spans ncat - k - 1 to ncat - k).
 */
struct chart_hbars {
    const char *name, *title, *xlabel;
    int ncat, nser;
    const char *const *cat_label;   /* left of each group */
    const char *const *ser_label;   /* the legend (drawn when nser > 1) */
    const int *ser_color;           /* palette index per series (NULL: the series' index) */
    const char *const *key;         /* data-key per bar: [cat * nser + ser] */
    const double *v;                /* [cat * nser + ser]; NAN: absent */
    const double *share;            /* NULL, or a fraction per bar printed beside its value ("12%") */
    int run;                        /* data-run of every bar */
    chart_fmt xfmt;                 /* NULL: rt_report_fmt_num */
    const char *caption;
};
void rt_report_chart_hbars(struct sbuf *b, const struct chart_hbars *c);

/* A timeline: rows (threads) of spans over time, nested spans drawn thinner on top of their parents. */
struct chart_span {
    int row, cat; /* cat: palette index and legend entry */
    double t0, t1; /* microseconds from the window's start */
    const char *name;
};
struct chart_timeline {
    const char *name, *title;
    int nrow;
    const char *const *row_label;
    int ncat;
    const char *const *cat_label;
    const struct chart_span *sp; /* sorted by row, then start, the longer first */
    int nsp;
    double t1;                   /* the window's length, microseconds */
    const char *caption;
};
void rt_report_chart_timeline(struct sbuf *b, const struct chart_timeline *c);

#endif
