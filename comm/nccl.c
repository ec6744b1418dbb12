/*
 * nccl.c - the GPU half of comm/: the NCCL communicator (bootstrapped through
 * the MPI process group, or made in this process for a world of one; set up
 * non-blocking under the group's deadline), the report of NCCL's version,
 * variables and transport at creation, and the bucketer's device path: a
 * comm stream that follows the compute stream by events, ncclAllReduce per
 * bucket, and the host-side wait that is also the NCCL watchdog.
 *
 * It does not allocate gradients, know the compute backend (the compute
 * stream arrives as a void *), or replace the MPI watchdog: the comm thread
 * keeps its heartbeats and pidfds, which see a dead peer wherever this rank
 * is waiting.
 *
 * Without NCCL in the build (RT_HAVE_NCCL undefined) only the stubs at the
 * end are compiled: the public functions exist and say -ENOTSUP.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "comm/comm_impl.h"
#include "common/common.h"

#ifdef RT_HAVE_NCCL

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "common/cudalibs.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "comm/nccl.c needs NCCL 2.14 or later (non-blocking communicators, ncclCommFinalize)"
#endif

extern char **environ;

/* While NCCL logs to our file (during rt_nccl_create): what to put back. */
struct nccl_log {
    int fd;                     /* -1: not capturing (the user set NCCL_DEBUG, or no file) */
    char path[512];
    char *saved[3];             /* previous NCCL_DEBUG, _SUBSYS, _FILE (NULL: unset) */
    int user_debug;             /* 1: the user asked for NCCL's log: leave it alone */
};

struct rt_nccl {
    struct rt_comm *c;
    ncclComm_t comm;            /* NULL until ncclCommInitRankConfig has returned one */
    int device, rank, world;
    uint64_t step;              /* for failure messages: the bucketer's step */
    int ready;                  /* 0 while rt_nccl_create runs */
    struct nccl_log log;
    char describe[320];
};

static void log_stop(struct nccl_log *L);
static void log_warnings(const struct nccl_log *L);

/* ---- failures -------------------------------------------------------------------- */

/* "step 41" or "at start-up", for messages. */
static const char *when(const struct rt_nccl *n, char *buf, size_t len)
{
    if (n->ready)
        snprintf(buf, len, "step %" PRIu64, n->step);
    else
        snprintf(buf, len, "at start-up");
    return buf;
}

/* Prints `msg` (after NCCL's own warnings, which went to our file while it
 * was capturing), aborts the communicator (so no NCCL kernel or proxy thread
 * keeps waiting on peers) and ends the job. */
static _Noreturn void nccl_abort(struct rt_nccl *n, const char *msg)
{
    log_warnings(&n->log);
    log_stop(&n->log);
    rt_log(RT_LOG_ERROR, "%s", msg);
    fflush(stderr);
    if (n->comm)
        ncclCommAbort(n->comm);
    n->comm = NULL;
    rt_comm_abort(n->c, 1, NULL);
}

static _Noreturn void nccl_fail(struct rt_nccl *n, const char *lib, int code, const char *err, const char *expr,
                                const char *file, int line)
{
    char host[64] = "?", msg[1400], w[40];
    gethostname(host, sizeof(host) - 1);
    const char *last = ncclGetLastError(n->comm); /* a NULL comm is fine: the last error is global */
    snprintf(msg, sizeof(msg), "%s error %d (%s) in %s at %s:%d on %s (pid %d, GPU %d), %s%s%s. Ending the job.", lib,
             code, err ? err : "?", expr, file, line, host, (int)getpid(), n->device, when(n, w, sizeof(w)),
             last && *last ? "; NCCL's last error: " : "", last && *last ? last : "");
    nccl_abort(n, msg);
}

/* Waits for a non-blocking communicator to leave ncclInProgress (a set-up or
 * an enqueue that needs the peers), under the group's deadline. Returns the
 * state it settled in. */
static ncclResult_t settle(struct rt_nccl *n, const char *what)
{
    double timeout = rt_comm_timeout(n->c);
    uint64_t t0 = rt_now_ns();
    long nap_us = 10;
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &st);
        if (r != ncclSuccess)
            return r;
        if (st != ncclInProgress)
            return st;
        double age = (double)(rt_now_ns() - t0) * 1e-9;
        if (age > timeout) {
            char msg[1024], w[40];
            const char *last = ncclGetLastError(n->comm);
            snprintf(msg, sizeof(msg), "%s: %s did not complete within %.0f s (--comm-timeout): a peer never "
                     "joined or NCCL cannot connect%s%s. Ending the job.",
                     when(n, w, sizeof(w)), what, timeout, last && *last ? "; NCCL's last error: " : "",
                     last ? last : "");
            nccl_abort(n, msg);
        }
        struct timespec ts = {0, nap_us * 1000};
        nanosleep(&ts, NULL);
        nap_us = RT_MIN(nap_us * 2, 500);
    }
}

static void nccl_check(struct rt_nccl *n, ncclResult_t r, const char *expr, const char *file, int line)
{
    if (r == ncclInProgress)
        r = settle(n, expr);
    if (r != ncclSuccess)
        nccl_fail(n, "NCCL", (int)r, ncclGetErrorString(r), expr, file, line);
}

/* Every NCCL call after the ranks met: checked, settled when in progress. */
#define NCCL_CHECK(n, call) nccl_check((n), (call), #call, __FILE__, __LINE__)
#define NCCL_CUDA_CHECK(n, call)                                                                                     \
    do {                                                                                                             \
        cudaError_t e_ = (call);                                                                                     \
        if (e_ != cudaSuccess)                                                                                       \
            nccl_fail((n), "CUDA", (int)e_, cudaGetErrorString(e_), #call, __FILE__, __LINE__);                      \
    } while (0)

/* ---- NCCL's own log, read for the transport -------------------------------------- */

/* The transports a channel line can name, by locality. */
enum tr_kind {
    TR_P2P_CUMEM,
    TR_P2P_IPC,
    TR_P2P_DIRECT,
    TR_P2P_MNNVL,
    TR_P2P_OTHER,
    TR_SHM,
    TR_NET_IB,
    TR_NET_IB_GDR,
    TR_NET_SOCKET,
    TR_NET_OTHER,
    TR_COLLNET,
    TR_COUNT
};
static const char *const tr_names[TR_COUNT] = {"P2P/CUMEM",  "P2P/IPC",    "P2P/direct", "P2P/MNNVL",
                                               "P2P",        "SHM",        "NET/IB",     "NET/IB/GDRDMA",
                                               "NET/Socket", "NET/plugin", "CollNet"};

static const char *const log_vars[3] = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"};

/* NCCL re-reads NCCL_DEBUG* at its next log line after this; an exported
 * symbol it keeps for that purpose, looked up so that a release without it
 * only costs the report on a second communicator in the process. */
static void reset_nccl_log(void)
{
    void (*reset)(void);
    *(void **)&reset = dlsym(RTLD_DEFAULT, "ncclResetDebugInit");
    if (reset)
        reset();
}

/* Whether an nccl.conf sets NCCL_DEBUG (NCCL reads NCCL_CONF_FILE, else
 * ~/.nccl.conf, and /etc/nccl.conf). */
static int conf_sets_debug(const char *path)
{
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return 0;
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof(line), f)) {
        const char *p = line + strspn(line, " \t");
        found = !strncmp(p, "NCCL_DEBUG=", 11);
    }
    fclose(f);
    return found;
}

static void log_start(struct nccl_log *L)
{
    memset(L, 0, sizeof(*L));
    L->fd = -1;
    char home[512] = "";
    if (getenv("HOME"))
        snprintf(home, sizeof(home), "%s/.nccl.conf", getenv("HOME"));
    L->user_debug = getenv("NCCL_DEBUG") || conf_sets_debug(getenv("NCCL_CONF_FILE")) ||
                    conf_sets_debug(home[0] ? home : NULL) || conf_sets_debug("/etc/nccl.conf");
    if (L->user_debug)
        return;
    const char *tmp = getenv("TMPDIR");
    snprintf(L->path, sizeof(L->path), "%s/ringtrain-nccl-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (strchr(L->path, '%') || (L->fd = mkstemp(L->path)) < 0) {
        L->fd = -1; /* NCCL would expand '%': no report rather than a stray file */
        return;
    }
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(log_vars[i]);
        L->saved[i] = v ? strdup(v) : NULL;
    }
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,NET", 1);
    setenv("NCCL_DEBUG_FILE", L->path, 1);
    reset_nccl_log(); /* for a communicator after the first: NCCL read the variables then */
}

/* Puts the variables back and NCCL's logging with them; removes the file. */
static void log_stop(struct nccl_log *L)
{
    if (L->fd < 0)
        return;
    for (int i = 0; i < 3; i++) {
        if (L->saved[i])
            setenv(log_vars[i], L->saved[i], 1);
        else
            unsetenv(log_vars[i]);
        free(L->saved[i]);
        L->saved[i] = NULL;
    }
    reset_nccl_log();
    unlink(L->path);
    close(L->fd);
    L->fd = -1;
}

/* Classifies one "Channel .. : a[x] -> b[y] ... via T" line into seen[kind]
 * (bit 0: intra-node, bit 1: inter-node), the peer's node from `nodes`. */
static void classify(const char *line, int me, const int32_t *nodes, int world, int32_t *seen)
{
    const char *via = strstr(line, " via ");
    if (!via)
        return;
    via += 5;
    if (!strncasecmp(via, "COLLNET", 7)) {
        seen[TR_COLLNET] |= 2; /* the network's in-switch reduction */
        return;
    }
    const char *arrow = strstr(line, " : ");
    int a = -1, b = -1, x, y;
    if (!arrow || !strstr(line, "Channel") || sscanf(arrow, " : %d[%x] -> %d[%x]", &a, &x, &b, &y) != 4)
        return;
    int peer = a == me ? b : a;
    int where = peer >= 0 && peer < world && nodes[peer] != nodes[me] ? 2 : 1;
    enum tr_kind k;
    if (!strncmp(via, "P2P/CUMEM", 9))
        k = TR_P2P_CUMEM;
    else if (!strncmp(via, "P2P/IPC", 7))
        k = TR_P2P_IPC;
    else if (!strncmp(via, "P2P/direct", 10))
        k = TR_P2P_DIRECT;
    else if (!strncmp(via, "P2P/MNNVL", 9))
        k = TR_P2P_MNNVL;
    else if (!strncmp(via, "P2P", 3))
        k = TR_P2P_OTHER;
    else if (!strncmp(via, "SHM", 3))
        k = TR_SHM;
    else if (!strncmp(via, "NET/IB/", 7) || !strncmp(via, "NET/IB ", 7))
        k = strstr(via, "/GDRDMA") ? TR_NET_IB_GDR : TR_NET_IB;
    else if (!strncmp(via, "NET/Socket", 10))
        k = TR_NET_SOCKET;
    else if (!strncmp(via, "NET", 3))
        k = TR_NET_OTHER;
    else
        return;
    seen[k] |= where;
}

/* What NCCL logged to the file, from its start, one line at a time (newline stripped); NULL if
 * there is none. The stream reads a duplicate of the descriptor, so closing it leaves L->fd open. */
static FILE *log_open(const struct nccl_log *L)
{
    if (L->fd < 0)
        return NULL;
    const int fd = dup(L->fd);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    rewind(f);
    return f;
}

static int log_line(FILE *f, char **line, size_t *cap)
{
    const ssize_t n = getline(line, cap, f);
    if (n <= 0)
        return 0;
    if ((*line)[n - 1] == '\n')
        (*line)[n - 1] = 0;
    return 1;
}

/* Reads what NCCL logged to the file into seen[]. */
static void log_scan(const struct nccl_log *L, int me, const int32_t *nodes, int world, int32_t *seen)
{
    FILE *f = log_open(L);
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0;
    while (log_line(f, &line, &cap))
        classify(line, me, nodes, world, seen);
    free(line);
    fclose(f);
}

/* Echoes the warnings NCCL wrote to the file (at most 8): they would have
 * gone to the terminal had it not been capturing. */
static void log_warnings(const struct nccl_log *L)
{
    FILE *f = log_open(L);
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0;
    for (int shown = 0; shown < 8 && log_line(f, &line, &cap);) {
        const char *w = strstr(line, "NCCL WARN ");
        if (w) {
            rt_log(RT_LOG_ERROR, "NCCL: %s", w + strlen("NCCL WARN "));
            shown++;
        }
    }
    free(line);
    fclose(f);
}

/* "P2P/CUMEM (intra-node), NET/IB (inter-node)" from every rank's seen[]. */
static void transport_text(const int32_t *seen, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int where = 1; where <= 2; where++)
        for (int k = 0; k < TR_COUNT && o < len; k++)
            if (seen[k] & where)
                o += (size_t)snprintf(buf + o, len - o, "%s%s (%s)", o ? ", " : "", tr_names[k],
                                      where == 1 ? "intra-node" : "inter-node");
}

/* "NCCL_IB_HCA=mlx5_0 NCCL_SOCKET_IFNAME=ib0" (each cut at 80 characters). */
static void env_text(char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (char **e = environ; e && *e && o < len; e++) {
        if (strncmp(*e, "NCCL_", 5) != 0)
            continue;
        o += (size_t)snprintf(buf + o, len - o, "%s%.80s", o ? " " : "", *e);
    }
    if (!buf[0])
        snprintf(buf, len, "no NCCL_* variables set");
}

/* ---- the communicator ------------------------------------------------------------- */

int rt_nccl_available(void)
{
    /* In the build, and libnccl loads here (it is not linked: common/cudalibs.h). */
    return rt_cudalibs_load(RT_CUDALIBS_NCCL) == 0;
}

const char *rt_nccl_describe(const struct rt_nccl *n)
{
    return n->describe;
}

/* One integer summed over the ranks, end to end through NCCL; this is also
 * what makes NCCL (2.22 and later connect lazily) open its channels. */
static void check_allreduce(struct rt_nccl *n)
{
    cudaStream_t st;
    cudaEvent_t ev;
    int32_t *d = NULL, one = 1, sum = 0;
    NCCL_CUDA_CHECK(n, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    NCCL_CUDA_CHECK(n, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    NCCL_CUDA_CHECK(n, cudaMallocAsync((void **)&d, sizeof(*d), st));
    NCCL_CUDA_CHECK(n, cudaMemcpyAsync(d, &one, sizeof(one), cudaMemcpyHostToDevice, st));
    NCCL_CHECK(n, ncclAllReduce(d, d, 1, ncclInt32, ncclSum, n->comm, st));
    NCCL_CUDA_CHECK(n, cudaEventRecord(ev, st));
    /* Polled under the deadline; only then the (blocking) copy back. */
    uint64_t t0 = rt_now_ns();
    long nap_us = 10;
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady)
            nccl_fail(n, "CUDA", (int)e, cudaGetErrorString(e), "the first all-reduce", __FILE__, __LINE__);
        ncclResult_t as = ncclSuccess;
        NCCL_CHECK(n, ncclCommGetAsyncError(n->comm, &as));
        if (as != ncclSuccess && as != ncclInProgress)
            nccl_fail(n, "NCCL", (int)as, ncclGetErrorString(as), "the first all-reduce (asynchronous error)",
                      __FILE__, __LINE__);
        if ((double)(rt_now_ns() - t0) * 1e-9 > rt_comm_timeout(n->c)) {
            char msg[512];
            snprintf(msg, sizeof(msg), "at start-up: the NCCL communicator's first all-reduce did not complete "
                                       "within %.0f s (--comm-timeout): NCCL cannot connect the GPUs. Ending the job.",
                     rt_comm_timeout(n->c));
            nccl_abort(n, msg);
        }
        struct timespec ts = {0, nap_us * 1000};
        nanosleep(&ts, NULL);
        nap_us = RT_MIN(nap_us * 2, 500);
    }
    NCCL_CUDA_CHECK(n, cudaMemcpyAsync(&sum, d, sizeof(sum), cudaMemcpyDeviceToHost, st));
    NCCL_CUDA_CHECK(n, cudaStreamSynchronize(st)); /* our own stream, whose work is done */
    NCCL_CUDA_CHECK(n, cudaFreeAsync(d, st));
    NCCL_CUDA_CHECK(n, cudaStreamSynchronize(st));
    NCCL_CUDA_CHECK(n, cudaEventDestroy(ev));
    NCCL_CUDA_CHECK(n, cudaStreamDestroy(st));
    if (sum != n->world) {
        char msg[256];
        snprintf(msg, sizeof(msg), "at start-up: the NCCL communicator's check all-reduce gave %d, expected %d "
                                   "(the rank count). Ending the job.",
                 (int)sum, n->world);
        nccl_abort(n, msg);
    }
}

/* rt_nccl_create (local 0: the ranks of `c` meet through MPI) and rt_nccl_create_local (local 1: a world of
 * one made in this process; no collective of `c`, no environment changes, no transport report). */
static int nccl_create(struct rt_comm *c, int device, int local, struct rt_nccl **out)
{
    *out = NULL;
    const struct rt_rank_info *ri = rt_comm_info(c);
    if (local && ri->world != 1)
        return rt_errf(-EINVAL, "NCCL: a local communicator is a world of one process, but this one is rank %d of "
                                "%d (%s): the ranks meet through rt_nccl_create",
                       ri->rank, ri->world, ri->vars);
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || device < 0 || device >= ndev) {
        cudaGetLastError();
        return rt_errf(-ENODEV, "NCCL: GPU %d asked for, but %s", device,
                       e != cudaSuccess ? cudaGetErrorString(e) : ndev == 1 ? "1 is visible" : "fewer are visible");
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess) {
        cudaGetLastError();
        return rt_errf(-ENODEV, "NCCL: cannot use GPU %d: %s", device, cudaGetErrorString(e));
    }
    /* libnccl is loaded now, not linked (common/cudalibs.h). */
    int lib_rc = rt_cudalibs_load(RT_CUDALIBS_NCCL); /* rt_errmsg(): which, why, what to do */
    if (lib_rc)
        return lib_rc;
    struct rt_nccl *n = rt_calloc(1, sizeof(*n), "NCCL communicator");
    if (!n)
        return -ENOMEM;
    n->c = c;
    n->log.fd = -1;
    n->device = device;
    n->rank = ri->rank;
    n->world = ri->world;

    char vars[600];
    env_text(vars, sizeof(vars)); /* before log_start adds its own */
    struct nccl_log *L = &n->log;
    if (!local)
        log_start(L);

    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (n->rank == 0)
        NCCL_CHECK(n, ncclGetUniqueId(&id));
    if (!local)
        rt_comm_broadcast(c, &id, sizeof(id), 0, "the NCCL unique id");
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* a peer that never joins must not hang us past the deadline */
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, n->world, id, n->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        nccl_fail(n, "NCCL", (int)r, ncclGetErrorString(r), "ncclCommInitRankConfig", __FILE__, __LINE__);
    r = settle(n, "the NCCL communicator's set-up (ncclCommInitRankConfig)");
    if (r != ncclSuccess)
        nccl_fail(n, "NCCL", (int)r, ncclGetErrorString(r), "ncclCommInitRankConfig", __FILE__, __LINE__);
    check_allreduce(n);

    int v = 0;
    ncclGetVersion(&v);
    char ver[32], tr[200];
    snprintf(ver, sizeof(ver), "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    if (local) {
        snprintf(n->describe, sizeof(n->describe), "NCCL %s on GPU %d, transport: none (one rank, set up in-process)",
                 ver, device);
        rt_info("NCCL %s, one rank set up in this process (no MPI); %s", ver, vars);
        n->ready = 1;
        *out = n;
        return 0;
    }

    /* Every rank's transports, by the node of each channel's peer. */
    int32_t *nodes = rt_calloc((size_t)n->world, sizeof(int32_t), "node table");
    int32_t seen[TR_COUNT + 1] = {0}, me = ri->node;
    if (!nodes)
        nccl_abort(n, "out of memory for the node table");
    rt_comm_allgather(c, &me, nodes, sizeof(me), "the node table for the NCCL report");
    log_scan(L, n->rank, nodes, n->world, seen);
    seen[TR_COUNT] = L->fd < 0 && !L->user_debug; /* this rank could not capture NCCL's log */
    log_stop(L);
    free(nodes);
    rt_comm_allreduce(c, seen, TR_COUNT + 1, RT_COMM_I32, RT_RED_MAX, "the NCCL transport report");

    if (L->user_debug)
        snprintf(tr, sizeof(tr), "see NCCL_DEBUG output");
    else if (n->world == 1)
        snprintf(tr, sizeof(tr), "none (one rank)");
    else {
        transport_text(seen, tr, sizeof(tr));
        if (!tr[0])
            snprintf(tr, sizeof(tr), "%s", seen[TR_COUNT] ? "not known (NCCL's log could not be captured)"
                                                          : "not reported by NCCL");
    }
    snprintf(n->describe, sizeof(n->describe), "NCCL %s on GPU %d, transport: %s", ver, device, tr);
    if (n->rank == 0) {
        rt_info("NCCL %s, %d rank%s, one GPU each; %s", ver, n->world, n->world == 1 ? "" : "s", vars);
        rt_info("NCCL transport: %s", tr);
    }
    n->ready = 1;
    *out = n;
    return 0;
}

int rt_nccl_create(struct rt_comm *c, int device, struct rt_nccl **out)
{
    return nccl_create(c, device, 0, out);
}

int rt_nccl_create_local(struct rt_comm *c, int device, struct rt_nccl **out)
{
    return nccl_create(c, device, 1, out);
}

void rt_nccl_destroy(struct rt_nccl *n)
{
    if (!n)
        return;
    if (n->comm) {
        cudaSetDevice(n->device);
        NCCL_CHECK(n, ncclCommFinalize(n->comm)); /* settles: what was queued completes first */
        ncclCommDestroy(n->comm);
    }
    free(n);
}

/* ---- the bucketer's device path ---------------------------------------------------- */

/* Two generations of per-bucket records, used by the steps in turn (step % 2), so that a step's all-reduces can
 * be watched once the next step's are queued (the bucketer's late mode): generation g's bucket k at g * nb + k. */
struct rt_nccl_stream {
    struct rt_nccl *n;
    cudaStream_t compute, comm;
    cudaEvent_t ready;          /* on compute: what backward has queued so far */
    cudaEvent_t *done;          /* 2 x nb: on comm, after bucket k's all-reduce */
    uint64_t *t_queued;         /* 2 x nb: host time bucket k was queued */
    const char **what;          /* 2 x nb: borrowed descriptions */
    int nb;
    int gen;                    /* this step's generation */
    int queued[2];              /* buckets queued in each generation's step */
    int finished[2];            /* of those, known complete */
    uint64_t step[2];           /* each generation's step */
};

int rt_nccl_stream_create(struct rt_nccl *n, void *compute, int nb, struct rt_nccl_stream **out)
{
    *out = NULL;
    struct rt_nccl_stream *s = rt_calloc(1, sizeof(*s), "NCCL bucket stream");
    if (!s)
        return -ENOMEM;
    s->n = n;
    s->compute = (cudaStream_t)compute;
    s->nb = nb;
    s->done = rt_calloc(2 * (size_t)nb, sizeof(*s->done), "NCCL bucket events");
    s->t_queued = rt_calloc(2 * (size_t)nb, sizeof(*s->t_queued), "NCCL bucket events");
    s->what = rt_calloc(2 * (size_t)nb, sizeof(*s->what), "NCCL bucket events");
    if (!s->done || !s->t_queued || !s->what) {
        rt_nccl_stream_destroy(s);
        return -ENOMEM;
    }
    int lo = 0, hi = 0;
    cudaError_t e = cudaSetDevice(n->device);
    if (e == cudaSuccess)
        e = cudaDeviceGetStreamPriorityRange(&lo, &hi);
    /* The greatest priority (the lowest number): the all-reduce kernels are
     * scheduled ahead of backward's as soon as their inputs are ready. */
    if (e == cudaSuccess)
        e = cudaStreamCreateWithPriority(&s->comm, cudaStreamNonBlocking, hi);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming);
    for (int k = 0; k < 2 * nb && e == cudaSuccess; k++)
        e = cudaEventCreateWithFlags(&s->done[k], cudaEventDisableTiming);
    if (e != cudaSuccess) {
        cudaGetLastError();
        rt_nccl_stream_destroy(s);
        return rt_errf(-EIO, "cannot create the NCCL comm stream and its events on GPU %d: %s", n->device,
                       cudaGetErrorString(e));
    }
    *out = s;
    return 0;
}

void rt_nccl_stream_destroy(struct rt_nccl_stream *s)
{
    if (!s)
        return;
    if (s->comm)
        cudaStreamSynchronize(s->comm); /* its own stream only: nothing else is waited for */
    for (int k = 0; s->done && k < 2 * s->nb; k++)
        if (s->done[k])
            cudaEventDestroy(s->done[k]);
    if (s->ready)
        cudaEventDestroy(s->ready);
    if (s->comm)
        cudaStreamDestroy(s->comm);
    free(s->done);
    free(s->t_queued);
    free(s->what);
    free(s);
}

void rt_nccl_stream_begin(struct rt_nccl_stream *s, uint64_t step)
{
    s->gen = (int)(step & 1u);
    s->queued[s->gen] = 0;
    s->finished[s->gen] = 0;
    s->step[s->gen] = step;
    s->n->step = step;
}

void rt_nccl_stream_follow(struct rt_nccl_stream *s)
{
    NCCL_CUDA_CHECK(s->n, cudaEventRecord(s->ready, s->compute));
    NCCL_CUDA_CHECK(s->n, cudaStreamWaitEvent(s->comm, s->ready, 0));
}

void rt_nccl_stream_allreduce(struct rt_nccl_stream *s, int k, float *buf, size_t count, const char *what)
{
    const int i = s->gen * s->nb + k;
    s->what[i] = what;
    s->t_queued[i] = rt_now_ns();
    NCCL_CHECK(s->n, ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, s->n->comm, s->comm));
    NCCL_CUDA_CHECK(s->n, cudaEventRecord(s->done[i], s->comm));
    s->queued[s->gen] = k + 1;
}

/* The watchdog's message: generation g's buckets still in flight, the NCCL state. */
static _Noreturn void stream_fail(struct rt_nccl_stream *s, int g, const char *why)
{
    char inflight[700];
    size_t o = 0;
    int shown = 0, more = 0;
    inflight[0] = 0;
    for (int k = s->finished[g]; k < s->queued[g]; k++) {
        if (cudaEventQuery(s->done[g * s->nb + k]) == cudaSuccess)
            continue;
        if (shown < 3 && o < sizeof(inflight)) {
            o += (size_t)snprintf(inflight + o, sizeof(inflight) - o, "%s%s", shown ? "; " : "",
                                  s->what[g * s->nb + k]);
            shown++;
        } else {
            more++;
        }
    }
    if (more && o < sizeof(inflight))
        snprintf(inflight + o, sizeof(inflight) - o, "; and %d more bucket%s", more, more == 1 ? "" : "s");
    ncclResult_t as = ncclSuccess;
    ncclCommGetAsyncError(s->n->comm, &as);
    const char *last = ncclGetLastError(s->n->comm);
    char msg[1500];
    snprintf(msg, sizeof(msg), "step %" PRIu64 ": %s; in flight: %s; NCCL: %s%s%s. Ending the job.", s->step[g], why,
             shown ? inflight : "none", ncclGetErrorString(as), last && *last ? ", last error: " : "",
             last ? last : "");
    nccl_abort(s->n, msg);
}

void rt_nccl_stream_join(struct rt_nccl_stream *s)
{
    const int g = s->gen;
    if (s->queued[g])
        NCCL_CUDA_CHECK(s->n, cudaStreamWaitEvent(s->compute, s->done[g * s->nb + s->queued[g] - 1], 0));
}

/* Polls on the host until generation g's all-reduces are done, as the watchdog. */
static void watch(struct rt_nccl_stream *s, int g)
{
    if (s->finished[g] == s->queued[g])
        return;
    double timeout = rt_comm_timeout(s->n->c);
    long nap_us = 10;
    for (;;) {
        int progressed = 0;
        while (s->finished[g] < s->queued[g]) {
            cudaError_t e = cudaEventQuery(s->done[g * s->nb + s->finished[g]]);
            if (e == cudaErrorNotReady)
                break;
            if (e != cudaSuccess) {
                char why[300];
                snprintf(why, sizeof(why), "CUDA error %d (%s) while the gradients were all-reduced", (int)e,
                         cudaGetErrorString(e));
                stream_fail(s, g, why);
            }
            s->finished[g]++;
            progressed = 1;
        }
        if (s->finished[g] == s->queued[g])
            return;
        ncclResult_t as = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(s->n->comm, &as);
        if (r != ncclSuccess || (as != ncclSuccess && as != ncclInProgress)) {
            char why[200];
            snprintf(why, sizeof(why), "NCCL reported an error during the gradient all-reduce (%s)",
                     ncclGetErrorString(r != ncclSuccess ? r : as));
            stream_fail(s, g, why);
        }
        double age = (double)(rt_now_ns() - s->t_queued[g * s->nb + s->finished[g]]) * 1e-9;
        if (age > timeout) {
            char why[200];
            snprintf(why, sizeof(why), "the NCCL all-reduce of gradient bucket %d of %d did not complete within "
                                       "%.0f s (--comm-timeout)",
                     s->finished[g] + 1, s->nb, timeout);
            stream_fail(s, g, why);
        }
        /* Naps as the comm thread's: short and growing while in flight,
         * back to short after progress. */
        nap_us = progressed ? 10 : RT_MIN(nap_us * 2, 500);
        struct timespec ts = {0, nap_us * 1000};
        nanosleep(&ts, NULL);
    }
}

void rt_nccl_stream_wait(struct rt_nccl_stream *s)
{
    rt_nccl_stream_join(s);
    watch(s, s->gen);
}

void rt_nccl_stream_watch(struct rt_nccl_stream *s, int before)
{
    if (before)
        watch(s, s->gen ^ 1);
    else
        watch(s, s->gen);
}

#else /* no NCCL in this build */

struct rt_nccl {
    int unused;
};

int rt_nccl_available(void)
{
    return 0;
}

int rt_nccl_create(struct rt_comm *c, int device, struct rt_nccl **out)
{
    (void)c;
    (void)device;
    *out = NULL;
    return rt_errf(-ENOTSUP, "this build has no NCCL: the GPU all-reduce needs the CUDA toolkit and NCCL at "
                             "configure time (cmake -DNCCL_ROOT=..., see comm/README.md)");
}

int rt_nccl_create_local(struct rt_comm *c, int device, struct rt_nccl **out)
{
    return rt_nccl_create(c, device, out);
}

const char *rt_nccl_describe(const struct rt_nccl *n)
{
    (void)n;
    return "no NCCL in this build";
}

void rt_nccl_destroy(struct rt_nccl *n)
{
    (void)n;
}

int rt_nccl_stream_create(struct rt_nccl *n, void *compute, int nb, struct rt_nccl_stream **out)
{
    (void)n;
    (void)compute;
    (void)nb;
    *out = NULL;
    return rt_errf(-ENOTSUP, "device gradients need NCCL, which this build does not have");
}

void rt_nccl_stream_destroy(struct rt_nccl_stream *s)
{
    (void)s;
}

void rt_nccl_stream_begin(struct rt_nccl_stream *s, uint64_t step)
{
    (void)s;
    (void)step;
}

void rt_nccl_stream_follow(struct rt_nccl_stream *s)
{
    (void)s;
}

void rt_nccl_stream_allreduce(struct rt_nccl_stream *s, int k, float *buf, size_t count, const char *what)
{
    (void)s;
    (void)k;
    (void)buf;
    (void)count;
    (void)what;
}

void rt_nccl_stream_wait(struct rt_nccl_stream *s)
{
    (void)s;
}

void rt_nccl_stream_join(struct rt_nccl_stream *s)
{
    (void)s;
}

void rt_nccl_stream_watch(struct rt_nccl_stream *s, int before)
{
    (void)s;
    (void)before;
}

#endif
