/*
 * comm_impl.h - private to comm/: the collective job queue that the
 * process group (comm.c) runs on its comm thread and the bucketer
 * (bucket.c) feeds.
 */
#ifndef RT_COMM_IMPL_H
#define RT_COMM_IMPL_H

#include <mpi.h>

#include "comm/comm.h"

enum job_kind {
    JOB_ALLREDUCE,
    JOB_REDUCE,
    JOB_BCAST,
    JOB_ALLGATHER,
    JOB_BARRIER,
};

/*
 * One collective. The submitter owns the memory and keeps it until the job is
 * done; the comm thread starts jobs in submission order (the order every rank
 * issues them in) and completes them in any order.
 */
struct comm_job {
    enum job_kind kind;
    int local;                  /* 1: on the node-local communicator */
    void *buf;
    const void *sbuf;           /* ALLGATHER's send buffer */
    int count;
    MPI_Datatype dt;
    MPI_Op op;
    int root;
    double timeout_s;           /* 0: none */
    int bucket;                 /* bucket index, -1 for other collectives */
    char what[200];
    uint64_t step;              /* the step it was submitted at */
    /* comm thread */
    MPI_Request req;
    uint64_t t_start;
    struct comm_job *next;
    int done;                   /* under the group's lock */
};

/* Queues `j` (fills step, clears done) for the comm thread, and counts it
 * (a bucket all-reduce when j->bucket >= 0). */
void comm_job_submit(struct rt_comm *c, struct comm_job *j);
/* Blocks until `j` is done. Deadlines are the comm thread's business. */
void comm_job_wait(struct rt_comm *c, struct comm_job *j);
/* The group's collective deadline (rt_comm_opts.timeout_s). */
double comm_timeout(const struct rt_comm *c);
/* 1 when the group has more than one rank (a comm thread runs). */
int comm_parallel(const struct rt_comm *c);

#endif
