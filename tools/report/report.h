/*
 * report.h - `ringtrain report`: one self-contained HTML page (inline SVG
 * charts, inline CSS, no script, nothing fetched) from what runs already
 * write: the --metrics JSON Lines, the --json summary, a checkpoint's
 * state.json, and the JSON of `loadbench --json`, `commbench --json` and
 * `bench/scaling.sh --json`. `train --report FILE` hands its own records in.
 *
 * The page's structure is a contract the tests read (tests/report_view.py):
 * each chart is <figure class="chart" id="chart-NAME"> with one <svg
 * class="plot">; its plot area <g class="area"> carries the value-to-pixel
 * mapping (data-x0 data-x1 data-px0 data-px1, the same for y, data-xlog,
 * data-ylog); each line series is <g class="series" data-run data-key
 * data-label> holding one <polyline>; each stacked segment is <rect
 * class="bar" data-run data-x data-key data-value>; docs/PROFILING.md says more.
 */
#ifndef RT_TOOLS_REPORT_H
#define RT_TOOLS_REPORT_H

#include <stddef.h>

#include <jansson.h>

struct rt_report;

/*
 * Errors: the functions below return 0 or -errno, the message (naming the file) in rt_errmsg()
 * (common/common.h).
 */

/* A report titled TITLE (NULL: "ringtrain report"). NULL on no memory. */
struct rt_report *rt_report_new(const char *title);
void rt_report_free(struct rt_report *r); /* NULL is fine */

/*
 * One training run from memory: RECORDS a JSON array of the epoch records
 * (the --metrics objects), SUMMARY the --json summary object, STATE a
 * checkpoint's state.json; SUMMARY and STATE may be NULL. LABEL NULL: made
 * from the options that differ between the runs. The objects are referenced,
 * not copied. 0; -EINVAL when all three are missing, -E2BIG past the runs a
 * page holds (32).
 */
int rt_report_add_train(struct rt_report *r, const char *label, json_t *records, json_t *summary, json_t *state);

/*
 * One RUN argument of `ringtrain report`: a file, a directory, or files joined
 * with commas that make up one run (metrics,summary,checkpoint-dir). What each
 * file holds is read from its content. 0, or -errno: the path's own (-ENOENT
 * ...), -EINVAL for a file ringtrain does not write or two metrics files in
 * one run, -ENOENT for a directory holding none, -EISDIR for a directory in a
 * comma list without state.json, -E2BIG past a page's limits, -ENOMEM.
 */
int rt_report_add_path(struct rt_report *r, const char *arg);

/*
 * Writes the page to PATH (beside itself, renamed into place). 0, or -EINVAL
 * when nothing was added, -ENOMEM, or rt_file_write_atomic()'s -errno.
 */
int rt_report_write(struct rt_report *r, const char *path);

#endif
