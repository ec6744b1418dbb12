/*
 * comm_impl.h - private to comm/: the collective job queue that the
 * process group (comm.c) runs on its comm thread and the bucketer
 * (bucket.c) feeds, and the device path (nccl.c) the bucketer uses in NCCL
 * mode.
 */
#ifndef RT_COMM_IMPL_H
#define RT_COMM_IMPL_H

#include <mpi.h>

#include "comm/comm.h"

enum rt_comm_job_kind {
    JOB_ALLREDUCE,
    JOB_REDUCE,
    JOB_BCAST,
    JOB_ALLGATHER,
    JOB_BARRIER,
    JOB_SEND,                   /* to `root` (rt_comm_gather_one) */
    JOB_RECV,                   /* from `root` */
};

/*
 * One collective. The submitter owns the memory and keeps it until the job is
 * done; the comm thread starts jobs in submission order (the order every rank
 * issues them in) and completes them in any order.
 */
struct rt_comm_job {
    enum rt_comm_job_kind kind;
    int local;                  /* 1: on the node-local communicator */
    void *buf;
    const void *sbuf;           /* ALLGATHER's send buffer */
    int count;
    MPI_Datatype dt;
    MPI_Op op;
    int root;
    double timeout_s;           /* 0: none */
    int bucket;                 /* bucket index, -1 for other collectives */
    void (*fence)(void *ctx, int bucket); /* the comm thread calls it before starting (rt_bucket_opts.fence_wait) */
    void *fence_ctx;
    char what[200];
    uint64_t step;              /* the step it was submitted at */
    uint64_t *done_count;       /* or NULL: incremented (under the group's lock) when the job is done */
    /* comm thread */
    MPI_Request req;
    uint64_t t_submit, t_start; /* handed over (a bucket: ready); started on the comm thread */
    struct rt_comm_job *next;
    int done;                   /* under the group's lock */
};

/* Queues `j` (fills step, clears done) for the comm thread, and counts it
 * (a bucket all-reduce when j->bucket >= 0). */
void rt_comm_job_submit(struct rt_comm *c, struct rt_comm_job *j);
/* Blocks until `j` is done. Deadlines are the comm thread's business. */
void rt_comm_job_wait(struct rt_comm *c, struct rt_comm_job *j);
/* Blocks until *count (a job's done_count, written under the group's lock) reaches `target`; any thread. */
void rt_comm_count_wait(struct rt_comm *c, const uint64_t *count, uint64_t target);
/* The group's collective deadline (rt_comm_opts.timeout_s). */
double rt_comm_timeout(const struct rt_comm *c);
/* 1 when the group has more than one rank (a comm thread runs). */
int rt_comm_parallel(const struct rt_comm *c);
/* Counts a gradient bucket's all-reduce that did not go through the job
 * queue (NCCL mode), so rt_comm_counts() covers both paths. */
void rt_comm_count_bucket(struct rt_comm *c);

/* ---- lifeline.c: a TCP connection to each heartbeat partner ---------------------
 * Beside MPI, for the watchdog: a peer process that dies closes it (seen at
 * once, on any node), heartbeats go over it, and a rank that ends the job
 * says why on it. Set-up is collective; the rest is the comm thread's, except
 * rt_comm_lifeline_send(), which any thread may call.
 */
#define LL_TEXT_MAX 1000

enum rt_comm_lifeline_kind {
    LL_HEARTBEAT = 1, /* step and phase */
    LL_ABORT,         /* the sender is ending the job: text says why */
    LL_BYE,           /* the sender is past its last collective and leaving: its end is no death */
};

struct rt_comm_lifeline_msg {
    enum rt_comm_lifeline_kind kind;
    int rank, phase;
    uint64_t step;
    char text[LL_TEXT_MAX + 1];
};

struct rt_comm_lifeline;

/* Collective over `world`, before the comm thread: connects this rank with
 * every rank r for which partner[r] is set (the partner relation must be
 * symmetric), waiting at most timeout_s for all of them. Returns 0, or -errno
 * with rt_errmsg() naming the rank that could not be reached; every rank
 * returns (an error here is for the caller to abort the job on). */
int rt_comm_lifeline_create(MPI_Comm world, const int *partner, double timeout_s, struct rt_comm_lifeline **out);
void rt_comm_lifeline_destroy(struct rt_comm_lifeline *l); /* NULL is fine */
/* The connection to rank r, for poll(); -1 when there is none or it closed. */
int rt_comm_lifeline_fd(const struct rt_comm_lifeline *l, int r);
/* Best effort, never blocks: a peer that stopped taking messages gets none
 * from then on. Thread-safe. */
void rt_comm_lifeline_send(struct rt_comm_lifeline *l, int r, const struct rt_comm_lifeline_msg *m);
/* Reads what rank r's connection holds and calls on() for each whole
 * message, in order. Returns 0, or -EPIPE once the connection ended (the
 * peer closed it, or its process died), -EPROTO on garbage. */
int rt_comm_lifeline_read(struct rt_comm_lifeline *l, int r,
                          void (*on)(void *ctx, const struct rt_comm_lifeline_msg *m), void *ctx);
/* Closes the connection to rank r (rt_comm_lifeline_fd() is -1 from then on). */
void rt_comm_lifeline_close(struct rt_comm_lifeline *l, int r);

/* ---- nccl.c: the bucketer's device path --------------------------------------
 * One bucketer's comm stream, its events and the record of what is in flight.
 * All calls from the training thread, on the communicator's device. Without
 * NCCL in the build, rt_nccl_stream_create() returns -ENOTSUP and nothing else
 * is reached.
 */
struct rt_nccl_stream;

/* A comm stream and `nb` per-bucket events for all-reduces on n, following
 * `compute` (a cudaStream_t). Returns 0, -ENOTSUP or -EIO (rt_errmsg()). */
int rt_nccl_stream_create(struct rt_nccl *n, void *compute, int nb, struct rt_nccl_stream **out);
void rt_nccl_stream_destroy(struct rt_nccl_stream *s); /* NULL is fine */
/* A new step: no bucket is in flight. */
void rt_nccl_stream_begin(struct rt_nccl_stream *s, uint64_t step);
/* Makes the comm stream wait for everything queued on the compute stream so
 * far (one event), before the all-reduces of the buckets that just became
 * complete are queued behind it. */
void rt_nccl_stream_follow(struct rt_nccl_stream *s);
/* Queues bucket k's all-reduce (sum, in place) on the comm stream. Buckets
 * are queued in order 0, 1, ...; `what` (borrowed for the stream's life)
 * names it in failure messages. */
void rt_nccl_stream_allreduce(struct rt_nccl_stream *s, int k, float *buf, size_t count, const char *what);
/* Makes the compute stream wait for every queued all-reduce (an event), then
 * polls on the host until they are done, as the watchdog: an NCCL error or an
 * all-reduce older than the group's deadline ends the job. */
void rt_nccl_stream_wait(struct rt_nccl_stream *s);
/* The two halves: the compute stream waits for this step's all-reduces (an
 * event, no host wait); the host polls, as the watchdog, until this step's
 * (before = 0) or the step before's (before = 1) are done. The step records
 * are kept in two generations used in turn, so the step before's can be
 * watched once this one's are queued (late mode). */
void rt_nccl_stream_join(struct rt_nccl_stream *s);
void rt_nccl_stream_watch(struct rt_nccl_stream *s, int before);

#endif
