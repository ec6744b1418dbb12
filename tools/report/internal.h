/*
 * internal.h - what report.c (reading the inputs) and page.c (drawing them,
 * and writing the page) share: the runs, benchmark outputs and traced steps
 * a report holds, and the accessors of their JSON. page.c calls report.c and
 * svg.c; report.c calls neither.
 */
#ifndef RT_TOOLS_REPORT_INTERNAL_H
#define RT_TOOLS_REPORT_INTERNAL_H

#include <jansson.h>

#include "tools/report/report.h"
#include "tools/report/svg.h"

enum { MAX_RUNS = 32, MAX_BENCH = 16 };

struct run {
    char label[160];
    char src[512];
    int labelled;     /* the caller named it */
    json_t *records;  /* epoch records, sorted by epoch, one per epoch */
    json_t *summary, *state;
    char trace[512];  /* a --trace file given with the run */
};

struct bench {
    char src[512];
    json_t *j;
};

enum { TL_MAX_SPANS = 4000, TL_MAX_ROWS = 24, TL_MAX_CATS = CHART_COLORS };

/*
 * One optimizer step of a --trace file, read when the file is added: the lowest rank's (pid's) step of median
 * length and every span of that rank's threads in a window around it, a row per thread in the trace's own order.
 * Files past 256 MB are left to Perfetto: nsteps 0. The strings point into `strings`, which the timeline owns.
 */
struct timeline {
    char src[512];                         /* the file */
    int nsteps;                            /* the rank's steps in the file; 0: nothing to draw */
    double step_us;                        /* the step drawn: its length ... */
    const char *step_name;                 /* ... and its name ("step 7") */
    const char *proc;                      /* the trace's name of the rank ("rank 3 (host)"), else rank_name */
    char rank_name[48];                    /* "rank 0" */
    double t1;                             /* the window's length, microseconds */
    int nrow, ncat, nsp;
    const char *row_label[TL_MAX_ROWS];    /* the thread's name, else thread_no */
    char thread_no[TL_MAX_ROWS][24];       /* "thread 12" */
    const char *cat_label[TL_MAX_CATS];
    struct chart_span *sp;                 /* nsp spans, ordered as rt_report_chart_timeline() wants (owned) */
    json_t *strings;                       /* the trace's strings the pointers above point into (owned) */
};

struct rt_report {
    char title[256];
    struct run run[MAX_RUNS];
    int nrun;
    struct bench loadbench[MAX_BENCH], commbench[MAX_BENCH], scaling[MAX_BENCH];
    int nload, ncomm, nscal;
    struct bench profcmp[MAX_BENCH]; /* bench/gpu_vs_pytorch.sh --only profile: ringtrain's op profile and PyTorch's */
    int nprof;
    struct timeline *trace[MAX_BENCH]; /* --trace files: one step's timeline each (owned) */
    int ntrace;
};

/* Defined in report.c, called by page.c. */
int rt_report_inputs(const struct rt_report *r);          /* the inputs taken so far, of every kind */
double rt_report_num(const json_t *o, const char *key);   /* a number member, NAN when absent or null */
/* A value by a path: "profile.data.p50_ms", "rank_images_per_s[3]". NAN when absent or null. */
double rt_report_path_num(const json_t *o, const char *path);
const json_t *rt_report_run_command(const struct run *u); /* the run's command line (an array), or NULL */
void rt_report_make_labels(struct rt_report *r);          /* labels for the runs the caller did not name */

#endif
