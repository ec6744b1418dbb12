/*
 * cmd_eval.c - `ringtrain eval`: loss and accuracy of a checkpoint on a
 * dataset's test split.
 */
#include <getopt.h>
#include <stdio.h>

#include "common/common.h"
#include "tools/cli.h"
#include "tools/trainer.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: ringtrain eval --data DIR --checkpoint FILE [options]\n"
               "Prints the loss and accuracy of a checkpoint (model.safetensors from `ringtrain train`)\n"
               "on the dataset's test split.\n\n"
               "  --data DIR          packed dataset\n"
               "  --checkpoint FILE   model.safetensors\n"
               "  --model NAME        check that the checkpoint holds this model\n"
               "  --batch-size N      (default 256)\n"
               "  --workers N         loader threads (default 1)\n"
               "  --threads N         compute threads (default: the CPUs this process may use)\n"
               "  --device D          auto (default: a GPU when there is one), cpu or cuda\n"
               "  --json              also print one JSON line\n");
}

int cmd_eval(int argc, char **argv)
{
    enum { O_DATA = 256, O_CKPT, O_MODEL, O_BATCH, O_WORK, O_THR, O_JSON, O_DEV, O_HELP };
    static const struct option opts[] = {
        {"data", required_argument, NULL, O_DATA},     {"checkpoint", required_argument, NULL, O_CKPT},
        {"model", required_argument, NULL, O_MODEL},   {"batch-size", required_argument, NULL, O_BATCH},
        {"workers", required_argument, NULL, O_WORK},  {"threads", required_argument, NULL, O_THR},
        {"json", no_argument, NULL, O_JSON},           {"help", no_argument, NULL, O_HELP},
        {"device", required_argument, NULL, O_DEV},
        {NULL, 0, NULL, 0}};
    struct eval_cfg c = {.batch = 256};
    uint64_t v;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case O_DATA: c.data = optarg; break;
        case O_CKPT: c.checkpoint = optarg; break;
        case O_MODEL: c.model = optarg; break;
        case O_BATCH:
            if (cli_parse_u64("eval", "--batch-size", optarg, &v))
                return RT_EXIT_USAGE;
            if (v < 1 || v > 65536)
                return cli_usage_error("eval", "--batch-size must be 1..65536");
            c.batch = (uint32_t)v;
            break;
        case O_WORK:
            if (cli_parse_u64("eval", "--workers", optarg, &v))
                return RT_EXIT_USAGE;
            c.workers = (int)RT_MIN(v, 256);
            break;
        case O_THR:
            if (cli_parse_u64("eval", "--threads", optarg, &v))
                return RT_EXIT_USAGE;
            c.threads = (int)RT_MIN(v, 1024);
            break;
        case O_JSON: c.json = 1; break;
        case O_DEV:
            if (train_device_parse(optarg, &c.device) < 0)
                return cli_usage_error("eval", "%s", rt_errmsg());
            break;
        case O_HELP: usage(stdout); return RT_EXIT_OK;
        default: usage(stderr); return RT_EXIT_USAGE;
        }
    }
    if (optind < argc)
        return cli_usage_error("eval", "unexpected argument '%s'", argv[optind]);
    if (!c.data || !c.checkpoint)
        return cli_usage_error("eval", "--data DIR and --checkpoint FILE are required");
    return eval_run(&c);
}
