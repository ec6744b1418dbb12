/* cmd_verify.c - `ringtrain verify DIR`: one line per problem, exit 1 if any. */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "loader/offline.h"
#include "tools/cli.h"

static void print_problem(void *ctx, const char *line)
{
    (void)ctx;
    printf("FAIL %s\n", line);
}

int cmd_verify(int argc, char **argv)
{
    struct rt_dataset *ds;
    int problems;

    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("Usage: ringtrain verify DIR\n\n"
               "Checks every shard of the dataset at DIR against its manifest (sizes, whole-file checksums,\n"
               "shape, record ranges, class counts) and itself (header, labels, block index, every block's\n"
               "checksum and decode). Prints one line per problem; exits 0 when all is well, 1 otherwise.\n\n"
               "Options:\n"
               "  -h, --help  print this help\n\n"
               "Examples:\n"
               "  $ ringtrain verify data/cifar10\n");
        return RT_EXIT_OK;
    }
    if (argc != 2)
        return cli_usage_error("verify", "exactly one dataset directory, please");
    uint64_t t0 = rt_now_ns();
    if (rt_dataset_open(argv[1], &ds) < 0) {
        printf("FAIL %s\n", rt_errmsg());
        return RT_EXIT_FAIL;
    }
    const struct rt_dataset_info *info = rt_dataset_info(ds);
    problems = rt_dataset_verify(ds, print_problem, NULL);
    if (problems < 0) {
        rt_dataset_close(ds);
        return cli_fail();
    }
    uint32_t shards = 0;
    uint64_t records = 0;
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        shards += info->split[sp].nshards;
        records += info->split[sp].records;
    }
    double secs = (double)(rt_now_ns() - t0) * 1e-9;
    if (problems == 0)
        printf("OK %s: %u shards, %llu records, all checksums match (%.2f s, %.0f MB/s)\n", argv[1], shards,
               (unsigned long long)records, secs, secs > 0 ? (double)info->stored_bytes / secs / 1e6 : 0.0);
    else
        printf("%d problem%s in %s\n", problems, problems == 1 ? "" : "s", argv[1]);
    rt_dataset_close(ds);
    return problems ? RT_EXIT_FAIL : RT_EXIT_OK;
}
