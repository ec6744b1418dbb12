/*
 * meter.c - the driver's counters in one place: each micro-batch's time
 * (waiting for data, then forward and backward), each update's tail (the
 * reduction and the optimizer step), images and loss sums, summed for the
 * epoch and for the run. Nothing here touches a device or another rank.
 */
#include <string.h>

#include "common/common.h"
#include "tools/train/driver.h"

/* Micro-batches run before the "steady" figures start: caches, pools and pages warm. */
enum { METER_WARMUP = 3 };

static void span_add(struct train_span *s, uint64_t images, uint64_t train_ns, uint64_t wait_ns, uint64_t comm_ns)
{
    s->images += images;
    s->train_ns += train_ns;
    s->wait_ns += wait_ns;
    s->comm_ns += comm_ns;
}

static void add(struct train_meter *m, uint64_t images, uint64_t train_ns, uint64_t wait_ns, uint64_t comm_ns)
{
    span_add(&m->epoch, images, train_ns, wait_ns, comm_ns);
    span_add(&m->run, images, train_ns, wait_ns, comm_ns);
    if (m->run_micro > METER_WARMUP) {
        m->steady_images += images;
        m->steady_ns += train_ns;
    }
}

void meter_micro(struct train_meter *m, const struct train_batch *b)
{
    const uint64_t now = rt_now_ns();
    m->run_micro++;
    add(m, b->valid, now - b->t_start, b->t_ready - b->t_start, 0);
    m->t_last = now;
}

/* The sums arrive a step after their micro-batch (late.c), in the micro-batches' order. */
void meter_loss(struct train_meter *m, const struct rt_loss_stats *loss)
{
    m->ep_loss.loss_sum += loss->loss_sum;
    m->ep_loss.correct += loss->correct;
    m->ep_loss.count += loss->count;
}

/* Exposed communication seen on the compute stream rather than by the host (profile.c, a step late). */
void meter_comm(struct train_meter *m, uint64_t ns)
{
    m->epoch.comm_ns += ns;
    m->run.comm_ns += ns;
}

void meter_update(struct train_meter *m, uint64_t comm_ns)
{
    const uint64_t now = rt_now_ns();
    add(m, 0, now - m->t_last, 0, comm_ns);
    m->t_last = now;
}

void meter_epoch_reset(struct train_meter *m)
{
    memset(&m->ep_loss, 0, sizeof(m->ep_loss));
    memset(&m->epoch, 0, sizeof(m->epoch));
    m->epoch_t0 = rt_now_ns();
}
