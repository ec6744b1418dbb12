/*
 * shard_read.c - an open shard file with its header, labels and block index
 * loaded and validated, and pread() of single blocks. This is the simple,
 * synchronous reader used by verify, inspect and tests; the training loader
 * reads blocks through its own I/O engine with the same parse functions.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "loader/format.h"

struct rt_shard {
    int fd;
    char *path;
    struct rt_shard_header h;
    int32_t *labels;
    struct rt_block_entry *blocks;
};

static int pread_full(int fd, void *buf, size_t len, uint64_t off, const char *path)
{
    uint8_t *p = buf;
    size_t done = 0;

    while (done < len) {
        ssize_t n = pread(fd, p + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return rt_errf(-errno, "%s: read at offset %" PRIu64 " failed: %s", path, off + done,
                           strerror(errno));
        if (n == 0)
            return rt_errf(-EBADMSG, "%s: truncated: wanted %zu bytes at offset %" PRIu64
                           ", file ends at %" PRIu64,
                           path, len, off, off + done);
        done += (size_t)n;
    }
    return 0;
}

int rt_shard_open(const char *path, struct rt_shard **out)
{
    uint8_t hdr[RT_SHARD_HEADER_SIZE];
    uint8_t *tmp = NULL;
    struct stat st;
    struct rt_shard *s;
    int rc;

    s = rt_calloc(1, sizeof(*s), "shard");
    if (!s)
        return -ENOMEM;
    s->fd = -1;
    s->path = strdup(path);
    if (!s->path) {
        rc = rt_errf(-ENOMEM, "out of memory");
        goto err;
    }
    s->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) {
        rc = rt_errf(-errno, "%s: cannot open shard: %s", path, strerror(errno));
        goto err;
    }
    if (fstat(s->fd, &st) < 0) {
        rc = rt_errf(-errno, "%s: stat failed: %s", path, strerror(errno));
        goto err;
    }
    if ((uint64_t)st.st_size < RT_SHARD_HEADER_SIZE) {
        rc = rt_errf(-EBADMSG, "%s: truncated: %lld bytes, a shard header alone is %u", path,
                     (long long)st.st_size, RT_SHARD_HEADER_SIZE);
        goto err;
    }
    rc = pread_full(s->fd, hdr, sizeof(hdr), 0, path);
    if (rc < 0)
        goto err;
    rc = rt_shard_parse_header(hdr, sizeof(hdr), path, &s->h);
    if (rc < 0)
        goto err;
    if ((uint64_t)st.st_size != s->h.file_size) {
        rc = rt_errf(-EBADMSG, "%s: file is %lld bytes, header says %" PRIu64 "%s", path,
                     (long long)st.st_size, s->h.file_size,
                     (uint64_t)st.st_size < s->h.file_size ? " (truncated)" : "");
        goto err;
    }
    /* Header checks bound record_count and block_count by the file size now. */
    s->labels = rt_malloc(4 * s->h.record_count, "shard labels");
    s->blocks = rt_malloc(sizeof(*s->blocks) * s->h.block_count, "shard block index");
    tmp = rt_malloc(s->h.data_offset - s->h.labels_offset, "shard index bytes");
    if (!s->labels || !s->blocks || !tmp) {
        rc = -ENOMEM;
        goto err;
    }
    rc = pread_full(s->fd, tmp, s->h.data_offset - s->h.labels_offset, s->h.labels_offset, path);
    if (rc < 0)
        goto err;
    rc = rt_shard_parse_labels(&s->h, tmp, 4 * s->h.record_count, path, s->labels);
    if (rc < 0)
        goto err;
    rc = rt_shard_parse_index(&s->h, tmp + (s->h.index_offset - s->h.labels_offset),
                              (size_t)RT_BLOCK_ENTRY_SIZE * s->h.block_count, path, s->blocks);
    if (rc < 0)
        goto err;
    free(tmp);
    *out = s;
    return 0;
err:
    free(tmp);
    rt_shard_close(s);
    return rc;
}

void rt_shard_close(struct rt_shard *s)
{
    if (!s)
        return;
    if (s->fd >= 0)
        close(s->fd);
    free(s->path);
    free(s->labels);
    free(s->blocks);
    free(s);
}

const struct rt_shard_header *rt_shard_header(const struct rt_shard *s) { return &s->h; }

const int32_t *rt_shard_labels(const struct rt_shard *s) { return s->labels; }

const struct rt_block_entry *rt_shard_blocks(const struct rt_shard *s) { return s->blocks; }

int rt_shard_read_block(const struct rt_shard *s, uint32_t block, void *buf)
{
    if (block >= s->h.block_count)
        return rt_errf(-EINVAL, "%s: block %" PRIu32 " out of range (%" PRIu32 " blocks)", s->path, block,
                       s->h.block_count);
    return pread_full(s->fd, buf, s->blocks[block].stored_size, s->blocks[block].offset, s->path);
}
