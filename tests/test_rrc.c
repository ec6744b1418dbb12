/*
 * test_rrc.c - the crop boxes of loader/rrc.h.
 *  - RandomResizedCrop: per case of tests/fixtures/rrc/torchvision_rrc.json
 *    (tools/dev/gen_rrc_fixture.py: torchvision 0.14's get_params drawn n times)
 *    rt_rrc_box draws the same count over ids 0..n-1 and every stored
 *    quantile of area fraction, log aspect, top/H, left/W must sit where our
 *    sample puts it, and the fallback rates must agree (tolerances below);
 *  - exact rules on every draw: inside the image, integer coordinates, a
 *    non-fallback box reachable by torchvision's acceptance rule, a fallback
 *    box equal to the formula; determinism in (seed, epoch, id); flip ~ 1/2;
 *  - rt_center_box against torchvision's Resize + CenterCrop arithmetic
 *    worked by hand.
 * Seed 27 (printed). Exits 77 when RT_FIXTURES is unset.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/common.h"
#include "loader/rrc.h"

#define SEED 27u

/*
 * Tolerance for one quantile. x_q is torchvision's sample quantile (n_t
 * draws), F our sample's CDF (n_c draws). F(x_q) - q is a difference of two
 * independent empirical CDF errors, sd = sqrt(q(1-q)(1/n_t + 1/n_c)); we
 * allow 5 sd (about 0.025 at the median for 20000 + 20000 draws) plus 1/n
 * for the quantile's own discreteness. Atoms (integer w, h make many values
 * repeat) are handled by accepting any q between F(x_q-) and F(x_q).
 */
static double quantile_tol(double q, double nt, double nc)
{
    return 5.0 * sqrt(q * (1 - q) * (1 / nt + 1 / nc)) + 1.0 / nc;
}

/* Two-sample binomial: 5 sd of the pooled rate, plus one draw. */
static double rate_tol(double pt, double pc, double nt, double nc)
{
    const double p = (pt * nt + pc * nc) / (nt + nc);
    return 5.0 * sqrt(p * (1 - p) * (1 / nt + 1 / nc)) + 1.0 / nc;
}

enum { STAT_AREA, STAT_LOG_ASPECT, STAT_TOP, STAT_LEFT, STAT_COUNT };
static const char *const stat_names[STAT_COUNT] = {"area", "log_aspect", "top", "left"};

static int is_int(double v)
{
    return v == floor(v);
}

/* torchvision's fallback, written out again independently of rrc.c. */
static struct rt_box fallback_box(double W, double H, double rlo, double rhi)
{
    double w = W, h = H;
    if (W / H < rlo)
        h = nearbyint(W / rlo);
    else if (W / H > rhi)
        w = nearbyint(H * rhi);
    return (struct rt_box){floor((W - w) / 2), floor((H - h) / 2), w, h};
}

static double frac_lt(const double *v, int n, double x, int inclusive)
{
    /* Relative slack: numpy's log and glibc's may differ in the last bit at an atom. */
    const double eps = 1e-9 * fmax(1.0, fabs(x));
    int c = 0;
    for (int i = 0; i < n; i++)
        c += inclusive ? v[i] <= x + eps : v[i] < x - eps;
    return (double)c / n;
}

static void check_case(json_t *cs, const double *qs, size_t nq)
{
    const uint32_t W = (uint32_t)json_integer_value(json_object_get(cs, "width"));
    const uint32_t H = (uint32_t)json_integer_value(json_object_get(cs, "height"));
    const int n = (int)json_integer_value(json_object_get(cs, "n"));
    json_t *scale = json_object_get(cs, "scale"), *ratio = json_object_get(cs, "ratio");
    struct rt_rrc_opts o = {
        .scale_lo = json_number_value(json_array_get(scale, 0)),
        .scale_hi = json_number_value(json_array_get(scale, 1)),
        .ratio_lo = json_number_value(json_array_get(ratio, 0)),
        .ratio_hi = json_number_value(json_array_get(ratio, 1)),
    };
    CHECK(W > 0 && H > 0 && n > 100);
    if (!(W > 0 && H > 0 && n > 100))
        return;
    double *st[STAT_COUNT];
    for (int s = 0; s < STAT_COUNT; s++)
        st[s] = malloc(sizeof(double) * (size_t)n);
    int fallbacks = 0, flips = 0, bad_inside = 0, bad_int = 0, bad_rule = 0, bad_fallback = 0;
    int at_top = 0, at_bottom = 0, at_left = 0, at_right = 0; /* randint's inclusive ends are reached */
    const double A = (double)W * H;
    const struct rt_box fb_expect = fallback_box(W, H, o.ratio_lo, o.ratio_hi);
    for (int i = 0; i < n; i++) {
        struct rt_box b;
        int flip, fb;
        rt_rrc_box(&o, SEED, 0, (uint64_t)i, W, H, &b, &flip, &fb);
        fallbacks += fb;
        flips += flip;
        bad_inside += !(b.x >= 0 && b.y >= 0 && b.w > 0 && b.h > 0 && b.x + b.w <= W && b.y + b.h <= H);
        bad_int += !(is_int(b.x) && is_int(b.y) && is_int(b.w) && is_int(b.h));
        if (fb) {
            bad_fallback += memcmp(&b, &fb_expect, sizeof b) != 0;
        } else {
            /*
             * Some (target_area, aspect) in range rounds to (w, h):
             * sqrt(T a) in [w - 1/2, w + 1/2] and sqrt(T / a) in [h - 1/2, h + 1/2].
             */
            const double tlo = (b.w - 0.5) * (b.h - 0.5), thi = (b.w + 0.5) * (b.h + 0.5);
            const double alo = (b.w - 0.5) / (b.h + 0.5), ahi = (b.w + 0.5) / (b.h - 0.5);
            bad_rule += !(tlo <= o.scale_hi * A && thi >= o.scale_lo * A && alo <= o.ratio_hi && ahi >= o.ratio_lo);
            if (b.h < H && b.w < W) {
                at_top += b.y == 0;
                at_bottom += b.y + b.h == H;
                at_left += b.x == 0;
                at_right += b.x + b.w == W;
            }
        }
        st[STAT_AREA][i] = b.w * b.h / A;
        st[STAT_LOG_ASPECT][i] = log(b.w / b.h);
        st[STAT_TOP][i] = b.y / H;
        st[STAT_LEFT][i] = b.x / W;
    }
    CHECKF(bad_inside == 0 && bad_int == 0 && bad_rule == 0 && bad_fallback == 0,
           "%ux%u: %d outside, %d non-integer, %d break the acceptance rule, %d wrong fallbacks", W, H, bad_inside,
           bad_int, bad_rule, bad_fallback);

    if (fallbacks < n)
        CHECKF(at_top > 0 && at_bottom > 0 && at_left > 0 && at_right > 0,
               "%ux%u: placements at the edges top %d bottom %d left %d right %d", W, H, at_top, at_bottom, at_left,
               at_right);

    const double nt = (double)json_integer_value(json_object_get(cs, "n"));
    json_t *quant = json_object_get(cs, "quantiles");
    double worst = 0;
    for (int s = 0; s < STAT_COUNT; s++) {
        json_t *arr = json_object_get(quant, stat_names[s]);
        CHECK(json_array_size(arr) == nq);
        for (size_t k = 0; k < nq && k < json_array_size(arr); k++) {
            const double q = qs[k], x = json_number_value(json_array_get(arr, k));
            const double lo = frac_lt(st[s], n, x, 0), hi = frac_lt(st[s], n, x, 1);
            const double tol = quantile_tol(q, nt, n);
            const double dev = q < lo ? lo - q : q > hi ? q - hi : 0;
            worst = fmax(worst, dev / tol);
            CHECKF(dev <= tol, "%ux%u %s q%.2f: torchvision %.5f, ours F(<)=%.4f F(<=)=%.4f, tolerance %.4f", W, H,
                   stat_names[s], q, x, lo, hi, tol);
        }
    }
    const double pt = json_number_value(json_object_get(cs, "fallback_rate")), pc = (double)fallbacks / n;
    CHECKF(fabs(pt - pc) <= rate_tol(pt, pc, nt, n), "%ux%u: fallback rate %.4f, torchvision %.4f", W, H, pc, pt);
    const double pf = (double)flips / n;
    CHECKF(fabs(pf - 0.5) <= 5 * sqrt(0.25 / n), "%ux%u: flip rate %.4f", W, H, pf);
    printf("  %4ux%-4u scale (%.2f, %.2f): fallback %.4f (torchvision %.4f), flip %.4f, worst quantile deviation "
           "%.2f of its tolerance\n",
           W, H, o.scale_lo, o.scale_hi, pc, pt, pf, worst);
    for (int s = 0; s < STAT_COUNT; s++)
        free(st[s]);
}

static void check_determinism(void)
{
    struct rt_rrc_opts o;
    rt_rrc_defaults(&o);
    int same_epoch_diff = 0, other_epoch_same = 0, other_seed_same = 0;
    for (uint64_t id = 0; id < 1000; id++) {
        struct rt_box a, b, c, e;
        int fa, fb, fc, fe, xa, xb, xc, xe;
        rt_rrc_box(&o, SEED, 3, id, 500, 375, &a, &fa, &xa);
        rt_rrc_box(&o, SEED, 3, id, 500, 375, &b, &fb, &xb);
        rt_rrc_box(&o, SEED, 4, id, 500, 375, &c, &fc, &xc);
        rt_rrc_box(&o, SEED + 1, 3, id, 500, 375, &e, &fe, &xe);
        same_epoch_diff += memcmp(&a, &b, sizeof a) != 0 || fa != fb || xa != xb;
        other_epoch_same += memcmp(&a, &c, sizeof a) == 0;
        other_seed_same += memcmp(&a, &e, sizeof a) == 0;
    }
    CHECKF(same_epoch_diff == 0, "%d of 1000 boxes differ for the same (seed, epoch, id)", same_epoch_diff);
    /* Two independent boxes on 500x375 coincide with probability ~1e-6. */
    CHECKF(other_epoch_same <= 1, "%d of 1000 boxes equal in epochs 3 and 4", other_epoch_same);
    CHECKF(other_seed_same <= 1, "%d of 1000 boxes equal for seeds %u and %u", other_seed_same, SEED, SEED + 1);
}

static void check_center_box(void)
{
    /*
     * By hand, torchvision's arithmetic: R = round(min(out)/crop_ratio);
     * short side -> R, long -> int(R * long / short); crop offsets
     * int(round((size - out) / 2.0)) (ties to even), or -(out - size) // 2
     * where CenterCrop pads; then scaled back by W/new_w, H/new_h.
     */
    static const struct {
        uint32_t w, h, ow, oh;
        double ratio;
        struct rt_box want;
    } cases[] = {
        /* R = 256, new 341x256, left round(58.5) = 58, top 16 */
        {500, 375, 224, 224, 0.875, {58 * 500.0 / 341, 16 * 375.0 / 256, 224 * 500.0 / 341, 224 * 375.0 / 256}},
        /* portrait: new 256x341 */
        {375, 500, 224, 224, 0.875, {16 * 375.0 / 256, 58 * 500.0 / 341, 224 * 375.0 / 256, 224 * 500.0 / 341}},
        {64, 64, 64, 64, 1.0, {0, 0, 64, 64}},
        /* R = round(146.29) = 146, new 230x146 (int(230.42)), left 35, top 9 */
        {333, 211, 160, 128, 0.875, {35 * 333.0 / 230, 9 * 211.0 / 146, 160 * 333.0 / 230, 128 * 211.0 / 146}},
        /* R = 224, new 229x224, left round(2.5) = 2 (ties to even) */
        {229, 224, 224, 224, 1.0, {2, 0, 224, 224}},
        /* R = 128, new 128x128; width padded by 16 each side: left -16 */
        {100, 100, 160, 128, 1.0, {-16 * 100.0 / 128, 0, 160 * 100.0 / 128, 100}},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(cases); i++) {
        struct rt_box b;
        rt_center_box(cases[i].w, cases[i].h, cases[i].ow, cases[i].oh, cases[i].ratio, &b);
        const struct rt_box *e = &cases[i].want;
        CHECKF(fabs(b.x - e->x) < 1e-9 && fabs(b.y - e->y) < 1e-9 && fabs(b.w - e->w) < 1e-9 &&
                   fabs(b.h - e->h) < 1e-9,
               "center box %ux%u -> %ux%u / %.3f: (%.6f, %.6f, %.6f x %.6f), expected (%.6f, %.6f, %.6f x %.6f)",
               cases[i].w, cases[i].h, cases[i].ow, cases[i].oh, cases[i].ratio, b.x, b.y, b.w, b.h, e->x, e->y, e->w,
               e->h);
    }
}

int main(void)
{
    printf("test_rrc: seed %u\n", SEED);
    check_determinism();
    check_center_box();

    const char *dir = getenv("RT_FIXTURES");
    if (!dir) {
        fprintf(stderr, "RT_FIXTURES unset: skipping the torchvision comparison\n");
        return check_failures ? 1 : 77;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/rrc/torchvision_rrc.json", dir);
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    CHECKF(doc != NULL, "%s: %s", path, jerr.text);
    if (!doc)
        return check_result();
    json_t *jq = json_object_get(doc, "quantiles"), *cases = json_object_get(doc, "cases");
    double qs[16];
    const size_t nq = RT_MIN(json_array_size(jq), RT_ARRAY_LEN(qs));
    for (size_t i = 0; i < nq; i++)
        qs[i] = json_number_value(json_array_get(jq, i));
    CHECK(nq == 5 && json_array_size(cases) >= 5);
    printf("fixture %s (torchvision %s)\n", path, json_string_value(json_object_get(doc, "torchvision")));
    for (size_t i = 0; i < json_array_size(cases); i++)
        check_case(json_array_get(cases, i), qs, nq);
    json_decref(doc);
    return check_result();
}
