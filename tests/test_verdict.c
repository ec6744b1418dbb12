/*
 * test_verdict.c - the verdict engine (loader/verdict.h) that the trainer's
 * step profile, loadbench and the Python package share: each rule of
 * rt_step_limit on both sides of its threshold and in its order; the
 * loader's stage rule (the consumer, idle workers, the busiest stage, with
 * the stage's own time base); the shares from a loader's counters; the
 * "model alone" sentence's three forms; rt_input_verdict's lower medians
 * and its words; a loop with no work of its own names no limit. Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "common/common.h"
#include "loader/loader.h"
#include "loader/verdict.h"
#include "staging/ring.h"

static void test_step_rules(void)
{
    static const struct {
        struct rt_step_shares s;
        enum rt_limit want;
    } cases[] = {
        {{0}, RT_LIMIT_COMPUTE},
        /* the input first, whatever else */
        {{.data = RT_INPUT_BOUND_SHARE, .comm = 0.9, .host = 0.9}, RT_LIMIT_INPUT},
        {{.data = RT_INPUT_BOUND_SHARE - 1e-9}, RT_LIMIT_COMPUTE},
        /* the link: as much on every rank, the compute even */
        {{.comm = RT_COMM_BOUND_SHARE, .comm_least = RT_COMM_BOUND_SHARE, .host = 0.9}, RT_LIMIT_COMM},
        {{.comm = RT_COMM_BOUND_SHARE - 1e-9, .comm_least = 0.2, .host = 0.9}, RT_LIMIT_HOST},
        /* a slower rank: some rank waits less than the threshold, or the compute spread explains the wait */
        {{.comm = 0.4, .comm_least = RT_COMM_BOUND_SHARE - 1e-9}, RT_LIMIT_SLOWER_RANK},
        {{.comm = 0.4, .comm_least = 0.4, .imbalance = RT_STRAGGLER_RATIO}, RT_LIMIT_SLOWER_RANK},
        {{.comm = 0.4, .comm_least = 0.4, .imbalance = RT_STRAGGLER_RATIO - 1e-9}, RT_LIMIT_COMM},
        /* the host */
        {{.host = RT_HOST_BOUND_SHARE}, RT_LIMIT_HOST},
        {{.host = RT_HOST_BOUND_SHARE - 1e-9}, RT_LIMIT_COMPUTE},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(cases); i++) {
        const enum rt_limit got = rt_step_limit(&cases[i].s);
        CHECKF(got == cases[i].want, "case %zu: limit %s (%d), expected %d", i, rt_limit_word(got), (int)got,
               (int)cases[i].want);
    }
    CHECK(!strcmp(rt_limit_word(RT_LIMIT_INPUT), "input") && !strcmp(rt_limit_word(RT_LIMIT_COMM), "communication") &&
          !strcmp(rt_limit_word(RT_LIMIT_HOST), "host") && !strcmp(rt_limit_word(RT_LIMIT_COMPUTE), "compute") &&
          !strcmp(rt_limit_word(RT_LIMIT_SLOWER_RANK), "compute"));
}

static void test_stage_rules(void)
{
    char buf[256];
    double sh[RT_STAGE_N] = {0};
    /* the consumer waited little: it is the limit, whatever the stages */
    sh[RT_STAGE_DECODE] = 0.9;
    sh[RT_STAGE_RING_WAIT] = RT_CONSUMER_WAIT_SHARE - 0.01;
    rt_stage_limit(sh, buf, sizeof(buf));
    CHECKF(strstr(buf, "limited by the consumer: it waited for batches only 9% of the time"), "%s", buf);
    /* the busiest worker stage, of worker time */
    sh[RT_STAGE_RING_WAIT] = 0.5;
    sh[RT_STAGE_AUGMENT] = 0.3;
    rt_stage_limit(sh, buf, sizeof(buf));
    CHECKF(!strcmp(buf, "limited by decode (90% of worker time)"), "%s", buf);
    /* reads keep the wall clock busier: io, of wall time */
    sh[RT_STAGE_IO] = 0.95;
    rt_stage_limit(sh, buf, sizeof(buf));
    CHECKF(!strcmp(buf, "limited by io (95% of wall time)"), "%s", buf);
    /* workers mostly idle while a worker stage is the busiest: reads or planning */
    sh[RT_STAGE_IO] = 0.2;
    sh[RT_STAGE_DECODE] = 0.25;
    sh[RT_STAGE_IDLE] = RT_WORKERS_IDLE_SHARE;
    rt_stage_limit(sh, buf, sizeof(buf));
    CHECKF(!strcmp(buf, "workers idle 50% of the time; limited by reads or planning (io busy 20%)"), "%s", buf);

    /* The shares' time bases: io and the waits of wall time, the worker stages and idle of wall x workers. */
    struct rt_loader_stats st = {.workers = 2, .io_busy_ns = 500000000, .checksum_ns = 100000000,
                                 .decompress_ns = 200000000, .decode_ns = 400000000, .augment_ns = 800000000,
                                 .worker_idle_ns = 1000000000};
    struct rt_wait_stats prod = {.total_ns = 250000000}, cons = {.total_ns = 750000000};
    double s[RT_STAGE_N];
    rt_stage_shares(&st, &prod, &cons, 1.0, s);
    const double want[RT_STAGE_N] = {0.5, 0.05, 0.1, 0.2, 0.4, 0.25, 0.75, 0.5};
    for (int i = 0; i < RT_STAGE_N; i++)
        CHECKF(s[i] > want[i] - 1e-12 && s[i] < want[i] + 1e-12, "%s: share %g, expected %g",
               rt_stage_name((enum rt_stage)i, 0), s[i], want[i]);
    CHECK(!strcmp(rt_stage_name(RT_STAGE_SLOT_WAIT, 0), "slot wait") &&
          !strcmp(rt_stage_name(RT_STAGE_SLOT_WAIT, 1), "slot_wait"));
}

static void test_sentences(void)
{
    char buf[160];
    /* 100 ms step, 40 ms of it waiting, 60 images: the model alone would do 60 / 0.06 s */
    double rate = rt_verdict_alone(100e6, 40e6, 60, buf, sizeof(buf));
    CHECKF(rate > 999.99 && rate < 1000.01 && !strcmp(buf, "; the model alone would run at about 1000 img/s"),
           "%g: %s", rate, buf);
    rate = rt_verdict_alone(100e6, 40e6, 0, buf, sizeof(buf));
    CHECKF(rate == 0 && !strcmp(buf, "; the model's own work takes 60.0 ms of it"), "%s", buf);
    rate = rt_verdict_alone(100e6, 99.5e6, 60, buf, sizeof(buf));
    CHECKF(rate == 0 && strstr(buf, "too short to say"), "%s", buf);
    char text[256];
    rt_verdict_text("host", "E", "A", text, sizeof(text));
    CHECK(!strcmp(text, "verdict: host-bound: E\n  try: A"));
}

static void test_input_verdict(void)
{
    struct rt_input_verdict v;
    /* lower medians: waits 10 20 30 40 -> 20 ms; steps 100 (one) -> 100 ms: 20 % -> input */
    const uint64_t w[] = {40000000, 10000000, 30000000, 20000000}, s[] = {100000000};
    CHECK_OK(rt_input_verdict(w, 4, s, 1, 64, 2, 0, &v));
    CHECKF(v.input_bound && v.wait_p50_ns == 20e6 && v.step_p50_ns == 100e6 && !strcmp(v.limit, "input"),
           "%s", v.text);
    CHECKF(strstr(v.text, "verdict: input-bound: the step waits 20.0 ms of 100.0 ms for data (20%); the model alone "
                          "would run at about 800 img/s") &&
               strstr(v.text, "workers=4 of ringtrain.Loader") && strstr(v.text, "ringtrain.stage()") &&
               strstr(v.text, "--target 800"),
           "%s", v.text);
    /* below the threshold: the consumer's own work; staged data: no staging advice */
    const uint64_t w2[] = {10000000};
    CHECK_OK(rt_input_verdict(w2, 1, s, 1, 64, 2, 1, &v));
    CHECKF(!v.input_bound && !strcmp(v.limit, "compute") && strstr(v.text, "the other 90.0 ms"), "%s", v.text);
    CHECK_ERR(rt_input_verdict(w, 0, s, 1, 0, 0, 0, &v), "no step timings");
    /* a loop with no work of its own: no limit named, the delivery rate (64 images in the median 20 ms) */
    CHECK_OK(rt_loader_alone_verdict(w, 4, 64, &v));
    CHECKF(!v.input_bound && !strcmp(v.limit, "none") && v.wait_p50_ns == 20e6 &&
               strstr(v.text, "verdict: no limit measured: ") && strstr(v.text, "delivers about 3200 img/s"),
           "%s", v.text);
}

int main(void)
{
    test_step_rules();
    test_stage_rules();
    test_sentences();
    test_input_verdict();
    return check_result();
}
