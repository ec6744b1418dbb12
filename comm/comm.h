/*
 * comm.h - the comm stage: which rank this process is (rank discovery), the
 * collectives between ranks (Open MPI), the gradient bucketer that overlaps
 * the all-reduce of gradients with backward, and, for gradients on GPUs,
 * which GPU a rank drives (rt_gpu_preflight) and the NCCL communicator the
 * bucketer then reduces them with.
 *
 * It knows nothing of layers or models: the bucketer sees one float buffer
 * and a table of named slices of it, and is told how far into the buffer the
 * gradients are final. It never touches the compute backend: in NCCL mode it
 * is handed the compute stream as an opaque pointer.
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

/* "MPI", "Slurm", ...: a static string, never NULL. */
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
    int full_mesh;          /* every rank a heartbeat partner of every other up to this many ranks, the sparse
                               graph of rt_comm_hb_partners above; 0 = RT_COMM_FULL_MESH (the failure tests
                               lower it to see the sparse graph at a few dozen ranks) */
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
 * Returns 0 with *out set, or with *out NULL and rt_errmsg() saying why:
 * -ENOMEM, -EIO (MPI_Init_thread failed), -EINVAL (the launch variables
 * disagree or are malformed, or a world of more than one rank without an MPI
 * launcher). After MPI was initialised an error aborts the job instead of
 * returning.
 */
int rt_comm_create(const struct rt_comm_opts *o, struct rt_comm **out);

/* Stops the comm thread and finalises MPI after a barrier. NULL is fine.
 * Only after every rank's last collective; on errors call rt_comm_abort. */
void rt_comm_destroy(struct rt_comm *c);

/* Prints `[rank/world] message` (when msg is not NULL) and ends the job:
 * MPI_Abort with `code` on every rank, or exit(code) in a group of one. */
_Noreturn void rt_comm_abort(struct rt_comm *c, int code, const char *msg);

/* When the process group's start-up steps ended, as rt_now_ns() stamps (a group of one: all equal to the
 * time rt_comm_create was called). For the start-up breakdown `train` prints. */
struct rt_comm_startup {
    uint64_t begin_ns;       /* rt_comm_create called */
    uint64_t mpi_init_ns;    /* MPI_Init_thread returned */
    uint64_t rank_table_ns;  /* the node split and the rank table's gather done */
    uint64_t mesh_ns;        /* the lifeline connections made (the watchdog's mesh) */
    int mesh_peers;          /* heartbeat partners of this rank (connections it holds) */
};
/* Copies the stamps into *out. */
void rt_comm_startup(const struct rt_comm *c, struct rt_comm_startup *out);

/*
 * The heartbeat partners of `rank` in a world of `world` ranks: partner[r] is set to 1 for each (and 0
 * otherwise; partner has `world` entries). Up to `full` ranks (0: RT_COMM_FULL_MESH) every rank is
 * every other's partner. Above, rank r's partners are r +- 2^k (mod world) for every 2^k < world: a symmetric graph in
 * which every rank has at most 2 ceil(log2 world) partners (20 at 1,024 ranks) and any rank reaches any
 * other within ceil(log2 world) hops, so that a rank's death, seen by its partners, reaches every rank
 * by forwarding in that many hops. Returns the number of partners. Pure; thread-safe.
 */
#define RT_COMM_FULL_MESH 64
int rt_comm_hb_partners(int rank, int world, int full, int *partner);

/* This process's rank, world and node; owned by `c`, never NULL. */
const struct rt_rank_info *rt_comm_info(const struct rt_comm *c);

/* "MPI (Open MPI 4.1.4)" or "none (one process)"; owned by `c`. */
const char *rt_comm_backend(const struct rt_comm *c);

/*
 * Compute threads for this rank when the user gave none: the CPUs it may use
 * (affinity, SLURM_CPUS_PER_TASK) divided by the node-local ranks whose CPU
 * sets overlap its own, at least 1: never oversubscribed by default.
 */
int rt_comm_default_threads(const struct rt_comm *c);

/* Writes the rank table (rank, host, pid, node, local rank, CPUs, threads,
 * device) to `f` on rank 0; `threads` is each rank's compute thread count
 * (gathered). Collective: aborts the job on failure; never returns an error. */
void rt_comm_print_ranks(struct rt_comm *c, FILE *f, int threads, const char *device);
/* The same when the world has at most `max_rows` ranks; above, a summary that stays short at any size:
 * nodes alike in rank count, CPUs, threads and device in one line each (ranks, hosts), at most 8 lines,
 * and where the full table is (`ringtrain ranks` launched the same way). Collective, as above. */
void rt_comm_print_rank_summary(struct rt_comm *c, FILE *f, int threads, const char *device, int max_rows);

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
/* Records this rank's step and phase for the watchdog. Any thread; NULL `c`
 * is fine (nothing to record). */
void rt_comm_set_phase(struct rt_comm *c, uint64_t step, enum rt_comm_phase phase);

/* ==== collectives =============================================================
 * Blocking for the caller; run by the comm thread as non-blocking MPI calls
 * under the deadline. In a group of one they copy or do nothing. `what` names
 * the operation in failure messages ("validation metrics"). Buffers are host
 * memory, borrowed until the call returns. Every rank calls them in the same
 * order.
 *
 * They return nothing: an MPI error, a timeout or a dead peer prints one
 * message and aborts the whole job (MPI_Abort), so that no rank is left
 * waiting.
 */
enum rt_dtype_comm { RT_COMM_F32, RT_COMM_F64, RT_COMM_I64, RT_COMM_U64, RT_COMM_I32 };
enum rt_red_op { RT_RED_SUM, RT_RED_AVG, RT_RED_MAX, RT_RED_MIN };

/* Reduces `count` elements at `buf` in place on every rank (RT_RED_AVG: the
 * sum divided by the world size, for floating types). Aborts the job on
 * failure; never returns an error. */
void rt_comm_allreduce(struct rt_comm *c, void *buf, size_t count, enum rt_dtype_comm t, enum rt_red_op op,
                       const char *what);
/* Reduces into `buf` on `root`; other ranks' buffers are left as they were.
 * Aborts the job on failure; never returns an error. */
void rt_comm_reduce(struct rt_comm *c, void *buf, size_t count, enum rt_dtype_comm t, enum rt_red_op op, int root,
                    const char *what);
/* Root's `bytes` at `buf` into every rank's `buf`. Aborts the job on failure;
 * never returns an error. */
void rt_comm_broadcast(struct rt_comm *c, void *buf, size_t bytes, int root, const char *what);
/* recv holds world x bytes: rank r's `send` at r * bytes; bytes at most 1 GiB.
 * Aborts the job on failure; never returns an error. */
void rt_comm_allgather(struct rt_comm *c, const void *send, void *recv, size_t bytes, const char *what);
/* Rank `from`'s `bytes` at `buf` into rank 0's `buf` (of that size): every rank calls it, in the same
 * order; only rank 0 and `from` take part, the others return at once. For collecting per-rank results one
 * rank at a time (the trace), so that rank 0 never holds more than one. Aborts the job on failure; never
 * returns an error. */
void rt_comm_gather_one(struct rt_comm *c, int from, void *buf, size_t bytes, const char *what);
/* timeout_s < 0: the group's; 0: none (peers are still watched). Aborts the
 * job on failure; never returns an error. */
void rt_comm_barrier(struct rt_comm *c, double timeout_s, const char *what);
/* The same, among the ranks of this node. Aborts the job on failure; never
 * returns an error. */
void rt_comm_node_barrier(struct rt_comm *c, double timeout_s, const char *what);
/* Broadcast from the node's local rank 0 to the ranks of this node. Aborts
 * the job on failure; never returns an error. */
void rt_comm_node_broadcast(struct rt_comm *c, void *buf, size_t bytes, const char *what);

/* Collectives issued so far, by kind: all-reduces of gradient buckets (over
 * MPI, or NCCL in the bucketer's NCCL mode, where a group of one counts them
 * too: they still go through NCCL), and everything else. */
struct rt_comm_counts {
    uint64_t bucket_allreduces;
    uint64_t other;
};
/* Copies the counts into *out. Thread-safe. */
void rt_comm_counts(struct rt_comm *c, struct rt_comm_counts *out);

/* ==== gradient bucketer =====================================================
 *
 * Buckets are contiguous slices of the gradient buffer, cut at tensor
 * boundaries in buffer order (which is the order backward finishes them): the
 * first holds up to first_cap_bytes (communication starts early), the last --
 * the tensors backward finishes last, whose all-reduce nothing can hide -- up
 * to first_cap_bytes too, the others up to cap; a tensor larger than the cap is a
 * bucket of its own, and a buffer within first_cap_bytes is one bucket. The all-reduce of a bucket (a sum, in place,
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
    /* Device gradients (see "NCCL" below). NULL: `grads` is host memory,
     * reduced over MPI by the comm thread. */
    struct rt_nccl *nccl;    /* borrowed; outlives the bucketer */
    void *stream;            /* the compute stream backward runs on (a cudaStream_t) */
    /* Host gradients still being written by queued work (the CPU backend's
     * asynchronous streams): fence_mark(fence_ctx, k) runs on the caller's
     * thread when bucket k is handed to the comm thread (record an event
     * after what backward has queued), fence_wait(fence_ctx, k) on the comm
     * thread before the all-reduce reads it (wait for that event). NULL:
     * the gradients are final when rt_bucketer_ready() reports them. */
    void (*fence_mark)(void *ctx, int bucket);
    void (*fence_wait)(void *ctx, int bucket);
    void *fence_ctx;
    /* Late mode, host gradients (MPI): the host never waits for an update's
     * reduction. stream_call(stream_ctx, fn, arg) must make the compute
     * stream run fn(arg) when it reaches that point, before the ops queued
     * after it (the CPU's asynchronous streams: a queued call; the ordinary
     * CPU backend: at once); rt_bucketer_finish() then queues there the wait
     * for the update's all-reduces, so that the optimizer step queued after it
     * reads reduced gradients, and returns. In NCCL mode, set, it selects late
     * mode (the compute stream then waits on an event; stream_call is not
     * called). See rt_bucketer_finish for what changes. NULL: finish waits on
     * the host. */
    void (*stream_call)(void *ctx, void (*fn)(void *arg), void *arg);
    void *stream_ctx;
};

/*
 * Plans the buckets over grads[0, count) (floats, host memory the comm thread
 * may read and write during a step; borrowed for the bucketer's lifetime).
 * `t` (nt entries, any order, borrowed names) must tile the buffer apart from
 * alignment gaps. Returns 0 or -EINVAL / -ENOMEM.
 *
 * With o->nccl set, `grads` is device memory on the communicator's GPU and
 * the bucketer works in NCCL mode: it creates a comm stream of its own (non-
 * blocking, the device's highest priority, so that the all-reduce kernels
 * are scheduled ahead of backward's) and one event per bucket. Then
 *  - rt_bucketer_ready(), when buckets become complete, records an event on
 *    o->stream (what backward has queued so far), makes the comm stream wait
 *    for it and queues ncclAllReduce(sum, float, in place) for each bucket on
 *    the comm stream. Nothing waits on the host;
 *  - rt_bucketer_finish() queues what is left, makes o->stream wait (an
 *    event, not a host synchronisation) for the comm stream's all-reduces, so
 *    that the optimizer step queued after it reads reduced gradients, and
 *    polls on the host until they are done (that is *wait_ns), watching NCCL
 *    (see "NCCL", the watchdog). The control word still travels over MPI.
 * Call it on the thread that set the device. Returns -ENOTSUP without NCCL,
 * -EIO when CUDA cannot create the stream or events. On error *out is NULL
 * and rt_errmsg() says why.
 */
int rt_bucketer_create(struct rt_comm *c, float *grads, size_t count, const struct rt_bucket_tensor *t, int nt,
                       const struct rt_bucket_opts *o, struct rt_bucketer **out);
/* Frees the plan and, in NCCL mode, the comm stream and its events (after
 * the stream's queued work). Not while a step is in flight. NULL is fine. */
void rt_bucketer_destroy(struct rt_bucketer *b);

/* The number of buckets, at least 1. */
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
 * final during the step (rt_errmsg() names them): the plan check. An MPI,
 * NCCL or CUDA error, a deadline or a dead peer aborts the job instead, here
 * and in rt_bucketer_ready().
 *
 * In late mode (rt_bucket_opts.stream_call) nothing here waits for this
 * update: the wait is queued on the compute stream (in NCCL mode an event,
 * and the host watches the update before's all-reduces instead), and
 * *global_flags is the word of the update before (0 after the first), so a
 * rank's bits reach every rank one update later. The host waits only for the
 * update before's reductions -- their job structures are reused -- and that
 * before this update's first bucket starts, when this update's forward and
 * backward are queued behind them. *wait_ns is then the host's own time.
 */
int rt_bucketer_finish(struct rt_bucketer *b, uint32_t flags, uint32_t *global_flags, uint64_t *wait_ns);
/* Waits on the host for every reduction started so far (late mode leaves the last update's running). Before
 * the gradients are read or the bucketer destroyed; nothing to do otherwise. */
void rt_bucketer_settle(struct rt_bucketer *b);

/* ==== GPU placement ===========================================================
 *
 * rt_gpu_preflight() picks the GPU this rank drives before CUDA or NCCL is
 * touched. It is pure: `visible_gpus` is what the caller counted
 * (cudaGetDeviceCount, rt_backend_probe), `local_rank` / `local_size` come
 * from rt_comm_info(), and `get(ctx, name)` returns a variable or NULL
 * (getenv() behind a context, so tests can pass their own). The rules:
 *
 *  1. A rank that sees no GPU is refused (-ENODEV), naming
 *     CUDA_VISIBLE_DEVICES and, under a Slurm job without GPUs on the node,
 *     how to ask for them.
 *  2. Slurm's per-task binding: inside a Slurm job (SLURM_JOB_ID) whose
 *     tasks were given GPUs of their own -- SLURM_GPUS_PER_TASK
 *     (--gpus-per-task), a GPU in SLURM_TRES_PER_TASK, SLURM_GPU_BIND or
 *     SLURM_TRES_BIND with a type other than "none" (--gpu-bind=single:1,
 *     closest, map_gpu, per_task:N), SLURM_STEP_GPUS (or SLURM_JOB_GPUS)
 *     naming more GPUs than the rank sees, or one GPU per rank with several
 *     ranks on the node -- the rank drives device 0, its own first GPU.
 *     Slurm then hides the node's other GPUs from each task (and, with
 *     ConstrainDevices, keeps it from opening them), so NCCL cannot use
 *     peer-to-peer between them: with more than one rank on the node a note
 *     says so and names the fix, `srun --gres-flags=allow-task-sharing`
 *     (Slurm 23.11+, on the srun line, not #SBATCH; it keeps the per-task
 *     CUDA_VISIBLE_DEVICES but lets each task reach the others' GPUs) or
 *     GPUs per node with `--gpu-bind=none`. SLURM_GRES_FLAGS containing
 *     allow-task-sharing means the fix is in place: no note, rules 3-4.
 *  3. A rank that sees at least as many GPUs as the node has ranks drives
 *     device `local_rank` (mpirun, or srun with GPUs per node and no
 *     binding).
 *  4. A rank that sees exactly one GPU through a CUDA_VISIBLE_DEVICES set
 *     outside Slurm's binding (a wrapper giving each rank its own) drives
 *     device 0. Two ranks given the same GPU are NCCL's to refuse, at
 *     rt_nccl_create().
 *  5. Otherwise the node has fewer GPUs than ranks: -ENODEV, naming the
 *     counts and how to start fewer ranks per node.
 *
 * Returns 0 with *device set and `note` (len bytes) holding a paragraph for
 * the user or "", or -ENODEV / -EINVAL (local rank out of range) with
 * rt_errmsg() saying why and *device = -1. Thread-safe.
 */
int rt_gpu_preflight(int visible_gpus, int local_rank, int local_size,
                     const char *(*get)(void *ctx, const char *name), void *ctx, int *device, char *note,
                     size_t len);

/* ==== NCCL ====================================================================
 *
 * The GPU collective engine: one NCCL communicator over the process group's
 * ranks, one GPU per rank, used by the bucketer in NCCL mode (rt_bucket_opts
 * .nccl) to all-reduce device gradients on a comm stream while backward runs.
 * Across ranks MPI stays the bootstrap (the ncclUniqueId travels by
 * rt_comm_broadcast), the carrier of every host collective and of the step's
 * control word, and the watchdog of peers (heartbeats, pidfds): a dead peer
 * is still caught there. A group of one may make its communicator in this
 * process instead, without MPI (rt_nccl_create_local).
 *
 * Failures. Every NCCL call is checked; the communicator is non-blocking
 * (ncclConfig_t.blocking = 0), so a call that would wait on peers returns at
 * once and is polled (ncclCommGetAsyncError) under the group's deadline
 * (rt_comm_opts.timeout_s, --comm-timeout). An NCCL or CUDA error, or a
 * set-up or an all-reduce still unfinished at the deadline, prints one line
 * naming this rank's step, the bucket(s) in flight (i of n, MB, tensors),
 * NCCL's error string and ncclGetLastError(), then ncclCommAbort and
 * rt_comm_abort end the whole job.
 */
struct rt_nccl;

/* 1 when this build has NCCL and libnccl loads here (it is loaded at run time, not linked), else 0. */
int rt_nccl_available(void);

/*
 * Creates the communicator over every rank of `c`, on CUDA device `device`
 * (this rank's, from rt_gpu_preflight; it becomes the calling thread's
 * current device). Collective: every rank calls it, in the same order
 * relative to the group's other collectives. Rank 0 makes the ncclUniqueId,
 * rt_comm_broadcast hands it out, each rank joins with
 * ncclCommInitRankConfig and polls until NCCL is ready; then a one-integer
 * all-reduce checks the communicator end to end and makes NCCL connect its
 * channels.
 *
 * Rank 0 prints two lines to stderr: the NCCL version with the NCCL_*
 * variables set, and the transport the channels use ("P2P/CUMEM
 * (intra-node), NET/IB (inter-node)"). NCCL has no API for the transport;
 * unless the user set NCCL_DEBUG (in the environment or an nccl.conf) this
 * sets NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET and NCCL_DEBUG_FILE
 * (a private temporary file) for the set-up, reads the channel lines NCCL
 * logged, combines every rank's findings and restores the variables (and
 * NCCL's logging: ncclResetDebugInit). If the user set NCCL_DEBUG, the line
 * says "see NCCL_DEBUG output". setenv() is not thread-safe: no other
 * thread of the caller may read or change the environment meanwhile (call it
 * before starting the loader's workers; the comm thread only makes MPI
 * calls).
 *
 * Returns 0 with *out set, or with *out NULL and rt_errmsg() saying why:
 * -ENOTSUP when the build has no NCCL, -ENODEV when `device` cannot be used,
 * -ENOENT / -ENOSYS when libnccl cannot be loaded or lacks symbols, -ENOMEM.
 * Once the ranks have met (after the broadcast), failures and the deadline
 * end the job instead.
 */
int rt_nccl_create(struct rt_comm *c, int device, struct rt_nccl **out);

/*
 * The same communicator for a process group of one (rt_comm_info(c)->world
 * is 1, as rt_comm_create makes it for a process no MPI launcher started),
 * bootstrapped in this process: ncclGetUniqueId, ncclCommInitRankConfig for
 * one rank (non-blocking, polled under the group's deadline), then the
 * one-integer check all-reduce, on CUDA device `device` (it becomes the
 * calling thread's current device). No MPI call, no launcher, no peer: one
 * GPU's gradients go through the bucketer's NCCL mode as a run across GPUs
 * would send them (`ringtrain train --allreduce nccl`, tests/test_nccl.c).
 * Unlike rt_nccl_create it changes no environment variable (one rank has no
 * transport to report), so other threads may be running. Prints one line:
 * the NCCL version with the NCCL_* variables set.
 * Returns 0 with *out set (destroy it with rt_nccl_destroy), or with *out
 * NULL and rt_errmsg() saying why: -EINVAL when the group has more than one
 * rank, and the errors of rt_nccl_create (-ENOTSUP, -ENODEV, -ENOENT,
 * -ENOSYS, -ENOMEM). A failure of NCCL itself, or a set-up past the
 * deadline, ends the process as in rt_nccl_create.
 */
int rt_nccl_create_local(struct rt_comm *c, int device, struct rt_nccl **out);

/* One line for the banner: "NCCL 2.28.9 on GPU 0, transport: P2P/CUMEM
 * (intra-node)". Owned by `n`. */
const char *rt_nccl_describe(const struct rt_nccl *n);

/*
 * Finalizes (waiting, under the deadline, for what was queued) and destroys
 * the communicator. After every bucketer that uses it was destroyed, before
 * rt_comm_destroy(). NULL is fine. Every rank calls it.
 */
void rt_nccl_destroy(struct rt_nccl *n);

#endif /* RT_COMM_H */
