/*
 * io.h - the loader's block reader (private to loader/): a queue of read
 * requests served by one io_uring thread keeping `depth` reads in flight,
 * or, where io_uring is unavailable or not wanted, by a pool of `depth`
 * threads calling pread(). Both hand each completed read to the same
 * callback, so what is read never depends on the engine.
 *
 * The engine owns a pool of read buffers (registered with io_uring when the
 * kernel allows); a completed read's buffer stays with the callee until it
 * calls rt_io_put_buffer(), which is how decoding applies backpressure to
 * reading.
 */
#ifndef RT_LOADER_IO_H
#define RT_LOADER_IO_H

#include <stdint.h>

#include "loader/loader.h"

struct rt_io_req {
    uint32_t file;          /* index into rt_io_opts.paths */
    uint64_t offset;
    uint32_t len;
    uint64_t cookie;        /* the caller's */
    /* Set by the engine for the callback: */
    uint32_t buf;           /* buffer to hand back with rt_io_put_buffer() */
    const uint8_t *data;    /* the len bytes read */
};

/*
 * Called from an engine thread for every request, in completion order.
 * err is 0, or -errno with rt_errmsg() naming the file and offset; after an
 * error the engine stops reading.
 */
typedef void (*rt_io_done_fn)(void *ctx, struct rt_io_req *req, int err);

struct rt_io_opts {
    enum rt_io_kind kind;
    uint32_t depth;              /* reads in flight; >= 1 */
    int direct;                  /* O_DIRECT */
    uint32_t max_len;            /* largest request */
    uint32_t nbufs;              /* read buffers; >= depth */
    const char *const *paths;    /* borrowed during create */
    uint32_t nfiles;
    rt_io_done_fn done;
    void *done_ctx;
    const char *trace_tag;       /* appended to the threads' trace track names (" (val)"); NULL = none */
};

struct rt_io_stats {
    const char *kind;            /* "io_uring" or "pread" */
    int direct, fixed_buffers, fixed_files;
    uint64_t reads, bytes, busy_ns;
};

struct rt_io;

/* Opens the files, sets up the engine and starts its thread(s). 0 or -errno. */
int rt_io_create(const struct rt_io_opts *o, struct rt_io **out);
/* Stops the threads (waiting for reads in flight) and closes the files; NULL is fine. */
void rt_io_destroy(struct rt_io *io);
/* Queues a read (the request is copied). Thread-safe; never blocks. 0 or -ENOMEM. */
int rt_io_submit(struct rt_io *io, const struct rt_io_req *req);
/* Hands a buffer back once its data has been consumed. Thread-safe. */
void rt_io_put_buffer(struct rt_io *io, uint32_t buf);
void rt_io_get_stats(struct rt_io *io, struct rt_io_stats *s);

#endif
