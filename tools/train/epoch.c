/*
 * epoch.c - the end of an epoch: the global figures (sums over the ranks),
 * rank 0's batchnorm statistics on every rank, validation, the target
 * accuracy and its patience, the epoch line and metrics; then, for a full
 * epoch, the next position and the checkpoint.
 */
#include <math.h>
#include <stdio.h>

#include "common/common.h"
#include "common/trace.h"
#include "tools/train/driver.h"

int epoch_done(const struct train *T)
{
    return T->pos.batch >= T->in.batches_per_epoch;
}

/* Validation on the val (else test) split; the running tally of the target accuracy. */
static int validate(struct train *T, char *line, size_t len)
{
    struct train_results *r = &T->res;
    struct rt_loss_stats vs;
    uint64_t v0 = rt_now_ns();
    const int rc = evaluate_split(T->model, T->ds, (enum rt_split)T->val_split, T->cfg.image_size, T->cfg.batch,
                                  T->cfg.workers,
                                  T->cfg.pin, T->comm, T->mean, T->std, &vs);
    if (rc < 0)
        return rc;
    if (rt_trace_live())
        rt_trace_span(RT_TRACE_EVAL, "validation", NULL, v0, rt_now_ns());
    r->have_val = 1;
    r->val_loss = vs.count ? vs.loss_sum / vs.count : NAN;
    r->val_acc = vs.count ? vs.correct / vs.count : NAN;
    if (r->val_acc > r->best_acc)
        r->best_acc = r->val_acc;
    snprintf(line, len, "  val loss %.4f acc %5.2f%% (%.1fs)", r->val_loss, 100 * r->val_acc,
             (double)(rt_now_ns() - v0) * 1e-9);
    const double target = T->cfg.target_accuracy;
    r->streak = target > 0 && r->val_acc >= target ? r->streak + 1 : 0;
    return target > 0 && r->streak >= RT_MAX(T->cfg.patience, 1);
}

int epoch_close(struct train *T, int partial)
{
    /* The last update's loss sums, read now (a host wait at the epoch's end, outside the steady steps). */
    int rc = late_flush(T);
    if (rc < 0)
        return rc;
    const struct train_meter *m = &T->meter;
    /* Global figures: sums over the ranks; times are each rank's own, averaged. */
    double g[7] = {m->ep_loss.loss_sum, m->ep_loss.correct, m->ep_loss.count, (double)m->epoch.images,
                   (double)m->epoch.train_ns, (double)m->epoch.wait_ns, (double)m->epoch.comm_ns};
    rt_comm_allreduce(T->comm, g, 7, RT_COMM_F64, RT_RED_SUM, "epoch metrics");
    /* A non-finite loss in the epoch's last update, read just now: the sum carries it to every rank. */
    if (!isfinite(g[0]))
        return step_nonfinite_error(T);
    /* Each rank's own images over its own time, for the records: one number per rank, once an epoch. */
    if (T->rank_ips) {
        const double mine = m->epoch.train_ns ? (double)m->epoch.images / ((double)m->epoch.train_ns * 1e-9) : 0;
        rt_comm_allgather(T->comm, &mine, T->rank_ips, sizeof(mine), "each rank's images/s");
    }
    const double time_s = g[4] / T->world * 1e-9;
    T->res.train_loss = g[2] ? g[0] / g[2] : NAN;
    T->res.train_acc = g[2] ? g[1] / g[2] : NAN;
    T->res.have_val = 0;
    /* Rank 0's running statistics, as DDP's broadcast_buffers: validation and
     * checkpoints then see one model. */
    rt_comm_set_phase(T->comm, T->pos.update, RT_PHASE_VALIDATE);
    replicas_sync_from_root(T, RT_MODEL_BUFFERS, "batchnorm statistics");
    int hit = 0;
    char val[96] = "";
    if (!partial && T->val_split >= 0 && (hit = validate(T, val, sizeof(val))) < 0)
        return hit;
    report_epoch(T, partial, time_s, time_s > 0 ? g[3] / time_s : 0, g[4] > 0 ? g[5] / g[4] : 0,
                 g[4] > 0 ? g[6] / g[4] : 0, val);
    if (!partial)
        T->res.epochs_done++;
    return hit;
}

int epoch_next(struct train *T)
{
    const int hit = epoch_close(T, 0);
    if (hit < 0)
        return hit;
    train_advance(T, MOVE_EPOCH);
    watch_epoch_begin(T);
    const int rc = checkpoint_save(T);
    return rc < 0 ? rc : hit;
}
