/* Exact MaxSim over packed documents, fused: the max over a document's rows is taken while the
 * products are still in registers, so the (query rows x document rows) product matrix is never
 * written to memory (numpy's GEMM + maximum.reduceat writes it and reads it back).
 *
 * Built as the extension module uibk_embedding._maxsim_kernel (an empty module, so that importing
 * it finds the file) and called through ctypes by uibk_embedding/maxsim.py:
 *   uibk_maxsim_supported()  1 when this CPU has AVX2 + FMA + F16C (checked at run time, so the
 *                             library builds with the compiler's default flags on any x86-64);
 *   uibk_maxsim(...)          scores of documents [d0, d1) against every query (see below);
 *   uibk_maxsim_kinds()       how many row kinds uibk_maxsim reads (6: float32, float16, int8
 *                             rows, rotated 4-, 3- and 2-bit rows; 3 before the rotated codes); a
 *                             library built before int8 rows lacks it;
 *   uibk_maxsim_isas()        the paths this CPU runs: bit 0 AVX2 (+ FMA + F16C), bit 1 AVX-512F
 *                             (a library built before the AVX-512 path lacks it and the next);
 *   uibk_maxsim_isa(isa, ...) uibk_maxsim on a chosen path (1 AVX2, 2 AVX-512): both give the
 *                             same scores bit for bit; uibk_maxsim runs the best one.
 * Other CPUs (and other architectures, where this file compiles to the stub at the bottom) use
 * the numpy path in maxsim.py. The AVX-512 path is described above maxsim512 below; what follows
 * here is the AVX2 path.
 *
 * Micro-kernel: 6 document rows x 16 query rows in 12 AVX2 accumulators, one broadcast of each
 * row's value per dimension (the classic register-blocked GEMM shape, FMA-bound). Query rows are
 * given transposed and zero-padded to a multiple of 16 (qt: dim x rpad); padded rows are never
 * summed. Rows are copied (float16: widened with F16C; int8 rows: 8 codes at a time widened to
 * float32 and multiplied by the row's scale, in registers) into a small per-thread buffer, CHUNK
 * rows at a time, so no block of the matrix is ever converted in memory.
 * An int8 row (uibk_embedding/quantize.py) is dim int8 codes, a float16 scale and a float16 tag
 * (dim + 4 bytes): its values are scale * codes[i], and coordinate 0 the tag. A code times a
 * float16 scale is exact in float32, so int8 rows score bit for bit as their float32 rows do.
 * A rotated b-bit row (b = 4, 3, 2) is 16 b bytes of codes, then a float16 scale and a float16 tag:
 * 128 codes packed 8 to b bytes (code i of a group at bits b i of its little-endian integer), each
 * the value scale * (code - (2^b - 1) / 2) of the rotated body; the row is scanned as dim = 129
 * values [tag ; 128 rotated values] against queries the caller rotated the same way (quantize.py).
 * Decoded 8 codes at a time in registers (one broadcast, a variable shift, a mask), exactly.
 * Groups of fewer than 6 rows repeat their last row, which cannot change a maximum.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QB 16    /* query rows per block: two 8-float registers */
#define RB 6     /* document rows per micro-kernel call */
#define CHUNK 48 /* document rows converted / visited per query block (48 x 128 floats = 24 KiB) */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TARGET __attribute__((target("avx2,fma,f16c")))

int uibk_maxsim_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

/* maxes of 6 rows (r[0..5]) against one 16-row query block, folded into m[0..1]; n[0..1] gain
 * all ones in the lanes where a product is NaN, which the max would drop (_mm256_max_ps returns
 * its second operand when either is NaN), so that the caller makes those lanes NaN as numpy does */
TARGET static inline void group6(const float *const r[RB], int64_t dim, const float *qt,
                                 int64_t rpad, __m256 *m0, __m256 *m1, __m256 *n0, __m256 *n1) {
    __m256 a00 = _mm256_setzero_ps(), a01 = _mm256_setzero_ps();
    __m256 a10 = _mm256_setzero_ps(), a11 = _mm256_setzero_ps();
    __m256 a20 = _mm256_setzero_ps(), a21 = _mm256_setzero_ps();
    __m256 a30 = _mm256_setzero_ps(), a31 = _mm256_setzero_ps();
    __m256 a40 = _mm256_setzero_ps(), a41 = _mm256_setzero_ps();
    __m256 a50 = _mm256_setzero_ps(), a51 = _mm256_setzero_ps();
    const float *r0 = r[0], *r1 = r[1], *r2 = r[2], *r3 = r[3], *r4 = r[4], *r5 = r[5];
    for (int64_t k = 0; k < dim; k++) {
        const __m256 q0 = _mm256_loadu_ps(qt + k * rpad), q1 = _mm256_loadu_ps(qt + k * rpad + 8);
        __m256 b;
        b = _mm256_broadcast_ss(r0 + k); a00 = _mm256_fmadd_ps(b, q0, a00); a01 = _mm256_fmadd_ps(b, q1, a01);
        b = _mm256_broadcast_ss(r1 + k); a10 = _mm256_fmadd_ps(b, q0, a10); a11 = _mm256_fmadd_ps(b, q1, a11);
        b = _mm256_broadcast_ss(r2 + k); a20 = _mm256_fmadd_ps(b, q0, a20); a21 = _mm256_fmadd_ps(b, q1, a21);
        b = _mm256_broadcast_ss(r3 + k); a30 = _mm256_fmadd_ps(b, q0, a30); a31 = _mm256_fmadd_ps(b, q1, a31);
        b = _mm256_broadcast_ss(r4 + k); a40 = _mm256_fmadd_ps(b, q0, a40); a41 = _mm256_fmadd_ps(b, q1, a41);
        b = _mm256_broadcast_ss(r5 + k); a50 = _mm256_fmadd_ps(b, q0, a50); a51 = _mm256_fmadd_ps(b, q1, a51);
    }
#define UNORD(x, y) _mm256_cmp_ps(x, y, _CMP_UNORD_Q)
    *n0 = _mm256_or_ps(*n0, _mm256_or_ps(_mm256_or_ps(UNORD(a00, a10), UNORD(a20, a30)), UNORD(a40, a50)));
    *n1 = _mm256_or_ps(*n1, _mm256_or_ps(_mm256_or_ps(UNORD(a01, a11), UNORD(a21, a31)), UNORD(a41, a51)));
#undef UNORD
    a00 = _mm256_max_ps(_mm256_max_ps(a00, a10), _mm256_max_ps(a20, a30));
    a01 = _mm256_max_ps(_mm256_max_ps(a01, a11), _mm256_max_ps(a21, a31));
    *m0 = _mm256_max_ps(*m0, _mm256_max_ps(a00, _mm256_max_ps(a40, a50)));
    *m1 = _mm256_max_ps(*m1, _mm256_max_ps(a01, _mm256_max_ps(a41, a51)));
}

/* n int8 rows (dim codes, float16 scale, float16 tag each) dequantised into dst (n x dim floats) */
TARGET static void dequant(const uint8_t *src, float *dst, int64_t n, int64_t dim) {
    const int64_t stride = dim + 4;
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *row = src + r * stride;
        uint16_t sbits, tbits;
        memcpy(&sbits, row + dim, 2);
        memcpy(&tbits, row + dim + 2, 2);
        const float scale = _cvtsh_ss(sbits);
        const __m256 s = _mm256_set1_ps(scale);
        float *out = dst + r * dim;
        int64_t i = 0;
        for (; i + 8 <= dim; i += 8) {
            const __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + i)));
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(c), s));
        }
        for (; i < dim; i++) out[i] = (float)(int8_t)row[i] * scale;
        out[0] = _cvtsh_ss(tbits);
    }
}

/* the 8 codes of one group: b bytes read one at a time (never past the row) */
TARGET static inline __attribute__((always_inline)) uint32_t group_bits(const uint8_t *p, int bits) {
    uint32_t w = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    if (bits > 2) w |= (uint32_t)p[2] << 16;
    if (bits > 3) w |= (uint32_t)p[3] << 24;
    return w;
}

/* n rotated bits-bit rows (16 bits code bytes, float16 scale, float16 tag) decoded into dst
 * (n x 129 floats: the tag, then the 128 rotated values); bits is a constant where inlined */
TARGET static inline __attribute__((always_inline)) void decode_rows(const uint8_t *src, float *dst,
                                                                     int64_t n, int bits) {
    const int64_t stride = 16 * bits + 4;
    const __m256i shifts = _mm256_setr_epi32(0, bits, 2 * bits, 3 * bits, 4 * bits, 5 * bits, 6 * bits, 7 * bits);
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    const __m256 half = _mm256_set1_ps(0.5f * (float)((1 << bits) - 1));
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *row = src + r * stride;
        uint16_t sbits, tbits;
        memcpy(&sbits, row + 16 * bits, 2);
        memcpy(&tbits, row + 16 * bits + 2, 2);
        const __m256 s = _mm256_set1_ps(_cvtsh_ss(sbits));
        float *out = dst + r * 129;
        out[0] = _cvtsh_ss(tbits);
        for (int g = 0; g < 16; g++) {
            const __m256i w = _mm256_set1_epi32((int)group_bits(row + g * bits, bits));
            const __m256i c = _mm256_and_si256(_mm256_srlv_epi32(w, shifts), mask);
            /* code - half is exact (at most 5 significant bits), and so is its product with a
             * float16 scale: the values numpy's decoding computes */
            _mm256_storeu_ps(out + 1 + 8 * g, _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(c), half), s));
        }
    }
}

TARGET static void decode4(const uint8_t *src, float *dst, int64_t n) { decode_rows(src, dst, n, 4); }
TARGET static void decode3(const uint8_t *src, float *dst, int64_t n) { decode_rows(src, dst, n, 3); }
TARGET static void decode2(const uint8_t *src, float *dst, int64_t n) { decode_rows(src, dst, n, 2); }

TARGET static void widen(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}

/* Scores of documents [d0, d1) (rows offsets[d]..offsets[d+1] of docs, dim wide: kind 0 float32,
 * kind 1 IEEE float16, kind 2 int8 rows as above, kinds 3, 4, 5 rotated 4-, 3-, 2-bit rows, which
 * need dim = 129) against nq queries whose rows are qoff[q]..qoff[q+1] of the
 * transposed, padded query matrix qt (dim x rpad, rpad a multiple of 16). out[q * out_stride + d]
 * receives the sum over query q's rows of the max over document d's rows; a document without
 * rows scores -inf. work holds rpad + CHUNK * dim floats. Returns 0, or -1 when rpad is not a
 * multiple of 16. Pure computation: safe to call from several threads on disjoint [d0, d1). */
int uibk_maxsim_kinds(void) { return 6; }

TARGET static int maxsim256(const float *qt, int64_t rpad, int64_t dim, const void *docs, int kind,
                            const int64_t *offsets, int64_t d0, int64_t d1, const int64_t *qoff,
                            int64_t nq, float *out, int64_t out_stride, float *work) {
    float *maxes = work, *buf = work + rpad;
    const float *rows32 = (const float *)docs;
    const uint16_t *rows16 = (const uint16_t *)docs;
    const uint8_t *rows8 = (const uint8_t *)docs;
    for (int64_t d = d0; d < d1; d++) {
        const int64_t start = offsets[d], stop = offsets[d + 1];
        if (stop <= start) {
            for (int64_t q = 0; q < nq; q++) out[q * out_stride + d] = -__builtin_inff();
            continue;
        }
        for (int64_t i = 0; i < rpad; i++) maxes[i] = -__builtin_inff();
        for (int64_t c = start; c < stop; c += CHUNK) {
            const int64_t n = (stop - c < CHUNK) ? stop - c : CHUNK;
            if (kind >= 3) {
                const int bits = 7 - kind;  /* 3: 4 bits, 4: 3 bits, 5: 2 bits */
                const uint8_t *src = rows8 + c * (16 * bits + 4);
                if (bits == 4) decode4(src, buf, n);
                else if (bits == 3) decode3(src, buf, n);
                else decode2(src, buf, n);
            } else if (kind == 2) {
                dequant(rows8 + c * (dim + 4), buf, n, dim);
            } else if (kind == 1) {
                widen(rows16 + c * dim, buf, n * dim);
            } else {  /* copied too: one sequential stream, then 6 broadcast streams from L1
                       * (broadcasting straight from memory ran ~1.4x slower, loaded machine) */
                memcpy(buf, rows32 + c * dim, (size_t)(n * dim) * sizeof(float));
            }
            const float *rows = buf;
            for (int64_t qb = 0; qb < rpad; qb += QB) {
                __m256 m0 = _mm256_loadu_ps(maxes + qb), m1 = _mm256_loadu_ps(maxes + qb + 8);
                /* NaN lanes of earlier chunks stay NaN (all ones is a NaN) */
                __m256 n0 = _mm256_cmp_ps(m0, m0, _CMP_UNORD_Q), n1 = _mm256_cmp_ps(m1, m1, _CMP_UNORD_Q);
                for (int64_t g = 0; g < n; g += RB) {
                    const float *r[RB];
                    for (int t = 0; t < RB; t++) r[t] = rows + ((g + t < n) ? g + t : n - 1) * dim;
                    group6(r, dim, qt + qb, rpad, &m0, &m1, &n0, &n1);
                }
                _mm256_storeu_ps(maxes + qb, _mm256_or_ps(m0, n0));
                _mm256_storeu_ps(maxes + qb + 8, _mm256_or_ps(m1, n1));
            }
        }
        for (int64_t q = 0; q < nq; q++) {
            double s = 0.0;
            for (int64_t i = qoff[q]; i < qoff[q + 1]; i++) s += maxes[i];
            out[q * out_stride + d] = (float)s;
        }
    }
    return 0;
}


/* ---- AVX-512 path (picked at run time where the CPU has AVX-512F) ---------------------------------
 * The same arithmetic lane for lane: each product is the same chain of FMAs over k = 0..dim-1
 * starting from zero, the max is exact and the sum over a query's rows is the same double sum, so
 * the scores are bit for bit those of the AVX2 path. What changes is the tile: R document rows x
 * NZ 16-float query registers (NZ x 16 query rows at once: 32 rows of a typical query in one pass,
 * so each document row is broadcast once rather than once per 16 query rows), up to 24
 * accumulators of 32 registers (NZ = 3, R = 8 for 48 query rows; a wider query takes passes of
 * 32, each over the chunk's rows in L1). float32 rows are broadcast straight from the caller's
 * matrix (no copy); other kinds are widened / decoded into the per-thread buffer as before. Each
 * tile prefetches the lines a tile ahead (float32) or the next chunk's source bytes (other kinds):
 * without it the float32 scan ran about 2x slower in an interleaved A/B on a loaded machine
 * (indicative only). A document's last rows (fewer than R) take a tile of exactly their number:
 * no row is repeated. */
/* compilers too old for AVX-512 intrinsics build the AVX2 path alone */
#if (defined(__clang__) && __clang_major__ >= 5) || (!defined(__clang__) && __GNUC__ >= 7)
#define UIBK_AVX512 1
#define TARGET512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define RB512 12   /* document rows per tile with NZ = 1 or 2 (8 with NZ = 3) */
#define PF_ROWS 1  /* 0: no software prefetch (the hardware prefetcher alone) */

int uibk_maxsim_avx512_supported(void) {
    __builtin_cpu_init();
    return uibk_maxsim_supported() && __builtin_cpu_supports("avx512f");
}

/* maxes of R rows (rows, dim apart) against NZ query registers (qt + 16 z, rpad apart), folded
 * into m[z]; nan[z] gains the lanes where a product is NaN (_mm512_max_ps drops it, as the AVX2
 * path's max does; the caller makes those lanes NaN). NZ and R are constants where inlined. */
TARGET512 static inline __attribute__((always_inline)) void tile512(
        const float *rows, int64_t dim, const float *qt, int64_t rpad, const int NZ, const int R,
        const char *pf, __m512 *m, __mmask16 *nan) {
    __m512 acc[3][RB512];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 3
        for (int z = 0; z < NZ; z++) acc[z][r] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < dim; k++) {
        __m512 q[3];
#pragma GCC unroll 3
        for (int z = 0; z < NZ; z++) q[z] = _mm512_loadu_ps(qt + k * rpad + 16 * z);
        /* R x dim x 4 bytes ahead of the rows (pf: the rows a later tile reads), one 64-byte
         * line per column while they last: all of them, as R <= 16 */
        if (PF_ROWS && pf != NULL && k * 16 < R * dim) _mm_prefetch(pf + 64 * k, _MM_HINT_T0);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            const __m512 b = _mm512_set1_ps(rows[r * dim + k]);
#pragma GCC unroll 3
            for (int z = 0; z < NZ; z++) acc[z][r] = _mm512_fmadd_ps(b, q[z], acc[z][r]);
        }
    }
#pragma GCC unroll 3
    for (int z = 0; z < NZ; z++) {
        __m512 best = m[z];
        __mmask16 bad = nan[z];
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            bad |= _mm512_cmp_ps_mask(acc[z][r], acc[z][r], _CMP_UNORD_Q);
            best = _mm512_max_ps(best, acc[z][r]);
        }
        m[z] = best;
        nan[z] = bad;
    }
}

#define TILE_CASE(NZ, R) case R: tile512(rows, dim, qt, rpad, NZ, R, PF(g), m, nan); break;
/* what tile g prefetches: the bytes of the pass's region ahead that match its rows' place */
#define PF(g) (ahead != NULL ? ahead + (g) * dim * 4 : NULL)

/* n rows (n <= 48) against NZ query registers: full tiles, then one tile of the rest */
TARGET512 static void pass512_1(const float *rows, int64_t n, int64_t dim, const float *qt, int64_t rpad,
                                const char *ahead, __m512 *m, __mmask16 *nan) {
    int64_t g = 0;
    for (; g + RB512 <= n; g += RB512) tile512(rows + g * dim, dim, qt, rpad, 1, RB512, PF(g), m, nan);
    rows += g * dim;
    switch (n - g) {
        TILE_CASE(1, 1) TILE_CASE(1, 2) TILE_CASE(1, 3) TILE_CASE(1, 4) TILE_CASE(1, 5) TILE_CASE(1, 6)
        TILE_CASE(1, 7) TILE_CASE(1, 8) TILE_CASE(1, 9) TILE_CASE(1, 10) TILE_CASE(1, 11)
        default: break;
    }
}

TARGET512 static void pass512_2(const float *rows, int64_t n, int64_t dim, const float *qt, int64_t rpad,
                                const char *ahead, __m512 *m, __mmask16 *nan) {
    int64_t g = 0;
    for (; g + RB512 <= n; g += RB512) tile512(rows + g * dim, dim, qt, rpad, 2, RB512, PF(g), m, nan);
    rows += g * dim;
    switch (n - g) {
        TILE_CASE(2, 1) TILE_CASE(2, 2) TILE_CASE(2, 3) TILE_CASE(2, 4) TILE_CASE(2, 5) TILE_CASE(2, 6)
        TILE_CASE(2, 7) TILE_CASE(2, 8) TILE_CASE(2, 9) TILE_CASE(2, 10) TILE_CASE(2, 11)
        default: break;
    }
}

TARGET512 static void pass512_3(const float *rows, int64_t n, int64_t dim, const float *qt, int64_t rpad,
                                const char *ahead, __m512 *m, __mmask16 *nan) {
    int64_t g = 0;
    for (; g + 8 <= n; g += 8) tile512(rows + g * dim, dim, qt, rpad, 3, 8, PF(g), m, nan);
    rows += g * dim;
    switch (n - g) {
        TILE_CASE(3, 1) TILE_CASE(3, 2) TILE_CASE(3, 3) TILE_CASE(3, 4) TILE_CASE(3, 5) TILE_CASE(3, 6)
        TILE_CASE(3, 7)
        default: break;
    }
}
#undef TILE_CASE
#undef PF

TARGET512 static void widen512(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}

/* uibk_maxsim on AVX-512 (same arguments, same results) */
TARGET512 static int maxsim512(const float *qt, int64_t rpad, int64_t dim, const void *docs, int kind,
                               const int64_t *offsets, int64_t d0, int64_t d1, const int64_t *qoff,
                               int64_t nq, float *out, int64_t out_stride, float *work) {
    float *maxes = work, *buf = work + rpad;
    const float *rows32 = (const float *)docs;
    const uint16_t *rows16 = (const uint16_t *)docs;
    const uint8_t *rows8 = (const uint8_t *)docs;
    const __m512 all_ones = _mm512_castsi512_ps(_mm512_set1_epi32(-1));  /* a NaN */
    for (int64_t d = d0; d < d1; d++) {
        const int64_t start = offsets[d], stop = offsets[d + 1];
        if (stop <= start) {
            for (int64_t q = 0; q < nq; q++) out[q * out_stride + d] = -__builtin_inff();
            continue;
        }
        for (int64_t i = 0; i < rpad; i++) maxes[i] = -__builtin_inff();
        for (int64_t c = start; c < stop; c += CHUNK) {
            const int64_t n = (stop - c < CHUNK) ? stop - c : CHUNK;
            const float *rows;
            const char *ahead = NULL;  /* what this chunk's last pass prefetches: the next chunk */
            const int more = c + n < offsets[d1];
            if (kind == 0) {  /* in place: the rows are read once per pass, straight from the matrix */
                rows = rows32 + c * dim;
                if (more) ahead = (const char *)(rows + RB512 * dim);  /* a tile ahead of each tile */
            } else {
                if (kind >= 3) {
                    const int bits = 7 - kind;
                    const uint8_t *src = rows8 + c * (16 * bits + 4);
                    if (bits == 4) decode4(src, buf, n);
                    else if (bits == 3) decode3(src, buf, n);
                    else decode2(src, buf, n);
                    if (more) ahead = (const char *)(src + n * (16 * bits + 4));
                } else if (kind == 2) {
                    dequant(rows8 + c * (dim + 4), buf, n, dim);
                    if (more) ahead = (const char *)(rows8 + (c + n) * (dim + 4));
                } else {
                    widen512(rows16 + c * dim, buf, n * dim);
                    if (more) ahead = (const char *)(rows16 + (c + n) * dim);
                }
                rows = buf;
            }
            for (int64_t qb = 0; qb < rpad;) {
                const int64_t left = (rpad - qb) / 16;
                const int nz = left == 3 ? 3 : (left >= 2 ? 2 : 1);
                __m512 m[3];
                __mmask16 nan[3];
                for (int z = 0; z < nz; z++) {
                    m[z] = _mm512_loadu_ps(maxes + qb + 16 * z);
                    nan[z] = _mm512_cmp_ps_mask(m[z], m[z], _CMP_UNORD_Q);  /* NaN lanes stay NaN */
                }
                /* a pass before the last finds the rows in L1 on the next: the last prefetches */
                const char *pf = (qb + 16 * nz >= rpad) ? ahead : NULL;
                if (nz == 1) pass512_1(rows, n, dim, qt + qb, rpad, pf, m, nan);
                else if (nz == 2) pass512_2(rows, n, dim, qt + qb, rpad, pf, m, nan);
                else pass512_3(rows, n, dim, qt + qb, rpad, pf, m, nan);
                for (int z = 0; z < nz; z++)
                    _mm512_storeu_ps(maxes + qb + 16 * z, _mm512_mask_mov_ps(m[z], nan[z], all_ones));
                qb += 16 * nz;
            }
        }
        for (int64_t q = 0; q < nq; q++) {
            double s = 0.0;
            for (int64_t i = qoff[q]; i < qoff[q + 1]; i++) s += maxes[i];
            out[q * out_stride + d] = (float)s;
        }
    }
    return 0;
}

#else
int uibk_maxsim_avx512_supported(void) { return 0; }
#endif /* UIBK_AVX512 */

/* The paths this CPU runs: bit 0 the AVX2 one, bit 1 the AVX-512 one (0: neither, numpy's). */
int uibk_maxsim_isas(void) {
    return uibk_maxsim_supported() | (uibk_maxsim_avx512_supported() << 1);
}

/* uibk_maxsim on a chosen path: isa 1 AVX2 + FMA + F16C, 2 AVX-512F; -1 when this CPU lacks it
 * (or for the arguments uibk_maxsim refuses). */
int uibk_maxsim_isa(int isa, const float *qt, int64_t rpad, int64_t dim, const void *docs, int kind,
                    const int64_t *offsets, int64_t d0, int64_t d1, const int64_t *qoff, int64_t nq,
                    float *out, int64_t out_stride, float *work) {
    if (rpad % QB != 0 || kind < 0 || kind > 5 || (kind >= 3 && dim != 129)) return -1;
#ifdef UIBK_AVX512
    if (isa == 2 && uibk_maxsim_avx512_supported())
        return maxsim512(qt, rpad, dim, docs, kind, offsets, d0, d1, qoff, nq, out, out_stride, work);
#endif
    if (isa == 1 && uibk_maxsim_supported())
        return maxsim256(qt, rpad, dim, docs, kind, offsets, d0, d1, qoff, nq, out, out_stride, work);
    return -1;
}

/* the best path this CPU runs (AVX-512 where it has it) */
int uibk_maxsim(const float *qt, int64_t rpad, int64_t dim, const void *docs, int kind,
                const int64_t *offsets, int64_t d0, int64_t d1, const int64_t *qoff,
                int64_t nq, float *out, int64_t out_stride, float *work) {
    static int best = -1;  /* a race here writes the same value */
    if (best < 0) best = uibk_maxsim_avx512_supported() ? 2 : 1;
    return uibk_maxsim_isa(best, qt, rpad, dim, docs, kind, offsets, d0, d1, qoff, nq, out, out_stride, work);
}

#else /* not x86-64 with GCC/Clang: maxsim.py keeps its numpy path */

int uibk_maxsim_supported(void) { return 0; }

int uibk_maxsim_kinds(void) { return 0; }

int uibk_maxsim_avx512_supported(void) { return 0; }

int uibk_maxsim_isas(void) { return 0; }

int uibk_maxsim_isa(int isa, const float *qt, int64_t rpad, int64_t dim, const void *docs, int kind,
                    const int64_t *offsets, int64_t d0, int64_t d1, const int64_t *qoff, int64_t nq,
                    float *out, int64_t out_stride, float *work) {
    (void)isa;
    return uibk_maxsim(qt, rpad, dim, docs, kind, offsets, d0, d1, qoff, nq, out, out_stride, work);
}

int uibk_maxsim(const float *qt, int64_t rpad, int64_t dim, const void *docs, int kind,
                const int64_t *offsets, int64_t d0, int64_t d1, const int64_t *qoff, int64_t nq,
                float *out, int64_t out_stride, float *work) {
    (void)qt; (void)rpad; (void)dim; (void)docs; (void)kind; (void)offsets; (void)d0; (void)d1;
    (void)qoff; (void)nq; (void)out; (void)out_stride; (void)work;
    return -1;
}

#endif

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT, "_maxsim_kernel",
    "Fused exact MaxSim (AVX2/FMA/F16C; AVX-512F where present), called through ctypes by "
    "uibk_embedding.maxsim.", -1, NULL,
};

PyMODINIT_FUNC PyInit__maxsim_kernel(void) { return PyModule_Create(&kernel_module); }
