/* Row-independent CPU kernels of the decode route (AVX2 + FMA + F16C; built by kernels/cpu_build.py).
 *
 * Every kernel here computes each row of its output from that row's inputs alone, reducing in one fixed order
 * that depends only on the shapes (K, head_dim, key count), never on how many rows share the call, where a row
 * sits, or how columns are split across threads. So a row of a verify pass is bit-identical to the same token
 * decoded alone, by construction: no padding, no probe of a BLAS's blocking.
 *
 * Layouts: row-major, contiguous. dtype codes: 0 = float32, 1 = bfloat16 (uint16 storage), 2 = int8 weights.
 * Not here: choosing when to call these (kernels/decode_linear.py, kernels/decode_attention.py) or any check
 * of the arguments (the Python wrappers check shapes and dtypes before the call).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define F32 0
#define BF16 1
#define I8 2  /* weights only: int8 with a float32 scale per output row, applied after the row's sum */
#define PACKED 3  /* weights only: bf16 in column blocks of 32, K in pairs (sl_pack_bf16), for VDPBF16PS */
#define PACKED_I8 4  /* weights only: int8 in the same layout (sl_pack_i8), with a float32 scale per column */
#define PACK_COLS 32

static inline __m256 load8(const void *p, int dt) {
    if (dt == I8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
    if (dt == BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)p);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)p);
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {  /* round to nearest even, as torch does; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* 8 float32 values into p in dtype dt (float32 or bf16), rounding as f32_to_bf16 does, lane by lane */
static inline void store8(void *p, __m256 v, int dt) {
    if (dt != BF16) {
        _mm256_storeu_ps((float *)p, v);
        return;
    }
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128((__m128i *)p, packed);
}

/* Scratch on 64-byte lines: rows whose byte length is a multiple of 64 then start on a line, so no 512-bit load of
 * them straddles two (a dense layer's 8-row pass ran 10 % slower than the same kernels on torch's 64-byte-aligned
 * tensors with malloc's 16-byte alignment, bench.pass_parts on the AMD EPYC Zen 5). Freed with free(). */
static inline void *alloc64(size_t bytes) {
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

static inline float get1(const void *p, int64_t i, int dt) {
    if (dt == I8) return (float)((const int8_t *)p)[i];
    return dt == BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void put1(void *p, int64_t i, float v, int dt) {
    if (dt == BF16) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}

/* The one horizontal sum every dot product ends with: ((0+4)+(2+6)) + ((1+5)+(3+7)). */
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---------------------------------------------------------------- linear: y[r, n] = x[r, :] . w[n, :] + b[n]
 * x is first widened to float32 (exact). For every (row, column) two 8-lane float32 accumulators take the
 * 8-wide blocks of K in turn (block i into accumulator i % 2; the tail K % 8 zero-padded into one more block),
 * then hsum(acc0 + acc1), then the bias: the same sequence of roundings for every row count. Columns are read
 * one at a time, front to back: one sequential stream is what the AVX2 EPYC prefetched best (a probe of tile
 * shapes on 2026-11-30, not kept in the repository, found four interleaved columns slower; the kernel as built is
 * measured by `python -m bench.linear_rows`). Up to 4 rows share each weight load; rows 5-8 read the column
 * again from L1. */

static inline __attribute__((always_inline)) void tile(const float *x, const void *w, int wdt, int64_t K,
                                                        int64_t n, int R, float *out) {
    __m256 a0[4], a1[4];
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    const int64_t es = wdt == I8 ? 1 : wdt == BF16 ? 2 : 4;
    const char *wb = (const char *)w + n * K * es;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const __m256 w0 = load8(wb + k * es, wdt), w1 = load8(wb + (k + 8) * es, wdt);
        for (int r = 0; r < R; r++) {
            a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * K + k), a0[r]);
            a1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * K + k + 8), a1[r]);
        }
    }
    int odd = 0;  /* which accumulator the next block goes to */
    if (k + 8 <= K) {
        const __m256 w0 = load8(wb + k * es, wdt);
        for (int r = 0; r < R; r++) a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * K + k), a0[r]);
        k += 8;
        odd = 1;
    }
    if (k < K) {
        float wt[8], xt[8];
        for (int j = 0; j < 8; j++) wt[j] = k + j < K ? get1(w, n * K + k + j, wdt) : 0.0f;
        const __m256 wv = _mm256_loadu_ps(wt);
        for (int r = 0; r < R; r++) {
            for (int j = 0; j < 8; j++) xt[j] = k + j < K ? x[r * K + k + j] : 0.0f;
            if (odd) a1[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xt), a1[r]);
            else a0[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xt), a0[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum(_mm256_add_ps(a0[r], a1[r]));
}

/* int8 weights: the same contract, another fixed order. Two accumulators each take a 16-wide pair of blocks per
 * 32-step as one product-then-fma before a single add (w0*x0, + w1*x1, then acc += that): int8 weights are
 * half the bytes of bf16, and one FMA chain per accumulator would bound a one-row pass by its latency, not by
 * memory. The last partial step is zero-padded to 32. */
static inline __attribute__((always_inline)) void tile_i8(const float *x, const void *w, int64_t K, int64_t n,
                                                           int R, float *out) {
    __m256 a0[4], a1[4];
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    const int8_t *wb = (const int8_t *)w + n * K;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        const __m256 w0 = load8(wb + k, I8), w1 = load8(wb + k + 8, I8), w2 = load8(wb + k + 16, I8),
                     w3 = load8(wb + k + 24, I8);
        for (int r = 0; r < R; r++) {
            const float *xr = x + r * K + k;
            const __m256 p = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), _mm256_mul_ps(w0, _mm256_loadu_ps(xr)));
            const __m256 q = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xr + 24), _mm256_mul_ps(w2, _mm256_loadu_ps(xr + 16)));
            a0[r] = _mm256_add_ps(a0[r], p);
            a1[r] = _mm256_add_ps(a1[r], q);
        }
    }
    if (k < K) {
        float wt[32], xt[32];
        for (int j = 0; j < 32; j++) wt[j] = k + j < K ? (float)wb[k + j] : 0.0f;
        const __m256 w0 = _mm256_loadu_ps(wt), w1 = _mm256_loadu_ps(wt + 8), w2 = _mm256_loadu_ps(wt + 16),
                     w3 = _mm256_loadu_ps(wt + 24);
        for (int r = 0; r < R; r++) {
            for (int j = 0; j < 32; j++) xt[j] = k + j < K ? x[r * K + k + j] : 0.0f;
            const __m256 p = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), _mm256_mul_ps(w0, _mm256_loadu_ps(xt)));
            const __m256 q = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt + 24), _mm256_mul_ps(w2, _mm256_loadu_ps(xt + 16)));
            a0[r] = _mm256_add_ps(a0[r], p);
            a1[r] = _mm256_add_ps(a1[r], q);
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum(_mm256_add_ps(a0[r], a1[r]));
}

#define TILE(X, R, OUT) (wdt == I8 ? tile_i8(X, w, K, n, R, OUT) : tile(X, w, wdt, K, n, R, OUT))

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
/* ---------------------------------------------------------------- linear on AVX512-BF16 (bf16 rows only)
 * Built where the CPU has AVX512-BF16 (kernels/cpu_build.py picks the flags). For bf16 rows times bf16 weights,
 * or int8 weights widened exactly to bf16 (|q| <= 127 has 7 significant bits), VDPBF16PS multiplies 32 pairs per
 * instruction into 16 float32 lanes. Its order, per (row, column): one accumulator takes K's 32-wide blocks front
 * to back (the tail zero-masked), lane i adding the products of pairs 2i+1 then 2i as the instruction defines
 * (denormal inputs read as zero, as VDPBF16PS always does), then hsum16: the same roundings whatever the row count,
 * the tile a row lands in or the thread split, so rows stay independent by construction. The products are exact
 * (8 x 8 significant bits); only the accumulation rounds, as in the AVX2 kernel. A tile is NC columns x R rows:
 * every weight block is loaded once for the tile's R rows and every row block once for its NC columns. */

static inline float hsum16(__m512 v) {
    return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

static inline __m512i wblock(const void *w, int wdt, int64_t at, int64_t left) {
    if (wdt == BF16) {
        const uint16_t *p = (const uint16_t *)w + at;
        return left >= 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16((__mmask32)((1u << left) - 1u), p);
    }
    const int8_t *p = (const int8_t *)w + at;
    __m128i lo, hi;
    if (left >= 32) {
        lo = _mm_loadu_si128((const __m128i *)p);
        hi = _mm_loadu_si128((const __m128i *)(p + 16));
    } else {
        lo = _mm_maskz_loadu_epi8((__mmask16)(left >= 16 ? 0xffffu : (1u << left) - 1u), p);
        hi = _mm_maskz_loadu_epi8((__mmask16)(left <= 16 ? 0u : (1u << (left - 16)) - 1u), p + 16);
    }
    const __m512 flo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), fhi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
    return (__m512i)_mm512_cvtne2ps_pbh(fhi, flo);  /* [flo, fhi]: element order kept */
}

static inline __m512i xblock(const uint16_t *x, int64_t left) {
    return left >= 32 ? _mm512_loadu_si512(x) : _mm512_maskz_loadu_epi16((__mmask32)((1u << left) - 1u), x);
}

/* s[r] = row r . column n for R rows of x (bf16, row stride K): blocks 0, 2, 4, ... into one accumulator and 1, 3,
 * 5, ... into another (two chains per row, so one row is not bound by the instruction's latency), then hsum16 of
 * their sum. */
static inline __attribute__((always_inline)) void tile_bf(const uint16_t *x, const void *w, int wdt, int64_t K,
                                                           int64_t n, int R, float *s) {
    __m512 a0[8], a1[8];
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    const int64_t at = n * K;
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        const __m512i w0 = wblock(w, wdt, at + k, 64), w1 = wblock(w, wdt, at + k + 32, 64);
        for (int r = 0; r < R; r++) {
            a0[r] = _mm512_dpbf16_ps(a0[r], (__m512bh)w0, (__m512bh)xblock(x + r * K + k, 64));
            a1[r] = _mm512_dpbf16_ps(a1[r], (__m512bh)w1, (__m512bh)xblock(x + r * K + k + 32, 64));
        }
    }
    if (k < K) {  /* one or two more blocks, the last zero-masked: block parity decides the accumulator */
        const __m512i w0 = wblock(w, wdt, at + k, K - k);
        for (int r = 0; r < R; r++) a0[r] = _mm512_dpbf16_ps(a0[r], (__m512bh)w0, (__m512bh)xblock(x + r * K + k, K - k));
        if (k + 32 < K) {
            const __m512i w1 = wblock(w, wdt, at + k + 32, K - k - 32);
            for (int r = 0; r < R; r++)
                a1[r] = _mm512_dpbf16_ps(a1[r], (__m512bh)w1, (__m512bh)xblock(x + r * K + k + 32, K - k - 32));
        }
    }
    for (int r = 0; r < R; r++) s[r] = hsum16(_mm512_add_ps(a0[r], a1[r]));
}

/* Columns [n0, n1) of up to 8 rows into y (row stride ys, column n at n - y0). */
static void linear_block_bf(const uint16_t *x, int R, const void *w, int wdt, const float *ws, const void *b,
                            int bdt, void *y, int ydt, int64_t K, int64_t ys, int64_t y0, int64_t n0, int64_t n1) {
    float s[8];
    for (int64_t n = n0; n < n1; n++) {
        switch (R) {  /* constant row counts, so the accumulators stay in registers */
        case 1: tile_bf(x, w, wdt, K, n, 1, s); break;
        case 2: tile_bf(x, w, wdt, K, n, 2, s); break;
        case 3: tile_bf(x, w, wdt, K, n, 3, s); break;
        case 4: tile_bf(x, w, wdt, K, n, 4, s); break;
        case 5: tile_bf(x, w, wdt, K, n, 5, s); break;
        case 6: tile_bf(x, w, wdt, K, n, 6, s); break;
        case 7: tile_bf(x, w, wdt, K, n, 7, s); break;
        default: tile_bf(x, w, wdt, K, n, 8, s); break;
        }
        const float bias = b ? get1(b, n, bdt) : 0.0f;
        for (int r = 0; r < R; r++) {
            const float v = ws ? s[r] * ws[n] : s[r];
            put1(y, (int64_t)r * ys + n - y0, b ? v + bias : v, ydt);
        }
    }
}

/* ---------------------------------------------------------------- linear over packed bf16 weights
 * The weight [N, K] stored as ceil(N/32) column blocks, each [K/2][32][2]: for pair p of the reduction, the 32
 * columns' elements 2p and 2p+1 side by side (sl_pack_bf16; columns past N are zero). One 64-byte load then holds
 * two pairs for 16 columns, and VDPBF16PS with the row's pair broadcast adds x[2p+1] w[2p+1] then x[2p] w[2p] into
 * one float32 lane per column. Per (row, column) the order is fixed: pairs 0, 1, ..., K/2 - 1 into one
 * accumulator lane, then the bias; no horizontal sum, no dependence on the row count, the tile a row lands in or
 * the thread split, so rows stay independent by construction. A block is streamed once for up to 8 rows and
 * stays in L1 for the next 8, so the same loop serves a wide prefill chunk (one GEMM's worth of work). */
#define PREFETCH_AHEAD 4096  /* bytes: how far ahead of the block's stream a load is asked for */

static inline void store16(void *p, __m512 v, int dt, __mmask16 m) {
    if (dt != BF16) {
        _mm512_mask_storeu_ps(p, m, v);
        return;
    }
    const __m512i u = _mm512_castps_si512(v);  /* f32_to_bf16 lane by lane: nearest even, NaN kept quiet */
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(r));
}

/* 32 int8 weights (16 columns' pairs, in order) as 32 bf16, exactly: |q| <= 127 has 7 significant bits */
static inline __m512i i8_to_bf16(__m256i q) {
    const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
    const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
    return (__m512i)_mm512_cvtne2ps_pbh(f1, f0);
}

/* a0[r], a1[r]: the sums of columns 0-15 and 16-31 of the block at wb for R rows of x (the pair loop) */
static inline __attribute__((always_inline)) void pdot(const uint16_t *x, int R, const void *wb, int q8, int64_t K,
                                                        __m512 *a0, __m512 *a1) {
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    const uint32_t *xp = (const uint32_t *)x;
    const int64_t P = K / 2, step = q8 ? 2 * PACK_COLS : 4 * PACK_COLS;  /* bytes a pair of 32 columns */
    for (int64_t p = 0; p < P; p++) {
        const char *at = (const char *)wb + p * step;
        __m512i w0, w1;
        if (q8) {
            const __m512i q = _mm512_load_si512(at);
            w0 = i8_to_bf16(_mm512_castsi512_si256(q));
            w1 = i8_to_bf16(_mm512_extracti64x4_epi64(q, 1));
            _mm_prefetch(at + PREFETCH_AHEAD, _MM_HINT_T0);
        } else {
            w0 = _mm512_load_si512(at);
            w1 = _mm512_load_si512(at + 64);
            _mm_prefetch(at + PREFETCH_AHEAD, _MM_HINT_T0);
            _mm_prefetch(at + PREFETCH_AHEAD + 64, _MM_HINT_T0);
        }
        for (int r = 0; r < R; r++) {
            const __m512i xb = _mm512_set1_epi32((int)xp[r * P + p]);
            a0[r] = _mm512_dpbf16_ps(a0[r], (__m512bh)w0, (__m512bh)xb);
            a1[r] = _mm512_dpbf16_ps(a1[r], (__m512bh)w1, (__m512bh)xb);
        }
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
/* ---------------------------------------------------------------- packed blocks on AMX tiles
 * Built where the CPU has AMX-BF16 (the `amx` build; sl_amx_init must have had the kernel's leave to use tile data).
 * The packed layout is already what TDPBF16PS reads as its weight operand: 16 pairs of one 32-column block, for
 * columns 0-15 or 16-31, are 16 rows of 64 bytes at a stride of 128 (int8 blocks are widened exactly to bf16 into
 * that shape first, 16 pairs at a time). Per call: up to 16 rows of x as one tile, two accumulator tiles (columns
 * 0-15, 16-31), the block's pairs 16 at a time. The instruction makes each (row, column) sum from that row and column
 * alone, in an order fixed by K, so a row's sums do not depend on the rows beside it or on how many there are
 * (tests/kernels/test_packed.py holds row counts 1 to 80 to it). The tiles round differently from VDPBF16PS, so in
 * this build every packed block with K a multiple of 32 goes through here, one row or many, the output head's too:
 * the decode and the verify pass take the same sums. A 16-row block costs about what a 1-row one does here (the
 * weights' stream binds), where VDPBF16PS costs about one more pass of the block every 4 rows. */
#define HAVE_AMX 1
#define AMX_ROWS 16
#define AMX_PAIRS 16

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

static int amx_ready;  /* the kernel gave this process the tile data (sl_amx_init) */
/* The tile configuration a thread last loaded, by the entry call it was loaded in (amx_epoch, bumped at each entry
 * that may sum on tiles) and its row count: loading it costs about a tenth of a 32-column block's sums, so it is
 * loaded once a call and row count; a new call loads again, since another library's AMX code (oneDNN's) may have
 * loaded its own on this thread in between. */
static int amx_epoch;
static __thread int amx_thread_epoch = -1, amx_thread_rows;

static inline void amx_enter(void) { __atomic_add_fetch(&amx_epoch, 1, __ATOMIC_RELAXED); }

/* whether the block sums of a packed weight go through the tiles: decided by the build and the shape alone */
static inline int amx_serves(int64_t K) { return amx_ready && K % (2 * AMX_PAIRS) == 0; }

/* The tile configuration for R rows (1..16): tiles 0-3 sums of R rows x 16 float32, tile 4 R rows of 16 bf16 pairs,
 * tiles 5-7 16 pairs x 16 columns. Loaded where this thread's is not that (amx_epoch above). */
static inline void amx_rows(int R) {
    const int epoch = __atomic_load_n(&amx_epoch, __ATOMIC_RELAXED);
    if (amx_thread_epoch == epoch && amx_thread_rows == R) return;
    amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 5; t++) {
        c.rows[t] = (uint8_t)R;
        c.colsb[t] = 64;
    }
    c.rows[5] = c.rows[6] = c.rows[7] = AMX_PAIRS;
    c.colsb[5] = c.colsb[6] = c.colsb[7] = 64;
    _tile_loadconfig(&c);
    amx_thread_epoch = epoch;
    amx_thread_rows = R;
}

/* s[r * 32 + c] = row r of x (R <= 16 rows, row stride K) . column c of the packed block at wb; int8 weights (q8)
 * are widened exactly to bf16, 16 pairs at a time, into a scratch tile that stays in L1 (as pdot widens them) */
static void amx_dot(const uint16_t *x, int R, const void *wb, int q8, int64_t K, float *s) {
    uint16_t wide[AMX_PAIRS * 2 * PACK_COLS] __attribute__((aligned(64)));
    amx_rows(R);
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t p = 0; p < K / 2; p += AMX_PAIRS) {
        const char *at = (const char *)wb + p * 4 * PACK_COLS;
        if (q8) {
            const char *q = (const char *)wb + p * 2 * PACK_COLS;
            for (int i = 0; i < AMX_PAIRS; i++) {
                const __m512i v = _mm512_load_si512(q + i * 2 * PACK_COLS);
                _mm_prefetch(q + i * 2 * PACK_COLS + PREFETCH_AHEAD, _MM_HINT_T0);
                _mm512_store_si512(wide + i * 2 * PACK_COLS, i8_to_bf16(_mm512_castsi512_si256(v)));
                _mm512_store_si512(wide + i * 2 * PACK_COLS + 32, i8_to_bf16(_mm512_extracti64x4_epi64(v, 1)));
            }
            at = (const char *)wide;
        }
        _tile_loadd(6, at, 4 * PACK_COLS);
        _tile_loadd(7, at + 64, 4 * PACK_COLS);
        _tile_loadd(4, x + 2 * p, K * 2);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
    }
    _tile_stored(0, s, 4 * PACK_COLS);
    _tile_stored(1, s + 16, 4 * PACK_COLS);
}

#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Ask the kernel for the tile data (Linux keeps AMX off until a process asks). 0: granted; the build's packed
 * blocks then take the tiles. kernels/cpu_build.py calls it once at load and falls back to the avx512bf16 build
 * where it is refused. */
int sl_amx_init(void) {
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 1;
    amx_ready = 1;
    return 0;
}
#else
#define HAVE_AMX 0
#define AMX_ROWS 8
static inline int amx_serves(int64_t K) {
    (void)K;
    return 0;
}
static inline void amx_dot(const uint16_t *x, int R, const void *wb, int q8, int64_t K, float *s) {
    (void)x, (void)R, (void)wb, (void)q8, (void)K, (void)s;
}
static inline void amx_enter(void) {}
#endif

/* one row's sums of a block (columns 0-15, 16-31), times the column's scale (int8), plus the bias: as sl_linear_q */
static inline __attribute__((always_inline)) void pstore(__m512 a0, __m512 a1, const __m512 *scale, const __m512 *bias,
                                                          char *row, int ydt, int64_t es, __mmask16 m0, __mmask16 m1) {
    const __m512 v0 = scale ? _mm512_mul_ps(a0, scale[0]) : a0, v1 = scale ? _mm512_mul_ps(a1, scale[1]) : a1;
    store16(row, bias ? _mm512_add_ps(v0, bias[0]) : v0, ydt, m0);
    if (m1) store16(row + 16 * es, bias ? _mm512_add_ps(v1, bias[1]) : v1, ydt, m1);
}

static inline __attribute__((always_inline)) void ptile(const uint16_t *x, int R, const void *wb, int q8, int64_t K,
                                                         const __m512 *scale, const __m512 *bias, void *y, int ydt,
                                                         int64_t N, int64_t n0) {
    const int64_t left = N - n0, es = ydt == BF16 ? 2 : 4;
    const __mmask16 m0 = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1u);
    const __mmask16 m1 = left >= 32 ? 0xffff : (left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1u));
    if (amx_serves(K)) {
        float s[AMX_ROWS * PACK_COLS] __attribute__((aligned(64)));
        amx_dot(x, R, wb, q8, K, s);
        for (int r = 0; r < R; r++)
            pstore(_mm512_load_ps(s + r * PACK_COLS), _mm512_load_ps(s + r * PACK_COLS + 16), scale, bias,
                   (char *)y + (r * N + n0) * es, ydt, es, m0, m1);
        return;
    }
    __m512 a0[8], a1[8];
    pdot(x, R, wb, q8, K, a0, a1);
    for (int r = 0; r < R; r++) pstore(a0[r], a1[r], scale, bias, (char *)y + (r * N + n0) * es, ydt, es, m0, m1);
}

static inline void widen32(const void *src, int dt, int64_t n0, int64_t N, __m512 *out) {
    float t[PACK_COLS] = {0};
    for (int64_t c = 0; c < PACK_COLS && n0 + c < N; c++) t[c] = get1(src, n0 + c, dt);
    out[0] = _mm512_loadu_ps(t);
    out[1] = _mm512_loadu_ps(t + 16);
}

static void packed_block(const uint16_t *x, int64_t M, const void *wp, int q8, const float *ws, const void *b,
                         int bdt, void *y, int ydt, int64_t K, int64_t N, int64_t nb) {
    const void *wb = (const char *)wp + nb * K * PACK_COLS * (q8 ? 1 : 2);
    const int64_t n0 = nb * PACK_COLS, es = ydt == BF16 ? 2 : 4;
    __m512 bias[2], scale[2];
    if (b) widen32(b, bdt, n0, N, bias);
    if (ws) widen32(ws, F32, n0, N, scale);
    const __m512 *bp = b ? bias : NULL, *sp = ws ? scale : NULL;
    if (amx_serves(K)) {  /* the tiles take up to 16 rows a call; no registers to keep */
        for (int64_t m0 = 0; m0 < M; m0 += AMX_ROWS)
            ptile(x + m0 * K, (int)(M - m0 < AMX_ROWS ? M - m0 : AMX_ROWS), wb, q8, K, sp, bp,
                  (char *)y + m0 * N * es, ydt, N, n0);
        return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += 8) {
        const uint16_t *xr = x + m0 * K;
        void *yr = (char *)y + m0 * N * es;
        switch (M - m0 < 8 ? M - m0 : 8) {  /* constant row counts, so the accumulators stay in registers */
        case 1: ptile(xr, 1, wb, q8, K, sp, bp, yr, ydt, N, n0); break;
        case 2: ptile(xr, 2, wb, q8, K, sp, bp, yr, ydt, N, n0); break;
        case 3: ptile(xr, 3, wb, q8, K, sp, bp, yr, ydt, N, n0); break;
        case 4: ptile(xr, 4, wb, q8, K, sp, bp, yr, ydt, N, n0); break;
        case 5: ptile(xr, 5, wb, q8, K, sp, bp, yr, ydt, N, n0); break;
        case 6: ptile(xr, 6, wb, q8, K, sp, bp, yr, ydt, N, n0); break;
        case 7: ptile(xr, 7, wb, q8, K, sp, bp, yr, ydt, N, n0); break;
        default: ptile(xr, 8, wb, q8, K, sp, bp, yr, ydt, N, n0); break;
        }
    }
}

/* y[M, N] = x[M, K] @ W.T (* ws[N] for int8) (+ b) for W packed by sl_pack_bf16 (wdt PACKED) or sl_pack_i8
 * (wdt PACKED_I8), 64-byte aligned; bf16 rows, K even, any M. threads > 1 split column blocks. Returns 4 where the
 * build or the arguments cannot serve it. */
int sl_linear_packed(const void *x, int xdt, const void *wp, int wdt, const float *ws, const void *b, int bdt,
                     void *y, int ydt, int64_t M, int64_t K, int64_t N, int threads) {
    const int q8 = wdt == PACKED_I8;
    if (xdt != BF16 || (K & 1) || ((uintptr_t)wp & 63) || (wdt != PACKED && !q8) || (q8 != (ws != NULL))) return 4;
    const int64_t blocks = (N + PACK_COLS - 1) / PACK_COLS;
    amx_enter();
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && blocks >= 8)
    for (int64_t nb = 0; nb < blocks; nb++)
        packed_block((const uint16_t *)x, M, wp, q8, ws, b, bdt, y, ydt, K, N, nb);
    return 0;
}

#if defined(__AVX512VNNI__)
/* ---------------------------------------------------------------- int8 rows times int8 weights (VPDPBUSD)
 * For proposals only (a drafter's head: the target verifies every token), never for the target's own rows.
 * Each row of x (bf16) is quantized to int8 on the fly: s = max|x| / 127, q_k = round-half-even(x_k * (127 /
 * max|x|)); stored offset by 128 as an unsigned byte. Weights are int8 with a float32 scale per output column,
 * packed by sl_pack_q8: block j of 32 columns, quad p of the reduction, column c, element e at
 * ((j K/4 + p) 32 + c) 4 + e; rowsum[n] = sum_k w[n, k]. The exact int32 sum acc = sum_k (q_k + 128) w[n, k] gives
 * y[n] = (float)(acc - 128 rowsum[n]) * (s * ws[n]), float32. Each (row, column) is integer arithmetic, exact in any
 * order, then one rounding: rows do not depend on the rows beside them. K % 4 == 0. */
static void q8_quantize(const uint16_t *x, int64_t K, uint8_t *q, float *s) {
    float amax = 0.0f;
    for (int64_t k = 0; k < K; k++) {
        const float a = fabsf(bf16_to_f32(x[k]));
        amax = a > amax ? a : amax;
    }
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t k = 0; k < K; k++) q[k] = (uint8_t)((int)nearbyintf(bf16_to_f32(x[k]) * inv) + 128);
    *s = amax / 127.0f;
}

static inline __attribute__((always_inline)) void q8tile(const uint8_t *xq, int R, const int8_t *wb, int64_t K,
                                                         const float *sx, const float *ws, const int32_t *rs,
                                                         float *y, int64_t N, int64_t n0) {
    __m512i a0[8], a1[8];
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm512_setzero_si512();
    const int64_t Q = K / 4;
    for (int64_t p = 0; p < Q; p++) {
        const int8_t *at = wb + p * 4 * PACK_COLS;
        const __m512i w0 = _mm512_load_si512(at), w1 = _mm512_load_si512(at + 64);
        _mm_prefetch((const char *)at + PREFETCH_AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)at + PREFETCH_AHEAD + 64, _MM_HINT_T0);
        for (int r = 0; r < R; r++) {
            int32_t quad;
            memcpy(&quad, xq + r * K + 4 * p, 4);
            const __m512i xb = _mm512_set1_epi32(quad);
            a0[r] = _mm512_dpbusd_epi32(a0[r], xb, w0);
            a1[r] = _mm512_dpbusd_epi32(a1[r], xb, w1);
        }
    }
    const int64_t left = N - n0;
    const __mmask16 m0 = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1u);
    const __mmask16 m1 = left >= 32 ? 0xffff : (left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1u));
    const __m512i r0 = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m0, rs + n0), 7);  /* 128 rowsum */
    const __m512i r1 = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m1, rs + n0 + 16), 7);
    const __m512 s0 = _mm512_maskz_loadu_ps(m0, ws + n0), s1 = _mm512_maskz_loadu_ps(m1, ws + n0 + 16);
    for (int r = 0; r < R; r++) {  /* (float)(acc - 128 rowsum) * (s * ws), lane by lane */
        const __m512 sr = _mm512_set1_ps(sx[r]);
        const __m512 v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a0[r], r0)), _mm512_mul_ps(sr, s0));
        const __m512 v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a1[r], r1)), _mm512_mul_ps(sr, s1));
        _mm512_mask_storeu_ps(y + r * N + n0, m0, v0);
        if (m1) _mm512_mask_storeu_ps(y + r * N + n0 + 16, m1, v1);
    }
}

int sl_linear_q8(const void *x, const int8_t *wp, const float *ws, const int32_t *rowsum, float *y, int64_t M,
                 int64_t K, int64_t N, int threads) {
    if ((K & 3) || ((uintptr_t)wp & 63)) return 4;
    uint8_t *xq = (uint8_t *)alloc64((size_t)(M * K));
    float *sx = (float *)malloc((size_t)M * sizeof(float));
    if (!xq || !sx) {
        free(xq);
        free(sx);
        return 1;
    }
    for (int64_t r = 0; r < M; r++) q8_quantize((const uint16_t *)x + r * K, K, xq + r * K, sx + r);
    const int64_t blocks = (N + PACK_COLS - 1) / PACK_COLS;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && blocks >= 8)
    for (int64_t nb = 0; nb < blocks; nb++) {
        const int8_t *wb = wp + nb * K * PACK_COLS;
        const int64_t n0 = nb * PACK_COLS;
        for (int64_t m0 = 0; m0 < M; m0 += 8) {
            const uint8_t *xr = xq + m0 * K;
            float *yr = y + m0 * N;
            const float *sr = sx + m0;
            switch (M - m0 < 8 ? M - m0 : 8) {
            case 1: q8tile(xr, 1, wb, K, sr, ws, rowsum, yr, N, n0); break;
            case 2: q8tile(xr, 2, wb, K, sr, ws, rowsum, yr, N, n0); break;
            case 3: q8tile(xr, 3, wb, K, sr, ws, rowsum, yr, N, n0); break;
            case 4: q8tile(xr, 4, wb, K, sr, ws, rowsum, yr, N, n0); break;
            case 5: q8tile(xr, 5, wb, K, sr, ws, rowsum, yr, N, n0); break;
            case 6: q8tile(xr, 6, wb, K, sr, ws, rowsum, yr, N, n0); break;
            case 7: q8tile(xr, 7, wb, K, sr, ws, rowsum, yr, N, n0); break;
            default: q8tile(xr, 8, wb, K, sr, ws, rowsum, yr, N, n0); break;
            }
        }
    }
    free(xq);
    free(sx);
    return 0;
}
#define HAVE_VNNI 1
#else
#define HAVE_VNNI 0
#endif
#define HAVE_BF 1
#else
#define HAVE_BF 0
#endif
#ifndef HAVE_AMX
#define HAVE_AMX 0
#endif
#if !HAVE_AMX
int sl_amx_init(void) { return 1; }  /* this build has no tile code: nothing to ask for */
#endif

#if !HAVE_BF
static inline void amx_enter(void) {}
int sl_linear_packed(const void *x, int xdt, const void *wp, int wdt, const float *ws, const void *b, int bdt,
                     void *y, int ydt, int64_t M, int64_t K, int64_t N, int threads) {
    (void)x; (void)xdt; (void)wp; (void)wdt; (void)ws; (void)b; (void)bdt; (void)y; (void)ydt; (void)M; (void)K;
    (void)N; (void)threads;
    return 4;  /* packed weights need VDPBF16PS: the AVX512-BF16 build */
}
#endif

#if !HAVE_VNNI
int sl_linear_q8(const void *x, const int8_t *wp, const float *ws, const int32_t *rowsum, float *y, int64_t M,
                 int64_t K, int64_t N, int threads) {
    (void)x; (void)wp; (void)ws; (void)rowsum; (void)y; (void)M; (void)K; (void)N; (void)threads;
    return 4;  /* int8 rows need VPDPBUSD: the AVX512-BF16 build (every such CPU has AVX512-VNNI) */
}
#endif

/* out = w [N, K] int8 packed for sl_linear_q8 (layout above; columns past N zero), rowsum[n] = sum_k w[n, k]. */
int sl_pack_q8(const int8_t *w, int64_t N, int64_t K, int8_t *out, int32_t *rowsum) {
    if (K & 3) return 4;
    const int64_t blocks = (N + PACK_COLS - 1) / PACK_COLS, Q = K / 4;
    for (int64_t j = 0; j < blocks; j++)
        for (int64_t c = 0; c < PACK_COLS; c++) {
            const int64_t n = j * PACK_COLS + c;
            int32_t sum = 0;
            for (int64_t p = 0; p < Q; p++)
                for (int e = 0; e < 4; e++) {
                    const int8_t v = n < N ? w[n * K + 4 * p + e] : 0;
                    out[((j * Q + p) * PACK_COLS + c) * 4 + e] = v;
                    sum += v;
                }
            if (n < N) rowsum[n] = sum;
        }
    return 0;
}

/* out = w [N, K] packed for sl_linear_packed: block j, pair p, column c, element e at
 * ((j K/2 + p) 32 + c) 2 + e holds w[32 j + c, 2 p + e]; columns past N are zero. K even. */
#define PACK_BODY(T)                                                                              \
    const int64_t blocks = (N + PACK_COLS - 1) / PACK_COLS, P = K / 2;                            \
    for (int64_t j = 0; j < blocks; j++)                                                          \
        for (int64_t c = 0; c < PACK_COLS; c++) {                                                 \
            const int64_t n = j * PACK_COLS + c;                                                  \
            for (int64_t p = 0; p < P; p++) {                                                     \
                T *o = out + ((j * P + p) * PACK_COLS + c) * 2;                                   \
                o[0] = n < N ? w[n * K + 2 * p] : 0;                                              \
                o[1] = n < N ? w[n * K + 2 * p + 1] : 0;                                          \
            }                                                                                     \
        }

int sl_pack_bf16(const uint16_t *w, int64_t N, int64_t K, uint16_t *out) {
    if (K & 1) return 4;
    PACK_BODY(uint16_t)
    return 0;
}

int sl_pack_i8(const int8_t *w, int64_t N, int64_t K, int8_t *out) {
    if (K & 1) return 4;
    PACK_BODY(int8_t)
    return 0;
}

/* Columns [n0, n1) of up to 8 rows into y (row stride ys, column n at n - y0). */
static void linear_block(const float *x, int R, const void *w, int wdt, const float *ws, const void *b, int bdt,
                         void *y, int ydt, int64_t K, int64_t ys, int64_t y0, int64_t n0, int64_t n1) {
    float s[8];
    for (int64_t n = n0; n < n1; n++) {
        switch (R) {  /* constant row counts, so the accumulators stay in registers */
        case 1: TILE(x, 1, s); break;
        case 2: TILE(x, 2, s); break;
        case 3: TILE(x, 3, s); break;
        case 4: TILE(x, 4, s); break;
        case 5: TILE(x, 4, s); TILE(x + 4 * K, 1, s + 4); break;
        case 6: TILE(x, 4, s); TILE(x + 4 * K, 2, s + 4); break;
        case 7: TILE(x, 4, s); TILE(x + 4 * K, 3, s + 4); break;
        default: TILE(x, 4, s); TILE(x + 4 * K, 4, s + 4); break;
        }
        const float bias = b ? get1(b, n, bdt) : 0.0f;
        for (int r = 0; r < R; r++) {
            const float v = ws ? s[r] * ws[n] : s[r];
            put1(y, (int64_t)r * ys + n - y0, b ? v + bias : v, ydt);
        }
    }
}

static float *widen(const void *src, int dt, int64_t n, float *buf) {
    if (dt == F32) return (float *)src;
    const uint16_t *h = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++) buf[i] = bf16_to_f32(h[i]);
    return buf;
}

/* y[M, N] = x[M, K] @ w[N, K].T (* ws[N] for int8 weights) (+ b[N]). threads > 1 splits columns (never a row's
 * reduction). */
int sl_linear_q(const void *x, int xdt, const void *w, int wdt, const float *ws, const void *b, int bdt, void *y,
                int ydt, int64_t M, int64_t K, int64_t N, int threads) {
    if (wdt == PACKED || wdt == PACKED_I8) return sl_linear_packed(x, xdt, w, wdt, ws, b, bdt, y, ydt, M, K, N, threads);
    if ((wdt == I8) != (ws != NULL)) return 3;
#if HAVE_BF
    if (xdt == BF16 && (wdt == BF16 || wdt == I8)) {
        const int64_t ys = ydt == BF16 ? 2 : 4;
        for (int64_t m0 = 0; m0 < M; m0 += 8) {
            const int R = (int)(M - m0 < 8 ? M - m0 : 8);
            const uint16_t *xr = (const uint16_t *)x + m0 * K;
            void *yr = (char *)y + m0 * N * ys;
            if (threads <= 1 || N < 256) {
                linear_block_bf(xr, R, w, wdt, ws, b, bdt, yr, ydt, K, N, 0, 0, N);
            } else {
                const int64_t blocks = (N + 63) / 64;
#pragma omp parallel for num_threads(threads) schedule(static)
                for (int64_t bi = 0; bi < blocks; bi++) {
                    const int64_t a = bi * 64, e = a + 64 < N ? a + 64 : N;
                    linear_block_bf(xr, R, w, wdt, ws, b, bdt, yr, ydt, K, N, 0, a, e);
                }
            }
        }
        return 0;
    }
#endif
    float *xbuf = NULL;
    if (xdt != F32) {
        xbuf = (float *)alloc64((size_t)(M * K) * sizeof(float));
        if (!xbuf) return 1;
    }
    const float *xf = widen(x, xdt, M * K, xbuf);
    const int64_t ys = ydt == BF16 ? 2 : 4;
    for (int64_t m0 = 0; m0 < M; m0 += 8) {
        int R = (int)(M - m0 < 8 ? M - m0 : 8);
        const float *xr = xf + m0 * K;
        void *yr = (char *)y + m0 * N * ys;
        if (threads <= 1 || N < 256) {
            linear_block(xr, R, w, wdt, ws, b, bdt, yr, ydt, K, N, 0, 0, N);
        } else {
            /* column blocks of 64: a multiple of every tile width's 4, 3, 2 and 1 is not needed for exactness,
               only for speed; the split never changes which sums a column's value is made of */
            int64_t blocks = (N + 63) / 64;
#pragma omp parallel for num_threads(threads) schedule(static)
            for (int64_t bi = 0; bi < blocks; bi++) {
                int64_t a = bi * 64, e = a + 64 < N ? a + 64 : N;
                linear_block(xr, R, w, wdt, ws, b, bdt, yr, ydt, K, N, 0, a, e);
            }
        }
    }
    free(xbuf);
    return 0;
}

/* out [N, K] in odt = float(q[n, k]) * ws[n], an int8 weight dequantized (one float32 product, then the rounding
 * to bf16 as f32_to_bf16 does): the bits of `Int8Weight.dequantize`, for a wide prefill chunk's GEMM. */
int sl_dequant_i8(const int8_t *q, const float *ws, void *out, int odt, int64_t N, int64_t K, int threads) {
    const int64_t es = odt == BF16 ? 2 : 4;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t n = 0; n < N; n++) {
        const __m256 sc = _mm256_set1_ps(ws[n]);
        char *row = (char *)out + n * K * es;
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) store8(row + k * es, _mm256_mul_ps(load8(q + n * K + k, I8), sc), odt);
        for (; k < K; k++) put1(out, n * K + k, (float)q[n * K + k] * ws[n], odt);
    }
    return 0;
}

int sl_linear(const void *x, int xdt, const void *w, int wdt, const void *b, int bdt, void *y, int ydt, int64_t M,
              int64_t K, int64_t N, int threads) {
    return sl_linear_q(x, xdt, w, wdt, NULL, b, bdt, y, ydt, M, K, N, threads);
}

/* ---------------------------------------------------------------- attention over a slot's cache
 * exp for the softmax: Cephes-style range reduction + degree-6 polynomial, ~1 ulp, vectorized; the same
 * function for every element, so a row's probabilities do not depend on which SIMD lane computed them. */
static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365447505531f);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, z, x);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* q [rows, nh, hd] float32 (RoPE applied); kc, vc [slots, kvh, cap, hd] in cdt; row r attends to keys
 * 0 .. nkeys[r] - 1 of slot slot[r]; out [rows, nh, hd] in odt. hd % 8 == 0. scores[j] = (q . k_j) * scale,
 * softmax in float32 (max, exp, sum over j in order), out = sum_j p_j v_j in order, divided by the sum.
 * A job is one KV head over a run of consecutive rows of one slot (a verify lane's anchor and drafts, at most
 * ATT_ROWS) with the query heads that share the KV head (a GQA group, at most ATT_HEADS at a time): each block of
 * ATT_BLOCK keys (then values) is widened to float32 once into L1 and read by every (row, head) of the job that
 * reaches it, instead of once per row and head. Each (row, head)'s arithmetic is unchanged: one FMA chain over
 * head_dim per key, values summed key after key, so its output depends on neither the grouping, the block, nor
 * the rows beside it. */
#define ATT_BLOCK 32
#define ATT_HEADS 4
#define ATT_ROWS 32
#define ATT_QUERIES (ATT_HEADS * ATT_ROWS)

static inline void widen_block(float *dst, const char *src, int64_t keys, int64_t hd, int cdt, int64_t es) {
    for (int64_t j = 0; j < keys; j++)
        for (int64_t d = 0; d < hd; d += 8) _mm256_storeu_ps(dst + j * hd + d, load8(src + (j * hd + d) * es, cdt));
}

/* pt[j] = exp(pt[j] - mx) for j < nt, eight at a time (the tail zero-padded): the same polynomial for every
 * element, so a probability does not depend on which lane computed it */
static void exp_row(float *pt, int64_t nt, float mx) {
    const __m256 mv = _mm256_set1_ps(mx);
    int64_t j = 0;
    for (; j + 8 <= nt; j += 8) _mm256_storeu_ps(pt + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(pt + j), mv)));
    if (j < nt) {
        float tmp[8] = {0};
        for (int64_t i = j; i < nt; i++) tmp[i - j] = pt[i];
        _mm256_storeu_ps(tmp, exp8(_mm256_sub_ps(_mm256_loadu_ps(tmp), mv)));
        for (int64_t i = j; i < nt; i++) pt[i] = tmp[i - j];
    }
}

/* nq queries qs[t] [hd], query t over keys 0 .. ns[t] - 1 (ns ascending is not required); p: nq rows of
 * stride (max ns + 8) scores; o: nq outputs [hd], normalised. */
static void attend_job(const float *const *qs, const int64_t *ns, int64_t nq, const char *kb, const char *vb,
                       int cdt, int64_t es, int64_t hd, float scale, int64_t stride, float *p, float *buf, float *o) {
    int64_t n = 0;
    for (int64_t t = 0; t < nq; t++) n = ns[t] > n ? ns[t] : n;
    /* scores: p[t * stride + j]; keys in blocks, widened once for all queries */
    for (int64_t b0 = 0; b0 < n; b0 += ATT_BLOCK) {
        const int64_t mb = n - b0 < ATT_BLOCK ? n - b0 : ATT_BLOCK;
        widen_block(buf, kb + b0 * hd * es, mb, hd, cdt, es);
        for (int64_t t = 0; t < nq; t++) {
            if (ns[t] <= b0) continue;
            const int64_t m = ns[t] - b0 < mb ? ns[t] - b0 : mb;
            const float *qr = qs[t];
            float *pt = p + t * stride + b0;
            int64_t j = 0;
            for (; j + 4 <= m; j += 4) {  /* four keys in flight: four chains, each one key's fixed order */
                const float *k0 = buf + j * hd, *k1 = k0 + hd, *k2 = k1 + hd, *k3 = k2 + hd;
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t d = 0; d < hd; d += 8) {
                    const __m256 qd = _mm256_loadu_ps(qr + d);
                    a0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k0 + d), a0);
                    a1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k1 + d), a1);
                    a2 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k2 + d), a2);
                    a3 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k3 + d), a3);
                }
                pt[j] = hsum(a0) * scale;
                pt[j + 1] = hsum(a1) * scale;
                pt[j + 2] = hsum(a2) * scale;
                pt[j + 3] = hsum(a3) * scale;
            }
            for (; j < m; j++) {
                const float *kj = buf + j * hd;
                __m256 acc = _mm256_setzero_ps();
                for (int64_t d = 0; d < hd; d += 8)
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d), _mm256_loadu_ps(kj + d), acc);
                pt[j] = hsum(acc) * scale;
            }
        }
    }
    float sums[ATT_QUERIES];
    for (int64_t t = 0; t < nq; t++) {
        const int64_t nt = ns[t];
        float *pt = p + t * stride, mx = -INFINITY;
        for (int64_t j = 0; j < nt; j++) mx = pt[j] > mx ? pt[j] : mx;
        exp_row(pt, nt, mx);
        float sum = 0.0f;
        for (int64_t i = 0; i < nt; i++) sum += pt[i];
        sums[t] = sum;
        for (int64_t d = 0; d < hd; d++) o[t * hd + d] = 0.0f;
    }
    /* values: each query sums key after key into its accumulator (o), block by block */
    for (int64_t b0 = 0; b0 < n; b0 += ATT_BLOCK) {
        const int64_t mb = n - b0 < ATT_BLOCK ? n - b0 : ATT_BLOCK;
        widen_block(buf, vb + b0 * hd * es, mb, hd, cdt, es);
        for (int64_t t = 0; t < nq; t++) {
            if (ns[t] <= b0) continue;
            const int64_t m = ns[t] - b0 < mb ? ns[t] - b0 : mb;
            const float *pt = p + t * stride + b0;
            float *ot = o + t * hd;
            for (int64_t d0 = 0; d0 < hd; d0 += 64) {  /* eight accumulators in registers at a time */
                const int64_t w = hd - d0 < 64 ? hd - d0 : 64;
                __m256 acc[8];
                for (int64_t d = 0; d < w; d += 8) acc[d / 8] = _mm256_loadu_ps(ot + d0 + d);
                for (int64_t i = 0; i < m; i++) {
                    const __m256 pv = _mm256_set1_ps(pt[i]);
                    const float *vi = buf + i * hd + d0;
                    for (int64_t d = 0; d < w; d += 8) acc[d / 8] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vi + d), acc[d / 8]);
                }
                for (int64_t d = 0; d < w; d += 8) _mm256_storeu_ps(ot + d0 + d, acc[d / 8]);
            }
        }
    }
    for (int64_t t = 0; t < nq; t++) {
        const __m256 inv = _mm256_set1_ps(1.0f / sums[t]);
        for (int64_t d = 0; d < hd; d += 8)
            _mm256_storeu_ps(o + t * hd + d, _mm256_mul_ps(_mm256_loadu_ps(o + t * hd + d), inv));
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* The same job on 16 lanes (the avx512bf16 build, head_dim % 16 == 0), in another fixed order: each key block is
 * widened transposed ([head_dim][ATT_BLOCK]), so 16 keys' scores come out of one FMA chain over head_dim (d = 0,
 * 1, ...; no horizontal sum per key); the softmax's max is exact in any order, its exponentials are exp8's
 * polynomial lane for lane, its sum runs on 16 lanes (element i into lane i % 16, the tail zero) then one hsum16;
 * the values go key after key as above. With a bf16 cache the scores and the weighted values are bf16 dot
 * products (`scores_bf`, `values_bf`). Several queries' chains run side by side, each exactly its own; the
 * exponentials are exp16's. The two builds' scores and sums round differently; a (row, head) still depends on
 * nothing but its own query and keys, whatever the rows beside it (what each step gained: CHANGELOG.md). */
static inline float hsum16a(__m512 v) {
    return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

static inline __m512 load16(const void *p, int dt) {
    if (dt == BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    return _mm512_loadu_ps((const float *)p);
}

static inline void widen_block16(float *dst, const char *src, int64_t keys, int64_t hd, int cdt, int64_t es) {
    for (int64_t j = 0; j < keys; j++)
        for (int64_t d = 0; d < hd; d += 16) _mm512_storeu_ps(dst + j * hd + d, load16(src + (j * hd + d) * es, cdt));
}

/* keys j < `keys` of a block into kt[d * ATT_BLOCK + j], float32; lanes past `keys` zero */
static inline void widen_block_t(float *kt, const char *src, int64_t keys, int64_t hd, int cdt, int64_t es) {
    if (cdt == BF16) {  /* gathers: one 32-bit word per key holds its d and d + 1, 16 keys at a time */
        const __m512i step = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                _mm512_set1_epi32((int)(hd * 2)));
        const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
        for (int64_t h = 0; h < ATT_BLOCK; h += 16) {
            const int64_t left = keys - h;
            const __mmask16 live = (__mmask16)(left >= 16 ? 0xffffu : left <= 0 ? 0u : (1u << left) - 1u);
            const char *base = src + h * hd * 2;
            for (int64_t d = 0; d < hd; d += 2) {
                const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, step, base + d * 2, 1);
                _mm512_storeu_ps(kt + d * ATT_BLOCK + h, _mm512_castsi512_ps(_mm512_slli_epi32(g, 16)));
                _mm512_storeu_ps(kt + (d + 1) * ATT_BLOCK + h, _mm512_castsi512_ps(_mm512_and_si512(g, high)));
            }
        }
        return;
    }
    for (int64_t d = 0; d < hd; d++)
        for (int64_t j = keys; j < ATT_BLOCK; j++) kt[d * ATT_BLOCK + j] = 0.0f;
    for (int64_t j = 0; j < keys; j++)
        for (int64_t d = 0; d < hd; d++) kt[d * ATT_BLOCK + j] = get1(src, j * hd + d, cdt);
}

/* a query's scores for keys b0 .. b0 + min(left, mb) - 1 of a block: the two 16-key chains, scaled */
static inline void store_scores(float *pt, int64_t left, int64_t mb, __m512 a0, __m512 a1, __m512 sc) {
    const int64_t m = left < mb ? left : mb;
    _mm512_mask_storeu_ps(pt, (__mmask16)(m >= 16 ? 0xffffu : (1u << m) - 1u), _mm512_mul_ps(a0, sc));
    if (m > 16) _mm512_mask_storeu_ps(pt + 16, (__mmask16)(m >= 32 ? 0xffffu : (1u << (m - 16)) - 1u), _mm512_mul_ps(a1, sc));
}

/* r[0..15] (16 rows of 16 dwords) transposed in place: r[c] becomes column c */
static inline void transpose16(__m512i *r) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  /* 128-bit lane k of r[i + m]: rows i .. i + 3 of column 4k + m */
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int m = 0; m < 4; m++) {
        t[m] = _mm512_shuffle_i32x4(r[m], r[4 + m], 0x88);
        t[4 + m] = _mm512_shuffle_i32x4(r[m], r[4 + m], 0xdd);
        t[8 + m] = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0x88);
        t[12 + m] = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0xdd);
    }
    for (int m = 0; m < 4; m++) {
        r[m] = _mm512_shuffle_i32x4(t[m], t[8 + m], 0x88);
        r[4 + m] = _mm512_shuffle_i32x4(t[4 + m], t[12 + m], 0x88);
        r[8 + m] = _mm512_shuffle_i32x4(t[m], t[8 + m], 0xdd);
        r[12 + m] = _mm512_shuffle_i32x4(t[4 + m], t[12 + m], 0xdd);
    }
}

/* bf16 keys j < `keys` of a block as pairs: kp[(d / 2) * ATT_BLOCK + j] holds (k_j[d], k_j[d + 1]) as they are
 * (low half d), what `_mm512_dpbf16_ps` multiplies; lanes past `keys` zero. A key's pairs are the dwords of its
 * row, so 16 keys by 16 pairs is a 16 x 16 dword transpose (in registers: a gather a pair cost about as much as
 * the rest of a 1-row job). hd % 16 == 0. */
static inline void pair_block(uint32_t *kp, const char *src, int64_t keys, int64_t hd) {
    const uint32_t *k = (const uint32_t *)src;
    const int64_t hp = hd / 2;
    for (int64_t h = 0; h < ATT_BLOCK; h += 16)
        for (int64_t e0 = 0; e0 < hp; e0 += 16) {
            const int64_t w = hp - e0 < 16 ? hp - e0 : 16;  /* 8 where hd % 32 == 16 */
            const __mmask16 m = (__mmask16)(w == 16 ? 0xffffu : (1u << w) - 1u);
            __m512i r[16];
            for (int64_t i = 0; i < 16; i++)
                r[i] = h + i < keys ? _mm512_maskz_loadu_epi32(m, (const void *)(k + (h + i) * hp + e0)) : _mm512_setzero_si512();
            transpose16(r);
            for (int64_t e = 0; e < w; e++) _mm512_storeu_si512((void *)(kp + (e0 + e) * ATT_BLOCK + h), r[e]);
        }
}

/* with a bf16 cache the scores are bf16 dot products in float32 (`vdpbf16ps`, pairs of head_dim in order, d = 0,
 * 1, ...): the query rounded to bf16 (round to nearest even) as the keys are stored, the products exact, the sums
 * float32; two 16-key chains per query over head_dim / 2 steps. The same for every row, as above. `scores_q` takes
 * Q queries at once (a constant where it is called, so its 2 Q chains stay in registers): each key pair is loaded
 * once for all Q; six queries keep twelve independent chains in flight (four queries' eight were slower:
 * CHANGELOG.md). */
#define SCORE_QUERIES 6
static inline __attribute__((always_inline)) void scores_q(const int64_t *ns, const int64_t *act, int Q, int64_t b0,
                                                            int64_t mb, const uint32_t *kp, const uint32_t *qp,
                                                            int64_t hp, int64_t stride, float *p, __m512 sc) {
    __m512 a0[SCORE_QUERIES], a1[SCORE_QUERIES];
    const uint32_t *q[SCORE_QUERIES];
    for (int r = 0; r < Q; r++) {
        q[r] = qp + act[r] * hp;
        a0[r] = a1[r] = _mm512_setzero_ps();
    }
    for (int64_t e = 0; e < hp; e++) {
        const __m512bh k0 = (__m512bh)_mm512_loadu_si512((const void *)(kp + e * ATT_BLOCK));
        const __m512bh k1 = (__m512bh)_mm512_loadu_si512((const void *)(kp + e * ATT_BLOCK + 16));
        for (int r = 0; r < Q; r++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)q[r][e]);
            a0[r] = _mm512_dpbf16_ps(a0[r], x, k0);
            a1[r] = _mm512_dpbf16_ps(a1[r], x, k1);
        }
    }
    for (int r = 0; r < Q; r++) store_scores(p + act[r] * stride + b0, ns[act[r]] - b0, mb, a0[r], a1[r], sc);
}

static void scores_bf(const int64_t *ns, const int64_t *act, int64_t na, int64_t b0, int64_t mb, const uint32_t *kp,
                      const uint32_t *qp, int64_t hd, int64_t stride, float *p, __m512 sc) {
    const int64_t hp = hd / 2;
    int64_t i = 0;
    for (; i + SCORE_QUERIES <= na; i += SCORE_QUERIES)
        scores_q(ns, act + i, SCORE_QUERIES, b0, mb, kp, qp, hp, stride, p, sc);
    switch (na - i) {  /* the rest, again with a constant count */
    case 1: scores_q(ns, act + i, 1, b0, mb, kp, qp, hp, stride, p, sc); break;
    case 2: scores_q(ns, act + i, 2, b0, mb, kp, qp, hp, stride, p, sc); break;
    case 3: scores_q(ns, act + i, 3, b0, mb, kp, qp, hp, stride, p, sc); break;
    case 4: scores_q(ns, act + i, 4, b0, mb, kp, qp, hp, stride, p, sc); break;
    case 5: scores_q(ns, act + i, 5, b0, mb, kp, qp, hp, stride, p, sc); break;
    default: break;
    }
}

/* exp8's operations on 16 lanes, one for one (the same IEEE operations lane for lane: min, max, fma, floor, mul,
 * add, the truncating conversion and the exponent shift), so every element gets exp8's value bit for bit */
static inline __m512 exp16(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.3762626647949f), lo = _mm512_set1_ps(-87.3365447505531f);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
    fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 z = _mm512_mul_ps(x, x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, z, x);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

/* exp_row on 16 lanes (exp16), the tail masked */
static void exp_row16(float *pt, int64_t nt, float mx) {
    const __m512 mv = _mm512_set1_ps(mx);
    int64_t j = 0;
    for (; j + 16 <= nt; j += 16) _mm512_storeu_ps(pt + j, exp16(_mm512_sub_ps(_mm512_loadu_ps(pt + j), mv)));
    if (j < nt) {
        const __mmask16 m = (__mmask16)((1u << (nt - j)) - 1u);
        _mm512_mask_storeu_ps(pt + j, m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, pt + j), mv)));
    }
}

/* bf16 values of a block as key pairs: vp[(j / 2) * hd + d] holds (v_j[d], v_{j+1}[d]) (low half key j), what
 * `_mm512_dpbf16_ps` multiplies with a query's (p_j, p_{j+1}); keys past `keys` are zero. hd % 32 == 0. */
static inline void pair_values(uint32_t *vp, const char *src, int64_t keys, int64_t hd) {
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                        39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
                                        55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    const uint16_t *v = (const uint16_t *)src;
    for (int64_t j = 0; j < keys; j += 2)
        for (int64_t d = 0; d < hd; d += 32) {
            const __m512i a = _mm512_loadu_si512((const void *)(v + j * hd + d));
            const __m512i b = j + 1 < keys ? _mm512_loadu_si512((const void *)(v + (j + 1) * hd + d)) : _mm512_setzero_si512();
            _mm512_storeu_si512((void *)(vp + (j / 2) * hd + d), _mm512_permutex2var_epi16(a, lo, b));
            _mm512_storeu_si512((void *)(vp + (j / 2) * hd + d + 16), _mm512_permutex2var_epi16(a, hi, b));
        }
}

/* A query's probabilities of a block's keys j < m as bf16 pairs (p_j, p_{j+1}) (round to nearest even), zero
 * past m: pp[e] for e < (m + 1) / 2 */
static inline void pair_probs(uint32_t *pp, const float *pt, int64_t m) {
    const __m512 p0 = _mm512_maskz_loadu_ps((__mmask16)(m >= 16 ? 0xffffu : (1u << m) - 1u), pt);
    const __m512 p1 = _mm512_maskz_loadu_ps((__mmask16)(m >= 32 ? 0xffffu : m <= 16 ? 0u : (1u << (m - 16)) - 1u), pt + 16);
    _mm512_storeu_si512((void *)pp, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
}

/* With a bf16 cache the weighted values are bf16 dot products too: each query adds p_j v_j + p_{j+1} v_{j+1}
 * pair after pair of keys into float32 accumulators (`vdpbf16ps`), its probabilities rounded to bf16 once (as
 * torch's bf16 SDPA rounds them for its second product). `values_q` takes Q queries at once over V 16-wide parts of
 * head_dim from d0 (both constants where it is called): each value pair's V vectors are loaded once for all Q,
 * Q * V (16) chains in flight; head_dim 64 goes four queries at a time, a multiple of 128 two at a time per 128.
 * The pairs past a query's own keys add exact zeros, so a query's sums do not depend on the queries beside it. */
#define VALUE_CHAINS 16
static inline __attribute__((always_inline)) void values_q(const int64_t *ns, const int64_t *act, int Q, int V,
                                                            int64_t b0, int64_t mb, const uint32_t *vp, int64_t hd,
                                                            int64_t d0, int64_t stride, const float *p, float *o) {
    const int64_t pairs = (mb + 1) / 2;
    uint32_t pq[4][16];  /* Q <= 4, V <= 8 */
    __m512 c[VALUE_CHAINS], v[8];
    for (int r = 0; r < Q; r++) {
        const int64_t t = act[r];
        pair_probs(pq[r], p + t * stride + b0, ns[t] - b0 < mb ? ns[t] - b0 : mb);
        for (int d = 0; d < V; d++) c[r * V + d] = _mm512_loadu_ps(o + t * hd + d0 + d * 16);
    }
    for (int64_t e = 0; e < pairs; e++) {
        const uint32_t *ve = vp + e * hd + d0;
        for (int d = 0; d < V; d++) v[d] = (__m512)_mm512_loadu_si512((const void *)(ve + d * 16));
        for (int r = 0; r < Q; r++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)pq[r][e]);
            for (int d = 0; d < V; d++) c[r * V + d] = _mm512_dpbf16_ps(c[r * V + d], x, (__m512bh)v[d]);
        }
    }
    for (int r = 0; r < Q; r++)
        for (int d = 0; d < V; d++) _mm512_storeu_ps(o + act[r] * hd + d0 + d * 16, c[r * V + d]);
}

static void values_bf(const int64_t *ns, const int64_t *act, int64_t na, int64_t b0, int64_t mb,
                      const uint32_t *vp, int64_t hd, int64_t stride, const float *p, float *o) {
    int64_t u = 0;
    if (hd == 64) {
        for (; u + 4 <= na; u += 4) values_q(ns, act + u, 4, 4, b0, mb, vp, hd, 0, stride, p, o);
        switch (na - u) {
        case 1: values_q(ns, act + u, 1, 4, b0, mb, vp, hd, 0, stride, p, o); break;
        case 2: values_q(ns, act + u, 2, 4, b0, mb, vp, hd, 0, stride, p, o); break;
        case 3: values_q(ns, act + u, 3, 4, b0, mb, vp, hd, 0, stride, p, o); break;
        default: break;
        }
        return;
    }
    if (hd % 128 == 0) {
        for (int64_t d0 = 0; d0 < hd; d0 += 128) {
            for (u = 0; u + 2 <= na; u += 2) values_q(ns, act + u, 2, 8, b0, mb, vp, hd, d0, stride, p, o);
            if (u < na) values_q(ns, act + u, 1, 8, b0, mb, vp, hd, d0, stride, p, o);
        }
        return;
    }
    const int64_t pairs = (mb + 1) / 2;
    for (; u < na; u++) {
        const int64_t t = act[u];
        uint32_t pq[16];
        pair_probs(pq, p + t * stride + b0, ns[t] - b0 < mb ? ns[t] - b0 : mb);
        float *ot = o + t * hd;
        for (int64_t d0 = 0; d0 < hd; d0 += 128) {  /* eight 16-lane accumulators in registers at a time */
            const int64_t w = hd - d0 < 128 ? hd - d0 : 128;
            __m512 acc[8];
            for (int64_t d = 0; d < w; d += 16) acc[d / 16] = _mm512_loadu_ps(ot + d0 + d);
            for (int64_t e = 0; e < pairs; e++) {
                const __m512bh x = (__m512bh)_mm512_set1_epi32((int)pq[e]);
                const uint32_t *ve = vp + e * hd + d0;
                for (int64_t d = 0; d < w; d += 16)
                    acc[d / 16] = _mm512_dpbf16_ps(acc[d / 16], x, (__m512bh)_mm512_loadu_si512((const void *)(ve + d)));
            }
            for (int64_t d = 0; d < w; d += 16) _mm512_storeu_ps(ot + d0 + d, acc[d / 16]);
        }
    }
}

/* each query's (q[d], q[d + 1]) pairs rounded to bf16 once (round to nearest even), as a bf16 cache's keys are */
static inline void pair_queries(const float *const *qs, int64_t nq, int64_t hd, uint32_t *qp) {
    for (int64_t t = 0; t < nq; t++)
        for (int64_t d = 0; d < hd; d += 2)
            qp[t * (hd / 2) + d / 2] = (uint32_t)f32_to_bf16(qs[t][d]) | ((uint32_t)f32_to_bf16(qs[t][d + 1]) << 16);
}

/* o[t] /= sums[t]: each query's weighted values over its probabilities' sum (hd % 16 == 0) */
static inline void normalise16(float *o, const float *sums, int64_t nq, int64_t hd) {
    for (int64_t t = 0; t < nq; t++) {
        const __m512 inv = _mm512_set1_ps(1.0f / sums[t]);
        for (int64_t d = 0; d < hd; d += 16)
            _mm512_storeu_ps(o + t * hd + d, _mm512_mul_ps(_mm512_loadu_ps(o + t * hd + d), inv));
    }
}

#if HAVE_AMX
/* Attention over a bf16 cache on AMX tiles (the amx build, head_dim a multiple of 32): the same pairs as scores_bf
 * and values_bf, each product sum made by TDPBF16PS from one query's row alone. Queries go 16 to a tile from the
 * first that reaches the block; a job's queries are its rows in position order, so every query from that one on
 * reaches it too (one that does not, where rows come otherwise, is left out of the scores and adds exact zeros to
 * its values). The tiles round otherwise than VDPBF16PS, so in this build every such job takes them, one query or
 * many: a decode and a verify pass take the same sums. */
static inline int amx_attends(int64_t hd) { return amx_ready && hd % (2 * AMX_PAIRS) == 0; }

static inline int64_t first_reaching(const int64_t *ns, int64_t nq, int64_t b0) {
    int64_t t = 0;
    while (t < nq && ns[t] <= b0) t++;
    return t;
}

/* scores of the block's keys (kp as pair_block lays them) for every query that reaches it, as scores_bf stores them;
 * mx[t] (16 lanes) takes the max of query t's stored scores */
static void scores_amx(const int64_t *ns, int64_t nq, int64_t b0, int64_t mb, const uint32_t *kp, const uint32_t *qp,
                       int64_t hd, int64_t stride, float *p, __m512 sc, __m512 *mx) {
    const int64_t hp = hd / 2;
    float s[AMX_ROWS * ATT_BLOCK] __attribute__((aligned(64)));
    for (int64_t t0 = first_reaching(ns, nq, b0); t0 < nq; t0 += AMX_ROWS) {
        const int R = (int)(nq - t0 < AMX_ROWS ? nq - t0 : AMX_ROWS);
        amx_rows(R);
        _tile_zero(0);
        _tile_zero(1);
        for (int64_t e = 0; e < hp; e += AMX_PAIRS) {
            _tile_loadd(4, qp + t0 * hp + e, hp * 4);
            _tile_loadd(6, kp + e * ATT_BLOCK, ATT_BLOCK * 4);
            _tile_loadd(7, kp + e * ATT_BLOCK + 16, ATT_BLOCK * 4);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
        }
        _tile_stored(0, s, ATT_BLOCK * 4);
        _tile_stored(1, s + 16, ATT_BLOCK * 4);
        for (int r = 0; r < R; r++) {
            const int64_t t = t0 + r, left = ns[t] - b0, m = left < mb ? left : mb;
            if (left <= 0) continue;
            const __mmask16 m0 = (__mmask16)(m >= 16 ? 0xffffu : (1u << m) - 1u);
            const __mmask16 m1 = (__mmask16)(m >= 32 ? 0xffffu : m <= 16 ? 0u : (1u << (m - 16)) - 1u);
            const __m512 a0 = _mm512_mul_ps(_mm512_load_ps(s + r * ATT_BLOCK), sc);
            const __m512 a1 = _mm512_mul_ps(_mm512_load_ps(s + r * ATT_BLOCK + 16), sc);
            _mm512_mask_storeu_ps(p + t * stride + b0, m0, a0);
            _mm512_mask_storeu_ps(p + t * stride + b0 + 16, m1, a1);
            const __m512 lo = _mm512_mask_max_ps(mx[t], m0, mx[t], a0);
            mx[t] = _mm512_mask_max_ps(lo, m1, lo, a1);
        }
    }
}

/* exp(x) for x <= 0 as 2^n * 2^f (n = x log2(e) rounded to nearest, |f| <= 1/2, 2^f by its Taylor polynomial to
 * f^6: relative error about 2e-7 near the max, a few 1e-6 far below it where x log2(e) rounds; far under the bf16
 * rounding the probabilities then take), half exp16's
 * operations: the exponential is most of a wide job's arithmetic once its sums are on tiles. Far below the max it
 * is 0, as the probability is. */
static inline __m512 exp16_tiles(__m512 x) {
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 y = _mm512_set1_ps(1.5403530393381606e-4f);
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.3333558146428443e-3f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.6181291076284772e-3f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.5504108664821580e-2f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.4022650695910071e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.9314718055994531e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

/* A whole job on tiles: per block of keys, the scores (scores_amx, keeping each query's max) and the block's values
 * as pairs into `vps` (16 x hd pairs a block); then per query one pass that takes exp(score - max), sums it (16
 * lanes, key after key, as attend_job16 does) and writes it back over its own row as bf16 (round to nearest even),
 * zeros past the query's keys; then per 16 queries and 64 dimensions the values' sums stay in four tiles over every
 * block (A: the probabilities' rows, B: the value pairs). Every sum is the one values_bf's order makes, so the output
 * is attend_job16's with the tiles, bit for bit, for any rows beside it. stride: at least 16 floats. */
static void attend_amx(const float *const *qs, const int64_t *ns, int64_t nq, const char *kb, const char *vb,
                       int64_t hd, float scale, int64_t stride, float *p, uint32_t *buf, float *o) {
    int64_t n = 0;
    for (int64_t t = 0; t < nq; t++) n = ns[t] > n ? ns[t] : n;
    const int64_t blocks = (n + ATT_BLOCK - 1) / ATT_BLOCK;
    const __m512 sc = _mm512_set1_ps(scale);
    uint32_t qp[ATT_QUERIES * 128];  /* each query's (q[d], q[d + 1]) pairs, rounded once */
    __m512 mx[ATT_QUERIES];
    pair_queries(qs, nq, hd, qp);
    for (int64_t t = 0; t < nq; t++) mx[t] = _mm512_set1_ps(-INFINITY);
    uint32_t *kp = buf, *vps = buf + ATT_BLOCK / 2 * hd;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t b0 = b * ATT_BLOCK, mb = n - b0 < ATT_BLOCK ? n - b0 : ATT_BLOCK, pairs = (mb + 1) / 2;
        pair_block(kp, kb + b0 * hd * 2, mb, hd);
        scores_amx(ns, nq, b0, mb, kp, qp, hd, stride, p, sc, mx);
        uint32_t *vp = vps + b * (ATT_BLOCK / 2) * hd;
        pair_values(vp, vb + b0 * hd * 2, mb, hd);
        if (pairs < ATT_BLOCK / 2)  /* the tiles read all 16 pairs: the ones past the block's keys must be zeros */
            memset(vp + pairs * hd, 0, (size_t)(ATT_BLOCK / 2 - pairs) * hd * sizeof(uint32_t));
    }
    float sums[ATT_QUERIES];
    for (int64_t t = 0; t < nq; t++) {
        const int64_t nt = ns[t];
        float *pt = p + t * stride;
        uint16_t *pb = (uint16_t *)pt;  /* written behind the floats it is read from: 2j bytes <= 4j */
        const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx[t]));
        __m512 s16 = _mm512_setzero_ps();
        for (int64_t j = 0; j < blocks * ATT_BLOCK; j += ATT_BLOCK) {
            const int64_t l0 = nt - j, l1 = nt - j - 16;
            const __mmask16 m0 = (__mmask16)(l0 >= 16 ? 0xffffu : l0 <= 0 ? 0u : (1u << l0) - 1u);
            const __mmask16 m1 = (__mmask16)(l1 >= 16 ? 0xffffu : l1 <= 0 ? 0u : (1u << l1) - 1u);
            const __m512 e0 = _mm512_maskz_mov_ps(m0, exp16_tiles(_mm512_sub_ps(_mm512_maskz_loadu_ps(m0, pt + j), mv)));
            const __m512 e1 = _mm512_maskz_mov_ps(m1, exp16_tiles(_mm512_sub_ps(_mm512_maskz_loadu_ps(m1, pt + j + 16), mv)));
            if (m0) s16 = _mm512_add_ps(s16, e0);
            if (m1) s16 = _mm512_add_ps(s16, e1);
            _mm512_storeu_si512((void *)(pb + j), (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
        }
        sums[t] = hsum16a(s16);
    }
    for (int64_t t0 = 0; t0 < nq; t0 += AMX_ROWS) {
        const int R = (int)(nq - t0 < AMX_ROWS ? nq - t0 : AMX_ROWS);
        int64_t reach = 0;  /* the blocks any of these queries reaches */
        for (int r = 0; r < R; r++) reach = ns[t0 + r] > reach ? ns[t0 + r] : reach;
        reach = (reach + ATT_BLOCK - 1) / ATT_BLOCK;
        amx_rows(R);
        const char *pa = (const char *)(p + t0 * stride);
        float *ot = o + t0 * hd;
        const int64_t os = hd * 4;
        for (int64_t d0 = 0; d0 < hd; d0 += 64) {
            const int four = hd - d0 >= 64;  /* hd % 32 == 0: four tiles, or two at the end */
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t b = 0; b < reach; b++) {
                const uint32_t *vp = vps + b * (ATT_BLOCK / 2) * hd + d0;
                _tile_loadd(4, pa + b * ATT_BLOCK * 2, stride * 4);
                _tile_loadd(5, vp, os);
                _tile_dpbf16ps(0, 4, 5);
                _tile_loadd(6, vp + 16, os);
                _tile_dpbf16ps(1, 4, 6);
                if (!four) continue;
                _tile_loadd(7, vp + 32, os);
                _tile_dpbf16ps(2, 4, 7);
                _tile_loadd(5, vp + 48, os);
                _tile_dpbf16ps(3, 4, 5);
            }
            _tile_stored(0, ot + d0, os);
            _tile_stored(1, ot + d0 + 16, os);
            if (!four) continue;
            _tile_stored(2, ot + d0 + 32, os);
            _tile_stored(3, ot + d0 + 48, os);
        }
    }
    normalise16(o, sums, nq, hd);
}
#else
static inline int amx_attends(int64_t hd) {
    (void)hd;
    return 0;
}
static inline void attend_amx(const float *const *qs, const int64_t *ns, int64_t nq, const char *kb, const char *vb,
                              int64_t hd, float scale, int64_t stride, float *p, uint32_t *buf, float *o) {
    (void)qs, (void)ns, (void)nq, (void)kb, (void)vb, (void)hd, (void)scale, (void)stride, (void)p, (void)buf, (void)o;
}
#endif

static void attend_job16(const float *const *qs, const int64_t *ns, int64_t nq, const char *kb, const char *vb,
                         int cdt, int64_t es, int64_t hd, float scale, int64_t stride, float *p, float *buf, float *o) {
    if (cdt == BF16 && amx_attends(hd)) {
        attend_amx(qs, ns, nq, kb, vb, hd, scale, stride, p, (uint32_t *)buf, o);
        return;
    }
    int64_t n = 0;
    for (int64_t t = 0; t < nq; t++) n = ns[t] > n ? ns[t] : n;
    const __m512 sc = _mm512_set1_ps(scale);
    uint32_t qp[ATT_QUERIES * 128];  /* bf16 caches: each query's (q[d], q[d + 1]) pairs, rounded once */
    if (cdt == BF16) pair_queries(qs, nq, hd, qp);
    for (int64_t b0 = 0; b0 < n; b0 += ATT_BLOCK) {
        const int64_t mb = n - b0 < ATT_BLOCK ? n - b0 : ATT_BLOCK;
        int64_t act[ATT_QUERIES], na = 0;  /* the queries that reach this block */
        for (int64_t t = 0; t < nq; t++)
            if (ns[t] > b0) act[na++] = t;
        if (cdt == BF16) {
            pair_block((uint32_t *)buf, kb + b0 * hd * es, mb, hd);
            scores_bf(ns, act, na, b0, mb, (const uint32_t *)buf, qp, hd, stride, p, sc);
            continue;
        }
        widen_block_t(buf, kb + b0 * hd * es, mb, hd, cdt, es);
        int64_t i = 0;
        /* Four queries at a time: eight independent chains keep the FMA units busy (two chains alone wait on the
         * FMA latency); each query's two chains are exactly the single query's below. */
        for (; i + 4 <= na; i += 4) {
            const float *q0 = qs[act[i]], *q1 = qs[act[i + 1]], *q2 = qs[act[i + 2]], *q3 = qs[act[i + 3]];
            __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            for (int64_t d = 0; d < hd; d++) {
                const __m512 k0 = _mm512_loadu_ps(buf + d * ATT_BLOCK), k1 = _mm512_loadu_ps(buf + d * ATT_BLOCK + 16);
                const __m512 x0 = _mm512_set1_ps(q0[d]), x1 = _mm512_set1_ps(q1[d]);
                const __m512 x2 = _mm512_set1_ps(q2[d]), x3 = _mm512_set1_ps(q3[d]);
                a00 = _mm512_fmadd_ps(x0, k0, a00);
                a01 = _mm512_fmadd_ps(x0, k1, a01);
                a10 = _mm512_fmadd_ps(x1, k0, a10);
                a11 = _mm512_fmadd_ps(x1, k1, a11);
                a20 = _mm512_fmadd_ps(x2, k0, a20);
                a21 = _mm512_fmadd_ps(x2, k1, a21);
                a30 = _mm512_fmadd_ps(x3, k0, a30);
                a31 = _mm512_fmadd_ps(x3, k1, a31);
            }
            store_scores(p + act[i] * stride + b0, ns[act[i]] - b0, mb, a00, a01, sc);
            store_scores(p + act[i + 1] * stride + b0, ns[act[i + 1]] - b0, mb, a10, a11, sc);
            store_scores(p + act[i + 2] * stride + b0, ns[act[i + 2]] - b0, mb, a20, a21, sc);
            store_scores(p + act[i + 3] * stride + b0, ns[act[i + 3]] - b0, mb, a30, a31, sc);
        }
        for (; i < na; i++) {
            const int64_t t = act[i];
            const float *qr = qs[t];
            __m512 a0 = _mm512_setzero_ps(), a1 = a0;
            for (int64_t d = 0; d < hd; d++) {  /* keys 0-15 and 16-31 of the block: two chains */
                const __m512 qd = _mm512_set1_ps(qr[d]);
                a0 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(buf + d * ATT_BLOCK), a0);
                a1 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(buf + d * ATT_BLOCK + 16), a1);
            }
            store_scores(p + t * stride + b0, ns[t] - b0, mb, a0, a1, sc);
        }
    }
    float sums[ATT_QUERIES];
    for (int64_t t = 0; t < nq; t++) {
        const int64_t nt = ns[t];
        float *pt = p + t * stride;
        __m512 mx16 = _mm512_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 16 <= nt; j += 16) mx16 = _mm512_max_ps(mx16, _mm512_loadu_ps(pt + j));
        float mx = _mm512_reduce_max_ps(mx16);
        for (; j < nt; j++) mx = pt[j] > mx ? pt[j] : mx;
        exp_row16(pt, nt, mx);
        __m512 s16 = _mm512_setzero_ps();
        for (j = 0; j + 16 <= nt; j += 16) s16 = _mm512_add_ps(s16, _mm512_loadu_ps(pt + j));
        if (j < nt) s16 = _mm512_add_ps(s16, _mm512_maskz_loadu_ps((__mmask16)((1u << (nt - j)) - 1u), pt + j));
        sums[t] = hsum16a(s16);
        for (int64_t d = 0; d < hd; d++) o[t * hd + d] = 0.0f;
    }
    for (int64_t b0 = 0; b0 < n; b0 += ATT_BLOCK) {
        const int64_t mb = n - b0 < ATT_BLOCK ? n - b0 : ATT_BLOCK;
        int64_t act[ATT_QUERIES], na = 0;
        for (int64_t t = 0; t < nq; t++)
            if (ns[t] > b0) act[na++] = t;
        if (cdt == BF16 && hd % 32 == 0) {
            pair_values((uint32_t *)buf, vb + b0 * hd * es, mb, hd);
            values_bf(ns, act, na, b0, mb, (const uint32_t *)buf, hd, stride, p, o);
            continue;
        }
        widen_block16(buf, vb + b0 * hd * es, mb, hd, cdt, es);
        int64_t u = 0;
        if (hd == 64)  /* two queries at a time: eight chains, each value row loaded once for both */
            for (; u + 2 <= na; u += 2) {
                const int64_t t0 = act[u], t1 = act[u + 1];
                const int64_t m0 = ns[t0] - b0 < mb ? ns[t0] - b0 : mb, m1 = ns[t1] - b0 < mb ? ns[t1] - b0 : mb;
                const int64_t both = m0 < m1 ? m0 : m1;
                const float *p0 = p + t0 * stride + b0, *p1 = p + t1 * stride + b0;
                float *o0 = o + t0 * hd, *o1 = o + t1 * hd;
                __m512 c0 = _mm512_loadu_ps(o0), c1 = _mm512_loadu_ps(o0 + 16), c2 = _mm512_loadu_ps(o0 + 32),
                       c3 = _mm512_loadu_ps(o0 + 48), e0 = _mm512_loadu_ps(o1), e1 = _mm512_loadu_ps(o1 + 16),
                       e2 = _mm512_loadu_ps(o1 + 32), e3 = _mm512_loadu_ps(o1 + 48);
                int64_t i = 0;
                for (; i < both; i++) {
                    const float *vi = buf + i * 64;
                    const __m512 v0 = _mm512_loadu_ps(vi), v1 = _mm512_loadu_ps(vi + 16), v2 = _mm512_loadu_ps(vi + 32),
                                 v3 = _mm512_loadu_ps(vi + 48);
                    const __m512 x = _mm512_set1_ps(p0[i]), y = _mm512_set1_ps(p1[i]);
                    c0 = _mm512_fmadd_ps(x, v0, c0);
                    c1 = _mm512_fmadd_ps(x, v1, c1);
                    c2 = _mm512_fmadd_ps(x, v2, c2);
                    c3 = _mm512_fmadd_ps(x, v3, c3);
                    e0 = _mm512_fmadd_ps(y, v0, e0);
                    e1 = _mm512_fmadd_ps(y, v1, e1);
                    e2 = _mm512_fmadd_ps(y, v2, e2);
                    e3 = _mm512_fmadd_ps(y, v3, e3);
                }
                for (int64_t j = i; j < m0; j++) {  /* the longer query's last keys, in the same order */
                    const float *vj = buf + j * 64;
                    const __m512 x = _mm512_set1_ps(p0[j]);
                    c0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(vj), c0);
                    c1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(vj + 16), c1);
                    c2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(vj + 32), c2);
                    c3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(vj + 48), c3);
                }
                for (int64_t j = i; j < m1; j++) {
                    const float *vj = buf + j * 64;
                    const __m512 y = _mm512_set1_ps(p1[j]);
                    e0 = _mm512_fmadd_ps(y, _mm512_loadu_ps(vj), e0);
                    e1 = _mm512_fmadd_ps(y, _mm512_loadu_ps(vj + 16), e1);
                    e2 = _mm512_fmadd_ps(y, _mm512_loadu_ps(vj + 32), e2);
                    e3 = _mm512_fmadd_ps(y, _mm512_loadu_ps(vj + 48), e3);
                }
                _mm512_storeu_ps(o0, c0); _mm512_storeu_ps(o0 + 16, c1); _mm512_storeu_ps(o0 + 32, c2);
                _mm512_storeu_ps(o0 + 48, c3); _mm512_storeu_ps(o1, e0); _mm512_storeu_ps(o1 + 16, e1);
                _mm512_storeu_ps(o1 + 32, e2); _mm512_storeu_ps(o1 + 48, e3);
            }
        for (; u < na; u++) {
            const int64_t t = act[u];
            const int64_t m = ns[t] - b0 < mb ? ns[t] - b0 : mb;
            const float *pt = p + t * stride + b0;
            float *ot = o + t * hd;
            for (int64_t d0 = 0; d0 < hd; d0 += 128) {  /* eight 16-lane accumulators in registers at a time */
                const int64_t w = hd - d0 < 128 ? hd - d0 : 128;
                __m512 acc[8];
                for (int64_t d = 0; d < w; d += 16) acc[d / 16] = _mm512_loadu_ps(ot + d0 + d);
                for (int64_t i = 0; i < m; i++) {
                    const __m512 pv = _mm512_set1_ps(pt[i]);
                    const float *vi = buf + i * hd + d0;
                    for (int64_t d = 0; d < w; d += 16) acc[d / 16] = _mm512_fmadd_ps(pv, _mm512_loadu_ps(vi + d), acc[d / 16]);
                }
                for (int64_t d = 0; d < w; d += 16) _mm512_storeu_ps(ot + d0 + d, acc[d / 16]);
            }
        }
    }
    normalise16(o, sums, nq, hd);
}
#define ATTEND(HD) ((HD) % 16 == 0 ? attend_job16 : attend_job)
#else
#define ATTEND(HD) attend_job
#endif

int sl_attend(const float *q, const void *kc, const void *vc, int cdt, const int64_t *slot, const int64_t *nkeys,
              void *out, int odt, int64_t rows, int64_t nh, int64_t kvh, int64_t cap, int64_t hd, float scale,
              int threads) {
    if (hd % 8 != 0 || hd > 256) return 2;
    amx_enter();
    const int64_t es = cdt == BF16 ? 2 : 4, groups = nh / kvh, parts = (groups + ATT_HEADS - 1) / ATT_HEADS;
    int64_t maxk = 0, runs = 0;
    int64_t *run0 = (int64_t *)malloc((size_t)(rows + 1) * sizeof(int64_t));  /* first row of each run */
    if (!run0) return 1;
    for (int64_t r = 0; r < rows; r++) {
        maxk = nkeys[r] > maxk ? nkeys[r] : maxk;
        if (r == 0 || slot[r] != slot[r - 1] || r - run0[runs - 1] == ATT_ROWS) run0[runs++] = r;
    }
    run0[runs] = rows;
    /* a row of scores holds its query's bf16 probabilities too, up to the next block (attend_amx) */
    const int64_t jobs = runs * kvh * parts, stride = maxk + 8 > 16 ? maxk + 8 : 16;
    /* a block's keys (then values) widened, or on tiles every block's values as pairs (attend_amx) */
    const int64_t blocks = HAVE_AMX && cdt == BF16 ? (maxk + ATT_BLOCK - 1) / ATT_BLOCK : 0;
    const int64_t bufn = ATT_BLOCK * hd + blocks * (ATT_BLOCK / 2) * hd;
    int fail = 0;
#pragma omp parallel num_threads(threads) if (threads > 1 && jobs * maxk >= 4096)
    {
        float *p = (float *)alloc64((size_t)ATT_QUERIES * stride * sizeof(float));
        float *buf = (float *)alloc64((size_t)bufn * sizeof(float));
        float *o = (float *)alloc64((size_t)ATT_QUERIES * hd * sizeof(float));
        if (!p || !buf || !o) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(static)
        for (int64_t job = 0; job < jobs; job++) {
            if (!p || !buf || !o) continue;
            const int64_t run = job / (kvh * parts), g = (job / parts) % kvh, part = job % parts;
            const int64_t r0 = run0[run], nr = run0[run + 1] - r0, h0 = g * groups + part * ATT_HEADS;
            const int64_t here = groups - part * ATT_HEADS < ATT_HEADS ? groups - part * ATT_HEADS : ATT_HEADS;
            const float *qs[ATT_QUERIES];
            int64_t ns[ATT_QUERIES];
            for (int64_t i = 0; i < nr; i++)
                for (int64_t t = 0; t < here; t++) {
                    qs[i * here + t] = q + ((r0 + i) * nh + h0 + t) * hd;
                    ns[i * here + t] = nkeys[r0 + i];
                }
            const char *kb = (const char *)kc + ((slot[r0] * kvh + g) * cap) * hd * es;
            const char *vb = (const char *)vc + ((slot[r0] * kvh + g) * cap) * hd * es;
            ATTEND(hd)(qs, ns, nr * here, kb, vb, cdt, es, hd, scale, stride, p, buf, o);
            for (int64_t i = 0; i < nr; i++)
                for (int64_t t = 0; t < here; t++)
                    for (int64_t d = 0; d < hd; d++)
                        put1(out, ((r0 + i) * nh + h0 + t) * hd + d, o[(i * here + t) * hd + d], odt);
        }
        free(p);
        free(buf);
        free(o);
    }
    free(run0);
    return fail ? 1 : 0;
}

/* ---------------------------------------------------------------- row-wise ops, fused
 * Each reads and writes one row at a time in float32 and rounds once on the way out. */

static inline void widen_row(const void *src, int dt, int64_t n, float *dst) {
    if (dt == F32) memcpy(dst, src, (size_t)n * sizeof(float));
    else for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(((const uint16_t *)src)[i]);
}

/* sum of squares in the fixed order of the dot products above: 8 lanes over n, zero-padded tail, hsum */
static inline float sumsq(const float *v, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(v + i);
        acc = _mm256_fmadd_ps(a, a, acc);
    }
    if (i < n) {
        float t[8] = {0};
        for (int64_t j = i; j < n; j++) t[j - i] = v[j];
        __m256 a = _mm256_loadu_ps(t);
        acc = _mm256_fmadd_ps(a, a, acc);
    }
    return hsum(acc);
}

/* If h: x = round(x + h) (in place, x's dtype), then y = round(x * rsqrt(mean(x^2) + eps) * scale).
 * y may be NULL (the add alone). n <= 16384. */
int sl_add_rmsnorm(void *x, const void *h, int dt, const float *scale, void *y, int ydt, int64_t rows, int64_t n,
                   float eps) {
    if (n > 16384) return 2;
    float a[16384], b[16384];
    for (int64_t r = 0; r < rows; r++) {
        widen_row((char *)x + r * n * (dt == BF16 ? 2 : 4), dt, n, a);
        if (h) {
            widen_row((const char *)h + r * n * (dt == BF16 ? 2 : 4), dt, n, b);
            for (int64_t i = 0; i < n; i++) {
                a[i] = a[i] + b[i];
                if (dt == BF16) a[i] = bf16_to_f32(f32_to_bf16(a[i]));
                put1(x, r * n + i, a[i], dt);
            }
        }
        if (!y) continue;
        const float inv = 1.0f / sqrtf(sumsq(a, n) / (float)n + eps);
        for (int64_t i = 0; i < n; i++) put1(y, r * n + i, a[i] * inv * scale[i], ydt);
    }
    return 0;
}

/* out[r, i] = round(silu(gu[r, i]) * gu[r, inter + i]), silu(g) = g / (1 + exp(-g)) in float32. */
int sl_silu_mul(const void *gu, int dt, void *out, int64_t rows, int64_t inter) {
    const int64_t es = dt == BF16 ? 2 : 4;
    for (int64_t r = 0; r < rows; r++) {
        const char *g = (const char *)gu + r * 2 * inter * es, *u = g + inter * es;
        char *orow = (char *)out + r * inter * es;
        int64_t i = 0;
        for (; i + 8 <= inter; i += 8) {
            const __m256 gv = load8(g + i * es, dt);
            const __m256 sv = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
            store8(orow + i * es, _mm256_mul_ps(sv, load8(u + i * es, dt)), dt);
        }
        for (; i < inter; i += 8) {  /* the tail, zero-padded: the same arithmetic lane by lane */
            float gt[8] = {0}, ut[8] = {0}, o[8];
            const int64_t m = inter - i < 8 ? inter - i : 8;
            for (int64_t j = 0; j < m; j++) {
                gt[j] = get1(g, i + j, dt);
                ut[j] = get1(u, i + j, dt);
            }
            __m256 gv = _mm256_loadu_ps(gt);
            __m256 sv = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
            _mm256_storeu_ps(o, _mm256_mul_ps(sv, _mm256_loadu_ps(ut)));
            for (int64_t j = 0; j < m; j++) put1(out, r * inter + i + j, o[j], dt);
        }
    }
    return 0;
}

/* One head vector v [hd] in float32: optional RMSNorm with `norm` [hd], then rotate-half RoPE on the first `rot`
 * dims with this row's cos/sin [rot]. */
static inline void norm_rope(float *v, int64_t hd, int64_t rot, const float *cos, const float *sin,
                             const float *norm, float eps) {
    if (norm) {
        const float inv = 1.0f / sqrtf(sumsq(v, hd) / (float)hd + eps);
        for (int64_t i = 0; i < hd; i++) v[i] = v[i] * inv * norm[i];
    }
    float t[256];
    const int64_t half = rot / 2;
    for (int64_t i = 0; i < rot; i++) {
        const float other = i < half ? -v[i + half] : v[i - half];
        t[i] = v[i] * cos[i] + other * sin[i];
    }
    memcpy(v, t, (size_t)rot * sizeof(float));
}

/* From the fused projection qkv [rows, stride] (q at qoff, k at koff, v at voff, heads of hd): q_out [rows, nh, hd]
 * float32 normed + roped; k normed + roped and v written into kc/vc [slots, kvh, cap, hd] at (slot[r], pos[r]). */
int sl_qk_rope_write(const void *qkv, int dt, int64_t rows, int64_t stride, int64_t qoff, int64_t koff,
                     int64_t voff, int64_t nh, int64_t kvh, int64_t hd, int64_t rot, const float *cos,
                     const float *sin, const float *qnorm, const float *knorm, float eps, float *q_out, void *kc,
                     void *vc, int cdt, const int64_t *slot, const int64_t *pos, int64_t cap) {
    if (hd > 256 || rot > hd) return 2;
    const int64_t es = dt == BF16 ? 2 : 4;
    float v[256];
    for (int64_t r = 0; r < rows; r++) {
        const char *row = (const char *)qkv + r * stride * es;
        const float *c = cos + r * rot, *s = sin + r * rot;
        for (int64_t h = 0; h < nh; h++) {
            float *q = q_out + (r * nh + h) * hd;
            widen_row(row + (qoff + h * hd) * es, dt, hd, q);
            norm_rope(q, hd, rot, c, s, qnorm, eps);
        }
        for (int64_t g = 0; g < kvh; g++) {
            const int64_t at = ((slot[r] * kvh + g) * cap + pos[r]) * hd;
            widen_row(row + (koff + g * hd) * es, dt, hd, v);
            norm_rope(v, hd, rot, c, s, knorm, eps);
            for (int64_t i = 0; i < hd; i++) put1(kc, at + i, v[i], cdt);
            widen_row(row + (voff + g * hd) * es, dt, hd, v);
            for (int64_t i = 0; i < hd; i++) put1(vc, at + i, v[i], cdt);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- a whole dense decoder layer, in place
 * x <- x + o(attend(rope(qkv(norm(x))))); x <- x + down(silu_mul(gate_up(norm(x)))), made of exactly the calls
 * above in the order the per-op route makes them, with the same roundings (every linear's output and every
 * norm's output in x's dtype), so it equals that route bit for bit and saves ~10 Python-level calls a layer.
 * Ungated attention and a dense MLP only: the model sends other layers through the per-op route. */
typedef struct {
    int64_t hidden, nh, kvh, hd, rot, inter;
    float eps, scale;                  /* scale: the attention's, as the caller computes it (hd ** -0.5) */
    const float *in_norm, *post_norm, *q_norm, *k_norm;
    const void *qkv_w, *qkv_b, *o_w, *o_b, *gu_w, *gu_b, *down_w, *down_b;
    int64_t wdt;                       /* the weights' dtype code (the activations' is the call's dt) */
    const float *qkv_s, *o_s, *gu_s, *down_s;   /* int8 weights' row scales, else NULL */
} sl_layer;

int sl_dense_layer(const sl_layer *L, void *x, int dt, int64_t rows, const float *cos, const float *sin, void *kc,
                   void *vc, int cdt, int64_t cap, const int64_t *slot, const int64_t *pos, const int64_t *nkeys,
                   int threads) {
    const int64_t es = dt == BF16 ? 2 : 4, H = L->hidden, qkv_out = (L->nh + 2 * L->kvh) * L->hd;
    const int64_t wide = qkv_out > 2 * L->inter ? qkv_out : 2 * L->inter;
    char *h = alloc64((size_t)(rows * H * es)), *big = alloc64((size_t)(rows * wide * es));
    char *att = alloc64((size_t)(rows * L->nh * L->hd * es)), *o = alloc64((size_t)(rows * H * es));
    char *act = alloc64((size_t)(rows * L->inter * es));
    float *q = alloc64((size_t)(rows * L->nh * L->hd) * sizeof(float));
    int rc = (!h || !big || !att || !o || !q || !act) ? 1 : 0;
    if (!rc) rc = sl_add_rmsnorm(x, NULL, dt, L->in_norm, h, dt, rows, H, L->eps);
    if (!rc) rc = sl_linear_q(h, dt, L->qkv_w, (int)L->wdt, L->qkv_s, L->qkv_b, dt, big, dt, rows, H, qkv_out, threads);
    if (!rc) rc = sl_qk_rope_write(big, dt, rows, qkv_out, 0, L->nh * L->hd, (L->nh + L->kvh) * L->hd, L->nh, L->kvh,
                                   L->hd, L->rot, cos, sin, L->q_norm, L->k_norm, L->eps, q, kc, vc, cdt, slot, pos,
                                   cap);
    if (!rc) rc = sl_attend(q, kc, vc, cdt, slot, nkeys, att, dt, rows, L->nh, L->kvh, cap, L->hd,
                            L->scale, threads);
    if (!rc) rc = sl_linear_q(att, dt, L->o_w, (int)L->wdt, L->o_s, L->o_b, dt, o, dt, rows, L->nh * L->hd, H, threads);
    if (!rc) rc = sl_add_rmsnorm(x, o, dt, L->post_norm, h, dt, rows, H, L->eps);
    if (!rc) rc = sl_linear_q(h, dt, L->gu_w, (int)L->wdt, L->gu_s, L->gu_b, dt, big, dt, rows, H, 2 * L->inter, threads);
    if (!rc) rc = sl_silu_mul(big, dt, act, rows, L->inter);
    if (!rc) rc = sl_linear_q(act, dt, L->down_w, (int)L->wdt, L->down_s, L->down_b, dt, o, dt, rows, L->inter, H, threads);
    if (!rc) rc = sl_add_rmsnorm(x, o, dt, L->post_norm, NULL, dt, rows, H, L->eps);
    free(act);
    free(h);
    free(big);
    free(att);
    free(o);
    free(q);
    return rc;
}

/* ---------------------------------------------------------------- argmax of float32 rows
 * out[r] = the first index of row r's largest value, as torch.argmax: a NaN counts as the largest (its first
 * index wins). One vectorised pass for the max (and any NaN), one for its first index. */
static int64_t argmax_row(const float *v, int64_t n) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    __m256 nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 a = _mm256_loadu_ps(v + i);
        mx = _mm256_max_ps(mx, a);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    }
    float m8[8];
    _mm256_storeu_ps(m8, mx);
    float best = m8[0];
    for (int j = 1; j < 8; j++) best = m8[j] > best ? m8[j] : best;
    int any_nan = _mm256_movemask_ps(nan) != 0;
    for (; i < n; i++) {
        if (v[i] != v[i]) any_nan = 1;
        else if (v[i] > best) best = v[i];
    }
    int64_t at = 0;
    if (any_nan) {
        while (v[at] == v[at]) at++;
    } else {
        const __m256 b = _mm256_set1_ps(best);
        for (i = 0; i + 8 <= n; i += 8) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), b, _CMP_EQ_OQ));
            if (hit) break;
        }
        for (at = i; at < n && v[at] != best; at++) {}
    }
    return at;
}

int sl_argmax(const float *x, int64_t rows, int64_t n, int64_t *out) {
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * n, n);
    return 0;
}

/* ---------------------------------------------------------------- greedy accept, a deterministic drafter
 * Per lane l (rows cu[l] .. cu[l] + len[l]: the anchor's and its drafts'): the target's token at row j is the
 * argmax (as sl_argmax); drafts are accepted while they equal it; committed[l] holds the tokens of rows
 * 0 .. accepted (the last one the correction or the bonus), -1 after, committed_len[l] = accepted + 1. Rows past
 * the first mismatch are not read. The same result as kernels/accept.py's sample-and-compare for greedy lanes. */
int sl_accept_greedy(const float *logits, int64_t vocab, const int64_t *cu, int64_t lanes, const int64_t *drafts,
                     int64_t k, const int64_t *len, int64_t *committed, int64_t *committed_len, int64_t *accepted) {
    for (int64_t l = 0; l < lanes; l++) {
        int64_t *out = committed + l * (k + 1), j = 0;
        for (int64_t c = 0; c <= k; c++) out[c] = -1;
        for (;; j++) {
            const int64_t tok = argmax_row(logits + (cu[l] + j) * vocab, vocab);
            out[j] = tok;
            if (j >= len[l] || drafts[l * k + j] != tok) break;
        }
        accepted[l] = j;
        committed_len[l] = j + 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the output head's tokens, no logits written
 * tok[r] for rows r < M of x [M, K] times the head w [N, K] (float32, bf16, int8 with ws, or packed: as
 * sl_linear_q reads it) plus b, without writing the [M, N] logits. The columns go HEAD_COLS at a time, each logit made
 * by the very sums sl_linear_q and sl_linear_packed make (so it is bit for bit the one they would write). Per row:
 * - temp[r] == 0 (greedy): the first index of the largest logit, a NaN counting as largest (sl_argmax's rule). Over
 *   packed weights it is kept in registers, per lane the largest value and its first column (ptile_head); over the
 *   row-major ones the chunk's logits go through a scratch that stays in L1, where the dot products dwarf it;
 * - temp[r] > 0: the inverse-CDF draw at u[r] from softmax(logit / temp[r]). Pass one keeps, per chunk, max z and
 *   sum exp(z - max) (z = logit / temp, one IEEE division as torch's; exp8; float64 sums); the draw then takes the
 *   chunk in which the running mass, scaled to the row's max, first passes u * total, makes that chunk's logits
 *   again for that row alone, and walks its tokens' exp(z - max z) to the first whose running mass passes it.
 *   kernels/sampling.py's twin normalises torch's float32 exps and sums them in its own order, so the two draws
 *   can part only where u * total lies within rounding of a boundary between two tokens.
 * Threads split chunks; the chunks' results are combined in chunk order, so no token depends on the split. */
#define HEAD_COLS 256

typedef struct {
    const void *x;  /* [M, K]: bf16 rows where the bf16 kernels read them, else float32 (widened) */
    int64_t xes;
    const void *w;
    int wdt;
    const float *ws;
    const void *b;
    int bdt;
    int64_t K, N;
} head_job;

#if HAVE_BF
/* A greedy row over packed blocks, in registers: per lane of 32 the largest logit so far and the first column that has
 * it (columns come in order and only a strictly larger value takes over), and the row's first NaN column (-1: none). */
typedef struct {
    __m512 v[2];
    __m512i i[2];
    int64_t nan;
} lane_best;

static const int32_t IOTA16[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

static inline void best_init(lane_best *b, int64_t n0) {
    b->v[0] = b->v[1] = _mm512_set1_ps(-INFINITY);
    b->i[0] = _mm512_add_epi32(_mm512_set1_epi32((int32_t)n0), _mm512_loadu_si512(IOTA16));
    b->i[1] = _mm512_add_epi32(b->i[0], _mm512_set1_epi32(16));
    b->nan = -1;
}

/* the row's largest logit of the chunk and its first column; the first NaN, if any, as sl_argmax counts it */
static inline void best_reduce(const lane_best *b, float *mx, int64_t *arg) {
    if (b->nan >= 0) {
        *mx = NAN;
        *arg = b->nan;
        return;
    }
    const float m = _mm512_reduce_max_ps(_mm512_max_ps(b->v[0], b->v[1]));
    const __m512 mv = _mm512_set1_ps(m);
    const __m512i none = _mm512_set1_epi32(INT32_MAX);
    const __m512i c0 = _mm512_mask_mov_epi32(none, _mm512_cmp_ps_mask(b->v[0], mv, _CMP_EQ_OQ), b->i[0]);
    const __m512i c1 = _mm512_mask_mov_epi32(none, _mm512_cmp_ps_mask(b->v[1], mv, _CMP_EQ_OQ), b->i[1]);
    *mx = m;
    *arg = _mm512_reduce_min_epi32(_mm512_min_epi32(c0, c1));
}

/* ptile's sums for R rows of the block at column c0 (left columns of it real), each value as ptile stores it: into
 * best[r] for a greedy row (best given and temp[r] == 0), else into s + r * HEAD_COLS (32 columns, zeros past N) */
static inline __attribute__((always_inline)) void phead_row(__m512 a0, __m512 a1, const __m512 *scale,
                                                             const __m512 *bias, __mmask16 m0, __mmask16 m1, __m512i i0,
                                                             __m512i i1, int64_t c0, lane_best *b, float *s) {
    __m512 v0 = scale ? _mm512_mul_ps(a0, scale[0]) : a0, v1 = scale ? _mm512_mul_ps(a1, scale[1]) : a1;
    if (bias) {
        v0 = _mm512_add_ps(v0, bias[0]);
        v1 = _mm512_add_ps(v1, bias[1]);
    }
    if (!b) {
        _mm512_storeu_ps(s, v0);
        _mm512_storeu_ps(s + 16, v1);
        return;
    }
    const __mmask16 g0 = _mm512_mask_cmp_ps_mask(m0, v0, b->v[0], _CMP_GT_OQ);
    const __mmask16 g1 = _mm512_mask_cmp_ps_mask(m1, v1, b->v[1], _CMP_GT_OQ);
    b->v[0] = _mm512_mask_mov_ps(b->v[0], g0, v0);
    b->v[1] = _mm512_mask_mov_ps(b->v[1], g1, v1);
    b->i[0] = _mm512_mask_mov_epi32(b->i[0], g0, i0);
    b->i[1] = _mm512_mask_mov_epi32(b->i[1], g1, i1);
    if (b->nan < 0) {
        const __mmask16 u0 = _mm512_mask_cmp_ps_mask(m0, v0, v0, _CMP_UNORD_Q);
        const __mmask16 u1 = _mm512_mask_cmp_ps_mask(m1, v1, v1, _CMP_UNORD_Q);
        if (u0) b->nan = c0 + __builtin_ctz(u0);
        else if (u1) b->nan = c0 + 16 + __builtin_ctz(u1);
    }
}

static inline __attribute__((always_inline)) void ptile_head(const uint16_t *x, int R, const void *wb, int q8, int64_t K,
                                                              const __m512 *scale, const __m512 *bias, int64_t c0,
                                                              int64_t left, const float *temp, lane_best *best,
                                                              float *s) {
    const __mmask16 m0 = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1u);
    const __mmask16 m1 = left >= 32 ? 0xffff : (left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1u));
    const __m512i i0 = _mm512_add_epi32(_mm512_set1_epi32((int32_t)c0), _mm512_loadu_si512(IOTA16));
    const __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(16));
    if (amx_serves(K)) {
        float t[AMX_ROWS * PACK_COLS] __attribute__((aligned(64)));
        amx_dot(x, R, wb, q8, K, t);
        for (int r = 0; r < R; r++)
            phead_row(_mm512_load_ps(t + r * PACK_COLS), _mm512_load_ps(t + r * PACK_COLS + 16), scale, bias, m0, m1,
                      i0, i1, c0, best && temp[r] == 0.0f ? best + r : NULL, s + r * HEAD_COLS);
        return;
    }
    __m512 a0[8], a1[8];
    pdot(x, R, wb, q8, K, a0, a1);
    for (int r = 0; r < R; r++)
        phead_row(a0[r], a1[r], scale, bias, m0, m1, i0, i1, c0, best && temp[r] == 0.0f ? best + r : NULL,
                  s + r * HEAD_COLS);
}
#endif

/* the R rows at x over columns [n0, n1) (n0 a multiple of HEAD_COLS): each row's logits into s [R][HEAD_COLS], but
 * for packed weights a greedy row (best given, temp[r] == 0) goes into best[r] instead. Returns 1 where it did. */
static int head_chunk(const head_job *h, const void *x, int64_t R, int64_t n0, int64_t n1, const float *temp,
                      void *best, float *s) {
    const int64_t K = h->K;
#if HAVE_BF
    if (h->wdt == PACKED || h->wdt == PACKED_I8) {
        const int q8 = h->wdt == PACKED_I8;
        for (int64_t c0 = n0; c0 < n1; c0 += PACK_COLS) {
            const void *wb = (const char *)h->w + c0 * K * (q8 ? 1 : 2);
            __m512 bias[2], scale[2];
            if (h->b) widen32(h->b, h->bdt, c0, h->N, bias);
            if (h->ws) widen32(h->ws, F32, c0, h->N, scale);
            const __m512 *bp = h->b ? bias : NULL, *sp = h->ws ? scale : NULL;
            const int64_t left = h->N - c0;
            if (amx_serves(K)) {  /* the tiles take up to 16 rows a call; no registers to keep */
                for (int64_t m0 = 0; m0 < R; m0 += AMX_ROWS)
                    ptile_head((const uint16_t *)x + m0 * K, (int)(R - m0 < AMX_ROWS ? R - m0 : AMX_ROWS), wb, q8, K,
                               sp, bp, c0, left, temp ? temp + m0 : NULL, best ? (lane_best *)best + m0 : NULL,
                               s + m0 * HEAD_COLS + (c0 - n0));
                continue;
            }
            for (int64_t m0 = 0; m0 < R; m0 += 8) {
                const uint16_t *xr = (const uint16_t *)x + m0 * K;
                const float *tr = temp ? temp + m0 : NULL;
                lane_best *br = best ? (lane_best *)best + m0 : NULL;
                float *sr = s + m0 * HEAD_COLS + (c0 - n0);
                switch (R - m0 < 8 ? R - m0 : 8) {  /* constant row counts, so the accumulators stay in registers */
                case 1: ptile_head(xr, 1, wb, q8, K, sp, bp, c0, left, tr, br, sr); break;
                case 2: ptile_head(xr, 2, wb, q8, K, sp, bp, c0, left, tr, br, sr); break;
                case 3: ptile_head(xr, 3, wb, q8, K, sp, bp, c0, left, tr, br, sr); break;
                case 4: ptile_head(xr, 4, wb, q8, K, sp, bp, c0, left, tr, br, sr); break;
                case 5: ptile_head(xr, 5, wb, q8, K, sp, bp, c0, left, tr, br, sr); break;
                case 6: ptile_head(xr, 6, wb, q8, K, sp, bp, c0, left, tr, br, sr); break;
                case 7: ptile_head(xr, 7, wb, q8, K, sp, bp, c0, left, tr, br, sr); break;
                default: ptile_head(xr, 8, wb, q8, K, sp, bp, c0, left, tr, br, sr); break;
                }
            }
        }
        return best != NULL;
    }
#endif
    (void)temp;
    (void)best;
    for (int64_t m0 = 0; m0 < R; m0 += 8) {
        const int r = (int)(R - m0 < 8 ? R - m0 : 8);
        const char *xr = (const char *)x + m0 * K * h->xes;
        float *yr = s + m0 * HEAD_COLS;
#if HAVE_BF
        if (h->xes == 2) {
            linear_block_bf((const uint16_t *)xr, r, h->w, h->wdt, h->ws, h->b, h->bdt, yr, F32, K, HEAD_COLS, n0, n0, n1);
            continue;
        }
#endif
        linear_block((const float *)xr, r, h->w, h->wdt, h->ws, h->b, h->bdt, yr, F32, K, HEAD_COLS, n0, n0, n1);
    }
    return 0;
}

/* v[i] /= t for i < n in place; returns the max (NaN ignored) */
static float scale_max(float *v, int64_t n, float t) {
    const __m256 tv = _mm256_set1_ps(t);
    __m256 mx = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 z = _mm256_div_ps(_mm256_loadu_ps(v + i), tv);
        _mm256_storeu_ps(v + i, z);
        mx = _mm256_max_ps(mx, z);
    }
    float m8[8], best = -INFINITY;
    _mm256_storeu_ps(m8, mx);
    for (int j = 0; j < 8; j++) best = m8[j] > best ? m8[j] : best;
    for (; i < n; i++) {
        v[i] /= t;
        best = v[i] > best ? v[i] : best;
    }
    return best;
}

/* exp8(z[i] - m) for i < n into e (the tail through a zero-padded block); returns their float64 sum, lanes first */
static double exp_sum(const float *z, int64_t n, float m, float *e) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = exp8(_mm256_sub_ps(_mm256_loadu_ps(z + i), mv));
        if (e) _mm256_storeu_ps(e + i, x);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
    }
    double d[4], total = 0.0;
    _mm256_storeu_pd(d, _mm256_add_pd(s0, s1));
    total = (d[0] + d[2]) + (d[1] + d[3]);
    if (i < n) {
        float t[8] = {0};
        for (int64_t j = i; j < n; j++) t[j - i] = z[j];
        _mm256_storeu_ps(t, exp8(_mm256_sub_ps(_mm256_loadu_ps(t), mv)));
        for (int64_t j = i; j < n; j++) {
            if (e) e[j] = t[j - i];
            total += t[j - i];
        }
    }
    return total;
}

int sl_head_tokens(const void *x, int xdt, const void *w, int wdt, const float *ws, const void *b, int bdt, int64_t M,
                   int64_t K, int64_t N, const float *temp, const float *u, int64_t *tok, int threads) {
    const int packed = wdt == PACKED || wdt == PACKED_I8;
    if ((wdt == I8 || wdt == PACKED_I8) != (ws != NULL) || (packed && (!HAVE_BF || xdt != BF16 || (K & 1))))
        return 4;
    if (M <= 0) return 0;
    head_job h = {x, xdt == BF16 ? 2 : 4, w, wdt, ws, b, bdt, K, N};
    amx_enter();
    float *xf = NULL;
    if (xdt == BF16 && !packed && !(HAVE_BF && (wdt == BF16 || wdt == I8))) {  /* sl_linear_q widens these rows */
        xf = alloc64((size_t)(M * K) * sizeof(float));
        if (!xf) return 1;
        h.x = widen(x, xdt, M * K, xf);
        h.xes = 4;
    }
    const int64_t chunks = (N + HEAD_COLS - 1) / HEAD_COLS;
    float *cmax = malloc((size_t)(M * chunks) * sizeof(float));
    double *csum = malloc((size_t)(M * chunks) * sizeof(double));
    int64_t *carg = malloc((size_t)(M * chunks) * sizeof(int64_t));
    int rc = (!cmax || !csum || !carg) ? 1 : 0;
#pragma omp parallel num_threads(threads) if (!rc && threads > 1 && chunks >= 8)
    {
        float *s = alloc64((size_t)(M * HEAD_COLS) * sizeof(float));
#if HAVE_BF
        lane_best *best = packed ? alloc64((size_t)M * sizeof(lane_best)) : NULL;
#else
        void *best = NULL;
#endif
        if (!s || (packed && !best)) {
#pragma omp atomic write
            rc = 1;
        }
#pragma omp for schedule(static)
        for (int64_t c = 0; c < chunks; c++) {
            if (!s || (packed && !best) || rc) continue;
            const int64_t n0 = c * HEAD_COLS, n = N - n0 < HEAD_COLS ? N - n0 : HEAD_COLS;
#if HAVE_BF
            for (int64_t r = 0; r < M && best; r++) best_init(best + r, n0);
#endif
            const int inreg = head_chunk(&h, h.x, M, n0, n0 + n, temp, best, s);
            (void)inreg;  /* always 0 without the packed kernels */
            for (int64_t r = 0; r < M; r++) {
                float *v = s + r * HEAD_COLS;
                const int64_t at = r * chunks + c;
#if HAVE_BF
                if (inreg && temp[r] == 0.0f) {
                    best_reduce(best + r, cmax + at, carg + at);
                    continue;
                }
#endif
                if (temp[r] == 0.0f) {
                    carg[at] = argmax_row(v, n);
                    cmax[at] = v[carg[at]];
                    carg[at] += n0;
                } else {
                    cmax[at] = scale_max(v, n, temp[r]);
                    csum[at] = exp_sum(v, n, cmax[at], NULL);
                }
            }
        }
        free(s);
        free(best);
    }
    float *s1 = rc ? NULL : alloc64((size_t)HEAD_COLS * sizeof(float));
    float *e = rc ? NULL : alloc64((size_t)HEAD_COLS * sizeof(float));
    if (!rc && (!s1 || !e)) rc = 1;
    for (int64_t r = 0; r < M && !rc; r++) {
        const float *cm = cmax + r * chunks;
        if (temp[r] == 0.0f) {  /* the first chunk's winner unless a later chunk's is larger, or the first NaN */
            float best = cm[0];
            int64_t arg = carg[r * chunks];
            for (int64_t c = 1; c < chunks && best == best; c++)
                if (cm[c] != cm[c] || cm[c] > best) best = cm[c], arg = carg[r * chunks + c];
            tok[r] = arg;
            continue;
        }
        float mx = -INFINITY;
        for (int64_t c = 0; c < chunks; c++) mx = cm[c] > mx ? cm[c] : mx;
        double total = 0.0, cum = 0.0;
        for (int64_t c = 0; c < chunks; c++) total += exp((double)cm[c] - mx) * csum[r * chunks + c];
        const double target = (double)u[r] * total;
        int64_t pick = chunks - 1;  /* the last chunk's sum is total's own, so u < 1 stops there at the latest */
        for (int64_t c = 0; c < chunks - 1; c++) {
            const double mass = exp((double)cm[c] - mx) * csum[r * chunks + c];
            if (cum + mass > target) {
                pick = c;
                break;
            }
            cum += mass;
        }
        const int64_t n0 = pick * HEAD_COLS, n = N - n0 < HEAD_COLS ? N - n0 : HEAD_COLS;
        head_chunk(&h, (const char *)h.x + r * K * h.xes, 1, n0, n0 + n, NULL, NULL, s1);
        scale_max(s1, n, temp[r]);
        exp_sum(s1, n, mx, e);
        int64_t at = n - 1;  /* the chunk's exps summed afresh fall short of its mass by a rounding: its last token */
        for (int64_t i = 0; i < n; i++) {
            cum += e[i];
            if (cum > target) {
                at = i;
                break;
            }
        }
        tok[r] = n0 + at;
    }
    free(s1);
    free(e);
    free(cmax);
    free(csum);
    free(carg);
    free(xf);
    return rc;
}

/* ---------------------------------------------------------------- accept from the rows' tokens
 * sl_accept_greedy's rule with each row's token given (tok[cu[l] + j], e.g. by sl_head_tokens) instead of read from
 * its logits: drafts accepted while they equal the token of their row, committed[l] the tokens of rows 0 ..
 * accepted, -1 after, committed_len[l] = accepted + 1. */
int sl_accept_tokens(const int64_t *tok, const int64_t *cu, int64_t lanes, const int64_t *drafts, int64_t k,
                     const int64_t *len, int64_t *committed, int64_t *committed_len, int64_t *accepted) {
    for (int64_t l = 0; l < lanes; l++) {
        int64_t *out = committed + l * (k + 1), j = 0;
        for (int64_t c = 0; c <= k; c++) out[c] = -1;
        for (;; j++) {
            out[j] = tok[cu[l] + j];
            if (j >= len[l] || drafts[l * k + j] != out[j]) break;
        }
        accepted[l] = j;
        committed_len[l] = j + 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- an mtp proposal, every step in one call
 * The chain stages/drafters/mtp.py runs step by step, made of the same calls in the same order (so the same drafts):
 * per step d, for each lane b: x = fc([norm_emb(embed[tok]) | norm_hid(h)]); x += the layer (sl_dense_layer, its
 * key and value written at base[b] + d of window slot slot[b], keys 0 .. base[b] + d seen); tok = ids[argmax of the
 * int8-rows head over norm_out(x)] (sl_linear_q8); h = x. tok starts at the anchors, h at the carried states (h is
 * left holding the last step's). cos, sin [lanes, width, rot]; drafts [lanes, width]. */
typedef struct {
    const sl_layer *layer;
    const void *fc_w;
    int64_t fc_wdt;
    const float *fc_s, *norm_emb, *norm_hid, *norm_out;
    float eps;
    const void *embed;
    const int8_t *head_w;
    const float *head_s;
    const int32_t *head_rs;
    int64_t head_n;
    const int64_t *head_ids; /* the shortlist's vocabulary ids, or NULL (the head is the whole vocabulary) */
} sl_chain;

int sl_mtp_chain(const sl_chain *C, void *h, int dt, int64_t lanes, int64_t width, const int64_t *anchors,
                 const float *cos, const float *sin, void *kc, void *vc, int cdt, int64_t cap, const int64_t *slot,
                 const int64_t *base, const int64_t *forced, int64_t *drafts, int threads) {
    const int64_t H = C->layer->hidden, rot = C->layer->rot, es = dt == BF16 ? 2 : 4;
    char *cat = alloc64((size_t)(lanes * 2 * H * es)), *x = alloc64((size_t)(lanes * H * es));
    char *y = alloc64((size_t)(lanes * H * es));
    float *cs = alloc64((size_t)(lanes * rot) * sizeof(float)), *sn = alloc64((size_t)(lanes * rot) * sizeof(float));
    float *logits = alloc64((size_t)(lanes * C->head_n) * sizeof(float));
    int64_t *tok = malloc((size_t)lanes * sizeof(int64_t)), *pos = malloc((size_t)lanes * sizeof(int64_t));
    int64_t *seen = malloc((size_t)lanes * sizeof(int64_t)), *best = malloc((size_t)lanes * sizeof(int64_t));
    int rc = (!cat || !x || !y || !cs || !sn || !logits || !tok || !pos || !seen || !best) ? 1 : 0;
    for (int64_t b = 0; b < lanes && !rc; b++) tok[b] = anchors[b];
    for (int64_t d = 0; d < width && !rc; d++) {
        for (int64_t b = 0; b < lanes && !rc; b++) {
            char *row = cat + b * 2 * H * es;
            memcpy(x, (const char *)C->embed + tok[b] * H * es, (size_t)(H * es));  /* x: scratch for the row */
            rc = sl_add_rmsnorm(x, NULL, dt, C->norm_emb, row, dt, 1, H, C->eps);
            if (!rc) rc = sl_add_rmsnorm((char *)h + b * H * es, NULL, dt, C->norm_hid, row + H * es, dt, 1, H, C->eps);
            memcpy(cs + b * rot, cos + (b * width + d) * rot, (size_t)rot * sizeof(float));
            memcpy(sn + b * rot, sin + (b * width + d) * rot, (size_t)rot * sizeof(float));
            pos[b] = base[b] + d;
            seen[b] = base[b] + d + 1;
        }
        if (!rc) rc = sl_linear_q(cat, dt, C->fc_w, (int)C->fc_wdt, C->fc_s, NULL, 0, x, dt, lanes, 2 * H, H, threads);
        if (!rc) rc = sl_dense_layer(C->layer, x, dt, lanes, cs, sn, kc, vc, cdt, cap, slot, pos, seen, threads);
        if (!rc) rc = sl_add_rmsnorm(x, NULL, dt, C->norm_out, y, dt, lanes, H, C->eps);
        if (!rc) rc = sl_linear_q8(y, C->head_w, C->head_s, C->head_rs, logits, lanes, H, C->head_n, threads);
        if (!rc) rc = sl_argmax(logits, lanes, C->head_n, best);
        for (int64_t b = 0; b < lanes && !rc; b++) {
            const int64_t f = forced ? forced[b * width + d] : -1; /* a forced token is the step's input */
            tok[b] = f >= 0 ? f : C->head_ids ? C->head_ids[best[b]] : best[b];
            drafts[b * width + d] = tok[b];
        }
        if (!rc) memcpy(h, x, (size_t)(lanes * H * es));
    }
    free(cat);
    free(x);
    free(y);
    free(cs);
    free(sn);
    free(logits);
    free(tok);
    free(pos);
    free(seen);
    free(best);
    return rc;
}

/* An mtp head's window rows: for each row r of raw [rows, 2, hidden] (the trunk state before it | its token's
 * embedding), x = fc([norm_emb(raw[r, 1]) | norm_hid(raw[r, 0])]), the fusion a chain step makes; then the layer's
 * key (RoPE'd at its position) and value of in_norm(x), through the layer's own qkv product and key
 * writer: k, v [rows, kvh * hd] in dt. What stages/drafters/mtp.py projects a catch-up's rows with, in one call
 * (a catch-up right after a target pass finds its weights and the op dispatch cold: the fewer calls, the less). */
int sl_mtp_project(const sl_chain *C, const void *raw, int dt, int64_t rows, const int64_t *positions,
                   const float *cos_table, const float *sin_table, void *k, void *v, int threads) {
    const sl_layer *L = C->layer;
    const int64_t H = L->hidden, es = dt == BF16 ? 2 : 4, kv = L->kvh * L->hd;
    /* only the k | v rows of the qkv weight (its q rows are nh hd of them; a packed weight's blocks of PACK_COLS
     * rows must not split there, else every row is computed and q skipped after) */
    const int wdt = (int)L->wdt, packed = wdt == PACKED || wdt == PACKED_I8;
    const int64_t skip = packed && (L->nh * L->hd) % PACK_COLS ? 0 : L->nh * L->hd, out = L->nh * L->hd - skip + 2 * kv;
    const int64_t wes = wdt == F32 ? 4 : wdt == BF16 || wdt == PACKED ? 2 : 1;
    char *cat = alloc64((size_t)(rows * 2 * H * es)), *x = alloc64((size_t)(rows * H * es));
    char *h = alloc64((size_t)(rows * H * es)), *big = alloc64((size_t)(rows * out * es));
    float *q = alloc64((size_t)(rows * (out - 2 * kv + 1)) * sizeof(float));
    int64_t *slot = malloc((size_t)rows * sizeof(int64_t)), *pos = calloc((size_t)rows, sizeof(int64_t));
    float *cos = alloc64((size_t)(rows * L->rot) * sizeof(float)), *sin = alloc64((size_t)(rows * L->rot) * sizeof(float));
    int rc = (!cat || !x || !h || !big || !q || !slot || !pos || !cos || !sin) ? 1 : 0;
    for (int64_t r = 0; r < rows && !rc; r++) {
        memcpy(cos + r * L->rot, cos_table + positions[r] * L->rot, (size_t)L->rot * sizeof(float));
        memcpy(sin + r * L->rot, sin_table + positions[r] * L->rot, (size_t)L->rot * sizeof(float));
        const char *row = (const char *)raw + r * 2 * H * es;
        char *to = cat + r * 2 * H * es;
        rc = sl_add_rmsnorm((void *)(row + H * es), NULL, dt, C->norm_emb, to, dt, 1, H, C->eps);
        if (!rc) rc = sl_add_rmsnorm((void *)row, NULL, dt, C->norm_hid, to + H * es, dt, 1, H, C->eps);
        slot[r] = r; /* row r's key and value at "slot" r, position 0, of a cache of one position: [rows, kvh, hd] */
    }
    if (!rc) rc = sl_linear_q(cat, dt, C->fc_w, (int)C->fc_wdt, C->fc_s, NULL, 0, x, dt, rows, 2 * H, H, threads);
    if (!rc) rc = sl_add_rmsnorm(x, NULL, dt, L->in_norm, h, dt, rows, H, L->eps);
    const void *w = (const char *)L->qkv_w + skip * H * wes;
    const float *ws = L->qkv_s ? L->qkv_s + skip : NULL;
    const void *b = L->qkv_b ? (const char *)L->qkv_b + skip * es : NULL;
    const int64_t nh = skip ? 0 : L->nh; /* q heads left in the product (their rows are written to q, unread) */
    if (!rc) rc = sl_linear_q(h, dt, w, wdt, ws, b, dt, big, dt, rows, H, out, threads);
    if (!rc) rc = sl_qk_rope_write(big, dt, rows, out, 0, nh * L->hd, nh * L->hd + kv, nh, L->kvh, L->hd, L->rot, cos,
                                   sin, L->q_norm, L->k_norm, L->eps, q, k, v, dt, slot, pos, 1);
    free(cat);
    free(x);
    free(h);
    free(big);
    free(q);
    free(slot);
    free(pos);
    free(cos);
    free(sin);
    return rc;
}
