/*
 * fuzz_pickle.c - libFuzzer target for loader/pickle.c. Feeds each input to
 * both the batch and the meta reader and frees whatever they return; the
 * sanitizers report any overread, leak or undefined behaviour, and a crash
 * or hang is a finding. It checks no values: tests/test_pickle.c does that.
 *
 * Seeds: tests/fuzz/corpus/pickle/ (small files written by
 * tests/fixtures/make_pickle_fixtures.py).
 */
#include "loader/pickle.h"
#include "common/common.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct rt_cifar_py_batch b;
    struct rt_cifar_py_meta m;
    int rc;

    rc = rt_pickle_cifar_batch(data, size, "fuzz", &b);
    if (rc == 0) {
        /* Every byte the result claims must be there. */
        unsigned sum = 0;
        if (!b.data || !b.labels || b.n == 0)
            abort();
        for (uint64_t i = 0; i < b.n * 3072; i++)
            sum += b.data[i];
        for (uint64_t i = 0; i < b.n; i++) {
            if (b.labels[i] < 0 || (b.coarse && b.coarse[i] < 0))
                abort();
            sum += (unsigned)b.labels[i];
        }
        (void)sum;
    } else if ((rc != -EBADMSG && rc != -ENOMEM) || !strstr(rt_errmsg(), "fuzz")) {
        abort();
    }
    rt_pickle_cifar_batch_free(&b);

    rc = rt_pickle_cifar_meta(data, size, "fuzz", &m);
    if (rc == 0) {
        if (!m.names || m.n == 0 || (m.ncoarse && !m.coarse_names))
            abort();
        for (size_t i = 0; i < m.n; i++)
            (void)strlen(m.names[i]);
        for (size_t i = 0; i < m.ncoarse; i++)
            (void)strlen(m.coarse_names[i]);
    } else if ((rc != -EBADMSG && rc != -ENOMEM) || !strstr(rt_errmsg(), "fuzz")) {
        abort();
    }
    rt_pickle_cifar_meta_free(&m);
    return 0;
}
