/*
 * lifeline.c - a TCP connection between every two heartbeat partners, beside
 * MPI, which the comm thread (comm.c) watches.
 *
 * Why a connection of our own: when a process dies, its kernel closes its
 * sockets, so the peers on other nodes see the end of its connection at once.
 * MPI says nothing of the kind (Open MPI over TCP may print a reset and hang,
 * a fabric may say nothing at all), and the launchers' own clean-up is slow
 * where it exists: srun --kill-on-bad-exit first sends the survivors SIGTERM,
 * which a trainer answers with "finish the step", a step that can never end.
 * The connection also carries the heartbeats, so a stopped rank, or a node
 * whose link went down, is found by its silence; and a rank that ends the job
 * writes why before it aborts, so that its peers name the rank that ended it
 * instead of blaming each other.
 *
 * Set-up is collective over MPI_COMM_WORLD, before the comm thread starts.
 * Each rank listens on an ephemeral port on every address, the ranks gather
 * each other's addresses and port, and each rank connects to its partners
 * below it while it accepts the ones above it, in one poll loop (no rank waits
 * on another's order). Both ends check a job-wide token and both ranks in a
 * handshake, so a stray connection, or an address that leads to some other
 * process (a docker bridge has the same address on every node), is never
 * taken for a peer: the connector tries the peer's next address.
 *
 * Not here: what a message means (comm.c), the MPI collectives.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/comm_impl.h"
#include "common/common.h"

#define LL_MAGIC 0x524c4c31u /* "RLL1" */
#define LL_MAX_ADDRS 8
#define LL_CONNECT_S 3.0     /* one address's connect and handshake */

/* What each rank publishes: where it listens. */
struct card {
    uint64_t token; /* rank 0's, the same on every rank */
    uint32_t ip[LL_MAX_ADDRS]; /* network order, loopback last */
    uint16_t port;  /* network order */
    uint16_t naddr;
};

/* The handshake, both ways: the connector says who it is and whom it wants;
 * the acceptor answers with the same, reversed. */
struct hello {
    uint32_t magic;
    int32_t from, to;
    uint32_t zero;
    uint64_t token;
};

/* A message on an established connection: this header, then `len` bytes of text. */
struct head {
    uint32_t magic;
    uint16_t kind, len;
    int32_t rank, phase;
    uint64_t step;
};

struct conn {
    int fd;          /* -1: none (not a partner, closed) */
    int congested;   /* a send did not go out whole: nothing more is sent on it */
    size_t have;
    unsigned char buf[sizeof(struct head) + LL_TEXT_MAX];
};

struct rt_comm_lifeline {
    int rank, n;
    struct conn *conn;
    pthread_mutex_t tx; /* sends come from the comm thread and from whichever thread aborts */
};

/* ---- set-up ---------------------------------------------------------------------- */

/* This host's IPv4 addresses, the interfaces that are up, loopback last. */
static void my_addresses(struct card *c)
{
    struct ifaddrs *ifs = NULL;
    c->naddr = 0;
    if (getifaddrs(&ifs) == 0) {
        for (int pass = 0; pass < 2; pass++)
            for (struct ifaddrs *i = ifs; i && c->naddr < LL_MAX_ADDRS - 1; i = i->ifa_next) {
                if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
                    continue;
                int loop = (i->ifa_flags & IFF_LOOPBACK) != 0;
                if (loop != pass)
                    continue;
                c->ip[c->naddr++] = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr;
            }
        freeifaddrs(ifs);
    }
    if (c->naddr == 0)
        c->ip[c->naddr++] = htonl(INADDR_LOOPBACK);
}

static double left_s(uint64_t deadline)
{
    uint64_t now = rt_now_ns();
    return now >= deadline ? 0 : (double)(deadline - now) * 1e-9;
}

/* One connection being made: ours to a partner below (trying its addresses in
 * turn), or one a partner above made to us. */
struct pending {
    int fd, rank, addr, outgoing;
    int state;          /* outgoing: 0 connecting, 1 awaiting the answer; incoming: awaiting the hello */
    uint64_t deadline;
    size_t got;
    struct hello in;
};

static void set_socket_options(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Starts a connect to the next address of p->rank. Returns 0, or -errno
 * when none is left (the last address's error; -EHOSTUNREACH when the card
 * has none) or no socket can be made. */
static int dial_next(struct pending *p, const struct card *cards)
{
    const struct card *k = &cards[p->rank];
    int rc = -EHOSTUNREACH;
    while (p->addr < k->naddr) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = k->port, .sin_addr.s_addr = k->ip[p->addr]};
        p->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (p->fd < 0)
            return -errno;
        if (connect(p->fd, (const struct sockaddr *)&sa, sizeof(sa)) == 0 || errno == EINPROGRESS) {
            p->state = 0;
            p->got = 0;
            p->deadline = rt_now_ns() + (uint64_t)(LL_CONNECT_S * 1e9);
            return 0;
        }
        rc = -errno;
        close(p->fd);
        p->fd = -1;
        p->addr++;
    }
    return rc;
}

/* Reads what has arrived of the peer's hello. Returns 1 when it is whole, 0
 * when more is to come, -EPIPE when the peer closed, or -errno. */
static int read_hello(struct pending *p)
{
    ssize_t k = recv(p->fd, (char *)&p->in + p->got, sizeof(p->in) - p->got, MSG_DONTWAIT);
    if (k > 0)
        p->got += (size_t)k;
    else if (k == 0)
        return -EPIPE;
    else if (errno != EAGAIN && errno != EINTR)
        return -errno;
    return p->got == sizeof(p->in);
}

/* Returns 0, or -errno (-EAGAIN when the hello did not go out whole). */
static int send_hello(int fd, int from, int to, uint64_t token)
{
    struct hello h = {.magic = LL_MAGIC, .from = from, .to = to, .token = token};
    ssize_t k = send(fd, &h, sizeof(h), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k < 0)
        return -errno;
    return k == (ssize_t)sizeof(h) ? 0 : -EAGAIN;
}

static void describe_card(const struct card *k, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < k->naddr && o < len; i++) {
        char a[INET_ADDRSTRLEN];
        struct in_addr in = {.s_addr = k->ip[i]};
        inet_ntop(AF_INET, &in, a, sizeof(a));
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", a);
    }
}

/* The poll loop that makes every connection: 0, or -errno naming the partner
 * that could not be reached. */
static int connect_all(struct rt_comm_lifeline *l, int lfd, const struct card *cards, const int *partner,
                       double timeout_s)
{
    const int me = l->rank, n = l->n;
    int want = 0;
    for (int r = 0; r < n; r++)
        want += partner[r] && r != me;
    struct pending *p = rt_calloc((size_t)2 * n + 8, sizeof(*p), "lifeline set-up");
    struct pollfd *pf = rt_calloc((size_t)2 * n + 9, sizeof(*pf), "lifeline set-up");
    if (!p || !pf) {
        free(p);
        free(pf);
        return -ENOMEM;
    }
    int np = 0, rc = 0;
    const size_t cap = (size_t)2 * n + 8;
    for (int r = 0; r < me; r++) {
        if (!partner[r])
            continue;
        p[np] = (struct pending){.fd = -1, .rank = r, .outgoing = 1};
        int e = dial_next(&p[np], cards);
        if (e < 0) {
            char a[160];
            describe_card(&cards[r], a, sizeof(a));
            rc = rt_errf(-EHOSTUNREACH, "lifeline: cannot connect to rank %d (at %s, port %u): %s", r, a,
                         ntohs(cards[r].port), strerror(-e));
            goto out;
        }
        np++;
    }
    const uint64_t deadline = rt_now_ns() + (uint64_t)(timeout_s * 1e9);
    int done = 0;
    while (done < want) {
        if (left_s(deadline) <= 0) {
            for (int i = 0; i < np; i++)
                if (p[i].fd >= 0 && p[i].outgoing) {
                    rc = rt_errf(-ETIMEDOUT, "lifeline: rank %d did not answer within %.0f s", p[i].rank, timeout_s);
                    goto out;
                }
            rc = rt_errf(-ETIMEDOUT, "lifeline: %d of the ranks above this one did not connect within %.0f s",
                         want - done, timeout_s);
            goto out;
        }
        pf[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < np; i++)
            pf[i + 1] = (struct pollfd){.fd = p[i].fd, .events = p[i].outgoing && p[i].state == 0 ? POLLOUT : POLLIN};
        poll(pf, (nfds_t)np + 1, 100);
        const int polled = np;
        if ((pf[0].revents & POLLIN) && (size_t)np < cap) {
            int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0)
                p[np++] = (struct pending){.fd = fd, .rank = -1,
                                           .deadline = rt_now_ns() + (uint64_t)(LL_CONNECT_S * 1e9)};
        }
        for (int i = 0; i < np; i++) {
            struct pending *q = &p[i];
            short ev = i < polled ? pf[i + 1].revents : 0;
            if (q->fd < 0)
                continue;
            int fail = 0, ok = 0;
            if (q->outgoing && q->state == 0 && ev) {
                int err = 0;
                socklen_t el = sizeof(err);
                getsockopt(q->fd, SOL_SOCKET, SO_ERROR, &err, &el);
                if (err || send_hello(q->fd, me, q->rank, cards[0].token) < 0)
                    fail = 1;
                else
                    q->state = 1;
            } else if (ev) {
                int h = read_hello(q);
                if (h < 0) {
                    fail = 1;
                } else if (h == 1) {
                    const struct hello *in = &q->in;
                    if (in->magic != LL_MAGIC || in->token != cards[0].token || in->to != me || in->from < 0 ||
                        in->from >= n || !partner[in->from] || (q->outgoing ? in->from != q->rank : in->from <= me) ||
                        (!q->outgoing && l->conn[in->from].fd >= 0))
                        fail = 1;
                    else if (!q->outgoing && send_hello(q->fd, me, in->from, cards[0].token) < 0)
                        fail = 1;
                    else
                        ok = 1;
                }
            }
            if (!ok && !fail && rt_now_ns() > q->deadline)
                fail = 1;
            if (ok) {
                int r = q->outgoing ? q->rank : q->in.from;
                set_socket_options(q->fd);
                l->conn[r].fd = q->fd;
                q->fd = -1;
                done++;
            } else if (fail) {
                /* Not our peer, or not there: an outgoing one tries the next address; a stray is dropped. */
                close(q->fd);
                q->fd = -1;
                if (q->outgoing) {
                    q->addr++;
                    if (dial_next(q, cards) < 0) {
                        char a[160];
                        describe_card(&cards[q->rank], a, sizeof(a));
                        rc = rt_errf(-EHOSTUNREACH, "lifeline: cannot reach rank %d at any of its addresses (%s, "
                                                    "port %u)",
                                     q->rank, a, ntohs(cards[q->rank].port));
                        goto out;
                    }
                }
            }
        }
        /* Drop finished entries, keeping the array dense. */
        int k = 0;
        for (int i = 0; i < np; i++)
            if (p[i].fd >= 0)
                p[k++] = p[i];
        np = k;
    }
out:
    for (int i = 0; i < np; i++)
        if (p[i].fd >= 0)
            close(p[i].fd);
    free(p);
    free(pf);
    return rc;
}

int rt_comm_lifeline_create(MPI_Comm world, const int *partner, double timeout_s, struct rt_comm_lifeline **out)
{
    *out = NULL;
    struct rt_comm_lifeline *l = rt_calloc(1, sizeof(*l), "lifeline");
    if (!l)
        return -ENOMEM;
    MPI_Comm_rank(world, &l->rank);
    MPI_Comm_size(world, &l->n);
    pthread_mutex_init(&l->tx, NULL);
    l->conn = rt_calloc((size_t)l->n, sizeof(*l->conn), "lifeline");
    struct card *cards = rt_calloc((size_t)l->n, sizeof(*cards), "lifeline");
    int rc = 0, lfd = -1;
    if (!l->conn || !cards) {
        rc = -ENOMEM;
        goto out;
    }
    for (int r = 0; r < l->n; r++)
        l->conn[r].fd = -1;

    struct card me = {0};
    if (l->rank == 0 && getrandom(&me.token, sizeof(me.token), 0) != (ssize_t)sizeof(me.token))
        me.token = rt_now_ns() ^ ((uint64_t)getpid() << 32);
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t sl = sizeof(sa);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, l->n + 16) < 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl) < 0) {
        rc = rt_errf(-errno, "lifeline: cannot listen on a TCP port: %s", strerror(errno));
        /* Every rank must still take part in the gathers below, or the others wait: publish no address. */
    }
    me.port = sa.sin_port;
    if (rc == 0)
        my_addresses(&me);
    if (MPI_Bcast(&me.token, 1, MPI_UINT64_T, 0, world) != MPI_SUCCESS ||
        MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, cards, (int)sizeof(me), MPI_BYTE, world) != MPI_SUCCESS) {
        rc = rt_errf(-EIO, "lifeline: exchanging addresses over MPI failed");
        goto out;
    }
    for (int r = 0; rc == 0 && r < l->n; r++)
        if (partner[r] && r != l->rank && cards[r].naddr == 0)
            rc = rt_errf(-EHOSTUNREACH, "lifeline: rank %d could not listen on a TCP port", r);
    if (rc == 0)
        rc = connect_all(l, lfd, cards, partner, timeout_s);
out:
    if (lfd >= 0)
        close(lfd);
    free(cards);
    if (rc < 0) {
        rt_comm_lifeline_destroy(l);
        return rc;
    }
    *out = l;
    return 0;
}

void rt_comm_lifeline_destroy(struct rt_comm_lifeline *l)
{
    if (!l)
        return;
    for (int r = 0; l->conn && r < l->n; r++)
        if (l->conn[r].fd >= 0)
            close(l->conn[r].fd);
    pthread_mutex_destroy(&l->tx);
    free(l->conn);
    free(l);
}

/* ---- messages ---------------------------------------------------------------------- */

int rt_comm_lifeline_fd(const struct rt_comm_lifeline *l, int r)
{
    return l ? l->conn[r].fd : -1;
}

void rt_comm_lifeline_send(struct rt_comm_lifeline *l, int r, const struct rt_comm_lifeline_msg *m)
{
    if (!l)
        return;
    unsigned char buf[sizeof(struct head) + LL_TEXT_MAX];
    size_t len = m->kind == LL_ABORT ? strnlen(m->text, LL_TEXT_MAX) : 0;
    struct head h = {.magic = LL_MAGIC, .kind = (uint16_t)m->kind, .len = (uint16_t)len, .rank = m->rank,
                     .phase = m->phase, .step = m->step};
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), m->text, len);
    pthread_mutex_lock(&l->tx);
    struct conn *c = &l->conn[r];
    /* A peer that stopped reading (stopped, or its node unreachable) fills the socket; a message cut in
     * two would garble the stream, so from the first short send on, nothing more goes to it. */
    if (c->fd >= 0 && !c->congested &&
        send(c->fd, buf, sizeof(h) + len, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)(sizeof(h) + len))
        c->congested = 1;
    pthread_mutex_unlock(&l->tx);
}

int rt_comm_lifeline_read(struct rt_comm_lifeline *l, int r,
                          void (*on)(void *ctx, const struct rt_comm_lifeline_msg *m), void *ctx)
{
    struct conn *c = &l->conn[r];
    if (c->fd < 0)
        return 0;
    for (;;) {
        ssize_t k = recv(c->fd, c->buf + c->have, sizeof(c->buf) - c->have, MSG_DONTWAIT);
        if (k == 0)
            return -EPIPE;
        if (k < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : -EPIPE;
        c->have += (size_t)k;
        while (c->have >= sizeof(struct head)) {
            struct head h;
            memcpy(&h, c->buf, sizeof(h));
            if (h.magic != LL_MAGIC || h.len > LL_TEXT_MAX)
                return -EPROTO;
            size_t whole = sizeof(h) + h.len;
            if (c->have < whole)
                break;
            struct rt_comm_lifeline_msg m = {.kind = (enum rt_comm_lifeline_kind)h.kind, .rank = h.rank,
                                             .phase = h.phase, .step = h.step};
            memcpy(m.text, c->buf + sizeof(h), h.len);
            m.text[h.len] = 0;
            memmove(c->buf, c->buf + whole, c->have - whole);
            c->have -= whole;
            on(ctx, &m);
        }
    }
}

void rt_comm_lifeline_close(struct rt_comm_lifeline *l, int r)
{
    pthread_mutex_lock(&l->tx);
    if (l->conn[r].fd >= 0)
        close(l->conn[r].fd);
    l->conn[r].fd = -1;
    pthread_mutex_unlock(&l->tx);
}
