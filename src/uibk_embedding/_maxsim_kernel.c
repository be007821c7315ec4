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
 *                             library built before int8 rows lacks it.
 * Other CPUs (and other architectures, where this file compiles to the stub at the bottom) use
 * the numpy path in maxsim.py.
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

TARGET int uibk_maxsim(const float *qt, int64_t rpad, int64_t dim, const void *docs, int kind,
                       const int64_t *offsets, int64_t d0, int64_t d1, const int64_t *qoff,
                       int64_t nq, float *out, int64_t out_stride, float *work) {
    if (rpad % QB != 0 || kind < 0 || kind > 5 || (kind >= 3 && dim != 129)) return -1;
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

#else /* not x86-64 with GCC/Clang: maxsim.py keeps its numpy path */

int uibk_maxsim_supported(void) { return 0; }

int uibk_maxsim_kinds(void) { return 0; }

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
    "Fused exact MaxSim (AVX2/FMA/F16C), called through ctypes by uibk_embedding.maxsim.", -1, NULL,
};

PyMODINIT_FUNC PyInit__maxsim_kernel(void) { return PyModule_Create(&kernel_module); }
