/*
 * test_common.c - common/: size parsing, the Philox RNG, atomic writes, and
 * the helpers for files on a node other users share (exclusive creation,
 * temporary names, opening for writing without following a link, reading
 * under a directory fd). rt_dir_open_owned is tested where it is used, in
 * test_stage.c.
 */
#include <errno.h>
#include <fcntl.h>
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


/* 1 if `path` holds exactly `text`. */
static int holds(const char *path, const char *text)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int same = rt_file_read(path, &buf, &len) == 0 && len == strlen(text) && !memcmp(buf, text, len);
    free(buf);
    return same;
}

/* Links and other names planted where we create or write: never written through. */
static void test_shared_files(void)
{
    char dir[256], victim[300], path[300], lnk[320], tmp[400], tmp2[400];
    int fd = -1, dfd;
    struct stat st;

    tu_tempdir(dir, sizeof(dir), "common-shared");
    snprintf(victim, sizeof(victim), "%s/victim", dir);
    CHECK_OK(rt_file_write_atomic(victim, "keep", 4));

    /* rt_file_create_fresh: a link (or old file) under the name is removed, a new file made. */
    dfd = open(dir, O_RDONLY | O_DIRECTORY);
    CHECK(dfd >= 0);
    CHECK(symlinkat(victim, dfd, "x.partial") == 0);
    CHECK_OK(rt_file_create_fresh(dfd, "x.partial", "x.partial", 0644, &fd));
    CHECK(fd >= 0 && write(fd, "new", 3) == 3);
    if (fd >= 0)
        close(fd);
    snprintf(path, sizeof(path), "%s/x.partial", dir);
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode) && holds(path, "new") && holds(victim, "keep"));

    /* rt_file_create_temp: a fresh name each time, beside the path, never an existing one. */
    snprintf(path, sizeof(path), "%s/ck.safetensors", dir);
    int fd2 = -1;
    CHECK_OK(rt_file_create_temp(path, tmp, sizeof(tmp), &fd));
    CHECK_OK(rt_file_create_temp(path, tmp2, sizeof(tmp2), &fd2));
    CHECKF(strcmp(tmp, tmp2) != 0 && !strncmp(tmp, path, strlen(path)) && strstr(tmp, ".tmp-"), "%s, %s", tmp,
           tmp2);
    if (fd >= 0)
        close(fd);
    if (fd2 >= 0)
        close(fd2);
    unlink(tmp);
    unlink(tmp2);
    CHECK_ERR(rt_file_create_temp("/no/such/dir/f", tmp, sizeof(tmp), &fd), "/no/such/dir/f");

    /* rt_file_write_atomic: a link at the old fixed temporary name, and at the final name. */
    snprintf(lnk, sizeof(lnk), "%s.tmp", path);
    CHECK(symlink(victim, lnk) == 0);
    CHECK_OK(rt_file_write_atomic(path, "w1", 2));
    CHECK(holds(path, "w1") && holds(victim, "keep"));
    CHECK(unlink(path) == 0 && symlink(victim, path) == 0);
    CHECK_OK(rt_file_write_atomic(path, "w2", 2));
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode) && holds(path, "w2") && holds(victim, "keep"));

    /* rt_file_open_write: created, emptied, appended; a link, a second name, a FIFO refused untouched. */
    snprintf(path, sizeof(path), "%s/m.jsonl", dir);
    CHECK_OK(rt_file_open_write(path, 0, "write metrics", &fd));
    CHECK(fd >= 0 && write(fd, "a\n", 2) == 2);
    if (fd >= 0)
        close(fd);
    CHECK_OK(rt_file_open_write(path, 1, "write metrics", &fd));
    CHECK(fd >= 0 && write(fd, "b\n", 2) == 2);
    if (fd >= 0)
        close(fd);
    CHECK(holds(path, "a\nb\n"));
    CHECK_OK(rt_file_open_write(path, 0, "write metrics", &fd));
    if (fd >= 0)
        close(fd);
    CHECK(holds(path, ""));
    snprintf(lnk, sizeof(lnk), "%s/m-link.jsonl", dir);
    CHECK(symlink(victim, lnk) == 0);
    CHECK_ERR(rt_file_open_write(lnk, 0, "write metrics", &fd), "is a symbolic link: refusing to write metrics "
                                                                  "through it");
    CHECK_ERR(rt_file_open_write(lnk, 1, "write metrics", &fd), "is a symbolic link");
    snprintf(lnk, sizeof(lnk), "%s/m-dangling.jsonl", dir);
    snprintf(tmp, sizeof(tmp), "%s/created-through-a-link", dir);
    CHECK(symlink(tmp, lnk) == 0);
    CHECK_ERR(rt_file_open_write(lnk, 0, "write metrics", &fd), "is a symbolic link");
    CHECK(access(tmp, F_OK) != 0);
    snprintf(lnk, sizeof(lnk), "%s/m-hard.jsonl", dir);
    CHECK(link(victim, lnk) == 0);
    CHECK_ERR(rt_file_open_write(lnk, 0, "write metrics", &fd), "has 2 names (hard links)");
    CHECK(holds(victim, "keep"));
    snprintf(lnk, sizeof(lnk), "%s/m-fifo.jsonl", dir);
    CHECK(mkfifo(lnk, 0600) == 0);
    CHECK_ERR(rt_file_open_write(lnk, 0, "write metrics", &fd), "not a regular file");

    /* rt_file_read_at: never through a link. */
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK(symlinkat(victim, dfd, "r-link") == 0);
    CHECK_ERR(rt_file_read_at(dfd, "r-link", "DIR/r-link", &buf, &len), "DIR/r-link: is a symbolic link");
    CHECK_OK(rt_file_read_at(dfd, "victim", NULL, &buf, &len));
    CHECK(len == 4 && !memcmp(buf, "keep", 4));
    free(buf);
    if (dfd >= 0)
        close(dfd);
    CHECK_OK(rt_remove_tree(dir));
}

int main(void)
{
    test_sizes();
    test_rng();
    test_files();
    test_shared_files();
    return check_result();
}
