/*
 * cmd_eval.c - `ringtrain eval`: loss and accuracy of a checkpoint on a
 * dataset's test split (the driver's train_evaluate_checkpoint), printed.
 */
#include <getopt.h>
#include <stdio.h>

#include "common/common.h"
#include "tools/cli.h"

static void usage(FILE *f)
{
    fprintf(f, "Usage: ringtrain eval --data DIR --checkpoint FILE [options]\n\n"
               "Prints the loss and accuracy of a checkpoint (model.safetensors from `ringtrain train`)\n"
               "on the dataset's test split. A state_dict saved elsewhere (PyTorch's names, no ringtrain\n"
               "metadata) is scored too: --model names its architecture, the dataset gives its image size,\n"
               "classes and normalisation.\n\n"
               "Options:\n"
               "  --data DIR          packed dataset (its test split is scored)\n"
               "  --checkpoint FILE   the model.safetensors a `ringtrain train --checkpoint-dir` wrote, or a\n"
               "                      safetensors state_dict from PyTorch (python3 -m ringtrain.convert for a .pth)\n"
               "  --model NAME        check that the checkpoint holds this model (required for PyTorch's files)\n"
               "  --batch-size N      images per batch (default 256)\n"
               "  --workers N         loader threads (default 1)\n"
               "  --threads N         compute threads (default: the CPUs this process may use)\n"
               "  --device D          auto (default: a GPU when there is one), cpu or cuda\n"
               "  --amp P             auto (default: bf16 where the device computes it, as train's), off, bf16, fp16\n"
               "  --tf32 on|off       GPU: fp32 convolutions on TF32 tensor cores, as train's (default on;\n"
               "                      off: strict fp32; no effect on the CPU)\n"
               "  --deterministic on|off\n"
               "                      GPU: only cuDNN algorithms that repeat bit for bit (default on; no\n"
               "                      effect on the CPU)\n"
               "  --json              also print one JSON line\n"
               "  -h, --help          print this help\n\n"
               "Examples:\n"
               "  $ ringtrain eval --data data/mnist --checkpoint ckpt/model.safetensors --amp off\n"
               "  $ ringtrain eval --data data/photos --checkpoint resnet18.safetensors --model resnet18\n");
}

int cmd_eval(int argc, char **argv)
{
    enum { O_CKPT = 256, O_AMP, O_HELP };
    static const struct option opts[] = {CLI_RUN_OPTIONS,
                                         {"checkpoint", required_argument, NULL, O_CKPT},
                                         {"amp", required_argument, NULL, O_AMP},
                                         {"help", no_argument, NULL, O_HELP},
                                         {NULL, 0, NULL, 0}};
    struct cli_run_opts run = {.batch = 256};
    const char *checkpoint = NULL;
    enum train_amp amp = AMP_AUTO;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (ch == O_CKPT) {
            checkpoint = optarg;
        } else if (ch == O_AMP) {
            if (train_amp_parse(optarg, &amp) < 0)
                return cli_usage_error("eval", "%s", rt_errmsg());
        } else if (ch == O_HELP || ch == 'h') {
            usage(stdout);
            return RT_EXIT_OK;
        } else {
            int r = cli_run_option("eval", ch, optarg, &run);
            if (r != 1) {
                if (r == 0)
                    usage(stderr);
                return RT_EXIT_USAGE;
            }
        }
    }
    if (optind < argc)
        return cli_usage_error("eval", "unexpected argument '%s'", argv[optind]);
    if (!run.data || !checkpoint)
        return cli_usage_error("eval", "--data DIR and --checkpoint FILE are required");
    struct eval_cfg c = {.data = run.data, .checkpoint = checkpoint, .model = run.model, .batch = run.batch,
                         .workers = run.workers, .threads = run.threads, .device = run.device, .amp = amp,
                         .tf32 = !run.no_tf32, .nondeterministic = run.nondeterministic};
    struct eval_result r;
    if (train_evaluate_checkpoint(&c, &r) < 0)
        return cli_fail();
    printf("%s on %s test split: %.0f images, loss %.4f, accuracy %.2f%% (%.1fs, %.0f img/s)\n", r.model, c.data,
           r.images, r.loss, 100 * r.accuracy, r.seconds, r.seconds > 0 ? r.images / r.seconds : 0);
    if (run.json)
        printf("{\"model\":\"%s\",\"images\":%.0f,\"loss\":%.6f,\"accuracy\":%.6f,\"time_s\":%.3f}\n", r.model,
               r.images, r.loss, r.accuracy, r.seconds);
    return RT_EXIT_OK;
}
