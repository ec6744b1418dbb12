/*
 * scaler.c - dynamic loss scaling (compute.h): the GradScaler rules of
 * PyTorch's torch.cuda.amp, as a pure state machine the trainer drives.
 */
#include "compute/compute.h"

void rt_scaler_init(struct rt_scaler *s)
{
    *s = (struct rt_scaler){
        .scale = 65536.0f,
        .growth = 2.0f,
        .backoff = 0.5f,
        .growth_interval = 2000,
        .max_skips = 20,
        .min_scale = 1.0f / 16384.0f,
    };
}

enum rt_scaler_verdict rt_scaler_update(struct rt_scaler *s, int found_nonfinite)
{
    if (!found_nonfinite) {
        s->skips_in_row = 0;
        if (++s->good >= s->growth_interval) {
            /* PyTorch grows only while the result stays finite */
            const float g = s->scale * s->growth;
            if (g <= 3.0e38f)
                s->scale = g;
            s->good = 0;
        }
        return RT_SCALER_APPLY;
    }
    s->good = 0;
    s->skipped++;
    s->skips_in_row++;
    s->scale *= s->backoff;
    if (s->max_skips && s->skips_in_row >= s->max_skips)
        return RT_SCALER_STOP_SKIPS;
    if (s->scale < s->min_scale)
        return RT_SCALER_STOP_COLLAPSED;
    return RT_SCALER_SKIP;
}
