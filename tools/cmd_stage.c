/*
 * cmd_stage.c - `ringtrain stage SRC`: options -> rt_local_copy_dataset(),
 * then a summary line and, as the last line of stdout, the staged directory
 * (the only line with --quiet) so that scripts can take it with $(...).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "staging/local_copy.h"
#include "tools/cli.h"

static void stage_help(void)
{
    printf("Usage: ringtrain stage SRC [options]\n\n"
           "Copies the packed dataset at SRC (manifest.json and its shards) to node-local storage and prints\n"
           "where it went. The copy is PARENT/ringtrain-<uid>/<h>, <uid> being your user id and <h> the 16 hex\n"
           "digits of the XXH64 of SRC/manifest.json, so the same dataset always lands in the same place, a\n"
           "repacked one in a new one, and each user has copies of their own. The last line of standard output\n"
           "is that directory's absolute path; with --quiet it is the only line:\n\n"
           "  $ DATA=$(ringtrain stage /shared/datasets/cifar10 --quiet) && ringtrain verify \"$DATA\"\n\n"
           "Each file is written as <file>.partial, its bytes hashed as written and checked against the\n"
           "manifest's size and XXH64, fsynced and renamed; manifest.json comes last (read back and checked\n"
           "against <h>), so a staged directory with manifest.json is complete. Running stage again copies\n"
           "nothing: it checks every staged file's size and, unless --trust-size, its XXH64, and copies again\n"
           "any that do not match. Processes staging the same dataset at once (every rank of a node) take turns\n"
           "on PARENT/ringtrain-<uid>/<h>.lock: one copies, the others wait, then check sizes only when the one\n"
           "they waited for checked every byte (not --trust-size), else in full. An interrupted copy (even\n"
           "kill -9) resumes: files already complete are kept, *.partial ones copied afresh. Free space is\n"
           "checked before copying. Old copies are never deleted; remove them with rm -rf.\n\n"
           "Shared nodes: PARENT/ringtrain-<uid> and the copies in it are created 0700 and refused when they are\n"
           "links, owned by another user or writable by group or others (the error names the path and its\n"
           "owner); PARENT itself must be yours or root's, and sticky if others may write it (as /tmp is).\n"
           "No link is followed under PARENT/ringtrain-<uid>, and files are created exclusively, so another\n"
           "user can neither change a checked copy nor make staging write through a link.\n\n"
           "Exit status: 0 staged, 1 failed (\"error: ...\" on stderr), 2 bad usage.\n\n"
           "Options:\n"
           "  -t, --to DIR            PARENT: the copy goes to DIR/ringtrain-<uid>/<h>, DIR is created if missing\n"
           "                          (default: $SLURM_TMPDIR, else $TMPDIR, else /tmp)\n"
           "  -d, --queue-depth N     blocks in flight, 1-4096 (default 32)\n"
           "  -b, --block-size BYTES  bytes per read and write, a multiple of 4K up to 64M (default 1M)\n"
           "  -s, --trust-size        check files already staged by size only, not by checksum\n"
           "  -a, --attempts N        copies of a file whose bytes do not match the manifest before giving up\n"
           "                          (default 3)\n"
           "  -T, --timeout SECONDS   give up when another process has held the destination's lock this long\n"
           "                          (default: wait until it finishes)\n"
           "  -e, --engine E          auto (io_uring, or read/write with a notice where io_uring is unavailable;\n"
           "                          default), uring, plain\n"
           "  -q, --quiet             print only the path (warnings still go to stderr)\n"
           "  -h, --help              print this help\n\n"
           "Environment:\n"
           "  SLURM_TMPDIR, TMPDIR     the default PARENT, in that order (else /tmp)\n"
           "  RINGTRAIN_TEST_SLOW_COPY test hook: sleep this many milliseconds after each block copied,\n"
           "                          so that tests can interrupt a copy midway\n");
}

static void print_summary(const struct rt_local_copy_result *r)
{
    const uint32_t block = r->block_bytes;
    char total[32], copied[32], bs[32];
    const char *how = r->files_hashed ? "size and XXH64" : "size";

    rt_format_bytes((double)r->bytes_total, total, sizeof(total));
    rt_format_bytes((double)r->bytes_copied, copied, sizeof(copied));
    if (r->files_copied == 0) {
        printf("stage: already staged, copied 0 bytes: %u files, %s, checked by %s in %.2f s", r->files, total,
               how, r->check_seconds);
        if (r->waited)
            printf(" (staged by another process while this one waited %.2f s)", r->wait_seconds);
        printf("\n");
        return;
    }
    if (block % (1u << 20) == 0)
        snprintf(bs, sizeof(bs), "%u MiB", block >> 20);
    else
        snprintf(bs, sizeof(bs), "%u KiB", block >> 10); /* a multiple of 4 KiB */
    printf("stage: copied %u of %u files, %s in %.2f s, %.1f MB/s", r->files_copied, r->files, copied,
           r->copy_seconds, r->copy_seconds > 0 ? (double)r->bytes_copied / r->copy_seconds / 1e6 : 0.0);
    if (r->engine == RT_LOCAL_COPY_ENGINE_URING)
        printf(" (io_uring, queue depth %u, %s blocks)", r->queue_depth, bs);
    else if (r->engine == RT_LOCAL_COPY_ENGINE_PLAIN)
        printf(" (read/write, %s blocks)", bs);
    if (r->files_copied < r->files)
        printf("; kept %u already staged, checked by %s", r->files - r->files_copied, how);
    if (r->files_damaged)
        printf("; %u damaged, copied again", r->files_damaged);
    if (r->partials_removed)
        printf("; %u partial file%s of an interrupted run discarded", r->partials_removed,
               r->partials_removed == 1 ? "" : "s");
    if (r->retries)
        printf("; %u copies repeated after a checksum mismatch", r->retries);
    if (r->waited)
        printf("; waited %.2f s for another process", r->wait_seconds);
    printf("\n");
}

int cmd_stage(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"to", required_argument, NULL, 't'},          {"queue-depth", required_argument, NULL, 'd'},
        {"block-size", required_argument, NULL, 'b'},  {"trust-size", no_argument, NULL, 's'},
        {"attempts", required_argument, NULL, 'a'},    {"timeout", required_argument, NULL, 'T'},
        {"engine", required_argument, NULL, 'e'},      {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},              {NULL, 0, NULL, 0},
    };
    struct rt_local_copy_opts o = {0};
    struct rt_local_copy_result r;
    int quiet = 0, c;
    uint64_t v;
    char *end;

    optind = 1;
    while ((c = getopt_long(argc, argv, "t:d:b:sa:T:e:qh", longopts, NULL)) != -1) {
        switch (c) {
        case 't': o.parent = optarg; break;
        case 'd':
            if (cli_parse_u64("stage", "--queue-depth", optarg, &v))
                return RT_EXIT_USAGE;
            if (v < 1 || v > 4096)
                return cli_usage_error("stage", "--queue-depth must be in 1..4096");
            o.queue_depth = (uint32_t)v;
            break;
        case 'b':
            if (rt_parse_size(optarg, &v) < 0)
                return cli_usage_error("stage", "--block-size: %s", rt_errmsg());
            if (v < 4096 || v > 64u << 20 || v % 4096)
                return cli_usage_error("stage", "--block-size must be a multiple of 4K in 4K..64M");
            o.block_bytes = (uint32_t)v;
            break;
        case 's': o.verify = RT_LOCAL_COPY_VERIFY_SIZE; break;
        case 'a':
            if (cli_parse_u64("stage", "--attempts", optarg, &v))
                return RT_EXIT_USAGE;
            if (v < 1 || v > 100)
                return cli_usage_error("stage", "--attempts must be in 1..100");
            o.max_attempts = (uint32_t)v;
            break;
        case 'T':
            o.lock_timeout_s = strtod(optarg, &end);
            if (*end || end == optarg || !(o.lock_timeout_s > 0 && o.lock_timeout_s < 1e9))
                return cli_usage_error("stage", "--timeout needs a number of seconds > 0, got '%s'", optarg);
            break;
        case 'e':
            if (!strcmp(optarg, "auto"))
                o.engine = RT_LOCAL_COPY_ENGINE_AUTO;
            else if (!strcmp(optarg, "uring"))
                o.engine = RT_LOCAL_COPY_ENGINE_URING;
            else if (!strcmp(optarg, "plain"))
                o.engine = RT_LOCAL_COPY_ENGINE_PLAIN;
            else
                return cli_usage_error("stage", "--engine must be auto, uring or plain, not '%s'", optarg);
            break;
        case 'q': quiet = 1; break;
        case 'h': stage_help(); return RT_EXIT_OK;
        default: return cli_usage_error("stage", "unknown option");
        }
    }
    if (optind != argc - 1)
        return cli_usage_error("stage", optind == argc ? "SRC is required" : "exactly one SRC, please");
    /* The failure tests interrupt a copy midway: a delay after each block (train.h's faults). */
    struct train_faults faults;
    if (train_faults_from_env(&faults) < 0)
        return cli_usage_error("stage", "%s", rt_errmsg());
    if (faults.copy_delay_ms) {
        o.progress = train_faults_copy_progress;
        o.progress_ctx = &faults;
    }
    if (quiet)
        rt_log_setup(0, 1, RT_LOG_WARN);

    if (rt_local_copy_dataset(argv[optind], &o, &r) < 0)
        return cli_fail();
    if (!quiet)
        print_summary(&r);
    printf("%s\n", r.path);
    return RT_EXIT_OK;
}
