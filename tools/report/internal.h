/*
 * internal.h - what report.c (reading the inputs) and page.c (drawing them)
 * share: the runs and benchmark outputs a report holds.
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

struct rt_report {
    char title[256];
    struct run run[MAX_RUNS];
    int nrun;
    struct bench loadbench[MAX_BENCH], commbench[MAX_BENCH], scaling[MAX_BENCH];
    int nload, ncomm, nscal;
    struct bench profcmp[MAX_BENCH]; /* bench/gpu_vs_pytorch.sh --only profile: ringtrain's op profile and PyTorch's */
    int nprof;
    char trace[MAX_BENCH][512]; /* --trace files: one step's timeline each */
    int ntrace;
};

double rep_num(const json_t *o, const char *key); /* a number member, NAN when absent or null */
/* A value by a path: "profile.data.p50_ms", "rank_images_per_s[3]". NAN when absent or null. */
double rep_path_num(const json_t *o, const char *path);
const json_t *rep_command_of(const struct run *u); /* the run's command line (an array), or NULL */
void rep_make_labels(struct rt_report *r);        /* labels for the runs the caller did not name */
/* The whole page into OUT (the caller frees it); PATH only names it in errors. 0, or -ENOMEM with rt_errmsg() set. */
int rep_page(struct rt_report *r, struct sbuf *out, const char *path);

#endif
