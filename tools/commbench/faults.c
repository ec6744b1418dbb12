/*
 * faults.c - the commbench failure test's fault: one wrong element after the
 * reduction. struct commbench_faults (commbench.h) is filled once, by the
 * command, before the run; the measurement asks commbench_faults_spoils()
 * at its one injection point and nowhere else, so the timed loop holds no
 * test branch. This file reads the environment; the rest of the library
 * does not.
 */
#include <stdlib.h>
#include <string.h>

#include "tools/commbench/commbench.h"

void commbench_faults_none(struct commbench_faults *f)
{
    *f = (struct commbench_faults){.spoil = 0, .spoil_rank = -1, .spoil_at = 0.5};
}

void commbench_faults_from_env(struct commbench_faults *f)
{
    const char *v = getenv("RINGTRAIN_TEST_COMMBENCH_CORRUPT");
    commbench_faults_none(f);
    /* The last rank, the middle element: the test (tests/test_commbench.sh) expects #wrong 1 in every row. */
    f->spoil = v && *v && strcmp(v, "0");
}

int commbench_faults_spoils(const struct commbench_faults *f, int rank, int world, size_t count, size_t *at)
{
    const int who = f->spoil_rank < 0 ? world + f->spoil_rank : f->spoil_rank;
    if (!f->spoil || rank != who || count == 0 || !(f->spoil_at >= 0 && f->spoil_at < 1))
        return 0;
    *at = (size_t)((double)count * f->spoil_at);
    if (*at >= count) /* rounding of a huge count */
        *at = count - 1;
    return 1;
}
