/*
 * verdict.h - what limits a run, one engine for every place that says so:
 * the trainer's step profile (tools/train/profile.c), `ringtrain loadbench`
 * (the loader's own stages), and a consumer that is not the trainer (a
 * PyTorch script timing its DataLoader, or ringtrain's Python loader, through
 * ringtrain.profile and rt_input_verdict). The thresholds, the rules that
 * pick the limit and the sentences the callers share live here and only
 * here; each caller words the advice for its own knobs.
 *
 * Nothing here times anything or prints: callers measure and show the text.
 * Functions return 0 or -errno with the reason in rt_errmsg().
 */
#ifndef RT_LOADER_VERDICT_H
#define RT_LOADER_VERDICT_H

#include <stddef.h>
#include <stdint.h>

struct rt_loader_stats;
struct rt_wait_stats;

/* ---- thresholds: where fixing the part pays more than the run-to-run noise -------------------------- */

#define RT_INPUT_BOUND_SHARE 0.15   /* the step's wait for data (the rank that waits most) */
#define RT_COMM_BOUND_SHARE 0.15    /* the step's exposed all-reduce */
#define RT_STRAGGLER_RATIO 0.5      /* the ranks' forward + backward spread, of the all-reduce wait */
#define RT_HOST_BOUND_SHARE 0.25    /* the step's time outside data, compute and communication */
#define RT_CONSUMER_WAIT_SHARE 0.1  /* loadbench: a consumer that waited for batches less than this is the limit */
#define RT_WORKERS_IDLE_SHARE 0.5   /* loadbench: workers idle this much wait for reads or planning */

/* ---- a training step ------------------------------------------------------------------------------ */

enum rt_limit {
    RT_LIMIT_INPUT,         /* the step waits for data */
    RT_LIMIT_SLOWER_RANK,   /* the all-reduce waits, for a slower rank's compute rather than the link */
    RT_LIMIT_COMM,          /* the all-reduce waits for the link, on every rank */
    RT_LIMIT_HOST,          /* the time outside the measured phases */
    RT_LIMIT_COMPUTE,       /* none of those: the model's own work */
};

/* A step's parts as shares of the step (a consumer that times only its waits leaves all but `data` 0). */
struct rt_step_shares {
    double data;            /* the wait for data, of the rank that waits most */
    double comm;            /* the exposed all-reduce (the ranks' median) */
    double comm_least;      /* the least exposed all-reduce share of any rank */
    double imbalance;       /* slowest minus fastest rank's forward + backward, over the all-reduce wait */
    double host;            /* outside data, compute and communication (copies included) */
};

/*
 * What limits the step, in this order: the input when data >=
 * RT_INPUT_BOUND_SHARE; an all-reduce wait of RT_COMM_BOUND_SHARE or more
 * that is not the same on every rank (some rank below the threshold) or
 * that the ranks' compute spread explains (imbalance >= RT_STRAGGLER_RATIO)
 * is a slower rank (in lock-step data parallelism the rank that finishes
 * backward last waits least); else the link; the host when host >=
 * RT_HOST_BOUND_SHARE; else compute.
 */
enum rt_limit rt_step_limit(const struct rt_step_shares *s);

/* The limit's word in "verdict: <word>-bound": input, compute (RT_LIMIT_SLOWER_RANK too), communication, host. */
const char *rt_limit_word(enum rt_limit l);

/*
 * The input-bound evidence's tail, the same for every consumer: from a step
 * of step_ns of which wait_ns waited for data, how fast the consumer alone
 * would run ("; the model alone would run at about N img/s" with
 * images_per_step; "; the model's own work takes X ms of it" without), or,
 * when the wait is (nearly) all of the step, that it is too short to say.
 * Returns the rate (0 when not known).
 */
double rt_verdict_alone(double step_ns, double wait_ns, double images_per_step, char *buf, size_t len);

/* "verdict: <limit>-bound: <evidence>\n  try: <advice>" (no final newline) into buf. */
void rt_verdict_text(const char *limit, const char *evidence, const char *advice, char *buf, size_t len);

/* ---- a consumer's own timings --------------------------------------------------------------------- */

struct rt_input_verdict {
    int input_bound;             /* share >= RT_INPUT_BOUND_SHARE (0 from rt_loader_alone_verdict) */
    double wait_p50_ns;          /* median wait for a batch */
    double step_p50_ns;          /* median step, the wait included */
    double share;                /* wait_p50_ns / step_p50_ns (0 when the step is 0) */
    char limit[16];              /* "input", or "compute" (the consumer's own work); "none": no work timed */
    char evidence[384];          /* "the step waits 41.0 ms of 60.0 ms for data (68%); ..." */
    char advice[512];            /* what to try */
    char text[960];              /* rt_verdict_text's */
};

/*
 * The verdict from per-step timings: wait_ns[nwait], each step's wait for
 * its batch, and step_ns[nstep], each whole step (its wait included), in
 * nanoseconds; the medians are the lower ones (the value at rank ceil(n/2)
 * of the sorted timings), as the trainer's p50. The two arrays are borrowed
 * and not changed; they may differ in length. images_per_step (0: unknown)
 * gives the rate the consumer alone would reach; workers is the loader's
 * worker count now (a DataLoader's num_workers: 0 = the main process),
 * staged whether the data already sits on node-local disk (then the advice
 * does not suggest staging). Returns 0, or -EINVAL when either array is
 * empty, -ENOMEM.
 */
int rt_input_verdict(const uint64_t *wait_ns, size_t nwait, const uint64_t *step_ns, size_t nstep,
                     uint32_t images_per_step, int workers, int staged, struct rt_input_verdict *v);

/*
 * The verdict of a loop that did no work of its own (ringtrain.profile without a body): every step is its
 * wait, so the timings say how fast the loader delivers, not whether it limits a training step. limit
 * "none", input_bound 0, the delivery rate in the evidence, and how to time a real step in the advice.
 * wait_ns as rt_input_verdict's; images_per_step 0: unknown. Returns 0, -EINVAL (no timings) or -ENOMEM.
 */
int rt_loader_alone_verdict(const uint64_t *wait_ns, size_t nwait, uint32_t images_per_step,
                            struct rt_input_verdict *v);

/* ---- the loader's own stages (loadbench, and the Python loader's stats()) ------------------------- */

enum rt_stage {
    RT_STAGE_IO,            /* reads in flight, of wall time */
    RT_STAGE_CHECKSUM,      /* the rest of worker time (wall x workers) ... */
    RT_STAGE_DECOMPRESS,
    RT_STAGE_DECODE,
    RT_STAGE_AUGMENT,
    RT_STAGE_SLOT_WAIT,     /* producers waiting for a free slot, of wall time */
    RT_STAGE_RING_WAIT,     /* the consumer waiting for a batch, of wall time */
    RT_STAGE_IDLE,          /* workers with nothing to do, of worker time */
    RT_STAGE_N
};

/* "io", "checksum", ..., "slot wait", "ring wait", "idle" (key 0), or the JSON keys "slot_wait" ... (key 1). */
const char *rt_stage_name(enum rt_stage s, int key);

/* Each stage's share of its time (above) over `wall_s` seconds of a loader with stats `s` and ring waits. */
void rt_stage_shares(const struct rt_loader_stats *s, const struct rt_wait_stats *prod,
                     const struct rt_wait_stats *cons, double wall_s, double share[RT_STAGE_N]);

/*
 * What limits the loader, from its shares, into buf: the consumer when it
 * waited for batches less than RT_CONSUMER_WAIT_SHARE of the time; reads or
 * planning when the workers idle RT_WORKERS_IDLE_SHARE or more and the
 * busiest stage is theirs; else the busiest of io..augment ("limited by
 * decode (41% of worker time)").
 */
void rt_stage_limit(const double share[RT_STAGE_N], char *buf, size_t len);

#endif /* RT_LOADER_VERDICT_H */
