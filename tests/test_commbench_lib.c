/*
 * test_commbench_lib.c - the commbench library (tools/commbench/commbench.h)
 * driven without the command, as a scale bench or the Python package would:
 * the config's check and sizes, the verdict on made-up rows, the fault's
 * rank and element, then under mpirun -np N (or alone, one rank) a run of
 * both paths on the CPU: every row whole floats, #wrong 0, busbw =
 * algbw * 2(n-1)/n and 0 for one rank; then the planted fault set in the
 * config (no environment): #wrong 1 in every row.
 * Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "comm/comm.h"
#include "common/common.h"
#include "tools/commbench/commbench.h"

static void test_config(void)
{
    struct commbench_config c;
    commbench_config_default(&c);
    CHECK_OK(commbench_config_check(&c));
    CHECK(c.faults.spoil == 0);
    c.min_bytes = 1024;
    c.max_bytes = 8192;
    c.bucket_bytes = 3000; /* off the grid: a size of its own */
    uint64_t s[COMMBENCH_MAX_SIZES];
    const int n = commbench_sizes(&c, s);
    CHECKF(n == 5 && s[0] == 1024 && s[1] == 2048 && s[2] == 3000 && s[3] == 4096 && s[4] == 8192, "n %d", n);
    c.bucket_bytes = 4096; /* on the grid: not twice */
    CHECK(commbench_sizes(&c, s) == 4);
    c.factor = 1;
    CHECK_ERR(commbench_config_check(&c), "factor");
    c.factor = 2;
    c.min_bytes = 6;
    CHECK_ERR(commbench_config_check(&c), "whole floats");
    c.min_bytes = 1024;
    c.paths = 0;
    CHECK_ERR(commbench_config_check(&c), "paths");
}

static void test_verdict(void)
{
    struct commbench_config c;
    commbench_config_default(&c);
    c.bucket_bytes = 2048;
    const struct commbench_row rows[] = {
        {COMMBENCH_COMM, 1024, 1, 1, 1, 9.0, 0},       {COMMBENCH_BUCKETER, 1024, 1, 1, 1, 1.0, 0},
        {COMMBENCH_BUCKETER, 2048, 1, 1, 1, 2.0, 0},   {COMMBENCH_BUCKETER, 4096, 1, 1, 1, 10.0, 0},
        {COMMBENCH_BUCKETER, 8192, 1, 1, 1, 9.0, 0}};
    struct commbench_verdict v;
    commbench_verdict(&c, rows, 5, &v);
    CHECK(v.path == COMMBENCH_BUCKETER && v.measured && v.busbw == 2.0 && v.best == 10.0 && v.best_bytes == 4096);
    CHECK(v.lo == 4096 && v.hi == 8192 && !v.reaches && fabs(v.fraction - 0.2) < 1e-12);
    c.bucket_bytes = 8192;
    commbench_verdict(&c, rows, 5, &v);
    CHECK(v.reaches);
    c.paths = 1u << COMMBENCH_COMM; /* the comm path's rows only */
    commbench_verdict(&c, rows, 5, &v);
    CHECK(v.path == COMMBENCH_COMM && !v.measured && v.best == 9.0 && !v.reaches);
}

static void test_faults(void)
{
    struct commbench_faults f;
    size_t at = 0;
    commbench_faults_none(&f);
    CHECK(!commbench_faults_spoils(&f, 3, 4, 100, &at));
    f.spoil = 1; /* the defaults of none(): the last rank, the middle */
    CHECK(!commbench_faults_spoils(&f, 2, 4, 100, &at));
    CHECK(commbench_faults_spoils(&f, 3, 4, 100, &at) && at == 50);
    CHECK(commbench_faults_spoils(&f, 0, 1, 1, &at) && at == 0);
    f.spoil_rank = 1;
    f.spoil_at = 0.99;
    CHECK(commbench_faults_spoils(&f, 1, 4, 100, &at) && at == 99);
    CHECK(!commbench_faults_spoils(&f, 3, 4, 100, &at));
}

/* Both paths over 4..64K bytes; every row's #wrong must be `want`. Collective. */
static void run(struct rt_comm *comm, int spoil, uint64_t want)
{
    struct commbench_config c;
    commbench_config_default(&c);
    c.min_bytes = 4;
    c.max_bytes = 64 << 10;
    c.factor = 4;
    c.warmup = 1;
    c.iters = 2;
    c.bucket_bytes = 1000;
    c.device = DEVICE_CPU;
    c.faults.spoil = spoil;
    struct commbench *b;
    CHECK_OK(commbench_open(comm, &c, &b));
    if (!b)
        return;
    const struct commbench_info *in = commbench_info(b);
    const int world = rt_comm_info(comm)->world;
    CHECK(in->world == world && in->nccl == 0 && in->gpu == NULL && in->nhosts >= 1 && in->hosts[0]);
    uint64_t s[COMMBENCH_MAX_SIZES];
    const int n = commbench_sizes(&c, s);
    CHECK(n == 9); /* 4, 16, ..., 64K and 1000 */
    for (int p = 0; p < COMMBENCH_NPATHS; p++)
        for (int i = 0; i < n; i++) {
            struct commbench_row r;
            CHECK_OK(commbench_measure(b, (enum commbench_path)p, s[i], &r));
            CHECKF(r.wrong == want, "%s %llu B: #wrong %llu, expected %llu", commbench_path_name(r.path),
                   (unsigned long long)r.bytes, (unsigned long long)r.wrong, (unsigned long long)want);
            CHECK(r.bytes == s[i] && r.max_time_us >= r.time_us && r.time_us >= 0);
            CHECK(fabs(r.busbw - r.algbw * 2.0 * (world - 1) / world) <= 1e-9 * r.algbw);
        }
    struct commbench_row r;
    CHECK_ERR(commbench_measure(b, COMMBENCH_COMM, 6, &r), "whole floats");
    commbench_close(b);
}

int main(void)
{
    test_config();
    test_verdict();
    test_faults();
    struct rt_comm *comm;
    if (rt_comm_create(NULL, &comm) < 0) {
        fprintf(stderr, "rt_comm_create: %s\n", rt_errmsg());
        return 1;
    }
    run(comm, 0, 0);
    run(comm, 1, 1);
    rt_comm_destroy(comm);
    return check_result();
}
