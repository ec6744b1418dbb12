/*
 * waitprof.h - the input side's verdict from a consumer's own timings: given
 * how long each step waited for its batch and how long each whole step took,
 * is the input pipeline what limits the run, and what to try. The C trainer
 * draws the same conclusion for the data wait of its step profile
 * (tools/train/profile.c) with the threshold below; this is the verdict for a
 * consumer that is not the trainer (a PyTorch script timing its DataLoader or
 * ringtrain's Python loader), worded for that consumer's knobs.
 *
 * It does not time anything or print: the caller measures and shows the text.
 * Functions return 0 or -errno with the reason in rt_errmsg().
 */
#ifndef RT_LOADER_WAITPROF_H
#define RT_LOADER_WAITPROF_H

#include <stddef.h>
#include <stdint.h>

/*
 * A run is input-bound when the (median) step waits for data this share of
 * the (median) step or more: where a faster input pays more than the
 * run-to-run noise. The trainer's step profile uses the same threshold.
 */
#define RT_INPUT_BOUND_SHARE 0.15

struct rt_input_verdict {
    int input_bound;             /* share >= RT_INPUT_BOUND_SHARE */
    double wait_p50_ns;          /* median wait for a batch */
    double step_p50_ns;          /* median step, the wait included */
    double share;                /* wait_p50_ns / step_p50_ns (0 when the step is 0) */
    char limit[16];              /* "input", or "compute" (the consumer's own work) */
    char evidence[384];          /* "the step waits 41.0 ms of 60.0 ms for data (68%); ..." */
    char advice[512];            /* what to try */
    char text[960];              /* "verdict: <limit>-bound: <evidence>\n  try: <advice>" (no final newline) */
};

/*
 * Computes the verdict from per-step timings: wait_ns[nwait], each step's
 * wait for its batch, and step_ns[nstep], each whole step (its wait
 * included), in nanoseconds; the medians are the lower ones (the value at
 * rank ceil(n/2) of the sorted timings), as the trainer's p50. The two arrays
 * are borrowed and not changed; they may differ in length. images_per_step
 * (0: unknown) gives the rate the consumer alone would reach; workers is the
 * loader's worker count now (a DataLoader's num_workers: 0 = the main
 * process), staged whether the data already sits on node-local disk (then
 * the advice does not suggest staging). Returns 0, or -EINVAL when either
 * array is empty, -ENOMEM.
 */
int rt_input_verdict(const uint64_t *wait_ns, size_t nwait, const uint64_t *step_ns, size_t nstep,
                     uint32_t images_per_step, int workers, int staged, struct rt_input_verdict *v);

#endif /* RT_LOADER_WAITPROF_H */
