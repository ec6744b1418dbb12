/*
 * startup.c - where the time from launch to the first update goes, and what
 * each rank holds once running: the start-up stamps (enum train_boot) taken
 * on every rank, reduced over the ranks with two small all-reduces (when the
 * last rank was through each part, the peaks and totals of memory and file
 * descriptors) -- O(log n) collectives, never a gather of every rank's table.
 * The report prints them (report.c) and `--json` carries them: the scale
 * bench reads them from there.
 */
#include <dirent.h>
#include <string.h>
#include <sys/resource.h>

#include "common/common.h"
#include "tools/train/driver.h"

static const char *const part_names[BOOT_N] = {
    "exec", "process start", "MPI init", "rank table", "lifeline mesh", "data open", "compute",
    "model", "initial sync", "loader open", "banner", "first batch", "first step",
};
static const char *const part_keys[BOOT_N] = {
    "exec", "process", "mpi_init", "rank_table", "mesh", "data", "compute",
    "model", "sync", "loader", "banner", "first_batch", "first_step",
};

const char *startup_part_name(enum train_boot k)
{
    return part_names[k];
}

const char *startup_part_key(enum train_boot k)
{
    return part_keys[k];
}

void startup_mark(struct train *T, enum train_boot k)
{
    if (!T->boot[k])
        T->boot[k] = rt_now_ns();
}

/* Entries in a /proc/self directory, less "." and ".." (and the directory's own descriptor for fd/). */
static int count_entries(const char *path, int own)
{
    DIR *d = opendir(path);
    if (!d)
        return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - own;
}

void startup_gather(struct train *T)
{
    struct rt_comm_startup cs;
    rt_comm_startup(T->comm, &cs);
    uint64_t t[BOOT_N];
    memcpy(t, T->boot, sizeof(t));
    t[BOOT_EXEC] = rt_process_start_ns();
    t[BOOT_COMM_BEGIN] = cs.begin_ns;
    t[BOOT_MPI_INIT] = cs.mpi_init_ns;
    t[BOOT_RANK_TABLE] = cs.rank_table_ns;
    t[BOOT_MESH] = cs.mesh_ns;
    if (!t[BOOT_EXEC] || t[BOOT_EXEC] > t[BOOT_COMM_BEGIN])
        t[BOOT_EXEC] = t[BOOT_COMM_BEGIN];
    /* A part not reached (a run stopped before its first update), or a process group made before the run
     * (the Python package): its stamp is the one before, and the part takes no time. */
    for (int k = 1; k < BOOT_N; k++)
        if (t[k] < t[k - 1])
            t[k] = t[k - 1];
    const int reached = T->boot[BOOT_FIRST_STEP] != 0;

    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double rss_mb = (double)ru.ru_maxrss / 1024.0;
    /* MAX of each: for every stamp, when the last rank reached it (Unix time, so that nodes compare); the first
     * rank's exec as the MAX of its negation; whether any rank reached its first update ([0]). Parts are
     * then differences between the last ranks' stamps: they add up to the launch-to-first-update time, and a
     * rank waiting in a collective for a slower one is not counted twice. */
    double mx[BOOT_N + 6];
    for (int k = 1; k < BOOT_N; k++)
        mx[k] = rt_unix_time_of(t[k]);
    mx[0] = reached;
    mx[BOOT_N] = reached ? rt_unix_time_of(t[BOOT_FIRST_STEP]) : 0;
    mx[BOOT_N + 1] = -rt_unix_time_of(t[BOOT_EXEC]);
    mx[BOOT_N + 2] = rss_mb;
    mx[BOOT_N + 3] = count_entries("/proc/self/fd", 1);
    mx[BOOT_N + 4] = cs.mesh_peers;
    mx[BOOT_N + 5] = count_entries("/proc/self/task", 0);
    rt_comm_allreduce(T->comm, mx, BOOT_N + 6, RT_COMM_F64, RT_RED_MAX, "the start-up figures");
    double sum = rss_mb;
    rt_comm_allreduce(T->comm, &sum, 1, RT_COMM_F64, RT_RED_SUM, "the ranks' memory");

    struct train_startup *s = &T->startup;
    memset(s, 0, sizeof(*s));
    s->have = mx[0] > 0;
    s->first_step_unix = mx[BOOT_N];
    s->exec_unix = -mx[BOOT_N + 1];
    double prev = s->exec_unix;
    for (int k = 1; k < BOOT_N; k++) {
        s->part_s[k] = mx[k] > prev ? mx[k] - prev : 0;
        prev = mx[k] > prev ? mx[k] : prev;
    }
    s->total_s = prev - s->exec_unix;
    s->rss_max_mb = mx[BOOT_N + 2];
    s->rss_sum_mb = sum;
    s->fds_max = (int)mx[BOOT_N + 3];
    s->peers_max = (int)mx[BOOT_N + 4];
    s->threads_max = (int)mx[BOOT_N + 5];
}
