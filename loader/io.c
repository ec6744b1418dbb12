/*
 * io.c - the loader's block reader: io_uring with `depth` reads in flight
 * (registered files and buffers where the kernel allows, optional
 * O_DIRECT), or a pool of pread() threads where io_uring is unavailable or
 * the caller asks for it. See io.h for the contract.
 *
 * The io_uring thread fills the submission queue to depth from the request
 * queue (as long as read buffers are free), submits once, waits for one
 * completion and reaps the rest, requeueing short reads. New requests only
 * need a wake-up when nothing is in flight; otherwise the next completion
 * brings the thread back to the queue.
 *
 * valgrind does not see the kernel fill io_uring buffers and flags their
 * bytes as uninitialised; under valgrind use the pread engine.
 *
 * Trace tracks: "loader io" (the io_uring thread: "read blocks" from submit
 * to the first completion, "reap" for handing the completions on) or
 * "loader io N" (each pread thread: "read blocks" per request, of one
 * block), each name followed by the caller's trace_tag.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/common.h"
#include "common/trace.h"
#include "loader/io.h"

#define ALIGN 4096u

/* Trace track order: the io_uring thread, then the pread threads (the loader's threads sort in 10..99). */
#define TRACE_SORT_URING 11
#define TRACE_SORT_PREAD 60
#define TRACE_SORT_LAST 99

/* A read in progress: where it lives in its buffer and how much has arrived. */
struct pending {
    struct rt_io_req req;
    uint64_t start;      /* file offset of buf[0] (aligned down for O_DIRECT) */
    uint32_t need;       /* bytes from start that must arrive */
    uint32_t want;       /* bytes asked for (aligned up for O_DIRECT) */
    uint32_t got;
};

struct rt_io {
    struct rt_io_opts o;
    int *fds;
    char **paths;
    int uring;                  /* io_uring engine in use */
    struct io_uring ring;
    int fixed_files, fixed_bufs;
    uint8_t *bufmem;
    size_t buf_size;
    struct pending *pend;       /* one per buffer */

    pthread_mutex_t mu;
    pthread_cond_t cond;        /* requests or buffers arrived, or stop */
    struct rt_io_req *queue;    /* circular */
    size_t qcap, qhead, qlen;
    uint32_t *free_bufs;
    uint32_t nfree;
    int stop, failed;
    uint32_t inflight;
    uint64_t busy_since, busy_ns, reads, bytes;

    pthread_t *threads;
    uint32_t nthreads;
    uint32_t started;           /* atomic: pread threads numbered so far (their track names) */
    char tag[16];               /* trace_tag */
};

static uint64_t align_down(uint64_t v) { return v / ALIGN * ALIGN; }
static uint64_t align_up(uint64_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

/* Called with mu held: the busy clock runs while anything is in flight. */
static void inflight_add(struct rt_io *io, int delta)
{
    if (delta > 0 && io->inflight == 0)
        io->busy_since = rt_now_ns();
    io->inflight = (uint32_t)((int)io->inflight + delta);
    if (delta < 0 && io->inflight == 0)
        io->busy_ns += rt_now_ns() - io->busy_since;
}

/* Pops a request and a buffer if both are available (mu held). */
static int take_work(struct rt_io *io, struct pending **out)
{
    if (!io->qlen || !io->nfree || io->failed)
        return 0;
    uint32_t b = io->free_bufs[--io->nfree];
    struct pending *p = &io->pend[b];
    p->req = io->queue[io->qhead];
    io->qhead = (io->qhead + 1) % io->qcap;
    io->qlen--;
    p->req.buf = b;
    p->start = io->o.direct ? align_down(p->req.offset) : p->req.offset;
    p->need = (uint32_t)(p->req.offset - p->start) + p->req.len;
    p->want = io->o.direct ? (uint32_t)align_up(p->need) : p->need;
    p->got = 0;
    p->req.data = io->bufmem + io->buf_size * b + (p->req.offset - p->start);
    *out = p;
    return 1;
}

static void fail(struct rt_io *io, struct pending *p, int err)
{
    pthread_mutex_lock(&io->mu);
    io->failed = 1;
    pthread_mutex_unlock(&io->mu);
    io->o.done(io->o.done_ctx, &p->req, err);
}

/* Accounts for `n` more bytes of p; returns 1 when the read is complete. */
static int advance(struct rt_io *io, struct pending *p, long n)
{
    if (n < 0) {
        fail(io, p, rt_errf((int)n, "%s: read of %" PRIu32 " bytes at offset %" PRIu64 " failed: %s",
                            io->paths[p->req.file], p->req.len, p->req.offset, strerror((int)-n)));
        return -1;
    }
    if (n == 0 && p->got < p->need) {
        fail(io, p, rt_errf(-EBADMSG, "%s: truncated: wanted %" PRIu32 " bytes at offset %" PRIu64
                            ", the file ends at %" PRIu64,
                            io->paths[p->req.file], p->req.len, p->req.offset, p->start + p->got));
        return -1;
    }
    p->got += (uint32_t)n;
    return p->got >= p->need;
}

static void complete(struct rt_io *io, struct pending *p)
{
    pthread_mutex_lock(&io->mu);
    io->reads++;
    io->bytes += p->req.len;
    pthread_mutex_unlock(&io->mu);
    io->o.done(io->o.done_ctx, &p->req, 0);
}

/* ---- io_uring engine ------------------------------------------------------- */

static void uring_prep(struct rt_io *io, struct pending *p)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring); /* never NULL: inflight <= entries */
    uint8_t *dst = io->bufmem + io->buf_size * p->req.buf + p->got;
    int fd = io->fixed_files ? (int)p->req.file : io->fds[p->req.file];

    if (io->fixed_bufs)
        io_uring_prep_read_fixed(sqe, fd, dst, p->want - p->got, p->start + p->got, (int)p->req.buf);
    else
        io_uring_prep_read(sqe, fd, dst, p->want - p->got, p->start + p->got);
    if (io->fixed_files)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, p);
}

/* Ends span `name` begun at t0 (non-zero: it was recording) on this thread's track, labelled "<n> <what>". */
static void trace_count_end(uint64_t t0, const char *name, unsigned n, const char *what)
{
    char label[64]; /* the recorder keeps 23 characters */
    snprintf(label, sizeof(label), "%u %s", n, what);
    rt_trace_span(RT_TRACE_LOADER, name, label, t0, rt_now_ns());
}

static void *uring_thread(void *arg)
{
    struct rt_io *io = arg;
    char name[32];

    snprintf(name, sizeof(name), "loader io%s", io->tag);
    rt_trace_thread_name(name, TRACE_SORT_URING);
    for (;;) {
        struct pending *p;
        unsigned prepped = 0;

        pthread_mutex_lock(&io->mu);
        while (!io->stop && io->inflight == 0 && !(io->qlen && io->nfree && !io->failed))
            pthread_cond_wait(&io->cond, &io->mu);
        if (io->stop && io->inflight == 0) {
            pthread_mutex_unlock(&io->mu);
            break;
        }
        while (!io->stop && io->inflight < io->o.depth && take_work(io, &p)) {
            uring_prep(io, p);
            inflight_add(io, 1);
            prepped++;
        }
        pthread_mutex_unlock(&io->mu);
        /* Spans: the submission and the wait for a completion, then the reaping; both end in this pass. */
        uint64_t t_read = rt_trace_begin();
        if (prepped) {
            int rc = io_uring_submit(&io->ring);
            if (rc < 0) {
                /* Nothing reached the kernel; report against the first request and stop. */
                fail(io, p, rt_errf(rc, "io_uring submit failed: %s", strerror(-rc)));
                pthread_mutex_lock(&io->mu);
                inflight_add(io, -(int)prepped);
                pthread_mutex_unlock(&io->mu);
                continue;
            }
        }
        pthread_mutex_lock(&io->mu);
        uint32_t inflight = io->inflight;
        pthread_mutex_unlock(&io->mu);
        if (!inflight)
            continue;

        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&io->ring, &cqe);
        if (rc < 0) {
            if (rc == -EINTR)
                continue;
            rt_errf(rc, "io_uring wait failed: %s", strerror(-rc));
            pthread_mutex_lock(&io->mu);
            io->failed = 1;
            pthread_mutex_unlock(&io->mu);
            continue;
        }
        if (t_read)
            trace_count_end(t_read, "read blocks", inflight, "in flight");
        uint64_t t_reap = rt_trace_begin();
        /* Reap everything that is ready, requeueing short reads at once. */
        unsigned head, seen = 0, requeued = 0;
        int done_count = 0;
        io_uring_for_each_cqe(&io->ring, head, cqe)
        {
            struct pending *q = io_uring_cqe_get_data(cqe);
            int st = advance(io, q, cqe->res);
            seen++;
            if (st == 0) {
                uring_prep(io, q);
                requeued++;
            } else {
                if (st == 1)
                    complete(io, q);
                done_count++;
            }
        }
        io_uring_cq_advance(&io->ring, seen);
        if (requeued)
            io_uring_submit(&io->ring);
        pthread_mutex_lock(&io->mu);
        inflight_add(io, -done_count);
        pthread_mutex_unlock(&io->mu);
        if (t_reap)
            trace_count_end(t_reap, "reap", (unsigned)done_count, "done");
    }
    return NULL;
}

/* ---- pread engine ------------------------------------------------------------ */

static void *pread_thread(void *arg)
{
    struct rt_io *io = arg;
    const uint32_t idx = __atomic_fetch_add(&io->started, 1, __ATOMIC_RELAXED);
    char name[32];

    snprintf(name, sizeof(name), "loader io %" PRIu32 "%s", idx, io->tag);
    rt_trace_thread_name(name, idx < TRACE_SORT_LAST - TRACE_SORT_PREAD ? TRACE_SORT_PREAD + (int)idx
                                                                        : TRACE_SORT_LAST);
    for (;;) {
        struct pending *p;

        pthread_mutex_lock(&io->mu);
        while (!io->stop && !(io->qlen && io->nfree && !io->failed))
            pthread_cond_wait(&io->cond, &io->mu);
        if (io->stop) {
            pthread_mutex_unlock(&io->mu);
            break;
        }
        take_work(io, &p);
        inflight_add(io, 1);
        pthread_mutex_unlock(&io->mu);

        /* Read before the callback: once the buffer is handed on, another thread may reuse p. */
        const uint32_t bytes = p->req.len;
        const uint64_t t0 = rt_trace_begin();
        int st = 0;
        while (st == 0) {
            ssize_t n = pread(io->fds[p->req.file], io->bufmem + io->buf_size * p->req.buf + p->got,
                              p->want - p->got, (off_t)(p->start + p->got));
            if (n < 0 && errno == EINTR)
                continue;
            st = advance(io, p, n < 0 ? -errno : n);
        }
        if (st == 1)
            complete(io, p);
        if (t0)
            trace_count_end(t0, "read blocks", bytes, "bytes");
        pthread_mutex_lock(&io->mu);
        inflight_add(io, -1);
        pthread_mutex_unlock(&io->mu);
    }
    return NULL;
}

/* ---- set-up ------------------------------------------------------------------ */

/* Opens with O_DIRECT when asked and the filesystem takes it; *direct is cleared otherwise. */
static int open_file(const char *path, int *direct, int *fd_out)
{
    int fd;

    if (*direct) {
        fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (fd >= 0) {
            /* Some filesystems accept the flag at open and refuse the read. */
            void *probe = aligned_alloc(ALIGN, ALIGN);
            ssize_t n = probe ? pread(fd, probe, ALIGN, 0) : -1;
            free(probe);
            if (n >= 0) {
                *fd_out = fd;
                return 0;
            }
            close(fd);
        }
        if (errno != EINVAL)
            return rt_errf(-errno, "%s: cannot open: %s", path, strerror(errno));
        *direct = 0;
        rt_info("io: %s does not support O_DIRECT; reading through the page cache", path);
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rt_errf(-errno, "%s: cannot open: %s", path, strerror(errno));
    *fd_out = fd;
    return 0;
}

static int setup_uring(struct rt_io *io)
{
    int rc;

    if (getenv("RINGTRAIN_NO_IO_URING") && *getenv("RINGTRAIN_NO_IO_URING") &&
        strcmp(getenv("RINGTRAIN_NO_IO_URING"), "0"))
        return -ENOSYS;
    rc = io_uring_queue_init(io->o.depth < 8 ? 8 : io->o.depth, &io->ring, 0);
    if (rc < 0)
        return rc;
    io->uring = 1;
    if (io_uring_register_files(&io->ring, io->fds, io->o.nfiles) == 0)
        io->fixed_files = 1;
    struct iovec *iov = rt_malloc(sizeof(*iov) * io->o.nbufs, "io vectors");
    if (!iov)
        return 0;
    for (uint32_t i = 0; i < io->o.nbufs; i++) {
        iov[i].iov_base = io->bufmem + io->buf_size * i;
        iov[i].iov_len = io->buf_size;
    }
    /* Registered buffers are pinned; without the memlock allowance plain reads do. */
    if (io_uring_register_buffers(&io->ring, iov, io->o.nbufs) == 0)
        io->fixed_bufs = 1;
    free(iov);
    return 0;
}

int rt_io_create(const struct rt_io_opts *o, struct rt_io **out)
{
    struct rt_io *io;
    int rc;

    if (!o->depth || o->nbufs < o->depth || !o->nfiles || !o->done)
        return rt_errf(-EINVAL, "io: bad options (depth %" PRIu32 ", buffers %" PRIu32 ")", o->depth, o->nbufs);
    io = rt_calloc(1, sizeof(*io), "io engine");
    if (!io)
        return -ENOMEM;
    io->o = *o;
    io->o.paths = NULL;
    io->o.trace_tag = NULL;
    snprintf(io->tag, sizeof(io->tag), "%s", o->trace_tag ? o->trace_tag : "");
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->cond, NULL);
    io->fds = rt_malloc(sizeof(int) * o->nfiles, "io files");
    io->paths = rt_calloc(o->nfiles, sizeof(char *), "io paths");
    io->buf_size = align_up(o->max_len) + 2 * ALIGN;
    io->bufmem = aligned_alloc(ALIGN, io->buf_size * o->nbufs);
    io->pend = rt_calloc(o->nbufs, sizeof(*io->pend), "io pending");
    io->free_bufs = rt_malloc(sizeof(uint32_t) * o->nbufs, "io buffer list");
    io->qcap = 256;
    io->queue = rt_malloc(sizeof(*io->queue) * io->qcap, "io queue");
    if (!io->fds || !io->paths || !io->bufmem || !io->pend || !io->free_bufs || !io->queue) {
        rc = rt_errf(-ENOMEM, "io: out of memory for %" PRIu32 " read buffers", o->nbufs);
        free(io->fds);
        io->fds = NULL;
        goto err;
    }
    for (uint32_t i = 0; i < o->nfiles; i++)
        io->fds[i] = -1;
    for (uint32_t i = 0; i < o->nbufs; i++)
        io->free_bufs[i] = o->nbufs - 1 - i;
    io->nfree = o->nbufs;
    for (uint32_t i = 0; i < o->nfiles; i++) {
        io->paths[i] = strdup(o->paths[i]);
        if (!io->paths[i]) {
            rc = rt_errf(-ENOMEM, "out of memory");
            goto err;
        }
        rc = open_file(o->paths[i], &io->o.direct, &io->fds[i]);
        if (rc < 0)
            goto err;
    }
    if (o->kind != RT_IO_PREAD) {
        rc = setup_uring(io);
        if (rc < 0 && o->kind == RT_IO_URING) {
            rc = rt_errf(rc, "io_uring is not available here: %s", strerror(-rc));
            goto err;
        }
        if (rc < 0)
            rt_info("io: io_uring unavailable (%s); reading with a pool of %" PRIu32 " pread threads instead",
                    strerror(-rc), o->depth);
    }
    io->nthreads = io->uring ? 1 : o->depth;
    io->threads = rt_calloc(io->nthreads, sizeof(pthread_t), "io threads");
    if (!io->threads) {
        rc = -ENOMEM;
        goto err;
    }
    for (uint32_t i = 0; i < io->nthreads; i++) {
        rc = -pthread_create(&io->threads[i], NULL, io->uring ? uring_thread : pread_thread, io);
        if (rc < 0) {
            rt_errf(rc, "io: cannot start a thread: %s", strerror(-rc));
            io->nthreads = i;
            goto err;
        }
    }
    *out = io;
    return 0;
err:
    rt_io_destroy(io);
    return rc;
}

void rt_io_destroy(struct rt_io *io)
{
    if (!io)
        return;
    pthread_mutex_lock(&io->mu);
    io->stop = 1;
    pthread_cond_broadcast(&io->cond);
    pthread_mutex_unlock(&io->mu);
    for (uint32_t i = 0; i < io->nthreads; i++)
        pthread_join(io->threads[i], NULL);
    if (io->uring)
        io_uring_queue_exit(&io->ring);
    for (uint32_t i = 0; io->fds && i < io->o.nfiles; i++)
        if (io->fds[i] >= 0)
            close(io->fds[i]);
    for (uint32_t i = 0; io->paths && i < io->o.nfiles; i++)
        free(io->paths[i]);
    pthread_cond_destroy(&io->cond);
    pthread_mutex_destroy(&io->mu);
    free(io->threads);
    free(io->fds);
    free(io->paths);
    free(io->bufmem);
    free(io->pend);
    free(io->free_bufs);
    free(io->queue);
    free(io);
}

int rt_io_submit(struct rt_io *io, const struct rt_io_req *req)
{
    pthread_mutex_lock(&io->mu);
    if (io->qlen == io->qcap) {
        struct rt_io_req *q = rt_malloc(sizeof(*q) * io->qcap * 2, "io queue");
        if (!q) {
            pthread_mutex_unlock(&io->mu);
            return -ENOMEM;
        }
        for (size_t i = 0; i < io->qlen; i++)
            q[i] = io->queue[(io->qhead + i) % io->qcap];
        free(io->queue);
        io->queue = q;
        io->qhead = 0;
        io->qcap *= 2;
    }
    io->queue[(io->qhead + io->qlen) % io->qcap] = *req;
    io->qlen++;
    /* The io_uring thread only sleeps on the condition when nothing is in flight. */
    pthread_cond_broadcast(&io->cond);
    pthread_mutex_unlock(&io->mu);
    return 0;
}

void rt_io_put_buffer(struct rt_io *io, uint32_t buf)
{
    pthread_mutex_lock(&io->mu);
    io->free_bufs[io->nfree++] = buf;
    pthread_cond_broadcast(&io->cond);
    pthread_mutex_unlock(&io->mu);
}

void rt_io_get_stats(struct rt_io *io, struct rt_io_stats *s)
{
    pthread_mutex_lock(&io->mu);
    s->kind = io->uring ? "io_uring" : "pread";
    s->direct = io->o.direct;
    s->fixed_buffers = io->fixed_bufs;
    s->fixed_files = io->fixed_files;
    s->reads = io->reads;
    s->bytes = io->bytes;
    s->busy_ns = io->busy_ns + (io->inflight ? rt_now_ns() - io->busy_since : 0);
    pthread_mutex_unlock(&io->mu);
}
