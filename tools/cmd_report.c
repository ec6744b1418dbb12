/*
 * cmd_report.c - `ringtrain report RUN... -o FILE`: parses the options and
 * hands each RUN to tools/report/ (report.h), which reads it and writes the
 * page.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"
#include "tools/cli.h"
#include "tools/report/report.h"

static void usage(FILE *f)
{
    fprintf(f, "Usage: ringtrain report RUN... [-o FILE] [--title TEXT]\n\n"
               "One self-contained HTML page (inline SVG charts, no script, nothing fetched: it opens from a\n"
               "cluster's scratch directory in any browser) from what runs wrote:\n"
               "  - train: loss and accuracy per epoch (runs overlaid, labelled by the options in which their\n"
               "    command lines differ), images/s per rank, learning rate, fp16 loss scale, the step profile\n"
               "    (p50 and p99 of each phase per epoch) with the verdict, GPU utilisation, memory and power\n"
               "    (NVML), and the banner's facts as a table;\n"
               "  - loadbench --json: images/s against workers and the stage shares;\n"
               "  - commbench --json: bus bandwidth against message size, the bucket size marked;\n"
               "  - bench/scaling.sh --json: speedup and efficiency against ranks;\n"
               "  - train --profile-ops --json: the per-op profile, ms per step by category, the top ops and\n"
               "    the convolutions' algorithms;\n"
               "  - bench/gpu_vs_pytorch.sh --only profile's comparison file: ringtrain's and PyTorch's\n"
               "    categories side by side per model and precision, the largest differences named.\n"
               "A RUN is a file, a directory, or files of one run joined with commas. What a file holds is read\n"
               "from its content: --metrics JSON Lines, the --json summary (the file, or captured output whose\n"
               "last JSON line it is), a checkpoint directory's state.json, the benchmarks' --json, a --trace\n"
               "file (named on the page), a profile comparison (its \"profile_comparison\" member). A directory\n"
               "is one run: its .json/.jsonl/.out/.log/.txt files and the state.json of a checkpoint directory\n"
               "inside it; other files are passed over.\n"
               "`train --report FILE` writes the same page for the run it ends.\n\n"
               "Options:\n"
               "  -o, --output FILE  the page to write (default report.html; written beside, renamed into place)\n"
               "  --title TEXT       the page's title (default \"ringtrain report\")\n"
               "  -h, --help         print this help\n\n"
               "Examples:\n"
               "  $ ringtrain train --data data/cifar10 --metrics run/metrics.jsonl --checkpoint-dir run/ckpt --json > run/train.out\n"
               "  $ ringtrain report run -o run/report.html\n"
               "  $ ringtrain report a/metrics.jsonl,a/train.out b/metrics.jsonl,b/train.out lb.json -o compare.html\n");
}

int cmd_report(int argc, char **argv)
{
    static const struct option opts[] = {{"output", required_argument, NULL, 'o'},
                                         {"title", required_argument, NULL, 't'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *out = "report.html", *title = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 't': title = optarg; break;
        case 'h': usage(stdout); return RT_EXIT_OK;
        default: return RT_EXIT_USAGE;
        }
    }
    if (optind >= argc)
        return cli_usage_error("report", "name at least one RUN: a --metrics file, a run's directory, files joined with commas");
    struct rt_report *r = rt_report_new(title);
    int rc = RT_EXIT_OK;
    for (int i = optind; i < argc && rc == RT_EXIT_OK; i++)
        if (rt_report_add_path(r, argv[i]) < 0)
            rc = RT_EXIT_FAIL;
    if (rc == RT_EXIT_OK && rt_report_write(r, out) < 0)
        rc = RT_EXIT_FAIL;
    if (rc != RT_EXIT_OK)
        fprintf(stderr, "ringtrain report: %s\n", rt_errmsg());
    rt_report_free(r);
    return rc;
}
