/* Batch inference with a Llama-style transformer: prompts file in, completions file out.
 *
 * usage: generate [--model PATH] [--tokenizer PATH] [--prompts PATH] [--out PATH] [--max-tokens N]
 *
 * Defaults: /input/model.bin, /input/tokenizer.bin, /input/prompts.jsonl, /output/completions.jsonl,
 * 256 tokens for a prompt line without "max_tokens". The job's format (checkpoint, tokenizer, prompt and
 * result lines, exit status) is described in docs/inference.md, "The job".
 *
 * The model is llama2.c's: checkpoint header of seven int32 (dim, hidden_dim, n_layers, n_heads,
 * n_kv_heads, vocab_size, seq_len; negative vocab_size = separate classifier), float32 weights in its
 * order, RMSNorm, rotary embeddings, grouped-query attention, SwiGLU. Tokenizer encoding and decoding
 * follow llama2.c's encode and decode. No clock, no random source: greedy decoding picks the lowest token
 * id on a tie, sampling draws from a xoshiro256** generator seeded from the prompt line's "seed".
 *
 * The dot products are written with explicit 4-lane vectors: wasm SIMD (-msimd128) in the shipped
 * module; SSE, or plain C (with -DGENERATE_PLAIN, or when neither is available), in a native build of the
 * same source. Every path adds in the same order (lane j sums elements j, j+4, j+8, ...; then
 * (lane0 + lane1) + (lane2 + lane3); then the tail in order), and the exponentials, sines and cosines
 * are our own (libm's differ between wasi-libc and glibc in the last bit), so a native build with
 * -ffp-contract=off gives the same completions as the module, sampled ones included.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------------------------------------
 * Four-lane float vectors
 */
#if defined(__wasm_simd128__) && !defined(GENERATE_PLAIN)
#include <wasm_simd128.h>
typedef v128_t f4;
#define F4_ZERO() wasm_f32x4_splat(0.0f)
#define F4_LOAD(p) wasm_v128_load(p)
#define F4_ADD(a, b) wasm_f32x4_add((a), (b))
#define F4_MUL(a, b) wasm_f32x4_mul((a), (b))
#define F4_SPLAT(v) wasm_f32x4_splat(v)
#define F4_STORE(p, v) wasm_v128_store((p), (v))
#define F4_DIV(a, b) wasm_f32x4_div((a), (b))
#define F4_SUB(a, b) wasm_f32x4_sub((a), (b))
/* 2^n for whole floats n in [-126, 127] */
#define F4_POW2(n) wasm_i32x4_shl(wasm_i32x4_add(wasm_i32x4_trunc_sat_f32x4(n), wasm_i32x4_splat(127)), 23)
/* a where x >= lo, else 0 */
#define F4_KEEP_GE(a, x, lo) wasm_v128_and((a), wasm_f32x4_ge((x), (lo)))
/* b where b > a, else a (lane by lane: a NaN in b never wins) */
#define F4_MAX(a, b) wasm_v128_bitselect((b), (a), wasm_f32x4_gt((b), (a)))
static inline float f4_sum(f4 v) {
    return (wasm_f32x4_extract_lane(v, 0) + wasm_f32x4_extract_lane(v, 1)) +
           (wasm_f32x4_extract_lane(v, 2) + wasm_f32x4_extract_lane(v, 3));
}
/* {f4_sum(a), f4_sum(b), f4_sum(c), f4_sum(d)}, the same additions done four at a time after a transpose. */
static inline f4 f4_sum4(f4 a, f4 b, f4 c, f4 d) {
    f4 ab_lo = wasm_i32x4_shuffle(a, b, 0, 4, 1, 5), ab_hi = wasm_i32x4_shuffle(a, b, 2, 6, 3, 7);
    f4 cd_lo = wasm_i32x4_shuffle(c, d, 0, 4, 1, 5), cd_hi = wasm_i32x4_shuffle(c, d, 2, 6, 3, 7);
    f4 l0 = wasm_i32x4_shuffle(ab_lo, cd_lo, 0, 1, 4, 5), l1 = wasm_i32x4_shuffle(ab_lo, cd_lo, 2, 3, 6, 7);
    f4 l2 = wasm_i32x4_shuffle(ab_hi, cd_hi, 0, 1, 4, 5), l3 = wasm_i32x4_shuffle(ab_hi, cd_hi, 2, 3, 6, 7);
    return wasm_f32x4_add(wasm_f32x4_add(l0, l1), wasm_f32x4_add(l2, l3));
}
#elif defined(__SSE__) && !defined(GENERATE_PLAIN)
#include <emmintrin.h>
typedef __m128 f4;
#define F4_ZERO() _mm_setzero_ps()
#define F4_LOAD(p) _mm_loadu_ps(p)
#define F4_ADD(a, b) _mm_add_ps((a), (b))
#define F4_MUL(a, b) _mm_mul_ps((a), (b))
#define F4_SPLAT(v) _mm_set1_ps(v)
#define F4_STORE(p, v) _mm_storeu_ps((p), (v))
#define F4_DIV(a, b) _mm_div_ps((a), (b))
#define F4_SUB(a, b) _mm_sub_ps((a), (b))
#define F4_POW2(n) _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(n), _mm_set1_epi32(127)), 23))
#define F4_KEEP_GE(a, x, lo) _mm_and_ps((a), _mm_cmpge_ps((x), (lo)))
static inline f4 F4_MAX(f4 a, f4 b) {
    f4 gt = _mm_cmpgt_ps(b, a);
    return _mm_or_ps(_mm_and_ps(gt, b), _mm_andnot_ps(gt, a));
}
static inline float f4_sum(f4 v) {
    float l[4];
    _mm_storeu_ps(l, v);
    return (l[0] + l[1]) + (l[2] + l[3]);
}
static inline f4 f4_sum4(f4 a, f4 b, f4 c, f4 d) {
    f4 ab_lo = _mm_unpacklo_ps(a, b), ab_hi = _mm_unpackhi_ps(a, b);
    f4 cd_lo = _mm_unpacklo_ps(c, d), cd_hi = _mm_unpackhi_ps(c, d);
    f4 l0 = _mm_movelh_ps(ab_lo, cd_lo), l1 = _mm_movehl_ps(cd_lo, ab_lo);
    f4 l2 = _mm_movelh_ps(ab_hi, cd_hi), l3 = _mm_movehl_ps(cd_hi, ab_hi);
    return _mm_add_ps(_mm_add_ps(l0, l1), _mm_add_ps(l2, l3));
}
#else
typedef struct {
    float v[4];
} f4;
static inline f4 F4_ZERO(void) {
    f4 r = {{0.0f, 0.0f, 0.0f, 0.0f}};
    return r;
}
static inline f4 F4_LOAD(const float *p) {
    f4 r = {{p[0], p[1], p[2], p[3]}};
    return r;
}
static inline f4 F4_ADD(f4 a, f4 b) {
    f4 r = {{a.v[0] + b.v[0], a.v[1] + b.v[1], a.v[2] + b.v[2], a.v[3] + b.v[3]}};
    return r;
}
static inline f4 F4_MUL(f4 a, f4 b) {
    f4 r = {{a.v[0] * b.v[0], a.v[1] * b.v[1], a.v[2] * b.v[2], a.v[3] * b.v[3]}};
    return r;
}
static inline f4 F4_SPLAT(float x) {
    f4 r = {{x, x, x, x}};
    return r;
}
static inline void F4_STORE(float *p, f4 a) { memcpy(p, a.v, sizeof a.v); }
static inline f4 F4_SUB(f4 a, f4 b) {
    f4 r = {{a.v[0] - b.v[0], a.v[1] - b.v[1], a.v[2] - b.v[2], a.v[3] - b.v[3]}};
    return r;
}
static inline f4 F4_POW2(f4 n) {
    f4 r;
    for (int k = 0; k < 4; k++) {
        uint32_t bits = (uint32_t)((int32_t)n.v[k] + 127) << 23;
        memcpy(&r.v[k], &bits, 4);
    }
    return r;
}
static inline f4 F4_KEEP_GE(f4 a, f4 x, f4 lo) {
    f4 r;
    for (int k = 0; k < 4; k++) r.v[k] = x.v[k] >= lo.v[k] ? a.v[k] : 0.0f;
    return r;
}
static inline f4 F4_MAX(f4 a, f4 b) {
    f4 r;
    for (int k = 0; k < 4; k++) r.v[k] = b.v[k] > a.v[k] ? b.v[k] : a.v[k];
    return r;
}
static inline f4 F4_DIV(f4 a, f4 b) {
    f4 r = {{a.v[0] / b.v[0], a.v[1] / b.v[1], a.v[2] / b.v[2], a.v[3] / b.v[3]}};
    return r;
}
static inline float f4_sum(f4 v) { return (v.v[0] + v.v[1]) + (v.v[2] + v.v[3]); }
static inline f4 f4_sum4(f4 a, f4 b, f4 c, f4 d) {
    f4 r = {{f4_sum(a), f4_sum(b), f4_sum(c), f4_sum(d)}};
    return r;
}
#endif

static float dot(const float *a, const float *b, int n) {
    int n4 = n & ~3;
    f4 acc = F4_ZERO();
    for (int j = 0; j < n4; j += 4) acc = F4_ADD(acc, F4_MUL(F4_LOAD(a + j), F4_LOAD(b + j)));
    float s = f4_sum(acc);
    for (int j = n4; j < n; j++) s += a[j] * b[j];
    return s;
}

/* xout[i] = dot(w row i, x) for d rows of n. Four rows at a time share each load of x, sixteen columns per
 * step with each row's products added into its accumulator in column order (so every lane sums the same
 * terms in the same order as dot()); written as one expression per row so that the wasm build keeps the
 * partial sums on the operand stack (fewer instructions, less fuel). */
static void matmul(float *xout, const float *x, const float *w, int n, int d) {
    int n16 = n & ~15, n4 = n & ~3;
    int i = 0;
    for (; i + 4 <= d; i += 4) {
        const float *w0 = w + (size_t)i * n, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
        f4 a0 = F4_ZERO(), a1 = F4_ZERO(), a2 = F4_ZERO(), a3 = F4_ZERO();
        int j = 0;
        for (; j < n16; j += 16) {
            f4 x0 = F4_LOAD(x + j), x1 = F4_LOAD(x + j + 4), x2 = F4_LOAD(x + j + 8), x3 = F4_LOAD(x + j + 12);
#define ROW16(a, wr)                                                                                    \
    a = F4_ADD(F4_ADD(F4_ADD(F4_ADD(a, F4_MUL(F4_LOAD(wr + j), x0)), F4_MUL(F4_LOAD(wr + j + 4), x1)), \
                      F4_MUL(F4_LOAD(wr + j + 8), x2)),                                               \
               F4_MUL(F4_LOAD(wr + j + 12), x3))
            ROW16(a0, w0);
            ROW16(a1, w1);
            ROW16(a2, w2);
            ROW16(a3, w3);
#undef ROW16
        }
        for (; j < n4; j += 4) {
            f4 xv = F4_LOAD(x + j);
            a0 = F4_ADD(a0, F4_MUL(F4_LOAD(w0 + j), xv));
            a1 = F4_ADD(a1, F4_MUL(F4_LOAD(w1 + j), xv));
            a2 = F4_ADD(a2, F4_MUL(F4_LOAD(w2 + j), xv));
            a3 = F4_ADD(a3, F4_MUL(F4_LOAD(w3 + j), xv));
        }
        f4 sums = f4_sum4(a0, a1, a2, a3);
        if (j == n) {
            F4_STORE(xout + i, sums);
            continue;
        }
        float s[4];
        F4_STORE(s, sums);
        for (; j < n; j++) {
            s[0] += w0[j] * x[j];
            s[1] += w1[j] * x[j];
            s[2] += w2[j] * x[j];
            s[3] += w3[j] * x[j];
        }
        memcpy(xout + i, s, sizeof s);
    }
    for (; i < d; i++) xout[i] = dot(w + (size_t)i * n, x, n);
}

/* ---------------------------------------------------------------------------------------------
 * Errors and memory
 */
__attribute__((noreturn)) static void die(const char *what, const char *msg) {
    fprintf(stderr, "generate: %s: %s\n", what, msg);
    exit(1);
}

static void *xalloc(size_t n, const char *what) {
    void *p = malloc(n ? n : 1);
    if (!p) die(what, "out of memory");
    return p;
}

static void *xcalloc(uint64_t count, uint64_t size, const char *what) {
    if (size && count > (uint64_t)SIZE_MAX / size) die(what, "needs more memory than the module can address");
    void *p = calloc(count ? (size_t)count : 1, size ? (size_t)size : 1);
    if (!p) die(what, "out of memory");
    return p;
}

/* Growable byte buffer. */
typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static void buf_reserve(buf_t *b, size_t extra) {
    if (extra > SIZE_MAX - b->len - 1) die("output", "out of memory");
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            cap = b->len + extra + 1;
            break;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) die("output", "out of memory");
    b->p = p;
    b->cap = cap;
}

static void buf_put(buf_t *b, const void *s, size_t n) {
    buf_reserve(b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void buf_puts(buf_t *b, const char *s) { buf_put(b, s, strlen(s)); }

/* Reads a whole file; returns NULL (errno set, or EFBIG / ENOMEM) on failure. */
static char *read_file(const char *path, size_t *size_out, const char **err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *err = strerror(errno);
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        *err = strerror(errno);
        fclose(f);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        *err = "not a regular file";
        fclose(f);
        return NULL;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size >= (uint64_t)SIZE_MAX) {
        *err = "file too large for the module's memory";
        fclose(f);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    char *data = malloc(size + 1);
    if (!data) {
        *err = "out of memory reading the file";
        fclose(f);
        return NULL;
    }
    size_t got = 0;
    while (got < size) {
        size_t n = fread(data + got, 1, size - got, f);
        if (n == 0) break;
        got += n;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad || got != size) {
        free(data);
        *err = bad ? "read error" : "file shorter than its size";
        return NULL;
    }
    data[size] = 0;
    *size_out = size;
    return data;
}

/* ---------------------------------------------------------------------------------------------
 * The model
 */
typedef struct {
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
    int head_size, kv_dim, shared;
} config_t;

typedef struct {
    const float *token_embedding; /* vocab x dim */
    const float *rms_att;         /* layer x dim */
    const float *wq, *wk, *wv;    /* layer x (dim or kv_dim) x dim */
    const float *wo;              /* layer x dim x dim */
    const float *rms_ffn;         /* layer x dim */
    const float *w1, *w2, *w3;    /* layer x hidden x dim, layer x dim x hidden, layer x hidden x dim */
    const float *rms_final;       /* dim */
    const float *wcls;            /* vocab x dim */
} weights_t;

typedef struct {
    float *x, *xb, *xb2, *hb, *hb2, *q, *att, *logits, *key_cache, *value_cache, *rope_cos, *rope_sin;
} state_t;

#define MAX_DIM (1 << 16)
#define MAX_HIDDEN (1 << 20)
#define MAX_LAYERS (1 << 10)
#define MAX_VOCAB (1 << 22)
#define MAX_SEQ (1 << 20)

static void check_range(const char *name, int32_t v, int32_t hi) {
    if (v < 1 || v > hi) {
        fprintf(stderr, "generate: model: header value %s = %ld is out of range [1, %ld]\n", name, (long)v,
                (long)hi);
        exit(1);
    }
}

static void load_model(const char *path, config_t *c, weights_t *w) {
    size_t size;
    const char *err;
    char *data = read_file(path, &size, &err);
    if (!data) {
        fprintf(stderr, "generate: model %s: %s\n", path, err);
        exit(1);
    }
    if (size < 28) die("model", "file shorter than the 28-byte header");
    int32_t h[7];
    memcpy(h, data, sizeof h);
    int32_t vocab = h[5];
    c->shared = vocab > 0;
    if (vocab == INT32_MIN) die("model", "header value vocab_size = -2147483648 is out of range");
    if (vocab < 0) vocab = -vocab;
    check_range("dim", h[0], MAX_DIM);
    check_range("hidden_dim", h[1], MAX_HIDDEN);
    check_range("n_layers", h[2], MAX_LAYERS);
    check_range("n_heads", h[3], h[0]);
    check_range("n_kv_heads", h[4], h[3]);
    check_range("vocab_size (absolute value)", vocab, MAX_VOCAB);
    check_range("seq_len", h[6], MAX_SEQ);
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    c->vocab_size = vocab;
    c->seq_len = h[6];
    if (c->dim % c->n_heads != 0) die("model", "dim is not a multiple of n_heads");
    if (c->n_heads % c->n_kv_heads != 0) die("model", "n_heads is not a multiple of n_kv_heads");
    c->head_size = c->dim / c->n_heads;
    if (c->head_size % 2 != 0) die("model", "head size (dim / n_heads) is odd: rotary embeddings need pairs");
    c->kv_dim = c->head_size * c->n_kv_heads;

    uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t V = (uint64_t)c->vocab_size, kv = (uint64_t)c->kv_dim;
    uint64_t per_layer = dim + dim * dim + 2 * dim * kv + dim * dim + dim + 3 * dim * hid;
    uint64_t floats = V * dim + L * per_layer + dim + (uint64_t)c->seq_len * (uint64_t)c->head_size;
    if (!c->shared) floats += V * dim;
    uint64_t want = 28 + 4 * floats;
    if ((uint64_t)size != want) {
        fprintf(stderr,
                "generate: model: file is %llu bytes but its header (dim %d, hidden %d, layers %d, heads %d, "
                "kv heads %d, vocab %d, seq %d) needs %llu\n",
                (unsigned long long)size, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                c->vocab_size, c->seq_len, (unsigned long long)want);
        exit(1);
    }
    const float *p = (const float *)(const void *)(data + 28);
    w->token_embedding = p;
    p += V * dim;
    w->rms_att = p;
    p += L * dim;
    w->wq = p;
    p += L * dim * dim;
    w->wk = p;
    p += L * dim * kv;
    w->wv = p;
    p += L * dim * kv;
    w->wo = p;
    p += L * dim * dim;
    w->rms_ffn = p;
    p += L * dim;
    w->w1 = p;
    p += L * dim * hid;
    w->w2 = p;
    p += L * hid * dim;
    w->w3 = p;
    p += L * dim * hid;
    w->rms_final = p;
    p += dim;
    p += (uint64_t)c->seq_len * (uint64_t)c->head_size; /* llama2.c's unused freq_cis_real and _imag */
    w->wcls = c->shared ? w->token_embedding : p;
}

static void alloc_state(const config_t *c, state_t *s) {
    uint64_t cache = (uint64_t)c->n_layers * (uint64_t)c->seq_len * (uint64_t)c->kv_dim;
    uint64_t big = c->hidden_dim > c->dim ? (uint64_t)c->hidden_dim : (uint64_t)c->dim;
    s->x = xcalloc(c->dim, sizeof(float), "model state");
    s->xb = xcalloc(c->dim, sizeof(float), "model state");
    s->xb2 = xcalloc(c->dim, sizeof(float), "model state");
    s->hb = xcalloc(big, sizeof(float), "model state");
    s->hb2 = xcalloc(big, sizeof(float), "model state");
    s->q = xcalloc(c->dim, sizeof(float), "model state");
    s->att = xcalloc((uint64_t)c->n_heads * (uint64_t)c->seq_len, sizeof(float), "attention scores");
    s->logits = xcalloc(c->vocab_size, sizeof(float), "logits");
    s->key_cache = xcalloc(cache, sizeof(float), "key cache");
    s->value_cache = xcalloc(cache, sizeof(float), "value cache");
    s->rope_cos = xcalloc(c->head_size / 2, sizeof(float), "model state");
    s->rope_sin = xcalloc(c->head_size / 2, sizeof(float), "model state");
}

static void rmsnorm(float *o, const float *x, const float *weight, int size) {
    float ss = 0.0f;
    int j = 0;
    for (; j + 4 <= size; j += 4) ss = (((ss + x[j] * x[j]) + x[j + 1] * x[j + 1]) + x[j + 2] * x[j + 2]) + x[j + 3] * x[j + 3];
    for (; j < size; j++) ss += x[j] * x[j];
    ss /= size;
    ss += 1e-5f;
    ss = 1.0f / sqrtf(ss);
    for (j = 0; j < size; j++) o[j] = weight[j] * (ss * x[j]);
}

/* Our own exp, sin and cos in double precision, rounded to float by the callers: the same operations in
 * every build, so the wasm module and a native build agree bit for bit (libm's expf, powf, sinf and cosf
 * differ between wasi-libc and glibc in the last bit for some inputs). Accurate to a few units in the
 * 16th digit, so the float results are the correctly rounded ones except in the rarest of near ties. */
static double two_to(int k) { /* 2^k for k in [-1022, 1023] */
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double d;
    memcpy(&d, &bits, 8);
    return d;
}

static double exp_d(double x) {
    if (x != x) return x;
    if (x > 700.0) x = 700.0; /* far past float's range either way */
    if (x < -700.0) return 0.0;
    double k = x * 1.4426950408889634 + 6755399441055744.0 - 6755399441055744.0; /* round to whole */
    double r = (x - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
    double p = 1.0 / 6227020800.0; /* Taylor to r^13 / 13!, |r| <= 0.35 */
    static const double inv_fact[] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                                      1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,     1.0 / 120.0,
                                      1.0 / 24.0,        1.0 / 6.0,        0.5,             1.0,
                                      1.0};
    for (int i = 0; i < 13; i++) p = p * r + inv_fact[i];
    return p * two_to((int)k);
}

static float expf_ours(float x) { return (float)exp_d((double)x); }

/* sin and cos of x (|x| < 2^30) at once: x = k pi/2 + r (Cody-Waite), Taylor series on |r| <= pi/4. */
static void sincos_d(double x, double *s_out, double *c_out) {
    double k = x * 6.36619772367581382433e-01 + 6755399441055744.0 - 6755399441055744.0;
    double r = ((x - k * 1.57079632673412561417e+00) - k * 6.07710050650619224932e-11) -
               k * 2.02226624879595063154e-21;
    double r2 = r * r;
    double sp = 0.0, cp = 0.0; /* sin r = r (1 - r^2/3! + ...), cos r = 1 - r^2/2! + ..., to r^18 */
    for (int i = 9; i >= 1; i--) {
        sp = 1.0 - sp * r2 / ((2.0 * i) * (2.0 * i + 1.0));
        cp = 1.0 - cp * r2 / ((2.0 * i - 1.0) * (2.0 * i));
    }
    double sn = r * sp, cs = cp;
    int q = (int)(((long long)k) & 3);
    *s_out = q == 0 ? sn : q == 1 ? cs : q == 2 ? -sn : -cs;
    *c_out = q == 0 ? cs : q == 1 ? -sn : q == 2 ? -cs : sn;
}

/* e^x for x <= 0, four lanes, the same operations in every build (so not libm's expf, whose wasm and
 * native versions may differ): x = n ln2 + r with n whole, e^r from Cephes' expf polynomial (within about
 * 2 ulp), times 2^n from the exponent bits; 0 below -87 (where 2^n would leave the normal range). */
static inline f4 f4_exp_nonpositive(f4 x) {
    const f4 magic = F4_SPLAT(12582912.0f); /* 1.5 * 2^23: adding and subtracting it rounds to a whole float */
    f4 n = F4_SUB(F4_ADD(F4_MUL(x, F4_SPLAT(1.44269504088896341f)), magic), magic);
    f4 r = F4_SUB(F4_SUB(x, F4_MUL(n, F4_SPLAT(0.693359375f))), F4_MUL(n, F4_SPLAT(-2.12194440e-4f)));
    f4 p = F4_SPLAT(1.9875691500e-4f);
    p = F4_ADD(F4_MUL(p, r), F4_SPLAT(1.3981999507e-3f));
    p = F4_ADD(F4_MUL(p, r), F4_SPLAT(8.3334519073e-3f));
    p = F4_ADD(F4_MUL(p, r), F4_SPLAT(4.1665795894e-2f));
    p = F4_ADD(F4_MUL(p, r), F4_SPLAT(1.6666665459e-1f));
    p = F4_ADD(F4_MUL(p, r), F4_SPLAT(5.0000001201e-1f));
    f4 e = F4_ADD(F4_ADD(F4_MUL(p, F4_MUL(r, r)), r), F4_SPLAT(1.0f));
    return F4_KEEP_GE(F4_MUL(e, F4_POW2(n)), x, F4_SPLAT(-87.0f));
}

/* The attention's softmax, four lanes at a time: the maximum (lane maxima, then across lanes), the
 * exponentials with their sum (lane j adds elements j, j+4, ...; then f4_sum; then the tail in order; a
 * tail of fewer than four is computed padded with zeros), then the division. */
static void softmax(float *x, int size) {
    int n4 = size & ~3, i;
    float max_val = x[0];
    if (n4) {
        f4 m4 = F4_SPLAT(x[0]);
        i = 0;
        for (; i + 16 <= n4; i += 16)
            m4 = F4_MAX(F4_MAX(F4_MAX(F4_MAX(m4, F4_LOAD(x + i)), F4_LOAD(x + i + 4)), F4_LOAD(x + i + 8)), F4_LOAD(x + i + 12));
        for (; i < n4; i += 4) m4 = F4_MAX(m4, F4_LOAD(x + i));
        float l[4];
        F4_STORE(l, m4);
        for (int k = 0; k < 4; k++)
            if (l[k] > max_val) max_val = l[k];
    }
    for (i = n4; i < size; i++)
        if (x[i] > max_val) max_val = x[i];
    f4 m = F4_SPLAT(max_val), acc = F4_ZERO();
    for (i = 0; i < n4; i += 4) {
        f4 e = f4_exp_nonpositive(F4_SUB(F4_LOAD(x + i), m));
        F4_STORE(x + i, e);
        acc = F4_ADD(acc, e);
    }
    float sum = f4_sum(acc);
    if (n4 < size) {
        float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        memcpy(tail, x + n4, (size_t)(size - n4) * sizeof(float));
        F4_STORE(tail, f4_exp_nonpositive(F4_SUB(F4_LOAD(tail), m)));
        memcpy(x + n4, tail, (size_t)(size - n4) * sizeof(float));
        for (i = n4; i < size; i++) sum += x[i];
    }
    f4 sum4 = F4_SPLAT(sum);
    for (i = 0; i + 8 <= n4; i += 8) {
        F4_STORE(x + i, F4_DIV(F4_LOAD(x + i), sum4));
        F4_STORE(x + i + 4, F4_DIV(F4_LOAD(x + i + 4), sum4));
    }
    for (; i < n4; i += 4) F4_STORE(x + i, F4_DIV(F4_LOAD(x + i), sum4));
    for (i = n4; i < size; i++) x[i] /= sum;
}

/* One step at position pos; the logits are computed only when want_logits (the prompt's last token and
 * every generated one). */
static void forward(const config_t *c, const weights_t *w, state_t *s, int token, int pos, int want_logits) {
    int dim = c->dim, kv_dim = c->kv_dim, hs = c->head_size, hidden = c->hidden_dim;
    int kv_mul = c->n_heads / c->n_kv_heads;
    float *x = s->x;
    memcpy(x, w->token_embedding + (size_t)token * dim, (size_t)dim * sizeof(float));

    for (int i = 0; i < hs; i += 2) {
        float e = i / (float)hs;
        float freq = 1.0f / (float)exp_d((double)e * 9.21034037197618273607); /* 10000^e, ln 10000 */
        float val = pos * freq;
        double sn, cs;
        sincos_d((double)val, &sn, &cs);
        s->rope_cos[i / 2] = (float)cs;
        s->rope_sin[i / 2] = (float)sn;
    }
    float scale = sqrtf((float)hs);

    for (int l = 0; l < c->n_layers; l++) {
        rmsnorm(s->xb, x, w->rms_att + (size_t)l * dim, dim);
        size_t loff = (size_t)l * c->seq_len * kv_dim;
        float *k = s->key_cache + loff + (size_t)pos * kv_dim;
        float *v = s->value_cache + loff + (size_t)pos * kv_dim;
        matmul(s->q, s->xb, w->wq + (size_t)l * dim * dim, dim, dim);
        matmul(k, s->xb, w->wk + (size_t)l * dim * kv_dim, dim, kv_dim);
        matmul(v, s->xb, w->wv + (size_t)l * dim * kv_dim, dim, kv_dim);

        for (int i = 0; i < dim; i += 2) {
            int j = (i % hs) / 2;
            float fcr = s->rope_cos[j], fci = s->rope_sin[j];
            int rotn = i < kv_dim ? 2 : 1;
            for (int r = 0; r < rotn; r++) {
                float *vec = r == 0 ? s->q : k;
                float v0 = vec[i], v1 = vec[i + 1];
                vec[i] = v0 * fcr - v1 * fci;
                vec[i + 1] = v0 * fci + v1 * fcr;
            }
        }

        for (int h = 0; h < c->n_heads; h++) {
            const float *q = s->q + (size_t)h * hs;
            float *att = s->att + (size_t)h * c->seq_len;
            size_t hoff = loff + (size_t)(h / kv_mul) * hs;
            const float *kh = s->key_cache + hoff;
            int t = 0;
            if ((hs & 3) == 0) {
                /* Four keys at a time: each score is dot(q, k_t) / scale, added in dot()'s order. */
                f4 scale4 = F4_SPLAT(scale);
                for (; t + 3 <= pos; t += 4) {
                    const float *k0 = kh + (size_t)t * kv_dim, *k1 = k0 + kv_dim, *k2 = k1 + kv_dim, *k3 = k2 + kv_dim;
                    f4 a0 = F4_ZERO(), a1 = F4_ZERO(), a2 = F4_ZERO(), a3 = F4_ZERO();
                    int i = 0;
                    for (; i + 8 <= hs; i += 8) {
                        f4 qv = F4_LOAD(q + i), qw = F4_LOAD(q + i + 4);
                        a0 = F4_ADD(F4_ADD(a0, F4_MUL(qv, F4_LOAD(k0 + i))), F4_MUL(qw, F4_LOAD(k0 + i + 4)));
                        a1 = F4_ADD(F4_ADD(a1, F4_MUL(qv, F4_LOAD(k1 + i))), F4_MUL(qw, F4_LOAD(k1 + i + 4)));
                        a2 = F4_ADD(F4_ADD(a2, F4_MUL(qv, F4_LOAD(k2 + i))), F4_MUL(qw, F4_LOAD(k2 + i + 4)));
                        a3 = F4_ADD(F4_ADD(a3, F4_MUL(qv, F4_LOAD(k3 + i))), F4_MUL(qw, F4_LOAD(k3 + i + 4)));
                    }
                    for (; i < hs; i += 4) {
                        f4 qv = F4_LOAD(q + i);
                        a0 = F4_ADD(a0, F4_MUL(qv, F4_LOAD(k0 + i)));
                        a1 = F4_ADD(a1, F4_MUL(qv, F4_LOAD(k1 + i)));
                        a2 = F4_ADD(a2, F4_MUL(qv, F4_LOAD(k2 + i)));
                        a3 = F4_ADD(a3, F4_MUL(qv, F4_LOAD(k3 + i)));
                    }
                    F4_STORE(att + t, F4_DIV(f4_sum4(a0, a1, a2, a3), scale4));
                }
            }
            for (; t <= pos; t++) att[t] = dot(q, kh + (size_t)t * kv_dim, hs) / scale;
            softmax(att, pos + 1);
            /* xb = sum over t (in order, from 0) of att[t] * v_t, four elements at a time in registers. */
            float *xb = s->xb + (size_t)h * hs;
            const float *vh = s->value_cache + hoff;
            int i = 0;
            for (; i + 8 <= hs; i += 8) {
                f4 acc = F4_ZERO(), acc2 = F4_ZERO();
                int t = 0;
                for (; t + 3 <= pos; t += 4) { /* four positions per step, added in order */
                    const float *v0 = vh + (size_t)t * kv_dim + i, *v1 = v0 + kv_dim, *v2 = v1 + kv_dim, *v3 = v2 + kv_dim;
                    f4 a0 = F4_SPLAT(att[t]), a1 = F4_SPLAT(att[t + 1]), a2 = F4_SPLAT(att[t + 2]), a3 = F4_SPLAT(att[t + 3]);
                    acc = F4_ADD(F4_ADD(F4_ADD(F4_ADD(acc, F4_MUL(a0, F4_LOAD(v0))), F4_MUL(a1, F4_LOAD(v1))),
                                        F4_MUL(a2, F4_LOAD(v2))),
                                 F4_MUL(a3, F4_LOAD(v3)));
                    acc2 = F4_ADD(F4_ADD(F4_ADD(F4_ADD(acc2, F4_MUL(a0, F4_LOAD(v0 + 4))), F4_MUL(a1, F4_LOAD(v1 + 4))),
                                         F4_MUL(a2, F4_LOAD(v2 + 4))),
                                  F4_MUL(a3, F4_LOAD(v3 + 4)));
                }
                for (; t <= pos; t++) {
                    f4 a = F4_SPLAT(att[t]);
                    const float *vt = vh + (size_t)t * kv_dim + i;
                    acc = F4_ADD(acc, F4_MUL(a, F4_LOAD(vt)));
                    acc2 = F4_ADD(acc2, F4_MUL(a, F4_LOAD(vt + 4)));
                }
                F4_STORE(xb + i, acc);
                F4_STORE(xb + i + 4, acc2);
            }
            for (; i + 4 <= hs; i += 4) {
                f4 acc = F4_ZERO();
                for (int t = 0; t <= pos; t++) acc = F4_ADD(acc, F4_MUL(F4_SPLAT(att[t]), F4_LOAD(vh + (size_t)t * kv_dim + i)));
                F4_STORE(xb + i, acc);
            }
            for (; i < hs; i++) {
                float acc = 0.0f;
                for (int t = 0; t <= pos; t++) acc += att[t] * vh[(size_t)t * kv_dim + i];
                xb[i] = acc;
            }
        }
        matmul(s->xb2, s->xb, w->wo + (size_t)l * dim * dim, dim, dim);
        for (int i = 0; i < dim; i++) x[i] += s->xb2[i];

        rmsnorm(s->xb, x, w->rms_ffn + (size_t)l * dim, dim);
        matmul(s->hb, s->xb, w->w1 + (size_t)l * dim * hidden, dim, hidden);
        matmul(s->hb2, s->xb, w->w3 + (size_t)l * dim * hidden, dim, hidden);
        for (int i = 0; i < hidden; i++) {
            float val = s->hb[i];
            val *= (1.0f / (1.0f + expf_ours(-val)));
            val *= s->hb2[i];
            s->hb[i] = val;
        }
        matmul(s->xb, s->hb, w->w2 + (size_t)l * dim * hidden, hidden, dim);
        for (int i = 0; i < dim; i++) x[i] += s->xb[i];
    }
    if (!want_logits) return;
    rmsnorm(x, x, w->rms_final, dim);
    matmul(s->logits, x, w->wcls, dim, c->vocab_size);
}

/* ---------------------------------------------------------------------------------------------
 * The tokenizer
 */
typedef struct {
    int vocab_size, max_len; /* max_len: the longest token in bytes */
    const unsigned char **str;
    int *len;
    float *score;
    int *table;         /* open-addressing hash of the tokens' bytes: ids, -1 for an empty slot */
    uint32_t table_mask; /* table size - 1 (a power of two at least twice the vocabulary) */
    int byte_token[256]; /* id of "<0xXX>" for each byte, or -1 */
} tokenizer_t;

static uint32_t hash_bytes(const unsigned char *s, int n) { /* FNV-1a */
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

static int same_bytes(const tokenizer_t *t, int id, const unsigned char *s, int n) {
    return t->len[id] == n && (n == 0 || memcmp(t->str[id], s, (size_t)n) == 0);
}

/* The lowest id whose bytes are s[0..n), or -1. */
static int lookup(const tokenizer_t *t, const unsigned char *s, int n) {
    for (uint32_t k = hash_bytes(s, n) & t->table_mask;; k = (k + 1) & t->table_mask) {
        int id = t->table[k];
        if (id < 0) return -1;
        if (same_bytes(t, id, s, n)) return id;
    }
}

/* Ids inserted in increasing order, a repeated string kept at its first (lowest) id. */
static void build_table(tokenizer_t *t) {
    uint64_t size = 1;
    while (size < 2 * (uint64_t)t->vocab_size) size *= 2;
    t->table = xcalloc(size, sizeof *t->table, "tokenizer");
    t->table_mask = (uint32_t)(size - 1);
    for (uint64_t k = 0; k < size; k++) t->table[k] = -1;
    for (int id = 0; id < t->vocab_size; id++) {
        uint32_t k = hash_bytes(t->str[id], t->len[id]) & t->table_mask;
        while (t->table[k] >= 0 && !same_bytes(t, t->table[k], t->str[id], t->len[id])) k = (k + 1) & t->table_mask;
        if (t->table[k] < 0) t->table[k] = id;
    }
}

static int hexval(unsigned char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}

/* The byte a "<0xXX>" token stands for, or -1. */
static int byte_of(const unsigned char *s, int n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static void load_tokenizer(const char *path, int vocab_size, tokenizer_t *t) {
    size_t size;
    const char *err;
    char *data = read_file(path, &size, &err);
    if (!data) {
        fprintf(stderr, "generate: tokenizer %s: %s\n", path, err);
        exit(1);
    }
    if (size < 4) die("tokenizer", "file shorter than its 4-byte header");
    int32_t max_token_length;
    memcpy(&max_token_length, data, 4);
    if (max_token_length < 1) die("tokenizer", "max_token_length is not positive");
    t->vocab_size = vocab_size;
    t->str = xcalloc(vocab_size, sizeof *t->str, "tokenizer");
    t->len = xcalloc(vocab_size, sizeof *t->len, "tokenizer");
    t->score = xcalloc(vocab_size, sizeof *t->score, "tokenizer");
    t->max_len = 1;
    size_t off = 4;
    for (int i = 0; i < vocab_size; i++) {
        if (size - off < 8) {
            fprintf(stderr, "generate: tokenizer: ends after %d tokens; the model's vocabulary has %d\n", i,
                    vocab_size);
            exit(1);
        }
        int32_t n;
        memcpy(&t->score[i], data + off, 4);
        memcpy(&n, data + off + 4, 4);
        off += 8;
        if (n < 0 || (uint64_t)n > (uint64_t)(size - off)) {
            fprintf(stderr, "generate: tokenizer: token %d has length %ld, past the end of the file\n", i, (long)n);
            exit(1);
        }
        if (n > (1 << 16)) {
            fprintf(stderr, "generate: tokenizer: token %d is %ld bytes long (at most 65536)\n", i, (long)n);
            exit(1);
        }
        t->str[i] = (const unsigned char *)data + off;
        t->len[i] = n;
        if (n > t->max_len) t->max_len = n;
        off += (size_t)n;
    }
    if (off != size) {
        fprintf(stderr,
                "generate: tokenizer: %llu bytes left after the model's %d tokens: not this model's tokenizer\n",
                (unsigned long long)(size - off), vocab_size);
        exit(1);
    }
    build_table(t);
    for (int b = 0; b < 256; b++) t->byte_token[b] = b + 3 < vocab_size ? b + 3 : -1;
}

/* llama2.c's encode: BOS, the dummy-prefix space for a non-empty text, UTF-8 characters looked up (bytes
 * as ids 3 + byte when not in the vocabulary), then merges of the best-scoring pair (leftmost on a tie).
 * Returns the token count, or -1 when a byte has no token (err set). tokens needs text_len + 2 slots. */
static int encode(const tokenizer_t *t, const unsigned char *text, size_t text_len, int *tokens, const char **err) {
    int n = 0;
    tokens[n++] = 1;
    if (text_len > 0) {
        int id = lookup(t, (const unsigned char *)" ", 1);
        if (id < 0) id = t->byte_token[' '];
        if (id < 0) {
            *err = "the vocabulary has no token for the prefix space";
            return -1;
        }
        tokens[n++] = id;
    }
    size_t i = 0;
    while (i < text_len) {
        size_t start = i++;
        while (i < text_len && (text[i] & 0xC0) == 0x80 && i - start < 4) i++;
        int id = lookup(t, text + start, (int)(i - start));
        if (id >= 0) {
            tokens[n++] = id;
            continue;
        }
        for (size_t j = start; j < i; j++) {
            int b = t->byte_token[text[j]];
            if (b < 0) {
                *err = "the prompt has a byte the vocabulary has no token for";
                return -1;
            }
            tokens[n++] = b;
        }
    }
    /* Merges, with the candidate for each adjacent pair cached and recomputed only next to a merge. */
    unsigned char *pair = malloc((size_t)t->max_len * 2);
    int *cand = malloc((size_t)n * sizeof(int));
    if (!pair || !cand) {
        free(pair);
        free(cand);
        *err = "out of memory encoding the prompt";
        return -1;
    }
#define PAIR_ID(k)                                                                          \
    do {                                                                                    \
        int a_ = tokens[k], b_ = tokens[(k) + 1];                                           \
        int la_ = t->len[a_], lb_ = t->len[b_];                                             \
        if (la_ + lb_ > t->max_len) {                                                       \
            cand[k] = -1;                                                                   \
        } else {                                                                            \
            if (la_) memcpy(pair, t->str[a_], (size_t)la_);                                 \
            if (lb_) memcpy(pair + la_, t->str[b_], (size_t)lb_);                           \
            cand[k] = lookup(t, pair, la_ + lb_);                                           \
        }                                                                                   \
    } while (0)
    for (int k = 0; k + 1 < n; k++) PAIR_ID(k);
    for (;;) {
        float best_score = -1e10f;
        int best_idx = -1;
        for (int k = 0; k + 1 < n; k++)
            if (cand[k] >= 0 && t->score[cand[k]] > best_score) {
                best_score = t->score[cand[k]];
                best_idx = k;
            }
        if (best_idx < 0) break;
        tokens[best_idx] = cand[best_idx];
        memmove(tokens + best_idx + 1, tokens + best_idx + 2, (size_t)(n - best_idx - 2) * sizeof(int));
        if (n - best_idx - 3 > 0)
            memmove(cand + best_idx + 1, cand + best_idx + 2, (size_t)(n - best_idx - 3) * sizeof(int));
        n--;
        if (best_idx > 0) PAIR_ID(best_idx - 1);
        if (best_idx + 1 < n) PAIR_ID(best_idx);
    }
#undef PAIR_ID
    free(pair);
    free(cand);
    return n;
}

/* llama2.c's decode: the piece for token after prev. */
static void decode(const tokenizer_t *t, int prev, int token, buf_t *out) {
    const unsigned char *s = t->str[token];
    int n = t->len[token];
    if (prev == 1 && n > 0 && s[0] == ' ') {
        s++;
        n--;
    }
    int b = byte_of(s, n);
    if (b >= 0) {
        unsigned char ch = (unsigned char)b;
        buf_put(out, &ch, 1);
    } else if (n) {
        buf_put(out, s, (size_t)n);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Sampling
 */
typedef struct {
    uint64_t s[4];
} rng_t;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static void rng_seed(rng_t *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rng_next(rng_t *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* A float uniform in [0, 1) from the top 24 bits. */
static float rng_float(rng_t *r) { return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f); }

typedef struct {
    float prob;
    int index;
} prob_index_t;

/* Sorts a[0..n) by probability, highest first, the lower index first on a tie (a is in index order on
 * entry): a stable radix sort, three passes of 11 bits over the inverted float bits (probabilities are
 * >= 0, so their bits order as they do). tmp holds n entries. */
static void sort_by_prob(prob_index_t *a, prob_index_t *tmp, int n) {
    static uint32_t count[2048];
    prob_index_t *src = a, *dst = tmp;
    for (int shift = 0; shift < 33; shift += 11) {
        memset(count, 0, sizeof count);
        for (int i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &src[i].prob, 4);
            count[(~bits >> shift) & 2047]++;
        }
        uint32_t total = 0;
        for (int d = 0; d < 2048; d++) {
            uint32_t c = count[d];
            count[d] = total;
            total += c;
        }
        for (int i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &src[i].prob, 4);
            dst[count[(~bits >> shift) & 2047]++] = src[i];
        }
        prob_index_t *t = src;
        src = dst;
        dst = t;
    }
    memcpy(a, src, (size_t)n * sizeof *a); /* three passes: the result is in tmp */
}

static int argmax(const float *v, int n) {
    int best = 0, i = 1;
    float bv = v[0];
#define TAKE(k)                  \
    do {                         \
        int gt_ = v[k] > bv;     \
        best = gt_ ? (k) : best; \
        bv = gt_ ? v[k] : bv;    \
    } while (0)
    for (; i + 4 <= n; i += 4) {
        TAKE(i);
        TAKE(i + 1);
        TAKE(i + 2);
        TAKE(i + 3);
    }
    for (; i < n; i++) TAKE(i);
#undef TAKE
    return best;
}

static int sample(float *logits, int n, float temperature, float top_p, rng_t *rng, prob_index_t *scratch,
                  prob_index_t *scratch2) {
    if (temperature == 0.0f) return argmax(logits, n);
    float max_val = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > max_val) max_val = logits[i];
    /* (logit - max) / temperature <= 0, then the attention's softmax (our exp, not libm's). */
    for (int i = 0; i < n; i++) logits[i] = (logits[i] - max_val) / temperature;
    softmax(logits, n);
    float coin = rng_float(rng);
    if (top_p >= 1.0f || n == 1) {
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) {
            cdf += logits[i];
            if (coin < cdf) return i;
        }
        return n - 1;
    }
    /* Nucleus: tokens below (1 - top_p) / (n - 1) cannot be in it (llama2.c's pre-filter). */
    float cutoff = (1.0f - top_p) / (float)(n - 1);
    int n0 = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] >= cutoff) {
            scratch[n0].prob = logits[i];
            scratch[n0].index = i;
            n0++;
        }
    if (n0 == 0) return argmax(logits, n);
    sort_by_prob(scratch, scratch2, n0);
    float cum = 0.0f;
    int last = n0 - 1;
    for (int i = 0; i < n0; i++) {
        cum += scratch[i].prob;
        if (cum > top_p) {
            last = i;
            break;
        }
    }
    float r = coin * cum;
    float cdf = 0.0f;
    for (int i = 0; i <= last; i++) {
        cdf += scratch[i].prob;
        if (r < cdf) return scratch[i].index;
    }
    return scratch[last].index;
}

/* ---------------------------------------------------------------------------------------------
 * JSON
 */

/* Appends s[0..n) as a JSON string: each maximal invalid UTF-8 subsequence becomes U+FFFD (as Python's
 * decode(errors="replace")), '"', '\' and U+0000-U+001F, U+007F are escaped. */
static void json_string(buf_t *b, const unsigned char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    buf_put(b, "\"", 1);
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            char esc[7];
            if (c == '"') buf_put(b, "\\\"", 2);
            else if (c == '\\') buf_put(b, "\\\\", 2);
            else if (c == '\n') buf_put(b, "\\n", 2);
            else if (c == '\r') buf_put(b, "\\r", 2);
            else if (c == '\t') buf_put(b, "\\t", 2);
            else if (c == '\b') buf_put(b, "\\b", 2);
            else if (c == '\f') buf_put(b, "\\f", 2);
            else if (c < 0x20 || c == 0x7f) {
                esc[0] = '\\';
                esc[1] = 'u';
                esc[2] = '0';
                esc[3] = '0';
                esc[4] = hex[c >> 4];
                esc[5] = hex[c & 15];
                buf_put(b, esc, 6);
            } else buf_put(b, &c, 1);
            i++;
            continue;
        }
        int need;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) need = 2, lo = 0xA0;
        else if (c == 0xED) need = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF) need = 2;
        else if (c == 0xF0) need = 3, lo = 0x90;
        else if (c == 0xF4) need = 3, hi = 0x8F;
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else need = -1;
        size_t j = i + 1;
        int ok = need > 0;
        for (int k = 0; ok && k < need; k++) {
            unsigned char lo_k = k == 0 ? lo : 0x80, hi_k = k == 0 ? hi : 0xBF;
            if (j < n && s[j] >= lo_k && s[j] <= hi_k) j++;
            else ok = 0;
        }
        if (ok) buf_put(b, s + i, j - i);
        else buf_put(b, "\xEF\xBF\xBD", 3);
        i = j;
    }
    buf_put(b, "\"", 1);
}

/* Is s[0..n) valid UTF-8? */
static int valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int need;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) need = 2, lo = 0xA0;
        else if (c == 0xED) need = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF) need = 2;
        else if (c == 0xF0) need = 3, lo = 0x90;
        else if (c == 0xF4) need = 3, hi = 0x8F;
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else return 0;
        if (n - i - 1 < (size_t)need) return 0;
        for (int k = 0; k < need; k++) {
            unsigned char lo_k = k == 0 ? lo : 0x80, hi_k = k == 0 ? hi : 0xBF;
            if (s[i + 1 + k] < lo_k || s[i + 1 + k] > hi_k) return 0;
        }
        i += (size_t)need + 1;
    }
    return 1;
}

typedef struct {
    const unsigned char *p, *end;
    const char *err; /* the first syntax error */
} lexer_t;

static void skip_ws(lexer_t *lx) {
    while (lx->p < lx->end && (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\n' || *lx->p == '\r')) lx->p++;
}

static void put_utf8(buf_t *b, uint32_t cp) {
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) u[0] = (unsigned char)cp, n = 1;
    else if (cp < 0x800) u[0] = (unsigned char)(0xC0 | (cp >> 6)), u[1] = (unsigned char)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        u[0] = (unsigned char)(0xE0 | (cp >> 12)), u[1] = (unsigned char)(0x80 | ((cp >> 6) & 63)),
        u[2] = (unsigned char)(0x80 | (cp & 63)), n = 3;
    else
        u[0] = (unsigned char)(0xF0 | (cp >> 18)), u[1] = (unsigned char)(0x80 | ((cp >> 12) & 63)),
        u[2] = (unsigned char)(0x80 | ((cp >> 6) & 63)), u[3] = (unsigned char)(0x80 | (cp & 63)), n = 4;
    buf_put(b, u, n);
}

static int hex4(lexer_t *lx, uint32_t *out) {
    if (lx->end - lx->p < 4) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(lx->p[i]);
        if (h < 0) return 0;
        v = v * 16 + (uint32_t)h;
    }
    lx->p += 4;
    *out = v;
    return 1;
}

/* Parses a JSON string at lx->p (which is '"') into out (when not NULL). Returns 0 on a syntax error. */
static int parse_string(lexer_t *lx, buf_t *out) {
    lx->p++;
    for (;;) {
        if (lx->p >= lx->end) {
            lx->err = "unterminated string";
            return 0;
        }
        unsigned char c = *lx->p;
        if (c == '"') {
            lx->p++;
            return 1;
        }
        if (c < 0x20) {
            lx->err = "control character in a string";
            return 0;
        }
        if (c != '\\') {
            const unsigned char *start = lx->p;
            while (lx->p < lx->end && *lx->p != '"' && *lx->p != '\\' && *lx->p >= 0x20) lx->p++;
            if (out) buf_put(out, start, (size_t)(lx->p - start));
            continue;
        }
        lx->p++;
        if (lx->p >= lx->end) {
            lx->err = "unterminated string";
            return 0;
        }
        c = *lx->p++;
        char e = 0;
        switch (c) {
        case '"': e = '"'; break;
        case '\\': e = '\\'; break;
        case '/': e = '/'; break;
        case 'b': e = '\b'; break;
        case 'f': e = '\f'; break;
        case 'n': e = '\n'; break;
        case 'r': e = '\r'; break;
        case 't': e = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (!hex4(lx, &cp)) {
                lx->err = "bad \\u escape";
                return 0;
            }
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                lx->err = "lone low surrogate in a \\u escape";
                return 0;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (lx->end - lx->p < 2 || lx->p[0] != '\\' || lx->p[1] != 'u') {
                    lx->err = "lone high surrogate in a \\u escape";
                    return 0;
                }
                lx->p += 2;
                if (!hex4(lx, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    lx->err = "high surrogate not followed by a low surrogate";
                    return 0;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (out) put_utf8(out, cp);
            continue;
        }
        default: lx->err = "bad escape in a string"; return 0;
        }
        if (out) buf_put(out, &e, 1);
    }
}

/* A JSON number at lx->p: its span and whether it is an integer (no fraction, no exponent). */
static int parse_number(lexer_t *lx, const unsigned char **start, size_t *len, int *is_int) {
    const unsigned char *p = lx->p, *e = lx->end;
    *start = p;
    *is_int = 1;
    if (p < e && *p == '-') p++;
    if (p >= e || *p < '0' || *p > '9') {
        lx->err = "bad number";
        return 0;
    }
    if (*p == '0') p++;
    else
        while (p < e && *p >= '0' && *p <= '9') p++;
    if (p < e && *p == '.') {
        *is_int = 0;
        p++;
        if (p >= e || *p < '0' || *p > '9') {
            lx->err = "bad number";
            return 0;
        }
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        *is_int = 0;
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') {
            lx->err = "bad number";
            return 0;
        }
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    *len = (size_t)(p - *start);
    lx->p = p;
    return 1;
}

static int literal(lexer_t *lx, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(lx->end - lx->p) < n || memcmp(lx->p, word, n) != 0) {
        lx->err = "bad literal";
        return 0;
    }
    lx->p += n;
    return 1;
}

#define MAX_DEPTH 64

/* Skips any JSON value. */
static int skip_value(lexer_t *lx, int depth) {
    skip_ws(lx);
    if (lx->p >= lx->end) {
        lx->err = "value expected";
        return 0;
    }
    unsigned char c = *lx->p;
    if (c == '"') return parse_string(lx, NULL);
    if (c == 't') return literal(lx, "true");
    if (c == 'f') return literal(lx, "false");
    if (c == 'n') return literal(lx, "null");
    if (c == '-' || (c >= '0' && c <= '9')) {
        const unsigned char *s;
        size_t n;
        int is_int;
        return parse_number(lx, &s, &n, &is_int);
    }
    if (c != '[' && c != '{') {
        lx->err = "value expected";
        return 0;
    }
    if (depth >= MAX_DEPTH) {
        lx->err = "nested too deeply";
        return 0;
    }
    unsigned char close = c == '[' ? ']' : '}';
    lx->p++;
    skip_ws(lx);
    if (lx->p < lx->end && *lx->p == close) {
        lx->p++;
        return 1;
    }
    for (;;) {
        if (close == '}') {
            skip_ws(lx);
            if (lx->p >= lx->end || *lx->p != '"') {
                lx->err = "object key expected";
                return 0;
            }
            if (!parse_string(lx, NULL)) return 0;
            skip_ws(lx);
            if (lx->p >= lx->end || *lx->p != ':') {
                lx->err = "':' expected";
                return 0;
            }
            lx->p++;
        }
        if (!skip_value(lx, depth + 1)) return 0;
        skip_ws(lx);
        if (lx->p < lx->end && *lx->p == ',') {
            lx->p++;
            continue;
        }
        if (lx->p < lx->end && *lx->p == close) {
            lx->p++;
            return 1;
        }
        lx->err = close == ']' ? "',' or ']' expected" : "',' or '}' expected";
        return 0;
    }
}

/* An integer literal's value, when it is in [lo, hi] (unsigned 64-bit; negative literals only for lo 0
 * fail). Returns 0 when out of range. */
static int int_value(const unsigned char *s, size_t n, uint64_t hi, uint64_t *out) {
    if (n && s[0] == '-') {
        for (size_t i = 1; i < n; i++)
            if (s[i] != '0') return 0;
        *out = 0; /* "-0" */
        return 1;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    if (v > hi) return 0;
    *out = v;
    return 1;
}

typedef struct {
    buf_t id; /* the id as JSON text, ready to echo */
    int has_id;
    buf_t prompt;
    int has_prompt;
    uint64_t max_tokens;
    int has_max_tokens;
    double temperature, top_p;
    int has_temperature, has_top_p;
    uint64_t seed;
    int has_seed;
    const char *err; /* the first error (syntax or value) */
    char errbuf[160];
} request_t;

static void req_error(request_t *r, const char *msg) {
    if (!r->err) r->err = msg;
}

static double number_value(const unsigned char *s, size_t n) {
    char tmp[64];
    if (n >= sizeof tmp) {
        /* A literal this long: let strtod see it from a heap copy. */
        char *big = xalloc(n + 1, "prompt line");
        memcpy(big, s, n);
        big[n] = 0;
        double v = strtod(big, NULL);
        free(big);
        return v;
    }
    memcpy(tmp, s, n);
    tmp[n] = 0;
    return strtod(tmp, NULL);
}

/* Parses one prompt line into r; r->err is set when the line cannot be run. */
static void parse_request(const unsigned char *line, size_t n, request_t *r) {
    if (!valid_utf8(line, n)) {
        req_error(r, "the line is not valid UTF-8");
        return;
    }
    lexer_t lx = {line, line + n, NULL};
    skip_ws(&lx);
    if (lx.p >= lx.end || *lx.p != '{') {
        req_error(r, "the line is not a JSON object");
        return;
    }
    lx.p++;
    skip_ws(&lx);
    int first = 1;
    buf_t key = {0};
    for (;;) {
        skip_ws(&lx);
        if (first && lx.p < lx.end && *lx.p == '}') {
            lx.p++;
            break;
        }
        first = 0;
        if (lx.p >= lx.end || *lx.p != '"') {
            lx.err = "object key expected";
            break;
        }
        key.len = 0;
        if (!parse_string(&lx, &key)) break;
        buf_put(&key, "", 0);
        skip_ws(&lx);
        if (lx.p >= lx.end || *lx.p != ':') {
            lx.err = "':' expected";
            break;
        }
        lx.p++;
        skip_ws(&lx);
        if (lx.p >= lx.end) {
            lx.err = "value expected";
            break;
        }
        unsigned char c = *lx.p;
        int is_num = c == '-' || (c >= '0' && c <= '9');
        const unsigned char *ns = NULL;
        size_t nl = 0;
        int is_int = 0;
        const char *k = key.p;
        int known = strlen(k) == key.len &&
                    (!strcmp(k, "id") || !strcmp(k, "prompt") || !strcmp(k, "max_tokens") ||
                     !strcmp(k, "temperature") || !strcmp(k, "top_p") || !strcmp(k, "seed"));
        if (!known) {
            if (!skip_value(&lx, 1)) break;
        } else if (!strcmp(k, "id")) {
            if (r->has_id) req_error(r, "\"id\" given twice");
            if (c == '"') {
                buf_t s = {0};
                if (!parse_string(&lx, &s)) {
                    free(s.p);
                    break;
                }
                if (!r->has_id) {
                    r->id.len = 0;
                    json_string(&r->id, (const unsigned char *)s.p, s.len);
                    r->has_id = 1;
                }
                free(s.p);
            } else if (is_num) {
                if (!parse_number(&lx, &ns, &nl, &is_int)) break;
                if (!is_int) req_error(r, "\"id\" must be a string or an integer");
                else if (!r->has_id) {
                    buf_put(&r->id, ns, nl);
                    r->has_id = 1;
                }
            } else {
                if (!skip_value(&lx, 1)) break;
                req_error(r, "\"id\" must be a string or an integer");
            }
        } else if (!strcmp(k, "prompt")) {
            if (r->has_prompt) req_error(r, "\"prompt\" given twice");
            if (c == '"') {
                r->prompt.len = 0;
                if (!parse_string(&lx, &r->prompt)) break;
                r->has_prompt = 1;
            } else {
                if (!skip_value(&lx, 1)) break;
                req_error(r, "\"prompt\" must be a string");
            }
        } else {
            /* The numeric keys. */
            if (!is_num) {
                if (!skip_value(&lx, 1)) break;
            } else if (!parse_number(&lx, &ns, &nl, &is_int)) {
                break;
            }
            if (!strcmp(k, "max_tokens")) {
                if (r->has_max_tokens) req_error(r, "\"max_tokens\" given twice");
                r->has_max_tokens = 1;
                if (!is_num || !is_int) req_error(r, "\"max_tokens\" must be an integer");
                else if (!int_value(ns, nl, (uint64_t)INT32_MAX, &r->max_tokens) || r->max_tokens < 1)
                    req_error(r, "\"max_tokens\" must be in [1, 2147483647]");
            } else if (!strcmp(k, "seed")) {
                if (r->has_seed) req_error(r, "\"seed\" given twice");
                r->has_seed = 1;
                if (!is_num || !is_int) req_error(r, "\"seed\" must be an integer");
                else if (!int_value(ns, nl, UINT64_MAX, &r->seed))
                    req_error(r, "\"seed\" must be in [0, 18446744073709551615]");
            } else if (!strcmp(k, "temperature")) {
                if (r->has_temperature) req_error(r, "\"temperature\" given twice");
                r->has_temperature = 1;
                if (!is_num) req_error(r, "\"temperature\" must be a number");
                else {
                    r->temperature = number_value(ns, nl);
                    if (!(r->temperature >= 0.0) || !isfinite(r->temperature))
                        req_error(r, "\"temperature\" must be a finite number >= 0");
                }
            } else {
                if (r->has_top_p) req_error(r, "\"top_p\" given twice");
                r->has_top_p = 1;
                if (!is_num) req_error(r, "\"top_p\" must be a number");
                else {
                    r->top_p = number_value(ns, nl);
                    if (!(r->top_p > 0.0 && r->top_p <= 1.0))
                        req_error(r, "\"top_p\" must be in (0, 1]");
                }
            }
        }
        skip_ws(&lx);
        if (lx.p < lx.end && *lx.p == ',') {
            lx.p++;
            continue;
        }
        if (lx.p < lx.end && *lx.p == '}') {
            lx.p++;
            break;
        }
        lx.err = "',' or '}' expected";
        break;
    }
    free(key.p);
    if (!lx.err) {
        skip_ws(&lx);
        if (lx.p != lx.end) lx.err = "text after the JSON object";
    }
    if (lx.err) {
        snprintf(r->errbuf, sizeof r->errbuf, "bad JSON at byte %lu: %s", (unsigned long)(lx.p - line + 1), lx.err);
        r->err = r->errbuf; /* a syntax error wins over a value error */
        return;
    }
    if (!r->has_id) req_error(r, "\"id\" is missing");
    if (!r->has_prompt) req_error(r, "\"prompt\" is missing");
}

/* ---------------------------------------------------------------------------------------------
 * The job
 */
typedef struct {
    config_t c;
    weights_t w;
    state_t s;
    tokenizer_t t;
    prob_index_t *scratch, *scratch2;
    int *tokens;
    size_t tokens_cap;
} model_t;

static void put_int(buf_t *b, long long v) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%lld", v);
    buf_puts(b, tmp);
}

static void error_line(buf_t *out, const request_t *r, long long line_no, const char *msg) {
    buf_puts(out, "{\"id\": ");
    if (r->has_id) buf_put(out, r->id.p, r->id.len);
    else buf_puts(out, "null");
    buf_puts(out, ", \"line\": ");
    put_int(out, line_no);
    buf_puts(out, ", \"error\": ");
    json_string(out, (const unsigned char *)msg, strlen(msg));
    buf_puts(out, ", \"finish_reason\": \"error\"}\n");
}

static void run_line(model_t *m, const unsigned char *line, size_t n, long long line_no, int default_max,
                     buf_t *out) {
    request_t r;
    memset(&r, 0, sizeof r);
    parse_request(line, n, &r);
    if (r.err) {
        error_line(out, &r, line_no, r.err);
        goto done;
    }
    const config_t *c = &m->c;
    size_t plen = r.prompt.len;
    /* Every token is at least one byte long except in pathological vocabularies, and at most max_len bytes:
     * a prompt longer than seq_len * max_len bytes cannot fit the context. */
    if (plen / (size_t)m->t.max_len >= (size_t)c->seq_len) {
        error_line(out, &r, line_no, "the prompt is longer than the model's context");
        goto done;
    }
    if (plen + 2 > m->tokens_cap) {
        free(m->tokens);
        m->tokens_cap = 0;
        m->tokens = plen + 2 <= SIZE_MAX / sizeof(int) ? malloc((plen + 2) * sizeof(int)) : NULL;
        if (!m->tokens) {
            error_line(out, &r, line_no, "out of memory encoding the prompt");
            goto done;
        }
        m->tokens_cap = plen + 2;
    }
    const char *err = NULL;
    int n_tokens = encode(&m->t, (const unsigned char *)(r.prompt.p ? r.prompt.p : ""), plen, m->tokens, &err);
    if (n_tokens < 0) {
        error_line(out, &r, line_no, err);
        goto done;
    }
    if (n_tokens >= c->seq_len) {
        char msg[128];
        snprintf(msg, sizeof msg, "the prompt is %d tokens: no room left in the model's context of %d", n_tokens,
                 c->seq_len);
        error_line(out, &r, line_no, msg);
        goto done;
    }
    long long max_tokens = r.has_max_tokens ? (long long)r.max_tokens : default_max;
    float temperature = r.has_temperature ? (float)r.temperature : 0.0f;
    float top_p = r.has_top_p ? (float)r.top_p : 1.0f;
    rng_t rng;
    rng_seed(&rng, r.has_seed ? r.seed : 0);

    buf_t text = {0};
    long long generated = 0;
    const char *finish = "length";
    int token = m->tokens[0];
    for (int pos = 0;; pos++) {
        int last_prompt = pos >= n_tokens - 1;
        forward(c, &m->w, &m->s, token, pos, last_prompt);
        if (!last_prompt) {
            token = m->tokens[pos + 1];
            continue;
        }
        int next = sample(m->s.logits, c->vocab_size, temperature, top_p, &rng, m->scratch, m->scratch2);
        if (next == 1 || next == 2) {
            finish = "stop";
            break;
        }
        decode(&m->t, token, next, &text);
        generated++;
        token = next;
        if (generated >= max_tokens || n_tokens + generated >= c->seq_len) break;
    }
    buf_puts(out, "{\"id\": ");
    buf_put(out, r.id.p, r.id.len);
    buf_puts(out, ", \"completion\": ");
    json_string(out, (const unsigned char *)(text.p ? text.p : ""), text.len);
    buf_puts(out, ", \"prompt_tokens\": ");
    put_int(out, n_tokens);
    buf_puts(out, ", \"completion_tokens\": ");
    put_int(out, generated);
    buf_puts(out, ", \"finish_reason\": \"");
    buf_puts(out, finish);
    buf_puts(out, "\"}\n");
    free(text.p);
done:
    free(r.id.p);
    free(r.prompt.p);
}

__attribute__((noreturn)) static void usage(const char *msg) {
    fprintf(stderr,
            "generate: %s\nusage: generate [--model PATH] [--tokenizer PATH] [--prompts PATH] [--out PATH] "
            "[--max-tokens N]\n",
            msg);
    exit(2);
}

int main(int argc, char **argv) {
    const char *model_path = "/input/model.bin", *tok_path = "/input/tokenizer.bin";
    const char *prompts_path = "/input/prompts.jsonl", *out_path = "/output/completions.jsonl";
    int default_max = 256;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) usage("an option is missing its value");
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--tokenizer")) tok_path = v;
        else if (!strcmp(a, "--prompts")) prompts_path = v;
        else if (!strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--max-tokens")) {
            uint64_t n = 0;
            size_t len = strlen(v);
            int digits = len > 0;
            for (size_t k = 0; k < len; k++)
                if (v[k] < '0' || v[k] > '9') digits = 0;
            if (!digits || !int_value((const unsigned char *)v, len, (uint64_t)INT32_MAX, &n) || n < 1)
                usage("--max-tokens must be an integer in [1, 2147483647]");
            default_max = (int)n;
        } else usage("unknown option");
    }

    static model_t m;
    load_model(model_path, &m.c, &m.w);
    load_tokenizer(tok_path, m.c.vocab_size, &m.t);
    alloc_state(&m.c, &m.s);
    m.scratch = xcalloc(m.c.vocab_size, sizeof *m.scratch, "sampler");
    m.scratch2 = xcalloc(m.c.vocab_size, sizeof *m.scratch2, "sampler");

    size_t psize;
    const char *err;
    char *prompts = read_file(prompts_path, &psize, &err);
    if (!prompts) {
        fprintf(stderr, "generate: prompts %s: %s\n", prompts_path, err);
        return 1;
    }
    FILE *out = fopen(out_path, "wb");
    if (!out) {
        fprintf(stderr, "generate: output %s: %s\n", out_path, strerror(errno));
        return 1;
    }
    buf_t line_out = {0};
    size_t i = 0;
    long long line_no = 0;
    while (i < psize) {
        size_t start = i;
        while (i < psize && prompts[i] != '\n') i++;
        size_t end = i;
        if (i < psize) i++; /* the newline */
        line_no++;
        size_t k = start;
        while (k < end && (prompts[k] == ' ' || prompts[k] == '\t' || prompts[k] == '\r')) k++;
        if (k == end) continue;
        line_out.len = 0;
        run_line(&m, (const unsigned char *)prompts + start, end - start, line_no, default_max, &line_out);
        if (fwrite(line_out.p, 1, line_out.len, out) != line_out.len) {
            fprintf(stderr, "generate: output %s: write failed\n", out_path);
            return 1;
        }
    }
    if (fclose(out) != 0) {
        fprintf(stderr, "generate: output %s: %s\n", out_path, strerror(errno));
        return 1;
    }
    return 0;
}
