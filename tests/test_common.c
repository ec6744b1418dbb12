/* test_common.c - common/: size parsing, the Philox RNG, atomic writes. */
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "test_util.h"

static void test_sizes(void)
{
    uint64_t v = 0;
    CHECK(rt_parse_size("4096", &v) == 0 && v == 4096);
    CHECK(rt_parse_size("64M", &v) == 0 && v == 64u << 20);
    CHECK(rt_parse_size("1.5G", &v) == 0 && v == 3u << 29);
    CHECK(rt_parse_size("512KiB", &v) == 0 && v == 512u << 10);
    CHECK(rt_parse_size("2kB", &v) == 0 && v == 2048);
    CHECK_ERR(rt_parse_size("12Q", &v), "not a size");
    CHECK_ERR(rt_parse_size("", &v), "not a size");
    CHECK_ERR(rt_parse_size("-3", &v), "not a size");
}

static void test_rng(void)
{
    struct rt_rng a, b, c;
    /* Philox4x32-10 known-answer test (Random123 kat_vectors: key 0, counter 0). */
    rt_rng_init(&a, 0, 0);
    CHECK(rt_rng_u32(&a) == 0x6627e8d5u);
    CHECK(rt_rng_u32(&a) == 0xe169c58du);
    CHECK(rt_rng_u32(&a) == 0xbc57ac4cu);
    CHECK(rt_rng_u32(&a) == 0x9b00dbd8u);

    /* Same (seed, stream) -> same numbers; another stream differs. */
    rt_rng_init(&a, 42, 7);
    rt_rng_init(&b, 42, 7);
    rt_rng_init(&c, 42, 8);
    int same = 1, differ = 0;
    for (int i = 0; i < 1000; i++) {
        uint32_t x = rt_rng_u32(&a), y = rt_rng_u32(&b), z = rt_rng_u32(&c);
        same &= x == y;
        differ += x != z;
    }
    CHECK(same);
    CHECK(differ > 990);

    /* rt_rng_below is uniform: chi-square over 10 bins, 100000 draws (seed 1). */
    unsigned bins[10] = {0};
    rt_rng_init(&a, 1, 0);
    for (int i = 0; i < 100000; i++) {
        uint32_t k = rt_rng_below(&a, 10);
        CHECK(k < 10);
        if (k < 10)
            bins[k]++;
    }
    double chi = 0;
    for (int i = 0; i < 10; i++)
        chi += (bins[i] - 10000.0) * (bins[i] - 10000.0) / 10000.0;
    CHECKF(chi < 27.9, "chi-square %.2f over 9 dof (p=0.001 bound 27.9)", chi);

    /* Normal draws: mean ~0, variance ~1. */
    double s = 0, s2 = 0;
    for (int i = 0; i < 100000; i++) {
        double x = rt_rng_normal(&a);
        s += x;
        s2 += x * x;
    }
    CHECKF(fabs(s / 1e5) < 0.02 && fabs(s2 / 1e5 - 1) < 0.03, "mean %.4f var %.4f", s / 1e5, s2 / 1e5);
}

static void test_files(void)
{
    char dir[256], path[512], tmp[520];
    uint8_t *buf;
    size_t len;

    tu_tempdir(dir, sizeof(dir), "common");
    snprintf(path, sizeof(path), "%s/a/b/c.txt", dir);
    CHECK_OK(rt_mkdirs(dir, 0755));
    snprintf(tmp, sizeof(tmp), "%s/a/b", dir);
    CHECK_OK(rt_mkdirs(tmp, 0755));
    CHECK_OK(rt_file_write_atomic(path, "hello", 5));
    CHECK_OK(rt_file_read(path, &buf, &len));
    CHECK(len == 5 && memcmp(buf, "hello", 5) == 0 && buf[5] == 0);
    free(buf);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0);
    CHECK_ERR(rt_file_read(tmp, &buf, &len), "c.txt.tmp");
    /* A file where a directory is wanted. */
    CHECK_ERR(rt_mkdirs(path, 0755), "c.txt");
    CHECK_OK(rt_remove_tree(dir));
    CHECK(access(dir, F_OK) != 0);
}

int main(void)
{
    test_sizes();
    test_rng();
    test_files();
    return check_result();
}
