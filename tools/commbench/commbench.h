/*
 * commbench.h - the all-reduce measurement behind `ringtrain commbench`:
 * nccl-tests' all_reduce_perf for this stack, as a library. It all-reduces
 * (sum of floats, in place) messages of a given size on the two paths
 * training uses -- rt_comm_allreduce (host memory, MPI through the comm
 * thread: validation metrics) and the gradient bucketer (one bucket of the
 * message size: begin, ready, finish; through NCCL over device memory on
 * GPUs) -- and returns plain rows: time per iteration averaged over the
 * iterations and the ranks, algbw = size / time, busbw = algbw * 2(n-1)/n,
 * and the elements whose sum came back wrong. What the rows say about a
 * gradient bucket size (commbench_verdict) is computed here too; printing,
 * the table, the JSON and the exit code are the caller's.
 *
 * Every size is checked, as nccl-tests checks: rank r holds
 * (r % 16 + 1) * (i % 7 + 1) at element i, small integers whose sum over the
 * ranks is exact in floats in any order of summation (up to some 280,000
 * ranks), and the buffer is filled again before every iteration (outside the
 * timed part), so that after the last one every element must equal the sum
 * exactly.
 *
 * It measures; it does not tune. Only the comm and compute libraries' public
 * calls are used: what it times is what training runs.
 *
 * The calls:
 *
 *     commbench_config_default(&cfg); ...       the sizes, iterations, paths
 *     commbench_open(c, &cfg, &b)               memory, the device, NCCL
 *     n = commbench_sizes(&cfg, sizes)
 *     for each path p in cfg.paths, each size:
 *         commbench_measure(b, p, size, &row)   one row
 *     commbench_verdict(&cfg, rows, nrows, &v)
 *     commbench_close(b)
 *
 * Collective: commbench_open, commbench_measure, commbench_close and
 * commbench_agree are called by every rank of the group, in the same order
 * with the same arguments (the config included); the rest are local. A
 * failure that some ranks meet alone (memory, a GPU) is agreed on before
 * the call returns, so every rank returns an error at the same point and
 * none is left inside the next collective.
 *
 * Errors: 0 or -errno with rt_errmsg() set. -ECANCELED means another rank
 * failed; its own message names it, and the lowest failing rank is named here.
 *
 * Faults: the failure tests plant a wrong element through struct
 * commbench_faults in the config (faults.c), consulted at one named point
 * after the timed iterations; commbench_faults_from_env() fills it from
 * RINGTRAIN_TEST_COMMBENCH_CORRUPT. Nothing else reads the environment.
 *
 * Threads: one thread drives a struct commbench from open to close.
 */
#ifndef RT_COMMBENCH_H
#define RT_COMMBENCH_H

#include <stddef.h>
#include <stdint.h>

#include "tools/train/train.h"

struct rt_comm;

#define COMMBENCH_MAX_BYTES ((uint64_t)4 << 30) /* the bucketer's limit for one tensor (2^30 floats) */
#define COMMBENCH_MAX_SIZES 64                  /* commbench_sizes() returns at most this many */
#define COMMBENCH_REACH 0.8 /* "a bucket reaches the link's bandwidth": this share of the best busbw */

/* The two paths training all-reduces on. */
enum commbench_path { COMMBENCH_COMM = 0, COMMBENCH_BUCKETER, COMMBENCH_NPATHS };

/* "comm", "bucketer". */
const char *commbench_path_name(enum commbench_path p);

/* ---- faults: injection points for the failure tests ----------------------------- */

/*
 * One wrong element, planted after the timed iterations of every size on
 * every path, before the check, as a broken all-reduce would leave it
 * (outside the timed part). No sum of the pattern is negative: the planted
 * value is -1.
 */
struct commbench_faults {
    int spoil;         /* 0: no fault; 1: one rank spoils one element of each reduced message ... */
    int spoil_rank;    /* ... this rank, < 0 counting from the last (-1: the last rank) ... */
    double spoil_at;   /* ... element floor(count * spoil_at) of the message's count floats, in [0, 1) */
};

/* No fault. */
void commbench_faults_none(struct commbench_faults *f);

/*
 * Fills `f` from the environment: RINGTRAIN_TEST_COMMBENCH_CORRUPT set to
 * anything but "" or "0" makes the last rank spoil the middle element
 * (count / 2) of every message; unset, none. Cannot fail.
 */
void commbench_faults_from_env(struct commbench_faults *f);

/*
 * Whether rank `rank` of `world` spoils a message of `count` floats under
 * `f`; 1 with *at set to the element, else 0. The library's one injection
 * point asks this; tests may too.
 */
int commbench_faults_spoils(const struct commbench_faults *f, int rank, int world, size_t count, size_t *at);

/* ---- the configuration ------------------------------------------------------------ */

struct commbench_config {
    uint64_t min_bytes, max_bytes;  /* the message sizes, multiples of 4 in 4..COMMBENCH_MAX_BYTES, min <= max */
    uint64_t factor;                /* each size is this many times the one before, >= 2 */
    uint64_t warmup, iters;         /* untimed and timed iterations per size; iters >= 1 */
    uint64_t bucket_bytes;          /* the gradient bucket commbench_verdict() judges, a multiple of 4; a size of
                                     * its own in commbench_sizes() when inside min..max */
    unsigned paths;                 /* the paths to measure: bits 1u << enum commbench_path */
    enum train_device device;       /* where the bucketer's buffer lives: auto (the GPU when every rank has one
                                     * and NCCL loads), cpu, or cuda (an error where it cannot) */
    struct commbench_faults faults; /* none unless a failure test plants one */
};

/*
 * The command's defaults: 1K..256M doubling, 5 warm-up and 20 timed
 * iterations, a bucket of 25 MiB (train's --bucket-cap-mb), both paths,
 * device auto, no fault.
 */
void commbench_config_default(struct commbench_config *c);

/*
 * Whether `c` holds what the fields above ask for (sizes, factor, iters,
 * bucket_bytes, at least one known path, a known device). Local. Returns 0,
 * or -EINVAL with rt_errmsg() naming the first field that does not.
 */
int commbench_config_check(const struct commbench_config *c);

/*
 * The sizes to measure, ascending, into `out` (COMMBENCH_MAX_SIZES
 * entries): min, min * factor, ... up to max, and bucket_bytes when it lies
 * inside [min, max] and is not one of them already. `c` is one that
 * commbench_config_check() accepts. Returns how many.
 */
int commbench_sizes(const struct commbench_config *c, uint64_t *out);

/* ---- the run ---------------------------------------------------------------------- */

struct commbench;

/* What a run measures on: the facts of a table's header. Owned by the struct commbench. */
struct commbench_info {
    int rank, world;
    int nccl;                 /* 1: the bucketer reduces device memory through NCCL; 0: host memory over MPI */
    const char *collectives;  /* rt_comm_backend(): "MPI (Open MPI 4.1.4)", "none (one process)" */
    const char *gpu;          /* rt_backend_describe() of this rank's GPU; NULL unless nccl */
    const char *nccl_line;    /* rt_nccl_describe(); NULL unless nccl */
    char cpu[128];            /* /proc/cpuinfo's model name, or "unknown" */
    int nhosts;               /* distinct host names over the ranks ... */
    char hosts[512];          /* ... comma-separated in order of their first rank (cut at 511 bytes) */
};

/*
 * Everything a run needs before the first message, on the process group `c`
 * (borrowed; it outlives the struct commbench): a host buffer of max_bytes,
 * the ranks' host names, the device for the bucketer (config .device; the
 * GPU only when the bucketer path is measured) with a device buffer and the
 * pattern on it, and the NCCL communicator. `cfg` is copied. Collective.
 * Fails with -EINVAL where commbench_config_check() does (at once, before
 * any collective: the config is the same on every rank); -ENOMEM when max_bytes times the ranks on this node would take
 * more than 90% of the available host memory, or an allocation fails;
 * -ENODEV for device cuda where this rank cannot (no GPU, or NCCL does not
 * load), -ECANCELED where another rank failed. A failure of NCCL's set-up
 * across ranks ends the job (rt_comm_abort), as the other ranks may be
 * inside it already. Returns 0 with *out set, or -errno with *out NULL.
 */
int commbench_open(struct rt_comm *c, const struct commbench_config *cfg, struct commbench **out);

/* The facts of the run; owned by `b`. */
const struct commbench_info *commbench_info(const struct commbench *b);

/* One line of the table: a path at one size, over all ranks. */
struct commbench_row {
    enum commbench_path path;
    uint64_t bytes;
    double time_us, max_time_us;  /* per timed iteration: the mean over the ranks, and the slowest rank's */
    double algbw, busbw;          /* GB/s (1e9 bytes), from the mean time; busbw 0 for one rank */
    uint64_t wrong;               /* elements that came back wrong, summed over the ranks */
};

/*
 * Path p at `bytes` (a multiple of 4, at most the config's max_bytes): the
 * warm-up iterations, a barrier, the timed ones, the check after the last,
 * the ranks' figures summed into *row (the same on every rank). Wrong
 * elements are a result (row->wrong), not an error. Collective. Returns 0,
 * -EINVAL for an unknown path or a size that is not whole floats up to
 * max_bytes (on every rank alike), or -errno naming the path and size (the
 * bucketer's errors; -EPROTO if it cut the message into more than one
 * bucket).
 */
int commbench_measure(struct commbench *b, enum commbench_path p, uint64_t bytes, struct commbench_row *row);

/* Frees what open made (the NCCL communicator after its work, device memory, the buffers). Every rank calls it,
 * before rt_comm_destroy() of the group. NULL is fine. */
void commbench_close(struct commbench *b);

/*
 * Every rank's `rc` for a step some ranks may fail alone, so that all of
 * them stop at the same point. Collective (one small all-reduce). Returns
 * rc when this rank failed (its message stands), -ECANCELED naming the
 * lowest failing rank when another one did, else 0.
 */
int commbench_agree(struct rt_comm *c, int rc);

/* ---- what the rows say ------------------------------------------------------------ */

/* The verdict on the gradient bucket size. */
struct commbench_verdict {
    int measured;               /* the bucket size is one of the rows */
    enum commbench_path path;   /* the bucketer's when it was measured, else comm's */
    double busbw, best;         /* GB/s: at the bucket size (0 unless measured), the best at any size on the path */
    uint64_t best_bytes;        /* where the best was */
    uint64_t lo, hi;            /* the smallest and the largest size at COMMBENCH_REACH of the best (0: none) */
    double fraction;            /* busbw / best (0 when best is 0) */
    int reaches;                /* measured, and fraction >= COMMBENCH_REACH */
};

/* Whether the config's bucket_bytes reaches the path's bandwidth in `rows` (n of them). Local. */
void commbench_verdict(const struct commbench_config *cfg, const struct commbench_row *rows, int n,
                       struct commbench_verdict *v);

#endif
