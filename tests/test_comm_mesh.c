/*
 * test_comm_mesh.c - the watchdog's heartbeat graph (rt_comm_hb_partners):
 * all-to-all up to the full-mesh size; above it, for every world size up to
 * 600 and a few large ones, a symmetric relation (each connection has two
 * ends), at most 2 ceil(log2 n) partners per rank (the connections each
 * rank holds stay few), and every rank within ceil(log2 n) hops of every
 * other (a death seen by its partners reaches all ranks by forwarding in that
 * many hops). A ring, or any graph of long paths, fails the last check.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/comm.h"

static int ceil_log2(int n)
{
    int k = 0;
    while ((1L << k) < n)
        k++;
    return k;
}

/* Breadth-first from `src` over the graph rows adj[r * n ..]: the largest distance, or -1 if some rank is
 * unreachable. */
static int eccentricity(const unsigned char *adj, int n, int src, int *dist, int *queue)
{
    for (int i = 0; i < n; i++)
        dist[i] = -1;
    int head = 0, tail = 0, far = 0;
    dist[src] = 0;
    queue[tail++] = src;
    while (head < tail) {
        const int u = queue[head++];
        for (int v = 0; v < n; v++)
            if (adj[(size_t)u * n + v] && dist[v] < 0) {
                dist[v] = dist[u] + 1;
                far = dist[v];
                queue[tail++] = v;
            }
    }
    return tail == n ? far : -1;
}

/* Checks the graph for `n` ranks with the full mesh up to `full`; sources: every rank when `all`, else 16. */
static void check_world(int n, int full, int all)
{
    unsigned char *adj = calloc((size_t)n * n, 1);
    int *row = calloc((size_t)n, sizeof(int)), *dist = calloc((size_t)n, sizeof(int)),
        *queue = calloc((size_t)n, sizeof(int));
    if (!adj || !row || !dist || !queue) {
        CHECKF(0, "out of memory at %d ranks", n);
        goto out;
    }
    const int sparse = n > (full > 0 ? full : RT_COMM_FULL_MESH);
    const int bound = sparse ? 2 * ceil_log2(n) : n - 1;
    int worst_degree = 0, bad_degree = 0;
    for (int r = 0; r < n; r++) {
        const int got = rt_comm_hb_partners(r, n, full, row);
        int count = 0;
        for (int s = 0; s < n; s++) {
            adj[(size_t)r * n + s] = (unsigned char)row[s];
            count += row[s] != 0;
        }
        if (got != count || row[r] || (!sparse && count != n - 1) || count > bound)
            bad_degree++;
        if (count > worst_degree)
            worst_degree = count;
    }
    CHECKF(!bad_degree, "%d ranks (full mesh up to %d): %d ranks with a wrong partner count (most %d, bound %d)", n,
           full, bad_degree, worst_degree, bound);
    int asym = 0;
    for (int r = 0; r < n; r++)
        for (int s = r + 1; s < n; s++)
            asym += adj[(size_t)r * n + s] != adj[(size_t)s * n + r];
    CHECKF(!asym, "%d ranks: %d one-sided partnerships", n, asym);
    const int hops = sparse ? ceil_log2(n) : 1;
    const int step = all ? 1 : n / 16 + 1;
    for (int src = 0; src < n; src += step) {
        const int e = eccentricity(adj, n, src, dist, queue);
        if (!(e >= 0 && e <= hops)) {
            CHECKF(0, "%d ranks (full mesh up to %d): from rank %d the farthest rank is %d hops away (bound %d)", n,
                   full, src, e, hops);
            break;
        }
    }
out:
    free(adj);
    free(row);
    free(dist);
    free(queue);
}

int main(void)
{
    for (int n = 1; n <= 600; n++)
        check_world(n, 0, n <= 200);
    /* The failure tests' lowered full mesh, at the sizes they run. */
    for (int n = 5; n <= 40; n++)
        check_world(n, 4, 1);
    check_world(1024, 0, 0);
    check_world(2048, 0, 0);
    int row[1024];
    printf("heartbeat partners per rank: 64 ranks %d, 65 ranks %d, 128 ranks %d, 1024 ranks %d\n",
           rt_comm_hb_partners(0, 64, 0, row), rt_comm_hb_partners(0, 65, 0, row),
           rt_comm_hb_partners(0, 128, 0, row), rt_comm_hb_partners(0, 1024, 0, row));
    return check_result();
}
