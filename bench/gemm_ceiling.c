/*
 * gemm_ceiling.c - the machine's ceiling for bench/train_vs_pytorch.sh: the
 * GFLOP/s of one large square matrix product in fp32 and in bf16, through
 * oneDNN, on the threads OMP_NUM_THREADS gives it.
 *
 *   cc -O2 bench/gemm_ceiling.c -o gemm_ceiling -ldnnl
 *   OMP_NUM_THREADS=T ./gemm_ceiling [--size N] [--repeats R] [--warmup W]
 *
 * fp32: dnnl_sgemm, C = A B, all N x N row-major.
 * bf16: a dnnl matmul primitive, src and weights bf16, dst fp32, all N x N
 *       plain row-major (format tag ab, as a GEMM would get them: no
 *       pre-packed weights), created once and executed on one stream.
 * Each: W untimed products (default 2), then R timed ones (default 5), each
 * 2 N^3 FLOPs; the median, min and max of the R are printed. N defaults to
 * 3072 (58 GFLOP a product).
 *
 * Output: one human line per precision on stderr, then one JSON line on
 * stdout: {"size", "repeats", "threads", "isa", "fp32_gflops",
 * "fp32_gflops_min", "fp32_gflops_max", "bf16_gflops", ..., "bf16_impl",
 * "bf16_note"}. bf16_gflops is null, with bf16_note saying why, when oneDNN
 * has no native bf16 matmul for this CPU (the implementation it picks names
 * neither bf16 nor amx: its reference code, or an emulation on plain AVX-512
 * such as "gemm:jit": no AVX512_BF16 or AMX) or cannot create one.
 * Exit status 0, 2 for a usage error, 1 when fp32 fails.
 */
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_REPEATS 101

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct stats {
    double med, lo, hi; /* GFLOP/s */
};

static struct stats summarise(double *gf, int n)
{
    qsort(gf, (size_t)n, sizeof(*gf), cmp_double);
    struct stats s = {n % 2 ? gf[n / 2] : 0.5 * (gf[n / 2 - 1] + gf[n / 2]), gf[0], gf[n - 1]};
    return s;
}

/* fp32 -> bf16, round to nearest even (the inputs are finite). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

static int usage(const char *argv0)
{
    fprintf(stderr, "usage: OMP_NUM_THREADS=T %s [--size N] [--repeats R] [--warmup W]\n", argv0);
    return 2;
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* The bf16 matmul: its GFLOP/s in *st, or 0 and why in note. */
static int bf16_matmul(long n, int warmup, int repeats, double flops, struct stats *st, char *impl,
                       size_t impl_len, char *note, size_t note_len)
{
    dnnl_engine_t eng = NULL;
    dnnl_stream_t strm = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
    uint16_t *a = NULL, *b = NULL;
    float *c = NULL;
    int ok = 0;
    dnnl_status_t rc;
    const char *what = "";
    dnnl_dims_t dims = {n, n};
    dnnl_memory_desc_t ad, bd, cd;
    dnnl_matmul_desc_t md;

#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        what = #call;                                                                                                  \
        if ((rc = (call)) != dnnl_success)                                                                             \
            goto fail;                                                                                                 \
    } while (0)
    TRY(dnnl_engine_create(&eng, dnnl_cpu, 0));
    TRY(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
    TRY(dnnl_memory_desc_init_by_tag(&ad, 2, dims, dnnl_bf16, dnnl_ab));
    TRY(dnnl_memory_desc_init_by_tag(&bd, 2, dims, dnnl_bf16, dnnl_ab));
    TRY(dnnl_memory_desc_init_by_tag(&cd, 2, dims, dnnl_f32, dnnl_ab));
    TRY(dnnl_matmul_desc_init(&md, &ad, &bd, NULL, &cd));
    rc = dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL);
    if (rc != dnnl_success) {
        snprintf(note, note_len, "oneDNN has no bf16 matmul for this CPU (status %d)", (int)rc);
        goto out;
    }
    const char *name = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) == dnnl_success && name)
        snprintf(impl, impl_len, "%s", name);
    if (!strstr(impl, "bf16") && !strstr(impl, "amx")) {
        snprintf(note, note_len, "oneDNN's bf16 matmul here is %s, not a native AVX512_BF16 or AMX kernel", impl);
        goto out;
    }
    TRY(dnnl_primitive_create(&prim, pd));
    a = malloc((size_t)n * (size_t)n * sizeof(*a));
    b = malloc((size_t)n * (size_t)n * sizeof(*b));
    c = malloc((size_t)n * (size_t)n * sizeof(*c));
    if (!a || !b || !c) {
        snprintf(note, note_len, "out of memory for three %ldx%ld matrices", n, n);
        goto out;
    }
    srand(2);
    for (long i = 0; i < n * n; i++) {
        a[i] = to_bf16((float)rand() / (float)RAND_MAX - 0.5f);
        b[i] = to_bf16((float)rand() / (float)RAND_MAX - 0.5f);
    }
    TRY(dnnl_memory_create(&ma, &ad, eng, a));
    TRY(dnnl_memory_create(&mb, &bd, eng, b));
    TRY(dnnl_memory_create(&mc, &cd, eng, c));
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    double gf[MAX_REPEATS];
    for (int i = 0; i < warmup + repeats; i++) {
        double t0 = now_s();
        TRY(dnnl_primitive_execute(prim, strm, 3, args));
        TRY(dnnl_stream_wait(strm));
        double t1 = now_s();
        if (i >= warmup)
            gf[i - warmup] = flops / (t1 - t0) / 1e9;
    }
    *st = summarise(gf, repeats);
    ok = 1;
    goto out;
fail:
    snprintf(note, note_len, "%s failed with status %d", what, (int)rc);
out:
#undef TRY
    if (mc)
        dnnl_memory_destroy(mc);
    if (mb)
        dnnl_memory_destroy(mb);
    if (ma)
        dnnl_memory_destroy(ma);
    if (prim)
        dnnl_primitive_destroy(prim);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (strm)
        dnnl_stream_destroy(strm);
    if (eng)
        dnnl_engine_destroy(eng);
    free(a);
    free(b);
    free(c);
    return ok;
}

static void json_num(const char *key, int have, double v)
{
    if (have)
        printf(", \"%s\": %.2f", key, v);
    else
        printf(", \"%s\": null", key);
}

/* s with " and \ dropped: the notes and names here hold neither normally. */
static void json_str(const char *key, const char *s)
{
    printf(", \"%s\": \"", key);
    for (; *s; s++)
        if (*s != '"' && *s != '\\' && (unsigned char)*s >= 0x20)
            putchar(*s);
    putchar('"');
}

int main(int argc, char **argv)
{
    long n = 3072, repeats = 5, warmup = 2;
    for (int i = 1; i < argc; i++) {
        long *dst = !strcmp(argv[i], "--size") ? &n : !strcmp(argv[i], "--repeats") ? &repeats
                                                      : !strcmp(argv[i], "--warmup")  ? &warmup
                                                                                      : NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return usage(argv[0]) - 2;
        long hi = dst == &n ? 16384 : dst == &repeats ? MAX_REPEATS : 100;
        long lo = dst == &warmup ? 0 : 1;
        if (!dst || i + 1 >= argc || parse_int(argv[i + 1], lo, hi, dst) < 0) {
            fprintf(stderr, "gemm_ceiling: bad option or value at '%s'\n", argv[i]);
            return usage(argv[0]);
        }
        i++;
    }
    const char *threads = getenv("OMP_NUM_THREADS");
    const double flops = 2.0 * (double)n * (double)n * (double)n;
    const dnnl_version_t *v = dnnl_version();
    const char *isa = isa_name(dnnl_get_effective_cpu_isa());

    /* fp32: dnnl_sgemm */
    float *a = malloc((size_t)n * (size_t)n * sizeof(*a));
    float *b = malloc((size_t)n * (size_t)n * sizeof(*b));
    float *c = malloc((size_t)n * (size_t)n * sizeof(*c));
    if (!a || !b || !c) {
        fprintf(stderr, "gemm_ceiling: out of memory for three %ldx%ld matrices\n", n, n);
        return 1;
    }
    srand(1);
    for (long i = 0; i < n * n; i++) {
        a[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        b[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    }
    double gf[MAX_REPEATS];
    for (long i = 0; i < warmup + repeats; i++) {
        double t0 = now_s();
        dnnl_status_t rc = dnnl_sgemm('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double t1 = now_s();
        if (rc != dnnl_success) {
            fprintf(stderr, "gemm_ceiling: dnnl_sgemm failed with status %d\n", (int)rc);
            return 1;
        }
        if (i >= warmup)
            gf[i - warmup] = flops / (t1 - t0) / 1e9;
    }
    struct stats f32 = summarise(gf, (int)repeats);
    free(a);
    free(b);
    free(c);
    fprintf(stderr, "fp32 dnnl_sgemm %ldx%ldx%ld: %.1f GFLOP/s (median of %ld, %.1f - %.1f), %s threads, oneDNN %d.%d.%d, %s\n",
            n, n, n, f32.med, repeats, f32.lo, f32.hi, threads ? threads : "(OMP_NUM_THREADS unset)", v->major,
            v->minor, v->patch, isa);

    /* bf16: a matmul primitive */
    struct stats b16 = {0, 0, 0};
    char impl[128] = "", note[256] = "";
    int have16 = bf16_matmul(n, (int)warmup, (int)repeats, flops, &b16, impl, sizeof(impl), note, sizeof(note));
    if (have16)
        fprintf(stderr, "bf16 matmul %ldx%ldx%ld (bf16 in, fp32 out): %.1f GFLOP/s (median of %ld, %.1f - %.1f), %s\n",
                n, n, n, b16.med, repeats, b16.lo, b16.hi, impl);
    else
        fprintf(stderr, "bf16 matmul: n/a: %s\n", note);

    printf("{\"size\": %ld, \"repeats\": %ld, \"warmup\": %ld", n, repeats, warmup);
    if (threads && *threads >= '0' && *threads <= '9')
        printf(", \"threads\": %d", atoi(threads));
    else
        printf(", \"threads\": null");
    printf(", \"onednn\": \"%d.%d.%d\"", v->major, v->minor, v->patch);
    json_str("isa", isa);
    json_num("fp32_gflops", 1, f32.med);
    json_num("fp32_gflops_min", 1, f32.lo);
    json_num("fp32_gflops_max", 1, f32.hi);
    json_num("bf16_gflops", have16, b16.med);
    json_num("bf16_gflops_min", have16, b16.lo);
    json_num("bf16_gflops_max", have16, b16.hi);
    json_str("bf16_impl", impl);
    json_str("bf16_note", note);
    printf("}\n");
    return 0;
}
