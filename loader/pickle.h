/*
 * pickle.h (private to loader/) - reads the CIFAR "python version" batch and
 * meta files, which are Python pickles, without executing anything.
 *
 * The parser runs the pickle opcode stream on a small value stack of its own
 * (dicts, lists, tuples, ints, strings, bytes) and only recognises the few
 * global callables that numpy arrays and Python 3's bytes-as-latin1 encoding
 * need, recording them as data rather than calling them. It accepts what
 * Python 2 cPickle writers emit (protocol 0-2, BINSTRING/SHORT_BINSTRING,
 * INT booleans) and what Python 3 writers emit (protocols 2-5: BINBYTES,
 * BINUNICODE, FRAME, MEMOIZE, STACK_GLOBAL, BYTEARRAY8, _codecs.encode).
 * Anything else -- unknown opcode, unknown global, PERSID, out-of-band
 * buffers, truncation -- is rejected with -EBADMSG and a message naming the
 * file, the byte offset and the opcode.
 */
#ifndef RT_LOADER_PICKLE_H
#define RT_LOADER_PICKLE_H

#include <stddef.h>
#include <stdint.h>

/* One CIFAR python batch: data_batch_N / test_batch (CIFAR-10), train / test (CIFAR-100). */
struct rt_cifar_py_batch {
    uint8_t *data;    /* n * 3072 bytes, each row 1024 R, 1024 G, 1024 B; owned */
    uint64_t n;       /* records */
    int32_t *labels;  /* n: 'labels' (CIFAR-10) or 'fine_labels' (CIFAR-100); owned */
    int32_t *coarse;  /* n: 'coarse_labels' (CIFAR-100) or NULL; owned */
};

/*
 * Parses one batch pickle held in `buf` (`len` bytes; `name` is used in
 * messages). Keys may be str or bytes. 'data' must be a uint8 numpy array of
 * shape (n, 3072) (C order) or (n, 3, 32, 32); labels a list (or int numpy
 * array) of n non-negative ints. Returns 0 or -EBADMSG / -ENOMEM; on error
 * `out` holds nothing to free.
 */
int rt_pickle_cifar_batch(const void *buf, size_t len, const char *name,
                          struct rt_cifar_py_batch *out);

/* Frees the arrays of a batch; a zeroed struct is fine. */
void rt_pickle_cifar_batch_free(struct rt_cifar_py_batch *b);

/* The meta file: 'batches.meta' (CIFAR-10) or 'meta' (CIFAR-100). */
struct rt_cifar_py_meta {
    char **names;         /* 'label_names' or 'fine_label_names'; owned */
    size_t n;
    char **coarse_names;  /* 'coarse_label_names' or NULL; owned */
    size_t ncoarse;
};

/* Parses a meta pickle. Returns 0 or -EBADMSG / -ENOMEM. */
int rt_pickle_cifar_meta(const void *buf, size_t len, const char *name,
                         struct rt_cifar_py_meta *out);

/* Frees a meta struct; a zeroed struct is fine. */
void rt_pickle_cifar_meta_free(struct rt_cifar_py_meta *m);

#endif /* RT_LOADER_PICKLE_H */
