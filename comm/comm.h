/*
 * comm.h - the comm stage: which rank this process is (rank discovery), the
 * collectives between ranks (Open MPI), and the gradient bucketer that
 * overlaps the all-reduce of gradients with backward.
 *
 * It knows nothing of layers or models: the bucketer sees one float buffer
 * and a table of named slices of it, and is told how far into the buffer the
 * gradients are final. It never touches the compute backend.
 *
 * Threads. A process group with more than one rank runs one comm thread. It
 * makes every MPI call after MPI_Init (so MPI is initialised with
 * MPI_THREAD_SERIALIZED), starts each collective as a non-blocking call in the
 * order the caller queued it, and doubles as the watchdog: it sends and
 * checks heartbeats, watches node-local peers' processes, and enforces the
 * collective deadlines. Failures it detects (a dead peer, a silent peer, a
 * collective past its deadline, an MPI error) print one message naming the
 * step, the operation (bucket) and, where known, the lagging rank, then abort
 * the whole job with MPI_Abort, so that no rank is left waiting.
 *
 * All functions below are called from one thread (the training thread),
 * except rt_comm_set_phase(), which any thread may call.
 */
#ifndef RT_COMM_H
#define RT_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ==== rank discovery ======================================================== */

/* Where the rank and world size came from (see rt_comm_resolve). */
enum rt_rank_source {
    RT_RANKS_NONE = 0,   /* nothing set: rank 0 of 1 */
    RT_RANKS_MPI,        /* an MPI launcher: mpirun, or srun --mpi=pmix */
    RT_RANKS_SLURM,      /* SLURM_PROCID / SLURM_NTASKS */
    RT_RANKS_TORCHRUN,   /* RANK / WORLD_SIZE */
};

const char *rt_rank_source_name(enum rt_rank_source s);

struct rt_rank_info {
    int rank, world;
    int local_rank, local_world;  /* among the ranks on this node */
    int node, nodes;              /* node index (by lowest rank on it) and node count */
    enum rt_rank_source source;
    int mpi;                      /* 1: an MPI launcher started this process */
    int cpus_per_task;            /* SLURM_CPUS_PER_TASK, 0 if unset */
    char job_id[64];              /* SLURM_JOB_ID, "" if unset */
    char vars[160];               /* the variables the rank came from, for messages */
};

/* What the MPI launcher says, before the environment is consulted. */
struct rt_launch_view {
    int mpi;                      /* 1: started by an MPI launcher */
    int rank, world;              /* MPI_COMM_WORLD's, when mpi */
    int mpirun;                   /* 1: started by mpirun's daemons (OMPI_COMM_WORLD_* set), whose
                                     SLURM_* variables describe the daemons, not the ranks */
};

/*
 * Resolves rank, world size and local rank with this fixed precedence:
 *   1. MPI, when view->mpi: MPI_COMM_WORLD's rank and size.
 *   2. Slurm, when SLURM_PROCID is set: SLURM_PROCID, and SLURM_STEP_NUM_TASKS
 *      (else SLURM_NTASKS) as the world; SLURM_LOCALID as the local rank.
 *   3. torchrun-style, when RANK is set: RANK, WORLD_SIZE, LOCAL_RANK,
 *      LOCAL_WORLD_SIZE.
 *   4. otherwise rank 0 of 1.
 * Every lower source that is also set must agree with the chosen one (rank and
 * world size; local rank between Slurm and torchrun). Under mpirun the Slurm
 * variables are the daemons' and are not compared. SLURM_JOB_ID and
 * SLURM_CPUS_PER_TASK are read whichever source wins. `get(ctx, name)`
 * returns a variable or NULL (getenv() behind a context, so tests can pass
 * their own). Node and local ranks under MPI come later, from the MPI
 * shared-memory split (rt_comm_create); here local_rank is the environment's
 * or 0, local_world 1, node 0, nodes 1.
 * Returns 0, or -EINVAL with rt_errmsg() naming the variables that disagree,
 * are malformed, or are set without their partner (RANK without WORLD_SIZE).
 */
int rt_comm_resolve(const char *(*get)(void *ctx, const char *name), void *ctx, const struct rt_launch_view *view,
                    struct rt_rank_info *out);

/* ==== process group ========================================================= */

struct rt_comm;

struct rt_comm_opts {
    double timeout_s;       /* a collective that has not completed after this long is a stall: abort.
                               0 = 300 s. Long waits the caller knows about (staging) pass their own. */
    double peer_timeout_s;  /* a peer whose heartbeat is this old is dead or stopped: abort. 0 = 20 s */
    double heartbeat_s;     /* heartbeat period; 0 = 1 s */
};

/*
 * Creates the process group. When an MPI launcher started the process
 * (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK set) this initialises MPI
 * (MPI_THREAD_SERIALIZED), resolves the ranks, splits the node-local
 * communicator, gathers each rank's host, pid and CPUs, and starts the comm
 * thread. Otherwise it is a group of one that never touches MPI, or an error
 * when the environment says the world is larger (a Slurm or torchrun launch
 * without MPI: Open MPI cannot join processes it did not start). Sets the
 * log prefix to "[rank/world]".
 * Returns 0 or -errno with rt_errmsg() set; after MPI was initialised an
 * error aborts the job instead of returning.
 */
int rt_comm_create(const struct rt_comm_opts *o, struct rt_comm **out);

/* Stops the comm thread and finalises MPI after a barrier. NULL is fine.
 * Only after every rank's last collective; on errors call rt_comm_abort. */
void rt_comm_destroy(struct rt_comm *c);

/* Prints `[rank/world] message` (when msg is not NULL) and ends the job:
 * MPI_Abort with `code` on every rank, or exit(code) in a group of one. */
_Noreturn void rt_comm_abort(struct rt_comm *c, int code, const char *msg);

const struct rt_rank_info *rt_comm_info(const struct rt_comm *c);

/* "Open MPI 4.1.4" or "none (one process)". */
const char *rt_comm_backend(const struct rt_comm *c);

/*
 * Compute threads for this rank when the user gave none: the CPUs it may use
 * (affinity, SLURM_CPUS_PER_TASK) divided by the node-local ranks whose CPU
 * sets overlap its own, at least 1: never oversubscribed by default.
 */
int rt_comm_default_threads(const struct rt_comm *c);

/* Writes the rank table (rank, host, pid, node, local rank, CPUs, threads,
 * device) to `f` on rank 0; `threads` is each rank's compute thread count
 * (gathered). Collective. */
void rt_comm_print_ranks(struct rt_comm *c, FILE *f, int threads, const char *device);

/* What the training thread is doing, sent in heartbeats and named in
 * failure messages ("rank 2 is behind: step 41, forward/backward"). */
enum rt_comm_phase {
    RT_PHASE_START = 0,
    RT_PHASE_COMPUTE,     /* forward and backward */
    RT_PHASE_GRAD_WAIT,   /* waiting for the gradient all-reduce */
    RT_PHASE_OPTIM,
    RT_PHASE_DATA,        /* waiting for the next batch */
    RT_PHASE_VALIDATE,
    RT_PHASE_CHECKPOINT,
    RT_PHASE_STAGE,
    RT_PHASE_DONE,
};
void rt_comm_set_phase(struct rt_comm *c, uint64_t step, enum rt_comm_phase phase);

/* ==== collectives =============================================================
 * Blocking for the caller; run by the comm thread as non-blocking MPI calls
 * under the deadline. In a group of one they copy or do nothing. `what` names
 * the operation in failure messages ("validation metrics"). They return 0;
 * an MPI error, a timeout or a dead peer aborts the job. Buffers are host
 * memory, borrowed until the call returns.
 */
enum rt_dtype_comm { RT_COMM_F32, RT_COMM_F64, RT_COMM_I64, RT_COMM_U64, RT_COMM_I32 };
enum rt_red_op { RT_RED_SUM, RT_RED_AVG, RT_RED_MAX, RT_RED_MIN };

int rt_comm_allreduce(struct rt_comm *c, void *buf, size_t count, enum rt_dtype_comm t, enum rt_red_op op,
                      const char *what);
/* Reduces into `buf` on `root`; other ranks' buffers are left as they were. */
int rt_comm_reduce(struct rt_comm *c, void *buf, size_t count, enum rt_dtype_comm t, enum rt_red_op op, int root,
                   const char *what);
int rt_comm_broadcast(struct rt_comm *c, void *buf, size_t bytes, int root, const char *what);
/* recv holds world x bytes: rank r's `send` at r * bytes. */
int rt_comm_allgather(struct rt_comm *c, const void *send, void *recv, size_t bytes, const char *what);
/* timeout_s < 0: the group's; 0: none (peers are still watched). */
int rt_comm_barrier(struct rt_comm *c, double timeout_s, const char *what);
/* The same, among the ranks of this node. */
int rt_comm_node_barrier(struct rt_comm *c, double timeout_s, const char *what);
/* Broadcast from the node's local rank 0 to the ranks of this node. */
int rt_comm_node_broadcast(struct rt_comm *c, void *buf, size_t bytes, const char *what);

/* Collectives issued so far, by kind: all-reduces of gradient buckets, and
 * everything else. */
struct rt_comm_counts {
    uint64_t bucket_allreduces;
    uint64_t other;
};
void rt_comm_counts(struct rt_comm *c, struct rt_comm_counts *out);

/* ==== gradient bucketer =====================================================
 *
 * Buckets are contiguous slices of the gradient buffer, cut at tensor
 * boundaries in buffer order (which is the order backward finishes them): the
 * first holds up to first_cap bytes (communication starts early), the last --
 * the tensors backward finishes last, whose all-reduce nothing can hide -- up
 * to first_cap too, the others up to cap; a tensor larger than the cap is a
 * bucket of its own, and a buffer within first_cap is one bucket. The all-reduce of a bucket (a sum, in place,
 * no packing copy) starts the moment backward reports its last gradient
 * final, and runs on the comm thread while backward goes on; the optimizer
 * waits for all of them. With overlap off, everything starts after backward.
 */
struct rt_bucketer;

/* A named slice of the gradient buffer, in floats. */
struct rt_bucket_tensor {
    const char *name;
    size_t offset, count;
};

struct rt_bucket_opts {
    size_t cap_bytes;        /* 0 = 25 MiB */
    size_t first_cap_bytes;  /* 0 = 1 MiB (never more than cap_bytes) */
    int no_overlap;          /* 1: start every all-reduce after backward */
};

/*
 * Plans the buckets over grads[0, count) (floats, host memory the comm thread
 * may read and write during a step; borrowed for the bucketer's lifetime).
 * `t` (nt entries, any order, borrowed names) must tile the buffer apart from
 * alignment gaps. Returns 0 or -EINVAL / -ENOMEM.
 */
int rt_bucketer_create(struct rt_comm *c, float *grads, size_t count, const struct rt_bucket_tensor *t, int nt,
                       const struct rt_bucket_opts *o, struct rt_bucketer **out);
void rt_bucketer_destroy(struct rt_bucketer *b);

int rt_bucketer_count(const struct rt_bucketer *b);
/* Bucket i: its slice in floats and its tensors' names ("fc.bias .. layer4.1.bn2.weight"). */
void rt_bucketer_bucket(const struct rt_bucketer *b, int i, size_t *offset, size_t *count, char *names, size_t len);

/* Starts an optimizer step's reduction: nothing is in flight yet, no
 * gradient is final. */
void rt_bucketer_begin(struct rt_bucketer *b, uint64_t step);

/*
 * Backward's hook: the gradients in [0, ready) floats are final. Starts the
 * all-reduce of every bucket that now lies inside (unless no_overlap).
 * `ready` never decreases within a step. The signature is that of
 * rt_step_opts.grads_ready.
 */
void rt_bucketer_ready(void *bucketer, size_t ready);

/*
 * Ends the step: starts what is left, then also all-reduces (bitwise OR)
 * `flags` (one word of the caller's bits, such as "stop requested"), and waits
 * for all.
 * Returns the flags of all ranks OR-ed into *global_flags, and the time spent
 * waiting here in *wait_ns (the communication backward did not hide).
 * Returns 0, or -EPROTO when the gradients of some tensors were never reported
 * final during the step (rt_errmsg() names them): the plan check.
 */
int rt_bucketer_finish(struct rt_bucketer *b, uint32_t flags, uint32_t *global_flags, uint64_t *wait_ns);

#endif /* RT_COMM_H */
