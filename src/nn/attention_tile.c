// attention_tile.c: masks, exponentials and softmax steps over one score tile (attention_tile.h).
//
// Per visible (query, key) pair the forward does 4 * head_dim FLOPs of matmul (~2 ns at head_dim
// 64) and one exp, so the exp must cost a small fraction of that: 2^x is computed 8 lanes at a time
// as 2^n * p(f) with n = round(x), f = x - n in [-1/2, 1/2] and p the degree-7 Taylor polynomial of
// e^(f ln 2) (truncation error < 6e-9, so float rounding dominates).
#include "attention_tile.h"

#include <math.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "nn/panel_kernel.h"
#define ATTN_TILE_AVX2 1
#else
#define ATTN_TILE_AVX2 0
#endif

#if ATTN_TILE_AVX2

// (ln 2)^k / k!, k = 0..7
#define EXP2_C0 1.0f
#define EXP2_C1 0.6931471805599453f
#define EXP2_C2 0.2402265069591007f
#define EXP2_C3 0.055504108664821576f
#define EXP2_C4 0.009618129107628477f
#define EXP2_C5 0.0013333558146428441f
#define EXP2_C6 0.00015403530393381606f
#define EXP2_C7 1.5252733804059838e-05f

static inline __m256 exp2_ps(__m256 x) {
    // clamp with x as the second operand so a NaN passes through (max/min return it) and shows up
    x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);
    x = _mm256_min_ps(_mm256_set1_ps(127.0f), x);
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(EXP2_C7);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C6));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(EXP2_C0));
    // 2^n by building the exponent field; n = -127 gives the bit pattern 0, i.e. exactly 0.0f
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline float hmax_ps(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static inline float hsum_ps(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

// lanes [0, n) set, for the ragged end of a row
static inline __m256i tail_mask(int n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

void attn_exp2_inplace(float *x, int n) {
    int j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, exp2_ps(_mm256_loadu_ps(x + j)));
    if (j < n) {
        __m256i tm = tail_mask(n - j);
        _mm256_maskstore_ps(x + j, tm, exp2_ps(_mm256_maskload_ps(x + j, tm)));
    }
}

void attn_tile_mask(float *s, int n_heads_stacked, int nq, int cols, int ld, const int32_t *qpos,
                    const int32_t *qseg, const int32_t *kpos, const int32_t *kseg) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int i = 0; i < nq; i++) {
        __m256i qp = _mm256_set1_epi32(qpos[i]), qs = _mm256_set1_epi32(qseg[i]);
        int j = 0;
        for (; j + 8 <= cols; j += 8) {
            __m256i kp = _mm256_loadu_si256((const __m256i *)(kpos + j));
            __m256i ks = _mm256_loadu_si256((const __m256i *)(kseg + j));
            // hidden = kpos > qpos  or  kseg != qseg
            __m256i later = _mm256_cmpgt_epi32(kp, qp);
            __m256i same = _mm256_cmpeq_epi32(ks, qs);
            __m256 hidden = _mm256_castsi256_ps(_mm256_andnot_si256(same, _mm256_set1_epi32(-1)));
            hidden = _mm256_or_ps(hidden, _mm256_castsi256_ps(later));
            for (int hh = 0; hh < n_heads_stacked; hh++) {
                float *row = s + (int64_t)(hh * nq + i) * ld;
                _mm256_storeu_ps(row + j, _mm256_blendv_ps(_mm256_loadu_ps(row + j), ninf, hidden));
            }
        }
        for (; j < cols; j++) {
            if (kseg[j] == qseg[i] && kpos[j] <= qpos[i]) continue;
            for (int hh = 0; hh < n_heads_stacked; hh++) s[(int64_t)(hh * nq + i) * ld + j] = -INFINITY;
        }
    }
}

void attn_tile_softmax_step(float *s, int rows, int cols, int ld, float *m, float *l, float *alpha) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    int full = cols & ~7, rest = cols - full;
    __m256i tm = tail_mask(rest);
    for (int r = 0; r < rows; r++) {
        float *row = s + (int64_t)r * ld;
        // row maximum, two accumulators to shorten the dependency chain
        __m256 mx0 = ninf, mx1 = ninf;
        int j = 0;
        for (; j + 16 <= full; j += 16) {
            mx0 = _mm256_max_ps(mx0, _mm256_loadu_ps(row + j));
            mx1 = _mm256_max_ps(mx1, _mm256_loadu_ps(row + j + 8));
        }
        for (; j < full; j += 8) mx0 = _mm256_max_ps(mx0, _mm256_loadu_ps(row + j));
        if (rest) mx1 = _mm256_max_ps(mx1, _mm256_blendv_ps(ninf, _mm256_maskload_ps(row + full, tm),
                                                           _mm256_castsi256_ps(tm)));
        float mx = hmax_ps(_mm256_max_ps(mx0, mx1));
        float m_new = mx > m[r] ? mx : m[r];
        if (m_new == -INFINITY) {  // nothing visible yet in this row: contributes nothing
            for (j = 0; j < cols; j++) row[j] = 0.0f;
            alpha[r] = 1.0f;
            continue;
        }
        __m256 mv = _mm256_set1_ps(m_new);
        __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
        for (j = 0; j + 16 <= full; j += 16) {
            __m256 p0 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(row + j), mv));
            __m256 p1 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(row + j + 8), mv));
            _mm256_storeu_ps(row + j, p0);
            _mm256_storeu_ps(row + j + 8, p1);
            sum0 = _mm256_add_ps(sum0, p0);
            sum1 = _mm256_add_ps(sum1, p1);
        }
        for (; j < full; j += 8) {
            __m256 p0 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(row + j), mv));
            _mm256_storeu_ps(row + j, p0);
            sum0 = _mm256_add_ps(sum0, p0);
        }
        if (rest) {
            __m256 p1 = exp2_ps(_mm256_sub_ps(_mm256_maskload_ps(row + full, tm), mv));
            p1 = _mm256_and_ps(p1, _mm256_castsi256_ps(tm));
            _mm256_maskstore_ps(row + full, tm, p1);
            sum1 = _mm256_add_ps(sum1, p1);
        }
        float a = exp2f(m[r] - m_new);  // m = -inf gives 0: the old (empty) sum is dropped
        l[r] = l[r] * a + hsum_ps(_mm256_add_ps(sum0, sum1));
        alpha[r] = a;
        m[r] = m_new;
    }
}

// b (cols, d) into panels of 16 keys: kp[(p * d + e) * 16 + c] = b[16 p + c, e], zero past cols.
static void qk_pack(float *kp, const float *b, int64_t ldb, int cols, int d) {
    for (int p0 = 0; p0 < cols; p0 += 16) {
        float *panel = kp + (int64_t)p0 * d;
        int n = cols - p0 < 16 ? cols - p0 : 16;
        for (int c = 0; c < 16; c++) {
            const float *src = b + (int64_t)(p0 + c) * ldb;
            for (int e = 0; e < d; e++) panel[e * 16 + c] = c < n ? src[e] : 0.0f;
        }
    }
}

void attn_tile_qk(float *s, int ld, const float *a, int lda, int rows, const float *b, int64_t ldb, int cols, int d,
                  float *kpack) {
    qk_pack(kpack, b, ldb, cols, d);
    // panels outer: one panel (16 keys x d, 4 KB at d 64) stays in L1 while every row block reads it
    for (int p0 = 0; p0 < cols; p0 += 16) {
        panel_rows(s + p0, ld, a, lda, rows, kpack + (int64_t)p0 * d, d, 0, NULL);
    }
}

// v (cols, d) into panels of 16 columns: vp[(q * cols + j) * 16 + c] = v[j, 16 q + c].
static void pv_pack(float *vp, const float *v, int64_t ldv, int cols, int d) {
    for (int q0 = 0; q0 < d; q0 += 16) {
        float *panel = vp + (int64_t)q0 * cols;
        for (int j = 0; j < cols; j++)
            for (int c = 0; c < 16; c++) panel[j * 16 + c] = v[(int64_t)j * ldv + q0 + c];
    }
}

void attn_tile_pv(float *acc, const float *alpha, const float *p, int ldp, int rows, const float *v, int64_t ldv,
                  int cols, int d, float *vpack) {
    pv_pack(vpack, v, ldv, cols, d);
    for (int q0 = 0; q0 < d; q0 += 16) {
        panel_rows(acc + q0, d, p, ldp, rows, vpack + (int64_t)q0 * cols, cols, 1, alpha);
    }
}

void attn_tile_exp2_bias(float *s, int rows, int cols, int ld, const float *bias) {
    int full = cols & ~7, rest = cols - full;
    __m256i tm = tail_mask(rest);
    for (int r = 0; r < rows; r++) {
        float *row = s + (int64_t)r * ld;
        __m256 b = _mm256_set1_ps(bias[r]);
        for (int j = 0; j < full; j += 8)
            _mm256_storeu_ps(row + j, exp2_ps(_mm256_add_ps(_mm256_loadu_ps(row + j), b)));
        if (rest)
            _mm256_maskstore_ps(row + full, tm, exp2_ps(_mm256_add_ps(_mm256_maskload_ps(row + full, tm), b)));
    }
}

#else  // plain C: the same contracts, one value at a time

void attn_exp2_inplace(float *x, int n) {
    for (int j = 0; j < n; j++) x[j] = x[j] <= -127.0f ? 0.0f : exp2f(x[j]);
}

void attn_tile_mask(float *s, int n_heads_stacked, int nq, int cols, int ld, const int32_t *qpos,
                    const int32_t *qseg, const int32_t *kpos, const int32_t *kseg) {
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < cols; j++) {
            if (kseg[j] == qseg[i] && kpos[j] <= qpos[i]) continue;
            for (int hh = 0; hh < n_heads_stacked; hh++) s[(int64_t)(hh * nq + i) * ld + j] = -INFINITY;
        }
}

void attn_tile_softmax_step(float *s, int rows, int cols, int ld, float *m, float *l, float *alpha) {
    for (int r = 0; r < rows; r++) {
        float *row = s + (int64_t)r * ld;
        float m_new = m[r];
        for (int j = 0; j < cols; j++) m_new = row[j] > m_new ? row[j] : m_new;
        if (m_new == -INFINITY) {
            for (int j = 0; j < cols; j++) row[j] = 0.0f;
            alpha[r] = 1.0f;
            continue;
        }
        float sum = 0.0f;
        for (int j = 0; j < cols; j++) {
            row[j] = exp2f(row[j] - m_new);
            sum += row[j];
        }
        float a = exp2f(m[r] - m_new);
        l[r] = l[r] * a + sum;
        alpha[r] = a;
        m[r] = m_new;
    }
}

void attn_tile_exp2_bias(float *s, int rows, int cols, int ld, const float *bias) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) {
            float x = s[(int64_t)r * ld + j] + bias[r];
            s[(int64_t)r * ld + j] = x <= -127.0f ? 0.0f : exp2f(x);
        }
}

#endif

void attn_tile_dsoftmax(float *dp, const float *p, int rows, int cols, int ld, const float *delta) {
    // plain loops: gcc vectorizes them at -O3
    for (int r = 0; r < rows; r++) {
        float *restrict d = dp + (int64_t)r * ld;
        const float *restrict pr = p + (int64_t)r * ld;
        float dl = delta[r];
        for (int j = 0; j < cols; j++) d[j] = pr[j] * (d[j] - dl);
    }
}
