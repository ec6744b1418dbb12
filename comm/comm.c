/*
 * comm.c - the process group: MPI start-up, the node-local split, the rank
 * table, the comm thread that runs every collective as a non-blocking MPI
 * call, and the watchdog in that thread (heartbeats, node-local peer
 * processes, collective deadlines). A group of one process never touches MPI.
 *
 * What the launchers already guarantee, and what this adds (see also
 * docs/ARCHITECTURE.md, "Comm"):
 *  - mpirun kills every rank once one exits abnormally or is killed; so does
 *    srun with --kill-on-bad-exit. Neither says where the survivors were.
 *  - Neither notices a rank that hangs or is stopped (SIGSTOP, a dead NFS
 *    mount, a deadlock): the job waits until its time limit.
 *  - srun --kill-on-bad-exit ends the others with SIGTERM, which the trainer
 *    takes for "finish the step and checkpoint": a step that cannot end
 *    without the dead rank.
 * The watchdog covers all three. Every rank holds a TCP connection to each
 * heartbeat partner (lifeline.c): a peer that dies, on any node, closes it,
 * which is seen at once; any peer whose heartbeats on it stop for
 * peer_timeout_s (stopped, hung, its node unreachable), and any collective
 * still running after timeout_s, ends the job with a message naming the step,
 * the operation and the rank that is behind. A rank that ends the job says
 * why on every connection first, so that its peers name it rather than blame
 * each other; and a rank that was itself stopped long enough for the others
 * to give up on it says so when it runs again, instead of blaming them.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_impl.h"
#include "common/trace.h"
#include "common/common.h"

#define GATHER_TAG 7302

/* A peer's last heartbeat: where its training thread was. */
struct heard {
    int phase;
    uint64_t step;
};

struct peer {
    char host[64];
    int32_t pid, local_rank, node, ncpus, threads;
    char cpus[64];
    uint64_t start;             /* the process's start, clock ticks since boot (/proc/PID/stat), 0 unknown */
};

struct rt_comm {
    struct rt_rank_info info;
    struct rt_comm_opts o;
    char backend[64];
    int threads_default;
    struct peer *peers;         /* world entries */

    MPI_Comm world, data, local;

    /* comm thread */
    pthread_t thread;
    int thread_started;
    int efd;                    /* eventfd: jobs queued or stop */
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* a job completed */
    struct rt_comm_job *q_head, *q_tail; /* submitted, not yet started */
    int stop;
    _Atomic uint64_t step;
    _Atomic int phase;
    struct rt_comm_counts counts;

    /* watchdog state, comm thread only */
    struct rt_comm_lifeline *ll; /* the connections to the heartbeat partners */
    uint64_t *hb_seen;          /* world entries, ns */
    struct heard *hb_last;      /* world entries */
    int *hb_peer;               /* world entries: 1 if a heartbeat partner */
    int *gone;                  /* world entries: 1 once it said it is leaving (LL_BYE, LL_ABORT) */
    uint64_t *busy_seen;        /* world entries: when a silent node-local peer was last found busy (ns), 0 never */
    uint64_t *busy_checked;     /* world entries: when its /proc entry was last read (ns) */
    uint64_t woke_ns;           /* when this process ran again after not running for idle_s */
    double idle_s;
    int abort_from;             /* the first peer that said it is ending the job (LL_ABORT), or -1 */
    uint64_t abort_step, abort_seen_ns;
    char abort_text[LL_TEXT_MAX + 1];
    struct rt_comm_startup boot;
};

static const char *const phase_names[] = {"starting",   "forward/backward", "waiting for gradients",
                                          "optimizer",  "waiting for data", "validation",
                                          "checkpoint", "staging",          "finished"};

static const char *phase_name(int p)
{
    return p >= 0 && p < (int)RT_ARRAY_LEN(phase_names) ? phase_names[p] : "?";
}

/* ---- node-local peers' processes ------------------------------------------------ */

/* Reads /proc/PID/stat (or a task's): the state letter and the start time in clock ticks. 0, or -1 when
 * there is no such entry. */
static int proc_stat(const char *path, char *state, uint64_t *start)
{
    char buf[1024];
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    unsigned long long st = 0;
    if (!p || sscanf(p + 2, "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", state,
                     &st) != 2)
        return -1;
    *start = st;
    return 0;
}

/*
 * Whether a node-local peer that has gone silent is starved rather than stopped: its process (the same pid
 * and start time as in the rank table) is there, not stopped, and one of its threads is running or waiting
 * for a CPU (R) or for the disk (D). With many ranks on few cores (a hundred ranks on two, in the scale
 * tests) a comm thread can wait seconds for a CPU in a step's first touches of memory; its silence is then
 * the node's load, not a failure. 1: busy; 0: stopped, or all its threads asleep; -1: not that process.
 */
static int peer_busy(const struct peer *p)
{
    char path[64], state;
    uint64_t start;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)p->pid);
    if (!p->start || proc_stat(path, &state, &start) < 0 || start != p->start)
        return -1;
    if (state == 'T' || state == 't' || state == 'Z' || state == 'X')
        return 0;
    snprintf(path, sizeof(path), "/proc/%d/task", (int)p->pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int busy = 0;
    for (struct dirent *e; !busy && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char tpath[96];
        uint64_t ts;
        snprintf(tpath, sizeof(tpath), "/proc/%d/task/%.20s/stat", (int)p->pid, e->d_name);
        if (proc_stat(tpath, &state, &ts) == 0 && (state == 'R' || state == 'D'))
            busy = 1;
    }
    closedir(d);
    return busy;
}

/* ---- fatal paths --------------------------------------------------------------- */

/* The safety net under MPI_Abort, which waits on the launcher: a launcher
 * that lost a node may never answer. */
static void *exit_soon(void *arg)
{
    struct timespec ts = {1, 0};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
    _exit((int)(intptr_t)arg);
}

/* How long a rank that ends the job waits, in the sparse mesh, for its word to spread (see end_job): more
 * than a peer's grace (ABORT_GRACE_NS, below) plus log2(world) hops. */
#define SPREAD_NS 500000000L

/* Ends the job; `tell`: say why to every peer first (not when repeating a
 * peer's own reason back to it). */
static _Noreturn void end_job(struct rt_comm *c, int code, const char *msg, int tell)
{
    if (msg)
        rt_log(RT_LOG_ERROR, "%s", msg);
    fflush(stdout);
    fflush(stderr);
    if (c && c->ll && tell) {
        struct rt_comm_lifeline_msg m = {.kind = LL_ABORT, .rank = c->info.rank,
                                         .step = atomic_load(&c->step)};
        snprintf(m.text, sizeof(m.text), "%s", msg ? msg : "an error (see its output)");
        for (int r = 0; r < c->info.world; r++)
            if (c->hb_peer[r])
                rt_comm_lifeline_send(c->ll, r, &m);
        /* In the sparse mesh the others hear it from partners passing it on (a hop each): give the word time
         * to reach every rank before MPI_Abort has the launcher kill them, so that each names this reason. */
        if (c->boot.mesh_peers < c->info.world - 1) {
            struct timespec ts = {0, SPREAD_NS};
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
        }
    }
    if (c && c->info.mpi) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_create(&t, &a, exit_soon, (void *)(intptr_t)code);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
    _exit(code);
}

_Noreturn void rt_comm_abort(struct rt_comm *c, int code, const char *msg)
{
    end_job(c, code, msg, 1);
}

static _Noreturn void fatal(struct rt_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static _Noreturn void fatal(struct rt_comm *c, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    end_job(c, 1, msg, 1);
}

/* Every MPI call after MPI_Init goes through this: the library's own message,
 * file:line, then the whole job ends. */
#define MPI_CHECK(c, call)                                                                                           \
    do {                                                                                                             \
        int rc_ = (call);                                                                                            \
        if (rc_ != MPI_SUCCESS)                                                                                      \
            mpi_fail((c), rc_, #call, __FILE__, __LINE__);                                                          \
    } while (0)

static _Noreturn void mpi_fail(struct rt_comm *c, int rc, const char *call, const char *file, int line)
{
    char err[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, err, &len) != MPI_SUCCESS)
        snprintf(err, sizeof(err), "MPI error %d", rc);
    char host[64] = "?";
    gethostname(host, sizeof(host) - 1);
    fatal(c, "%s failed on %s (pid %d) at %s:%d: %s (step %" PRIu64 ")", call, host, (int)getpid(), file, line, err,
          atomic_load(&c->step));
}

/* ---- small helpers --------------------------------------------------------------- */

static void cpu_list(const cpu_set_t *set, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < CPU_SETSIZE && o < len; i++) {
        if (!CPU_ISSET(i, set))
            continue;
        int j = i;
        while (j + 1 < CPU_SETSIZE && CPU_ISSET(j + 1, set))
            j++;
        int w = j > i ? snprintf(buf + o, len - o, "%s%d-%d", o ? "," : "", i, j)
                      : snprintf(buf + o, len - o, "%s%d", o ? "," : "", i);
        if (w < 0 || (size_t)w >= len - o) {
            if (len > 4)
                snprintf(buf + len - 4, 4, "...");
            return;
        }
        o += (size_t)w;
        i = j;
    }
}

static const char *env_get(void *ctx, const char *name)
{
    (void)ctx;
    return getenv(name);
}

static int launched_by_mpi(int *mpirun)
{
    *mpirun = getenv("OMPI_COMM_WORLD_SIZE") != NULL;
    return *mpirun || getenv("PMIX_RANK") || getenv("PMI_RANK") || getenv("PMI_SIZE");
}

const struct rt_rank_info *rt_comm_info(const struct rt_comm *c)
{
    return &c->info;
}

const char *rt_comm_backend(const struct rt_comm *c)
{
    return c->backend;
}

int rt_comm_default_threads(const struct rt_comm *c)
{
    return c->threads_default;
}

double rt_comm_timeout(const struct rt_comm *c)
{
    return c->o.timeout_s;
}

int rt_comm_parallel(const struct rt_comm *c)
{
    return c->info.world > 1;
}

void rt_comm_set_phase(struct rt_comm *c, uint64_t step, enum rt_comm_phase phase)
{
    if (!c)
        return;
    atomic_store(&c->step, step);
    atomic_store(&c->phase, (int)phase);
}

void rt_comm_count_bucket(struct rt_comm *c)
{
    pthread_mutex_lock(&c->mu);
    c->counts.bucket_allreduces++;
    pthread_mutex_unlock(&c->mu);
}

void rt_comm_counts(struct rt_comm *c, struct rt_comm_counts *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->counts;
    pthread_mutex_unlock(&c->mu);
}

/* ---- the comm thread -------------------------------------------------------------- */

static MPI_Comm job_comm(const struct rt_comm *c, const struct rt_comm_job *j)
{
    return j->local ? c->local : c->data;
}

static void job_start(struct rt_comm *c, struct rt_comm_job *j)
{
    MPI_Comm m = job_comm(c, j);
    /* The buffer may still be being written by work queued before the job was submitted. */
    if (j->fence)
        j->fence(j->fence_ctx, j->bucket);
    j->t_start = rt_now_ns();
    switch (j->kind) {
    case JOB_ALLREDUCE:
        MPI_CHECK(c, MPI_Iallreduce(MPI_IN_PLACE, j->buf, j->count, j->dt, j->op, m, &j->req));
        break;
    case JOB_REDUCE: {
        int me;
        MPI_Comm_rank(m, &me);
        const void *s = me == j->root ? MPI_IN_PLACE : j->buf;
        MPI_CHECK(c, MPI_Ireduce(s, me == j->root ? j->buf : NULL, j->count, j->dt, j->op, j->root, m, &j->req));
        break;
    }
    case JOB_BCAST:
        MPI_CHECK(c, MPI_Ibcast(j->buf, j->count, MPI_BYTE, j->root, m, &j->req));
        break;
    case JOB_ALLGATHER:
        MPI_CHECK(c, MPI_Iallgather(j->sbuf, j->count, MPI_BYTE, j->buf, j->count, MPI_BYTE, m, &j->req));
        break;
    case JOB_BARRIER:
        MPI_CHECK(c, MPI_Ibarrier(m, &j->req));
        break;
    case JOB_SEND:
        MPI_CHECK(c, MPI_Isend(j->buf, j->count, MPI_BYTE, j->root, GATHER_TAG, m, &j->req));
        break;
    case JOB_RECV:
        MPI_CHECK(c, MPI_Irecv(j->buf, j->count, MPI_BYTE, j->root, GATHER_TAG, m, &j->req));
        break;
    }
}

/* The peer that is furthest behind by its heartbeats, as text. */
static void lagging(const struct rt_comm *c, char *buf, size_t len)
{
    uint64_t now = rt_now_ns();
    int worst = -1;
    for (int r = 0; r < c->info.world; r++) {
        if (r == c->info.rank || !c->hb_peer[r] || !c->hb_seen[r])
            continue;
        if (worst < 0 || c->hb_last[r].step < c->hb_last[worst].step ||
            (c->hb_last[r].step == c->hb_last[worst].step && c->hb_last[r].phase < c->hb_last[worst].phase))
            worst = r;
    }
    uint64_t mine = atomic_load(&c->step);
    if (worst < 0 || c->hb_last[worst].step > mine) {
        snprintf(buf, len, "no peer this rank hears from is behind it");
        return;
    }
    snprintf(buf, len, "rank %d (%s, pid %d) is behind: step %" PRIu64 ", %s, heard from %.1f s ago", worst,
             c->peers[worst].host, c->peers[worst].pid, c->hb_last[worst].step, phase_name(c->hb_last[worst].phase),
             (double)(now - c->hb_seen[worst]) * 1e-9);
}

static void hb_send(struct rt_comm *c)
{
    struct rt_comm_lifeline_msg m = {.kind = LL_HEARTBEAT, .rank = c->info.rank, .phase = atomic_load(&c->phase),
                                     .step = atomic_load(&c->step)};
    for (int r = 0; r < c->info.world; r++)
        if (c->hb_peer[r] && !c->gone[r])
            rt_comm_lifeline_send(c->ll, r, &m);
}

/* This process did not run for a while (SIGSTOP, a suspended job, a starved
 * node) when woke_ns is recent: the others may have ended the job meanwhile,
 * and what this rank sees on waking is their doing, not their failure. */
static int was_stopped(const struct rt_comm *c, uint64_t now)
{
    return c->woke_ns && (double)(now - c->woke_ns) * 1e-9 < c->o.peer_timeout_s;
}

struct reader {
    struct rt_comm *c;
    int r;
};

/* Passes the word that the job ends (abort_from's reason) to each partner, or (`all` 0) to each not known to
 * be leaving. */
static void pass_word(struct rt_comm *c, int all)
{
    struct rt_comm_lifeline_msg fw = {.kind = LL_ABORT, .rank = c->abort_from, .step = c->abort_step};
    snprintf(fw.text, sizeof(fw.text), "%s", c->abort_text);
    for (int p = 0; p < c->info.world; p++)
        if (c->hb_peer[p] && (all || !c->gone[p]))
            rt_comm_lifeline_send(c->ll, p, &fw);
}

static void on_message(void *ctx, const struct rt_comm_lifeline_msg *m)
{
    struct rt_comm *c = ((struct reader *)ctx)->c;
    const int r = ((struct reader *)ctx)->r;
    switch (m->kind) {
    case LL_HEARTBEAT:
        c->hb_seen[r] = rt_now_ns();
        c->hb_last[r] = (struct heard){.phase = m->phase, .step = m->step};
        break;
    case LL_BYE:
        c->gone[r] = 1;
        break;
    case LL_ABORT: {
        /* m->rank is the rank that ended the job; r may be a partner passing its word on. */
        const int from = m->rank >= 0 && m->rank < c->info.world && m->rank != c->info.rank ? m->rank : r;
        c->gone[r] = 1;
        c->gone[from] = 1;
        if (c->abort_from < 0) {
            c->abort_from = from;
            c->abort_seen_ns = rt_now_ns();
            c->abort_step = m->step;
            snprintf(c->abort_text, sizeof(c->abort_text), "%s", m->text);
            /* Above RT_COMM_FULL_MESH ranks not every rank is a partner of the one that ended the job: pass
             * the word on at once, so that it reaches every rank within log2(world) hops. */
            pass_word(c, 0);
        }
        break;
    }
    }
}

/* Reads rank r's connection. Returns 1 when it ended without a word: the
 * peer's process died (its end after a goodbye or an abort is no death). */
static int hb_receive(struct rt_comm *c, int r)
{
    struct reader x = {c, r};
    int rc = rt_comm_lifeline_read(c->ll, r, on_message, &x);
    if (rc == -EPROTO)
        fatal(c, "rank %d (%s, pid %d) sent garbage on its lifeline connection. Ending the job.", r, c->peers[r].host,
              c->peers[r].pid);
    if (rc == 0)
        return 0;
    rt_comm_lifeline_close(c->ll, r);
    return !c->gone[r];
}

/* How long a peer's reason for ending the job waits for this rank's own
 * evidence: the peer saw a death first, and the dead rank's closed connection
 * may reach this rank a moment after the peer's message. */
#define ABORT_GRACE_NS 200000000ull

/* How many peer timeouts a silent node-local peer that is busy (starved of CPU, peer_busy) is given. */
#define STARVED_TIMEOUTS 10

/* After reading every connection that had something: a death this rank saw
 * itself comes first (each survivor names the dead rank), then a peer's
 * reason for ending the job. A rank that did not run for a while names
 * neither as a failure of the others. */
static void judge(struct rt_comm *c, int dead, const char *jt)
{
    const uint64_t now = rt_now_ns();
    const int stopped = was_stopped(c, now);
    if (c->abort_from >= 0 && dead < 0 && !stopped && now - c->abort_seen_ns < ABORT_GRACE_NS)
        return;
    if (c->abort_from >= 0 && (dead < 0 || stopped)) {
        const int r = c->abort_from;
        char msg[1200];
        snprintf(msg, sizeof(msg), "rank %d (%s, pid %d) ended the job at its step %" PRIu64 ": %s", r,
                 c->peers[r].host, c->peers[r].pid, c->abort_step, c->abort_text);
        /* Its reason names the rank at fault, so this rank does not add its own (that would only echo), but
         * it says the same word once more to every partner before it goes: one that passed the word to this
         * rank, or was passed it, has no word from this rank since and, slower (starved of CPU) and still in
         * its grace, would otherwise read this connection's end as this rank's death. */
        pass_word(c, 1);
        end_job(c, 1, msg, 0);
    }
    if (dead < 0)
        return;
    const int r = dead;
    if (stopped)
        fatal(c, "this rank did not run for %.1f s (stopped, or starved of CPU), and meanwhile rank %d (%s, pid %d) "
                 "ended (last heard at step %" PRIu64 ", %s): the job was ended while this rank was not running. "
                 "This rank: step %" PRIu64 ", %s.",
              c->idle_s, r, c->peers[r].host, c->peers[r].pid, c->hb_last[r].step, phase_name(c->hb_last[r].phase),
              atomic_load(&c->step), phase_name(atomic_load(&c->phase)));
    fatal(c, "rank %d (%s, pid %d) died (last heard at step %" PRIu64 ", %s) while this rank was at step %" PRIu64
             ", %s; in flight: %s. Ending the job.",
          r, c->peers[r].host, c->peers[r].pid, c->hb_last[r].step, phase_name(c->hb_last[r].phase),
          atomic_load(&c->step), phase_name(atomic_load(&c->phase)), jt);
}

/* The active job description for messages. */
static void job_text(const struct rt_comm_job *j, char *buf, size_t len)
{
    snprintf(buf, len, "%s (submitted at step %" PRIu64 ")", j->what, j->step);
}

/* pf[1 + i] is the connection of rank pr[i]. */
static void watch(struct rt_comm *c, struct rt_comm_job *active, struct pollfd *pf, const int *pr, int npf)
{
    char lag[256], jt[300] = "no collective in flight";
    struct rt_comm_job *oldest = active;
    if (oldest)
        job_text(oldest, jt, sizeof(jt));
    int dead = -1;
    for (int i = 1; i < npf; i++) {
        if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        if (hb_receive(c, pr[i - 1]) && dead < 0)
            dead = pr[i - 1];
        pf[i].fd = rt_comm_lifeline_fd(c->ll, pr[i - 1]); /* -1 once it ended: poll skips it */
    }
    judge(c, dead, jt);
    const uint64_t now = rt_now_ns(); /* after the heartbeats just read */
    const uint64_t hb_ns = (uint64_t)(c->o.heartbeat_s * 1e9);
    for (int r = 0; r < c->info.world; r++) {
        if (!c->hb_peer[r] || c->gone[r])
            continue;
        double quiet = (double)(now - c->hb_seen[r]) * 1e-9;
        if (quiet <= c->o.peer_timeout_s)
            continue;
        /* A peer on this node that is starved of CPU, not stopped (peer_busy), gets up to STARVED_TIMEOUTS
         * peer timeouts; /proc is read at most once a heartbeat period. */
        if (c->peers[r].node == c->info.node && quiet <= STARVED_TIMEOUTS * c->o.peer_timeout_s) {
            if (now - c->busy_checked[r] >= hb_ns) {
                c->busy_checked[r] = now;
                if (peer_busy(&c->peers[r]) == 1)
                    c->busy_seen[r] = now;
            }
            if (c->busy_seen[r] && now - c->busy_seen[r] < 2 * hb_ns)
                continue;
        }
        fatal(c, "rank %d (%s, pid %d) has sent no heartbeat for %.1f s (--peer-timeout %g): it is stopped or "
                 "hung, or its node is unreachable (last heard at step %" PRIu64 ", %s). This rank: step %" PRIu64
                 ", %s; in flight: %s. Ending the job.",
              r, c->peers[r].host, c->peers[r].pid, quiet, c->o.peer_timeout_s, c->hb_last[r].step,
              phase_name(c->hb_last[r].phase), atomic_load(&c->step), phase_name(atomic_load(&c->phase)), jt);
    }
    for (struct rt_comm_job *j = active; j; j = j->next) {
        if (j->timeout_s <= 0)
            continue;
        double age = (double)(now - j->t_start) * 1e-9;
        if (age > j->timeout_s) {
            job_text(j, jt, sizeof(jt));
            lagging(c, lag, sizeof(lag));
            fatal(c, "step %" PRIu64 ": %s did not complete within %.0f s (--comm-timeout); %s. Ending the job.",
                  atomic_load(&c->step), jt, j->timeout_s, lag);
        }
    }
}

/* A finished job on the trace: from hand-over to done, and the part the comm thread ran it (async spans:
 * several are in flight at once). Read here, before `done` hands the job back to its owner. */
static void trace_job(const struct rt_comm_job *j)
{
    const int track = rt_trace_track("all-reduce (comm thread)", 6);
    const uint64_t now = rt_now_ns(), id = (j->step << 12) | (uint64_t)(j->bucket & 0xfff);
    char label[24];
    if (j->bucket >= 0) {
        snprintf(label, sizeof(label), "%d", j->bucket);
        rt_trace_async(track, RT_TRACE_COMM, "bucket ready->reduced", label, id, j->t_submit, now);
        rt_trace_async(track, RT_TRACE_COMM, "bucket all-reduce", label, id, j->t_start, now);
    } else {
        snprintf(label, sizeof(label), "%.23s", j->what);
        rt_trace_async(track, RT_TRACE_COMM, "collective", label, id | 0xfff, j->t_submit, now);
    }
}

static void *comm_main(void *arg)
{
    struct rt_comm *c = arg;
    struct rt_comm_job *active = NULL, **tail = &active;
    rt_trace_thread_name("comm", 5);
    uint64_t next_hb = 0, hb_period = (uint64_t)(c->o.heartbeat_s * 1e9);
    int npf = 1;
    struct pollfd *pf = rt_calloc((size_t)c->info.world + 1, sizeof(*pf), "comm poll set");
    int *pr = rt_calloc((size_t)c->info.world, sizeof(*pr), "comm poll set");
    if (!pf || !pr)
        fatal(c, "out of memory starting the comm thread");
    pf[0] = (struct pollfd){.fd = c->efd, .events = POLLIN};
    for (int r = 0; r < c->info.world; r++)
        if (rt_comm_lifeline_fd(c->ll, r) >= 0) {
            pr[npf - 1] = r;
            pf[npf++] = (struct pollfd){.fd = rt_comm_lifeline_fd(c->ll, r), .events = POLLIN};
        }
    uint64_t t0 = rt_now_ns(), last_wake = t0;
    for (int r = 0; r < c->info.world; r++)
        c->hb_seen[r] = t0; /* silence counts from the start */
    long backoff_us = 0;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        struct rt_comm_job *fresh = c->q_head;
        c->q_head = c->q_tail = NULL;
        int stop = c->stop;
        pthread_mutex_unlock(&c->mu);
        for (struct rt_comm_job *j = fresh; j;) {
            struct rt_comm_job *nx = j->next;
            j->next = NULL;
            job_start(c, j);
            *tail = j;
            tail = &j->next;
            j = nx;
        }
        int progressed = fresh != NULL;
        /* Complete what has finished, in any order. */
        for (struct rt_comm_job **pp = &active; *pp;) {
            struct rt_comm_job *j = *pp;
            int done = 0;
            MPI_CHECK(c, MPI_Test(&j->req, &done, MPI_STATUS_IGNORE));
            if (!done) {
                pp = &j->next;
                continue;
            }
            *pp = j->next;
            if (!*pp)
                tail = pp;
            if (j->t_submit)
                trace_job(j);
            pthread_mutex_lock(&c->mu);
            j->done = 1;
            if (j->done_count)
                (*j->done_count)++;
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->mu);
            progressed = 1;
        }
        if (stop && !active)
            break;
        uint64_t now = rt_now_ns();
        if (now >= next_hb) {
            hb_send(c);
            next_hb = now + hb_period;
        }
        /* Sleep: until the next heartbeat when idle; in short, growing naps
         * while collectives are in flight (MPI progresses only inside its
         * calls, and a spinning thread would take a core from compute). */
        struct timespec ts;
        if (active) {
            backoff_us = progressed ? 0 : backoff_us ? RT_MIN(backoff_us * 2, 500) : 10;
            ts = (struct timespec){0, backoff_us * 1000};
        } else {
            backoff_us = 0;
            uint64_t d = next_hb > now ? next_hb - now : 0;
            if (c->abort_from >= 0)
                d = RT_MIN(d, ABORT_GRACE_NS / 4); /* a peer's abort is pending: judge it on time */
            ts = (struct timespec){(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
        }
        for (int i = 0; i < npf; i++)
            pf[i].revents = 0;
        int n = ppoll(pf, (nfds_t)npf, &ts, NULL);
        /* The loop wakes at least every heartbeat period: a longer gap is time this process did not run,
         * and the silence of the others over it is not theirs. */
        uint64_t woke = rt_now_ns();
        double gap = (double)(woke - last_wake) * 1e-9;
        last_wake = woke;
        if (gap > RT_MAX(3 * c->o.heartbeat_s, c->o.peer_timeout_s / 2)) {
            c->woke_ns = woke;
            c->idle_s = gap;
            for (int r = 0; r < c->info.world; r++)
                c->hb_seen[r] = woke;
        }
        if (n > 0 && (pf[0].revents & POLLIN)) {
            uint64_t v;
            if (read(c->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                fatal(c, "comm thread: eventfd read: %s", strerror(errno));
        }
        watch(c, active, pf, pr, npf);
    }
    /* Past the last collective: the connections' end from here on is no death. */
    struct rt_comm_lifeline_msg bye = {.kind = LL_BYE, .rank = c->info.rank, .step = atomic_load(&c->step)};
    for (int r = 0; r < c->info.world; r++)
        if (c->hb_peer[r])
            rt_comm_lifeline_send(c->ll, r, &bye);
    free(pf);
    free(pr);
    return NULL;
}

void rt_comm_job_submit(struct rt_comm *c, struct rt_comm_job *j)
{
    j->step = atomic_load(&c->step);
    j->t_submit = rt_trace_live() ? rt_now_ns() : 0;
    j->next = NULL;
    j->req = MPI_REQUEST_NULL;
    pthread_mutex_lock(&c->mu);
    j->done = 0;
    if (c->q_tail)
        c->q_tail->next = j;
    else
        c->q_head = j;
    c->q_tail = j;
    if (j->bucket < 0)
        c->counts.other++;
    else
        c->counts.bucket_allreduces++;
    pthread_mutex_unlock(&c->mu);
    uint64_t one = 1;
    if (write(c->efd, &one, sizeof(one)) < 0)
        fatal(c, "eventfd write: %s", strerror(errno));
}

void rt_comm_job_wait(struct rt_comm *c, struct rt_comm_job *j)
{
    pthread_mutex_lock(&c->mu);
    while (!j->done)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void rt_comm_count_wait(struct rt_comm *c, const uint64_t *count, uint64_t target)
{
    pthread_mutex_lock(&c->mu);
    while (*count < target)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* ---- collectives ---------------------------------------------------------------- */

static MPI_Datatype mpi_type(enum rt_dtype_comm t, size_t *size)
{
    switch (t) {
    case RT_COMM_F32: *size = 4; return MPI_FLOAT;
    case RT_COMM_F64: *size = 8; return MPI_DOUBLE;
    case RT_COMM_I64: *size = 8; return MPI_INT64_T;
    case RT_COMM_U64: *size = 8; return MPI_UINT64_T;
    case RT_COMM_I32: break;
    }
    *size = 4;
    return MPI_INT32_T;
}

static MPI_Op mpi_op(enum rt_red_op op)
{
    return op == RT_RED_MAX ? MPI_MAX : op == RT_RED_MIN ? MPI_MIN : MPI_SUM;
}

static void divide(void *buf, size_t count, enum rt_dtype_comm t, int world)
{
    if (t == RT_COMM_F32)
        for (size_t i = 0; i < count; i++)
            ((float *)buf)[i] /= (float)world;
    else if (t == RT_COMM_F64)
        for (size_t i = 0; i < count; i++)
            ((double *)buf)[i] /= (double)world;
}

/* Runs one blocking collective, in pieces of at most 1 GiB (MPI counts are int). */
static void run_job(struct rt_comm *c, enum rt_comm_job_kind kind, int local, void *buf, const void *sbuf,
                    size_t count, size_t esize, MPI_Datatype dt, MPI_Op op, int root, double timeout_s,
                    const char *what)
{
    size_t per = ((size_t)1 << 30) / esize, done = 0;
    do {
        size_t n = RT_MIN(count - done, per);
        struct rt_comm_job j = {.kind = kind, .local = local, .buf = (char *)buf + done * esize, .sbuf = sbuf,
                                .count = (int)n, .dt = dt, .op = op, .root = root, .bucket = -1,
                                .timeout_s = timeout_s < 0 ? c->o.timeout_s : timeout_s};
        snprintf(j.what, sizeof(j.what), "%s", what);
        rt_comm_job_submit(c, &j);
        rt_comm_job_wait(c, &j);
        done += n;
    } while (done < count);
}

void rt_comm_allreduce(struct rt_comm *c, void *buf, size_t count, enum rt_dtype_comm t, enum rt_red_op op,
                       const char *what)
{
    if (c->info.world == 1 || count == 0)
        return;
    size_t es;
    MPI_Datatype dt = mpi_type(t, &es);
    run_job(c, JOB_ALLREDUCE, 0, buf, NULL, count, es, dt, mpi_op(op), 0, -1, what);
    if (op == RT_RED_AVG)
        divide(buf, count, t, c->info.world);
}

void rt_comm_reduce(struct rt_comm *c, void *buf, size_t count, enum rt_dtype_comm t, enum rt_red_op op, int root,
                    const char *what)
{
    if (c->info.world == 1 || count == 0)
        return;
    size_t es;
    MPI_Datatype dt = mpi_type(t, &es);
    run_job(c, JOB_REDUCE, 0, buf, NULL, count, es, dt, mpi_op(op), root, -1, what);
    if (op == RT_RED_AVG && c->info.rank == root)
        divide(buf, count, t, c->info.world);
}

void rt_comm_broadcast(struct rt_comm *c, void *buf, size_t bytes, int root, const char *what)
{
    if (c->info.world == 1 || bytes == 0)
        return;
    run_job(c, JOB_BCAST, 0, buf, NULL, bytes, 1, MPI_BYTE, MPI_OP_NULL, root, -1, what);
}

void rt_comm_allgather(struct rt_comm *c, const void *send, void *recv, size_t bytes, const char *what)
{
    if (c->info.world == 1) {
        memcpy(recv, send, bytes);
        return;
    }
    if (bytes > (size_t)1 << 30)
        fatal(c, "%s: all-gather of %zu bytes per rank: at most 1 GiB", what, bytes);
    struct rt_comm_job j = {.kind = JOB_ALLGATHER, .buf = recv, .sbuf = send, .count = (int)bytes, .bucket = -1,
                            .timeout_s = c->o.timeout_s};
    snprintf(j.what, sizeof(j.what), "%s", what);
    rt_comm_job_submit(c, &j);
    rt_comm_job_wait(c, &j);
}

void rt_comm_gather_one(struct rt_comm *c, int from, void *buf, size_t bytes, const char *what)
{
    const int me = c->info.rank;
    if (from == 0 || (me != 0 && me != from) || bytes == 0)
        return;
    /* Point to point: only the two ranks meet, in the order every rank calls it. */
    run_job(c, me == 0 ? JOB_RECV : JOB_SEND, 0, buf, NULL, bytes, 1, MPI_BYTE, MPI_OP_NULL, me == 0 ? from : 0, -1,
            what);
}

void rt_comm_barrier(struct rt_comm *c, double timeout_s, const char *what)
{
    if (c->info.world == 1)
        return;
    run_job(c, JOB_BARRIER, 0, NULL, NULL, 1, 1, MPI_BYTE, MPI_OP_NULL, 0, timeout_s, what);
}

void rt_comm_node_barrier(struct rt_comm *c, double timeout_s, const char *what)
{
    if (c->info.local_world == 1)
        return;
    run_job(c, JOB_BARRIER, 1, NULL, NULL, 1, 1, MPI_BYTE, MPI_OP_NULL, 0, timeout_s, what);
}

void rt_comm_node_broadcast(struct rt_comm *c, void *buf, size_t bytes, const char *what)
{
    if (c->info.local_world == 1 || bytes == 0)
        return;
    run_job(c, JOB_BCAST, 1, buf, NULL, bytes, 1, MPI_BYTE, MPI_OP_NULL, 0, -1, what);
}

/* ---- start-up and shut-down ---------------------------------------------------- */

static void fill_self(struct peer *p, int threads)
{
    memset(p, 0, sizeof(*p));
    gethostname(p->host, sizeof(p->host) - 1);
    p->pid = (int32_t)getpid();
    char state;
    if (proc_stat("/proc/self/stat", &state, &p->start) < 0)
        p->start = 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        p->ncpus = CPU_COUNT(&set);
        cpu_list(&set, p->cpus, sizeof(p->cpus));
    }
    p->threads = threads;
}

/* Collective over MPI_COMM_WORLD, before the comm thread runs (so plain
 * blocking MPI calls are fine here). */
static void mpi_setup(struct rt_comm *c)
{
    MPI_Comm w = MPI_COMM_WORLD;
    MPI_CHECK(c, MPI_Comm_set_errhandler(w, MPI_ERRORS_RETURN));
    MPI_CHECK(c, MPI_Comm_dup(w, &c->data));
    MPI_CHECK(c, MPI_Comm_split_type(w, MPI_COMM_TYPE_SHARED, c->info.rank, MPI_INFO_NULL, &c->local));
    MPI_CHECK(c, MPI_Comm_rank(c->local, &c->info.local_rank));
    MPI_CHECK(c, MPI_Comm_size(c->local, &c->info.local_world));
    MPI_Comm leaders;
    MPI_CHECK(c, MPI_Comm_split(w, c->info.local_rank == 0 ? 0 : MPI_UNDEFINED, c->info.rank, &leaders));
    int nn[2] = {0, 0};
    if (leaders != MPI_COMM_NULL) {
        MPI_CHECK(c, MPI_Comm_rank(leaders, &nn[0]));
        MPI_CHECK(c, MPI_Comm_size(leaders, &nn[1]));
        MPI_CHECK(c, MPI_Comm_free(&leaders));
    }
    MPI_CHECK(c, MPI_Bcast(nn, 2, MPI_INT, 0, c->local));
    c->info.node = nn[0];
    c->info.nodes = nn[1];

    /* Default threads: this rank's CPUs shared with the node-local ranks
     * whose affinity overlaps it. */
    cpu_set_t mine, *all = rt_calloc((size_t)c->info.local_world, sizeof(cpu_set_t), "affinity masks");
    if (!all)
        fatal(c, "out of memory");
    CPU_ZERO(&mine);
    sched_getaffinity(0, sizeof(mine), &mine);
    MPI_CHECK(c, MPI_Allgather(&mine, (int)sizeof(mine), MPI_BYTE, all, (int)sizeof(mine), MPI_BYTE, c->local));
    int sharers = 0;
    for (int i = 0; i < c->info.local_world; i++) {
        cpu_set_t x;
        CPU_AND(&x, &mine, &all[i]);
        sharers += CPU_COUNT(&x) > 0;
    }
    free(all);
    c->threads_default = RT_MAX(1, rt_cpus_available() / RT_MAX(sharers, 1));

    struct peer me;
    fill_self(&me, c->threads_default);
    me.local_rank = c->info.local_rank;
    me.node = c->info.node;
    MPI_CHECK(c, MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, c->peers, (int)sizeof(me), MPI_BYTE, w));

    c->boot.rank_table_ns = rt_now_ns();

    c->boot.mesh_peers = rt_comm_hb_partners(c->info.rank, c->info.world, c->o.full_mesh, c->hb_peer);
    if (c->info.world > 1 && rt_comm_lifeline_create(w, c->hb_peer, RT_MAX(60, c->o.peer_timeout_s), &c->ll) < 0)
        fatal(c, "%s (the watchdog's connections between ranks go over TCP, beside MPI)", rt_errmsg());
    c->boot.mesh_ns = rt_now_ns();
}

int rt_comm_hb_partners(int rank, int world, int full, int *partner)
{
    int n = 0;
    if (full <= 0)
        full = RT_COMM_FULL_MESH;
    for (int r = 0; r < world; r++)
        partner[r] = world <= full && r != rank;
    if (world <= full)
        return world - 1;
    for (long d = 1; d < world; d *= 2) {
        partner[(rank + d) % world] = 1;
        partner[(rank - d % world + world) % world] = 1;
    }
    partner[rank] = 0;
    for (int r = 0; r < world; r++)
        n += partner[r];
    return n;
}

void rt_comm_startup(const struct rt_comm *c, struct rt_comm_startup *out)
{
    *out = c->boot;
}

int rt_comm_create(const struct rt_comm_opts *o, struct rt_comm **out)
{
    *out = NULL;
    struct rt_comm *c = rt_calloc(1, sizeof(*c), "process group");
    if (!c)
        return -ENOMEM;
    c->o = o ? *o : (struct rt_comm_opts){0};
    if (c->o.timeout_s <= 0)
        c->o.timeout_s = 300;
    if (c->o.peer_timeout_s <= 0)
        c->o.peer_timeout_s = 3;
    if (c->o.heartbeat_s <= 0)
        c->o.heartbeat_s = 0.5;
    if (c->o.heartbeat_s > c->o.peer_timeout_s / 4)
        c->o.heartbeat_s = c->o.peer_timeout_s / 4;
    c->efd = -1;
    c->abort_from = -1;
    c->boot.begin_ns = rt_now_ns();
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);

    struct rt_launch_view lv = {0};
    lv.mpi = launched_by_mpi(&lv.mpirun);
    if (lv.mpi) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            free(c);
            return rt_errf(-EIO, "MPI_Init_thread failed");
        }
        c->info.mpi = 1; /* from here on, errors abort the job */
        c->boot.mpi_init_ns = rt_now_ns();
        if (provided < MPI_THREAD_SERIALIZED)
            fatal(c, "this MPI gives thread level %d; the comm thread needs MPI_THREAD_SERIALIZED", provided);
        MPI_CHECK(c, MPI_Comm_rank(MPI_COMM_WORLD, &lv.rank));
        MPI_CHECK(c, MPI_Comm_size(MPI_COMM_WORLD, &lv.world));
        rt_log_setup(lv.rank, lv.world, RT_LOG_INFO);
    }
    if (rt_comm_resolve(env_get, NULL, &lv, &c->info) < 0) {
        if (lv.mpi)
            fatal(c, "%s", rt_errmsg());
        free(c);
        return -EINVAL;
    }
    c->info.mpi = lv.mpi;
    rt_log_setup(c->info.rank, c->info.world, RT_LOG_INFO);
    if (!lv.mpi && c->info.world > 1) {
        int r = c->info.rank, wsz = c->info.world;
        const char *how = c->info.source == RT_RANKS_SLURM
                              ? "under Slurm, start it with srun --mpi=pmix (`srun --mpi=list` shows what the site "
                                "has), or with mpirun inside the allocation"
                              : "start it with mpirun -np N instead (Open MPI cannot join processes started by "
                                "another launcher)";
        rt_errf(-EINVAL, "this is rank %d of %d by %s, but no MPI launcher started it: the collectives run over "
                         "MPI; %s",
                r, wsz, c->info.vars, how);
        free(c);
        return -EINVAL;
    }
    c->peers = rt_calloc((size_t)c->info.world, sizeof(*c->peers), "rank table");
    c->hb_seen = rt_calloc((size_t)c->info.world, sizeof(uint64_t), "rank table");
    c->hb_last = rt_calloc((size_t)c->info.world, sizeof(struct heard), "rank table");
    c->hb_peer = rt_calloc((size_t)c->info.world, sizeof(int), "rank table");
    c->gone = rt_calloc((size_t)c->info.world, sizeof(int), "rank table");
    c->busy_seen = rt_calloc((size_t)c->info.world, sizeof(uint64_t), "rank table");
    c->busy_checked = rt_calloc((size_t)c->info.world, sizeof(uint64_t), "rank table");
    if (!c->peers || !c->hb_seen || !c->hb_last || !c->hb_peer || !c->gone || !c->busy_seen || !c->busy_checked) {
        if (lv.mpi)
            fatal(c, "out of memory");
        rt_comm_destroy(c);
        return -ENOMEM;
    }
    if (!lv.mpi) {
        c->boot.mpi_init_ns = c->boot.rank_table_ns = c->boot.mesh_ns = c->boot.begin_ns;
        snprintf(c->backend, sizeof(c->backend), "none (one process)");
        c->threads_default = rt_cpus_available();
        fill_self(&c->peers[0], c->threads_default);
        c->info.local_world = 1;
        c->info.nodes = 1;
        *out = c;
        return 0;
    }
    int maj = 0, min = 0;
    MPI_Get_version(&maj, &min);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(lib, &len);
    int a = 0, b = 0, d = 0;
    if (sscanf(lib, "Open MPI v%d.%d.%d", &a, &b, &d) == 3)
        snprintf(c->backend, sizeof(c->backend), "MPI (Open MPI %d.%d.%d)", a, b, d);
    else
        snprintf(c->backend, sizeof(c->backend), "MPI %d.%d", maj, min);
    mpi_setup(c);
    if (c->info.world > 1) {
        c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (c->efd < 0)
            fatal(c, "eventfd: %s", strerror(errno));
        /* The comm thread takes no signals: SIGTERM/SIGUSR1 belong to the trainer. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        int e = pthread_create(&c->thread, NULL, comm_main, c);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (e)
            fatal(c, "cannot start the comm thread: %s", strerror(e));
        c->thread_started = 1;
    }
    *out = c;
    return 0;
}

void rt_comm_print_ranks(struct rt_comm *c, FILE *f, int threads, const char *device)
{
    struct peer me = c->peers[c->info.rank];
    me.threads = threads;
    if (c->info.world > 1)
        rt_comm_allgather(c, &me, c->peers, sizeof(me), "rank table");
    else
        c->peers[0] = me;
    if (c->info.rank != 0)
        return;
    fprintf(f, "  ranks     %-5s %-20s %-8s %-5s %-6s %-16s %-8s %s\n", "rank", "host", "pid", "node", "local",
            "CPUs", "threads", "device");
    for (int r = 0; r < c->info.world; r++) {
        const struct peer *p = &c->peers[r];
        char cpus[96];
        snprintf(cpus, sizeof(cpus), "%s (%d)", p->cpus, p->ncpus);
        fprintf(f, "            %-5d %-20s %-8d %-5d %-6d %-16s %-8d %s\n", r, p->host, p->pid,
                c->info.world > 1 ? p->node : 0, c->info.world > 1 ? p->local_rank : 0, cpus, p->threads, device);
    }
}

/* Ranks r..(next node) as text: "0-7", or "0,4,8 .. 28" when they are not contiguous. */
static void rank_span(const int *ranks, int n, char *buf, size_t len)
{
    if (n == 1)
        snprintf(buf, len, "%d", ranks[0]);
    else if (ranks[n - 1] - ranks[0] == n - 1)
        snprintf(buf, len, "%d-%d", ranks[0], ranks[n - 1]);
    else
        snprintf(buf, len, "%d,%d .. %d", ranks[0], ranks[1], ranks[n - 1]);
}

void rt_comm_print_rank_summary(struct rt_comm *c, FILE *f, int threads, const char *device, int max_rows)
{
    const int world = c->info.world;
    if (world <= max_rows) {
        rt_comm_print_ranks(c, f, threads, device);
        return;
    }
    struct peer me = c->peers[c->info.rank];
    me.threads = threads;
    rt_comm_allgather(c, &me, c->peers, sizeof(me), "rank table");
    if (c->info.rank != 0)
        return;
    /* Per node: its ranks (in rank order), threads' range, whether all its ranks have one CPU set. */
    const int nodes = c->info.nodes;
    int *count = rt_calloc((size_t)nodes, sizeof(int), "rank summary");
    int *order = rt_calloc((size_t)world, sizeof(int), "rank summary");
    int *first = rt_calloc((size_t)nodes + 1, sizeof(int), "rank summary");
    if (!count || !order || !first) {
        free(count);
        free(order);
        free(first);
        rt_comm_print_ranks(c, f, threads, device);
        return;
    }
    for (int r = 0; r < world; r++)
        count[c->peers[r].node]++;
    for (int k = 0; k < nodes; k++)
        first[k + 1] = first[k] + count[k];
    for (int k = 0; k < nodes; k++)
        count[k] = 0;
    for (int r = 0; r < world; r++) {
        const int k = c->peers[r].node;
        order[first[k] + count[k]++] = r;
    }
    fprintf(f, "  ranks     %d ranks on %d node%s (the table of every rank: `ringtrain ranks`, launched the same way)\n",
            world, nodes, nodes == 1 ? "" : "s");
    fprintf(f, "            %-12s %-28s %-14s %-6s %-16s %-8s %s\n", "nodes", "hosts", "ranks", "each", "CPUs per rank",
            "threads", "device");
    int lines = 0, k = 0;
    while (k < nodes) {
        /* Nodes k..j-1 alike: the same rank count, the first rank's CPU count and threads. */
        const struct peer *a = &c->peers[order[first[k]]];
        int j = k + 1, alike = 1;
        while (j < nodes && count[j] == count[k] && c->peers[order[first[j]]].ncpus == a->ncpus &&
               c->peers[order[first[j]]].threads == a->threads)
            j++;
        if (lines == 7 && j < nodes) {
            j = nodes; /* the rest in one line */
            alike = 0;
        }
        char ns[32], hosts[160], rs[48], cpus[96];
        snprintf(ns, sizeof(ns), j - k == 1 ? "%d" : "%d-%d", k, j - 1);
        const struct peer *z = &c->peers[order[first[j - 1]]];
        if (j - k == 1 || !strcmp(a->host, z->host))
            snprintf(hosts, sizeof(hosts), "%s", a->host);
        else
            snprintf(hosts, sizeof(hosts), "%.60s .. %.60s", a->host, z->host);
        if (j - k == 1)
            rank_span(order + first[k], count[k], rs, sizeof(rs));
        else
            snprintf(rs, sizeof(rs), "%d in all", first[j] - first[k]);
        int tmin = a->threads, tmax = a->threads, same_set = 1;
        for (int i = first[k]; i < first[j]; i++) {
            const struct peer *p = &c->peers[order[i]];
            tmin = RT_MIN(tmin, p->threads);
            tmax = RT_MAX(tmax, p->threads);
            same_set &= !strcmp(p->cpus, a->cpus) && p->ncpus == a->ncpus;
        }
        if (same_set)
            snprintf(cpus, sizeof(cpus), "%s (%d)", a->cpus, a->ncpus);
        else
            snprintf(cpus, sizeof(cpus), "%d each, own sets", a->ncpus);
        char th[24];
        snprintf(th, sizeof(th), tmin == tmax ? "%d" : "%d-%d", tmin, tmax);
        char each[16];
        snprintf(each, sizeof(each), "%d", count[k]);
        fprintf(f, "            %-12s %-28s %-14s %-6s %-16s %-8s %s\n", ns, hosts, rs, alike ? each : "-", cpus,
                th, device);
        lines++;
        k = j;
    }
    free(count);
    free(order);
    free(first);
}

void rt_comm_destroy(struct rt_comm *c)
{
    if (!c)
        return;
    if (c->thread_started) {
        rt_comm_barrier(c, -1, "the final barrier");
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_mutex_unlock(&c->mu);
        uint64_t one = 1;
        if (write(c->efd, &one, sizeof(one)) < 0)
            rt_warn("eventfd write: %s", strerror(errno));
        pthread_join(c->thread, NULL);
    }
    if (c->info.mpi) {
        MPI_Comm_free(&c->data);
        MPI_Comm_free(&c->local);
        MPI_Finalize();
    }
    rt_comm_lifeline_destroy(c->ll);
    if (c->efd >= 0)
        close(c->efd);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->peers);
    free(c->hb_seen);
    free(c->hb_last);
    free(c->hb_peer);
    free(c->gone);
    free(c->busy_seen);
    free(c->busy_checked);
    free(c);
}
