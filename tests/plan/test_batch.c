// test_batch.c: global batches (lists, cutting, lengths files, generation) and the length
// distributions, including the fit of the paper's two datasets (docs/datasets.md).
#include "test_util.h"

#include <math.h>

#include "bytescale/batch.h"
#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/rng.h"

#define K_ 1024
#define M_ (1024 * 1024)

// ---- helpers ----------------------------------------------------------------------------------

static const char *write_tmp(const char *name, const char *text) {
    static char path[700];
    const char *dir = test_tmpdir("plan_batch");
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (file_write_atomic(path, text, strlen(text)) != 0) fail_msg("%s", bs_errmsg());
    return path;
}

// The call failed and its message holds every one of the given pieces.
static void expect_error(int rc, const char *a, const char *b, const char *c) {
    assert_int_equal(rc, -1);
    const char *msg = bs_errmsg();
    const char *want[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (want[i] && !strstr(msg, want[i])) fail_msg("error \"%s\" does not mention \"%s\"", msg, want[i]);
}

// ---- lengths files ----------------------------------------------------------------------------

static void test_read_lines_and_json(void **state) {
    (void)state;
    const int64_t want[] = {4096, 1, 131072, 77};
    const char *forms[] = {
        "# lengths of one batch\n4096\n\n  1  # a comment after a number\n131072\r\n\t77",
        "[4096, 1, 131072, 77]\n",
        "  {\"name\": \"x\", \"lengths\": [4096, 1, 131072, 7.7e1]}",
    };
    for (int f = 0; f < 3; f++) {
        GlobalBatch b;
        const char *path = write_tmp("good.txt", forms[f]);
        if (batch_read_file(&b, path) != 0) fail_msg("form %d: %s", f, bs_errmsg());
        assert_int_equal(b.n, 4);
        assert_int_equal(b.n_tokens, 4096 + 1 + 131072 + 77);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(b.seqs[i].id, i);
            assert_int_equal(b.seqs[i].len, want[i]);
            assert_int_equal(b.seqs[i].src, -1);
        }
        batch_free(&b);
    }
}

static void test_read_bad_inputs_name_the_place(void **state) {
    (void)state;
    struct {
        const char *text, *m1, *m2, *m3;
    } cases[] = {
        {"10\n20\n3x\n", "bad.txt:3:", "\"3x\"", "not an integer"},
        {"10\n\n1.5\n", "bad.txt:3:", "\"1.5\"", "not an integer"},
        {"10\n12 13\n", "bad.txt:2:", "\"12 13\"", "one per line"},
        {"# c\n10\n0\n", "bad.txt:3:", "positive", "got 0"},
        {"10\n-7\n", "bad.txt:2:", "positive", "got -7"},
        {"99999999999999999999999\n", "bad.txt:1:", "out of range", NULL},
        {"", "bad.txt", "no lengths", NULL},
        {"# only\n\n   # comments\n", "bad.txt", "no lengths", NULL},
        {"[1, 2, \"x\"]", "bad.txt", "[2]", "\"x\""},
        {"[1, 2.5]", "bad.txt", "[1]", "2.5"},
        {"{\"lengths\": [5, 0]}", "bad.txt", "lengths[1]", "positive"},
        {"{\"lengths\": [5, -3]}", "bad.txt", "lengths[1]", "got -3"},
        {"{\"lens\": [5]}", "bad.txt", "\"lengths\"", NULL},
        {"[]", "bad.txt", "no lengths", NULL},
        {"[1, 2,, 3]", "bad.txt:1:", "invalid JSON", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        GlobalBatch b;
        const char *path = write_tmp("bad.txt", cases[i].text);
        expect_error(batch_read_file(&b, path), cases[i].m1, cases[i].m2, cases[i].m3);
        assert_null(b.seqs);  // nothing half-built is left behind
        assert_int_equal(b.n, 0);
    }
    GlobalBatch b;
    expect_error(batch_read_file(&b, "test-tmp/plan_batch/no-such-file"), "no-such-file", "cannot open", NULL);
}

// ---- cutting ----------------------------------------------------------------------------------

// batch_cut against a naive expansion, over many random batches; also the invariants one by one.
static void test_cut_matches_naive_expansion(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 7);
    for (int trial = 0; trial < 2000; trial++) {
        int n = (int)rng_below(&rng, 40);
        int64_t max_ctx = 1 + (int64_t)rng_below(&rng, trial % 3 == 0 ? 8 : 3000);
        GlobalBatch b;
        assert_int_equal(batch_init(&b, (int64_t)rng_below(&rng, 4)), 0);
        for (int i = 0; i < n; i++) {
            int64_t len = 1 + (int64_t)rng_below(&rng, rng_below(&rng, 4) == 0 ? 20000 : 3000);
            int64_t src = rng_below(&rng, 2) ? (int64_t)rng_below(&rng, 1000000) : -1;
            assert_int_equal(batch_push(&b, 100 + i, len, src), 0);
        }
        // the naive reference
        int64_t cap = 0;
        for (int i = 0; i < n; i++) cap += b.seqs[i].len;
        Sequence *ref = malloc((size_t)(cap + 1) * sizeof *ref);
        int64_t m = 0, tokens = b.n_tokens;
        for (int i = 0; i < n; i++) {
            Sequence s = b.seqs[i];
            for (int64_t off = 0; off < s.len; off += max_ctx) {
                int64_t len = s.len - off < max_ctx ? s.len - off : max_ctx;
                ref[m++] = (Sequence){s.id, len, s.src >= 0 ? s.src + off : -1};
            }
        }
        assert_int_equal(batch_cut(&b, max_ctx), 0);
        assert_int_equal(b.n, m);
        assert_int_equal(b.n_tokens, tokens);
        int64_t sum = 0;
        for (int64_t i = 0; i < m; i++) {
            Sequence s = b.seqs[i];
            assert_int_equal(s.id, ref[i].id);
            assert_int_equal(s.len, ref[i].len);
            assert_int_equal(s.src, ref[i].src);
            assert_true(s.len >= 1 && s.len <= max_ctx);
            sum += s.len;
            if (i > 0 && s.id == b.seqs[i - 1].id) {
                assert_int_equal(b.seqs[i - 1].len, max_ctx);  // only a sequence's last piece is short
                if (s.src >= 0) assert_int_equal(s.src, b.seqs[i - 1].src + max_ctx);
            }
            if (i > 0) assert_true(s.id >= b.seqs[i - 1].id);  // pieces of one id contiguous, in order
        }
        assert_int_equal(sum, tokens);
        free(ref);
        batch_free(&b);
    }
    // a batch assembled by hand (cap = 0): cut must grow it, not write past its end
    GlobalBatch h = {0};
    h.seqs = malloc(2 * sizeof *h.seqs);
    h.seqs[0] = (Sequence){0, 10, 50};
    h.seqs[1] = (Sequence){1, 3, -1};
    h.n = 2, h.n_tokens = 13;
    assert_int_equal(batch_cut(&h, 4), 0);
    assert_int_equal(h.n, 4);
    assert_int_equal(h.seqs[2].len, 2);
    assert_int_equal(h.seqs[2].src, 58);
    assert_int_equal(h.seqs[3].id, 1);
    assert_int_equal(batch_cut(&h, 0), 0);  // max_ctx <= 0: nothing to cut
    assert_int_equal(h.n, 4);
    assert_int_equal(batch_push(&h, 9, 5, -1), 0);
    assert_int_equal(h.n_tokens, 18);
    expect_error(batch_push(&h, 9, 0, -1), "sequence 9", "positive", NULL);
    batch_free(&h);
}

// ---- generation -------------------------------------------------------------------------------

static void test_generate_budget_order_and_seed(void **state) {
    (void)state;
    const char *specs[] = {"byted", "github", "uniform:1:64K", "lognormal:8:1.5", "fixed:1000"};
    const int64_t budgets[] = {32 * M_, 32 * M_, 5 * M_ + 3, 3 * M_ + 1, 10500};
    const int64_t ctxs[] = {256 * K_, 0, 10 * K_, 0, 0};
    for (int t = 0; t < 5; t++) {
        GlobalBatch a, b, raw;
        if (batch_generate(&a, specs[t], 42, budgets[t], ctxs[t]) != 0) fail_msg("%s: %s", specs[t], bs_errmsg());
        assert_int_equal(batch_generate(&b, specs[t], 42, budgets[t], ctxs[t]), 0);
        assert_int_equal(batch_generate(&raw, specs[t], 42, budgets[t], 0), 0);
        // exactly the budget, before and after cutting
        assert_int_equal(a.n_tokens, budgets[t]);
        assert_int_equal(raw.n_tokens, budgets[t]);
        int64_t sum = 0;
        for (int64_t i = 0; i < a.n; i++) {
            sum += a.seqs[i].len;
            assert_int_equal(a.seqs[i].src, -1);
            if (ctxs[t] > 0) assert_true(a.seqs[i].len <= ctxs[t]);
            if (i > 0) assert_true(a.seqs[i].id == a.seqs[i - 1].id || a.seqs[i].id == a.seqs[i - 1].id + 1);
        }
        assert_int_equal(sum, budgets[t]);
        assert_int_equal(a.seqs[a.n - 1].id, raw.n - 1);
        // the same seed gives the same batch
        assert_int_equal(a.n, b.n);
        assert_memory_equal(a.seqs, b.seqs, (size_t)a.n * sizeof *a.seqs);
        // the draw order: ids 0..n-1, the lengths dist_sample gives from rng_seed(42), the last one cut
        LengthDist *d;
        assert_int_equal(dist_parse(&d, specs[t]), 0);
        Rng rng;
        rng_seed(&rng, 42);
        for (int64_t i = 0; i < raw.n; i++) {
            int64_t len = dist_sample(d, &rng);
            assert_int_equal(raw.seqs[i].id, i);
            if (i < raw.n - 1) assert_int_equal(raw.seqs[i].len, len);
            else assert_true(raw.seqs[i].len <= len);
        }
        dist_free(d);
        // another seed gives another batch
        GlobalBatch c;
        assert_int_equal(batch_generate(&c, specs[t], 43, budgets[t], ctxs[t]), 0);
        if (t != 4) assert_true(c.n != a.n || memcmp(c.seqs, a.seqs, (size_t)a.n * sizeof *a.seqs) != 0);
        batch_free(&a), batch_free(&b), batch_free(&raw), batch_free(&c);
    }
    GlobalBatch f;
    assert_int_equal(batch_generate(&f, "fixed:1000", 1, 10500, 0), 0);  // 10 whole, the 11th cut to 500
    assert_int_equal(f.n, 11);
    assert_int_equal(f.seqs[10].len, 500);
    batch_free(&f);
    expect_error(batch_generate(&f, "fixed:10", 1, 0, 0), "budget", "positive", NULL);
    expect_error(batch_generate(&f, "zipf:2", 1, 100, 0), "\"zipf:2\"", "unknown name", "valid forms");
}

// ---- distribution specs -----------------------------------------------------------------------

static void test_parse_specs(void **state) {
    (void)state;
    struct {
        const char *spec;
        int64_t lo, hi;  // the range every sample must fall in
    } good[] = {
        {"fixed:8K", 8192, 8192}, {"fixed:2M", 2 * M_, 2 * M_}, {"fixed:1", 1, 1},
        {"uniform:8k:9K", 8192, 9216}, {"uniform:5:5", 5, 5}, {"lognormal:-3:0", 1, 1},
        {"byted", 16, 2 * M_}, {"github", 16, 2 * M_},
    };
    Rng rng;
    rng_seed(&rng, 3);
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        LengthDist *d;
        if (dist_parse(&d, good[i].spec) != 0) fail_msg("%s: %s", good[i].spec, bs_errmsg());
        int64_t lo = INT64_MAX, hi = 0;
        for (int k = 0; k < 20000; k++) {
            int64_t x = dist_sample(d, &rng);
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
        assert_true(lo >= good[i].lo && hi <= good[i].hi);
        if (good[i].spec[0] != 'b' && good[i].spec[0] != 'g') {  // the tails of the fits are too rare to hit
            assert_int_equal(lo, good[i].lo);
            assert_int_equal(hi, good[i].hi);
        }
        dist_free(d);
    }
    struct {
        const char *spec, *m1, *m2;
    } bad[] = {
        {"", "unknown name", NULL},
        {"Github", "unknown name \"Github\"", NULL},
        {"byted:2M", "byted takes no parameters", NULL},
        {"uniform:8K", "uniform takes 2 parameters, got 1", NULL},
        {"uniform:1:2:3", "uniform takes 2 parameters", NULL},
        {"uniform:x:8K", "LO \"x\" is not a length", NULL},
        {"uniform:1:8Q", "HI \"8Q\" is not a length", NULL},
        {"uniform:1:1.5K", "HI \"1.5K\" is not a length", NULL},
        {"uniform:0:8", "LO must be at least 1", NULL},
        {"uniform:9:8", "HI (8) is below LO (9)", NULL},
        {"uniform:-1:8", "LO \"-1\" is not a length", NULL},
        {"uniform: 1:8", "LO \" 1\" is not a length", NULL},
        {"fixed:", "LEN \"\" is not a length", NULL},
        {"fixed:99999999999M", "too large", NULL},
        {"fixed", "fixed takes 1 parameter, got 0", NULL},
        {"lognormal:a:1", "MU \"a\" is not a number", NULL},
        {"lognormal:1:-2", "SIGMA must be >= 0", NULL},
        {"lognormal:1:inf", "SIGMA \"inf\" is not a number", NULL},
    };
    static char sentinel;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        LengthDist *d = (LengthDist *)&sentinel;  // not a distribution: dist_parse must reset it to NULL
        int rc = dist_parse(&d, bad[i].spec);
        char quoted[64];
        snprintf(quoted, sizeof quoted, "\"%s\"", bad[i].spec);
        expect_error(rc, quoted, bad[i].m1, "valid forms: github, byted, uniform:LO:HI, lognormal:MU:SIGMA, fixed:LEN");
        assert_null(d);
    }
}

// ---- parametric forms against their exact moments ---------------------------------------------

// Draw n lengths; mean and variance of the draws.
static void sample_moments(const char *spec, int n, uint64_t seed, double *mean, double *var) {
    LengthDist *d;
    if (dist_parse(&d, spec) != 0) fail_msg("%s", bs_errmsg());
    Rng rng;
    rng_seed(&rng, seed);
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) {
        double x = (double)dist_sample(d, &rng);
        s += x, s2 += x * x;
    }
    dist_free(d);
    *mean = s / n;
    *var = s2 / n - *mean * *mean;
}

static void test_uniform_and_fixed_moments(void **state) {
    (void)state;
    const int n = 200000;
    double mean, var;
    // uniform on the integers LO..HI: mean (LO+HI)/2, variance ((HI-LO+1)^2 - 1) / 12
    int64_t ranges[][2] = {{1, 8192}, {3, 7}, {100000, 100000 + 2 * M_}};
    const char *specs[] = {"uniform:1:8K", "uniform:3:7", "uniform:100000:2197152"};
    for (int t = 0; t < 3; t++) {
        double w = (double)(ranges[t][1] - ranges[t][0] + 1);
        double mu = 0.5 * (double)(ranges[t][0] + ranges[t][1]), v = (w * w - 1) / 12;
        sample_moments(specs[t], n, 11 + t, &mean, &var);
        assert_close(mean, mu, 0, 4 * sqrt(v / n));  // within 4 standard errors
        assert_close(var, v, 0.02, 0);
    }
    // each of 3..7 about n/5 times
    LengthDist *d;
    assert_int_equal(dist_parse(&d, "uniform:3:7"), 0);
    Rng rng;
    rng_seed(&rng, 5);
    int counts[5] = {0};
    for (int i = 0; i < n; i++) counts[dist_sample(d, &rng) - 3]++;
    for (int i = 0; i < 5; i++) assert_close(counts[i], n / 5.0, 0, 5 * sqrt(n * 0.2 * 0.8));
    dist_free(d);
    sample_moments("fixed:3K", 1000, 1, &mean, &var);
    assert_true(mean == 3072 && var == 0);
}

// Exact mean and variance of max(1, round(exp(mu + sigma z))): with Q the normal tail,
// P(L >= k) = Q((ln(k - 1/2) - mu) / sigma) for k >= 2, E[L] = sum_k P(L >= k) and
// E[L^2] = sum_k (2k - 1) P(L >= k).
static void lognormal_exact(double mu, double sigma, double *mean, double *var) {
    double m1 = 1, m2 = 1;  // the k = 1 terms: P(L >= 1) = 1
    for (int64_t k = 2;; k++) {
        double p = 0.5 * erfc((log(k - 0.5) - mu) / sigma / sqrt(2.0));
        m1 += p;
        m2 += (2.0 * k - 1) * p;
        if (log(k) > mu + 3 * sigma && p * k * k < 1e-13 * m2) break;  // the rest is below 1e-12
    }
    *mean = m1;
    *var = m2 - m1 * m1;
}

static void test_lognormal_moments(void **state) {
    (void)state;
    const int n = 200000;
    double cases[][2] = {{7, 0.5}, {0.3, 1.2}, {5, 1}};  // the second one rounds many draws up to 1
    for (int t = 0; t < 3; t++) {
        char spec[64];
        snprintf(spec, sizeof spec, "lognormal:%g:%g", cases[t][0], cases[t][1]);
        double mean, var, em, ev;
        sample_moments(spec, n, 21 + t, &mean, &var);
        lognormal_exact(cases[t][0], cases[t][1], &em, &ev);
        if (t == 1) assert_true(em > exp(cases[t][0] + cases[t][1] * cases[t][1] / 2));  // clipping shows
        assert_close(mean, em, 0, 4 * sqrt(ev / n));
    }
}

// ---- the fits: a solver that derives the tables from the facts ---------------------------------
//
// Inside a bucket [lo, hi) the density of x is c x^-a and a length is floor(x), so
//   mass   Z      = integral_lo^hi x^-a dx
//   tokens Z E[L] = lo Z + sum_{j=lo+1}^{hi-1} S(j),   S(j) = integral_j^hi x^-a dx = Z P(L >= j).
// The sum runs over up to 2M terms; the solver evaluates it hundreds of times, so it sums the first
// 1024 terms directly and the rest with Euler-Maclaurin (error far below 1e-12 relative). The
// brute-force check further down sums every integer separately.

static double expm1_ratio(double z) { return fabs(z) < 1e-12 ? 1.0 + 0.5 * z : expm1(z) / z; }

// integral_m^n t^s dt, accurate for every s (including s = -1)
static double pow_integral(double s, double m, double n) {
    double L = log(n / m);
    return pow(m, s + 1) * L * expm1_ratio((s + 1) * L);
}

static double bucket_mass(double lo, double hi, double a) { return pow_integral(-a, lo, hi); }

static double bucket_tokens(double lo, double hi, double a) {
    double total = lo * bucket_mass(lo, hi, a);
    double j = lo + 1, direct_end = fmin(hi - 1, lo + 1024);
    for (; j <= direct_end; j++) total += pow_integral(-a, j, hi);
    if (j > hi - 1) return total;
    double m = j, n = hi - 1;
    // sum_{j=m}^{n} S(j): integral + end corrections with S' = -x^-a, S''' = -a(a+1) x^-(a+2), ...
    double integral = pow_integral(1 - a, m, n) - m * pow_integral(-a, m, n) + (n - m) * pow_integral(-a, n, hi);
    double ends = 0.5 * (pow_integral(-a, m, hi) + pow_integral(-a, n, hi));
    double d1 = -(pow(n, -a) - pow(m, -a)) / 12;
    double d3 = a * (a + 1) * (pow(n, -a - 2) - pow(m, -a - 2)) / 720;
    double d5 = -a * (a + 1) * (a + 2) * (a + 3) * (pow(n, -a - 4) - pow(m, -a - 4)) / 30240;
    return total + integral + ends + d1 + d3 + d5;
}

static double bucket_mean(double lo, double hi, double a) { return bucket_tokens(lo, hi, a) / bucket_mass(lo, hi, a); }

// Root of f on [lo, hi] by bisection (f changes sign there). p: the equation's parameters.
typedef double (*Equation)(double x, const double *p);
static double bisect(Equation f, const double *p, double lo, double hi) {
    double flo = f(lo, p);
    if (flo * f(hi, p) > 0) fail_msg("fit: no sign change in [%g, %g]", lo, hi);
    for (int it = 0; it < 200 && hi - lo > 1e-15 * fmax(1, fabs(lo)); it++) {
        double mid = 0.5 * (lo + hi), fm = f(mid, p);
        if ((fm > 0) == (flo > 0)) lo = mid, flo = fm;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

// p = {lo, hi, wanted mean}: the exponent giving a bucket that conditional mean
static double eq_mean(double a, const double *p) { return bucket_mean(p[0], p[1], a) - p[2]; }
static double exponent_for_mean(double lo, double hi, double mean) {
    const double p[3] = {lo, hi, mean};
    return bisect(eq_mean, p, -10, 20);
}

typedef struct {
    DistBucket b[8];
    int n;
} Fit;

// Byted. Facts: P(<= 4K) = 0.80; P(= 2M) = 0.0005 carrying 12.1% of tokens; P(>= 128K) = 0.01
// carrying 44.3%; 37% of tokens in lengths > 256K. The 2M point mass fixes the mean length mu
// (0.0005 * 2M / mu = 0.121); every other fact is then a mass or a token total of one bucket.
static double eq_byted_r2(double a, const double *p) {
    // p = {density of the bucket below at 128K, tokens per sample wanted in [128K, 256K]}
    double lo = 131072, hi = 262145;
    double mass = p[1] / bucket_mean(lo, hi, a);
    return mass * pow(lo, -a) / bucket_mass(lo, hi, a) - p[0];
}

static void fit_byted(Fit *f) {
    const double top = 2097152, mu = 0.0005 * top / 0.121;
    const double t4 = 4097, t128 = 131072, t256 = 262145;
    // [16, 4K]: log-uniform (assumed), 80% of samples
    double t0 = 0.80 * bucket_mean(16, t4, 1.0);
    // (4K, 128K): 19% of samples and the tokens not above 128K nor at or below 4K
    double a1 = exponent_for_mean(t4, t128, (0.557 * mu - t0) / 0.19);
    // [128K, 256K]: 7.3% of tokens (44.3 - 37), continuous with the bucket below at 128K
    const double p2[2] = {0.19 * pow(t128, -a1) / bucket_mass(t4, t128, a1), 0.073 * mu};
    double a2 = bisect(eq_byted_r2, p2, -10, 20);
    double m2 = 0.073 * mu / bucket_mean(t128, t256, a2);
    // (256K, 2M): the rest of the 1% at >= 128K, 24.9% of tokens (37 - 12.1)
    double m3 = 0.0095 - m2;
    double a3 = exponent_for_mean(t256, top, 0.249 * mu / m3);
    const DistBucket b[] = {
        {16, 4097, 0.80, 1.0}, {4097, 131072, 0.19, a1}, {131072, 262145, m2, a2},
        {262145, 2097152, m3, a3}, {2097152, 2097153, 0.0005, 0.0},
    };
    memcpy(f->b, b, sizeof b);
    f->n = 5;
}

// GitHub. Facts: 16.2% of tokens in lengths > 128K, 9.8% in lengths > 256K. Assumed: log-uniform
// from 16 to 4K, a power law (4K, 128K], one power law (128K, 2M], continuous at 4K and 128K. The
// ratio of the two facts fixes the tail exponent; continuity and the 16.2% fix the rest.
static double eq_github_tail(double a, const double *p) {
    (void)p;
    return bucket_tokens(131073, 262145, a) / bucket_tokens(262145, 2097153, a) - 0.064 / 0.098;
}

static void github_buckets(double a1, double a2, DistBucket b[5]) {
    const double t4 = 4097, t128 = 131073, t256 = 262145, top = 2097153;
    // levels c of the densities c x^-a, continuous at 4K and 128K, then normalized
    double c1 = 1, c0 = c1 * pow(t4, 1 - a1), c2 = c1 * pow(t128, a2 - a1);
    double m[4] = {c0 * bucket_mass(16, t4, 1), c1 * bucket_mass(t4, t128, a1), c2 * bucket_mass(t128, t256, a2),
                   c2 * bucket_mass(t256, top, a2)};
    double total = m[0] + m[1] + m[2] + m[3];
    b[0] = (DistBucket){16, 4097, m[0] / total, 1.0};
    b[1] = (DistBucket){4097, 131073, m[1] / total, a1};
    b[2] = (DistBucket){131073, 262145, m[2] / total, a2};
    b[3] = (DistBucket){262145, 2097153, m[3] / total, a2};
}

static double eq_github_share(double a1, const double *p) {
    DistBucket b[5];
    github_buckets(a1, p[0], b);
    double t[4];
    for (int i = 0; i < 4; i++) t[i] = b[i].mass * bucket_mean((double)b[i].lo, (double)b[i].hi, b[i].a);
    return (t[2] + t[3]) / (t[0] + t[1] + t[2] + t[3]) - 0.162;
}

static void fit_github(Fit *f) {
    double a2 = bisect(eq_github_tail, NULL, -10, 20);
    const double p[1] = {a2};
    double a1 = bisect(eq_github_share, p, -10, 20);
    github_buckets(a1, a2, f->b);
    f->n = 4;
}

static void print_fit(const char *name, const Fit *f) {
    printf("static const DistBucket %s[] = {\n", name);
    for (int i = 0; i < f->n; i++)
        printf("    {%lld, %lld, %.15g, %.15g},\n", (long long)f->b[i].lo, (long long)f->b[i].hi, f->b[i].mass, f->b[i].a);
    printf("};\n");
}

static void expect_table(const char *spec, const Fit *f) {
    LengthDist *d;
    assert_int_equal(dist_parse(&d, spec), 0);
    const DistBucket *t;
    int n = dist_buckets(d, &t);
    assert_int_equal(n, f->n);
    for (int i = 0; i < n; i++) {
        assert_int_equal(t[i].lo, f->b[i].lo);
        assert_int_equal(t[i].hi, f->b[i].hi);
        assert_close(t[i].mass, f->b[i].mass, 1e-9, 1e-15);
        assert_close(t[i].a, f->b[i].a, 1e-9, 1e-12);
    }
    dist_free(d);
}

static void test_fit_tables_follow_from_the_facts(void **state) {
    (void)state;
    Fit byted, github;
    fit_byted(&byted);
    fit_github(&github);
    if (getenv("BS_PRINT_FIT")) print_fit("BYTED", &byted), print_fit("GITHUB", &github);
    expect_table("byted", &byted);
    expect_table("github", &github);
    LengthDist *d;
    assert_int_equal(dist_parse(&d, "uniform:1:2"), 0);
    const DistBucket *t;
    assert_int_equal(dist_buckets(d, &t), 0);
    dist_free(d);
}

// ---- the fits: the stated facts, exactly in expectation and measured by sampling ----------------

typedef struct {
    const char *what;
    int tokens;       // 1: fraction of tokens, 0: fraction of samples
    int64_t lo, hi;   // lengths lo..hi
    double stated;    // the paper's figure (docs/datasets.md, "The facts")
} Fact;

static const Fact BYTED_FACTS[] = {
    {"samples <= 4K", 0, 1, 4096, 0.80},
    {"samples = 2M", 0, 2 * M_, 2 * M_, 0.0005},
    {"tokens in samples = 2M", 1, 2 * M_, 2 * M_, 0.121},
    {"samples >= 128K", 0, 128 * K_, INT64_MAX, 0.01},
    {"tokens in samples >= 128K", 1, 128 * K_, INT64_MAX, 0.443},
    {"tokens in samples > 256K", 1, 256 * K_ + 1, INT64_MAX, 0.37},
};
static const Fact GITHUB_FACTS[] = {
    {"tokens in samples > 128K", 1, 128 * K_ + 1, INT64_MAX, 0.162},
    {"tokens in samples > 256K", 1, 256 * K_ + 1, INT64_MAX, 0.098},
};

typedef struct {
    double value;  // the fact's value in expectation
    double sd1;    // standard deviation of its estimate from one sample (divide by sqrt(N))
} Expected;

typedef struct {
    double mass, mean, var;  // of the lengths in one bucket
    double p_lo;             // P(L = the bucket's first length): an off-by-one in the sampler shows here
} BucketExact;

// Sum the probability of every single length the table allows: P(L = k) = mass Z(k, k+1) / Z(lo, hi).
static void fit_expectations(const char *spec, const Fact *facts, int n_facts, Expected *out, double *mean,
                             BucketExact *be) {
    LengthDist *d;
    assert_int_equal(dist_parse(&d, spec), 0);
    const DistBucket *t;
    int n = dist_buckets(d, &t);
    double p_total = 0, m1 = 0, m2 = 0, p_in[8] = {0}, t_in[8] = {0}, q_in[8] = {0};
    for (int i = 0; i < n; i++) {
        double z = bucket_mass((double)t[i].lo, (double)t[i].hi, t[i].a), bm = 0, b1 = 0, b2 = 0;
        for (int64_t k = t[i].lo; k < t[i].hi; k++) {
            double x = (double)k, p = t[i].mass * pow_integral(-t[i].a, x, x + 1) / z;
            p_total += p, m1 += p * x, m2 += p * x * x;
            bm += p, b1 += p * x, b2 += p * x * x;
            if (k == t[i].lo && be) be[i].p_lo = p;
            for (int f = 0; f < n_facts; f++)
                if (k >= facts[f].lo && k <= facts[f].hi) p_in[f] += p, t_in[f] += p * x, q_in[f] += p * x * x;
        }
        if (be) be[i].mass = bm, be[i].mean = b1 / bm, be[i].var = fmax(0, b2 / bm - (b1 / bm) * (b1 / bm));
    }
    assert_close(p_total, 1.0, 0, 1e-12);
    for (int f = 0; f < n_facts; f++) {
        if (facts[f].tokens) {
            // delta method for a ratio of sums: Var = E[(L (1_in - v))^2] / mu^2 per sample
            double v = t_in[f] / m1;
            out[f].value = v;
            out[f].sd1 = sqrt(q_in[f] * (1 - v) * (1 - v) + (m2 - q_in[f]) * v * v) / m1;
        } else {
            out[f].value = p_in[f];
            out[f].sd1 = sqrt(p_in[f] * (1 - p_in[f]));
        }
    }
    *mean = m1;
    dist_free(d);
}

static void test_fit_facts_exact_in_expectation(void **state) {
    (void)state;
    Expected e[8];
    double mean;
    fit_expectations("byted", BYTED_FACTS, 6, e, &mean, NULL);
    for (int f = 0; f < 6; f++) assert_close(e[f].value, BYTED_FACTS[f].stated, 1e-9, 0);
    assert_close(mean, 0.0005 * 2 * M_ / 0.121, 1e-9, 0);  // the mean the 2M point mass implies
    fit_expectations("github", GITHUB_FACTS, 2, e, &mean, NULL);
    for (int f = 0; f < 2; f++) assert_close(e[f].value, GITHUB_FACTS[f].stated, 1e-9, 0);
}

// How many samples: a token fact is a ratio of sums dominated by rare long samples (Byted: 12.1% of
// the tokens sit in 1 sample of 2000). The delta method (fit_expectations) gives the standard
// deviation sd1 of one sample's contribution: 0.4 for "samples <= 4K", about 4.8 for every token
// fact (Byted "= 2M" 4.78, "> 256K" 4.19, ">= 128K" 3.77; GitHub "> 128K" 4.80, "> 256K" 4.78).
// A standard error of at most 0.2 percentage points (so that 1 pp is 5 of them) needs
// N >= (4.8 / 0.002)^2 = 5.8e6 samples; we draw N = 10^7 (8.7e10 Byted tokens, 2.6e10 GitHub
// tokens), a standard error of 0.15 pp, in well under a second. The test asserts the bound first.
#define FIT_SAMPLES 10000000

static void check_sampled_facts(const char *spec, const Fact *facts, int n_facts, uint64_t seed) {
    Expected e[8];
    BucketExact be[8];
    double mean;
    fit_expectations(spec, facts, n_facts, e, &mean, be);
    for (int f = 0; f < n_facts; f++) assert_true(e[f].sd1 / sqrt(FIT_SAMPLES) < 0.002);
    LengthDist *d;
    assert_int_equal(dist_parse(&d, spec), 0);
    const DistBucket *t;
    int nb = dist_buckets(d, &t);
    Rng rng;
    rng_seed(&rng, seed);
    int64_t count[8] = {0}, tok[8] = {0}, total = 0;
    int64_t b_count[8] = {0}, b_lo[8] = {0};
    double b_sum[8] = {0};
    for (int i = 0; i < FIT_SAMPLES; i++) {
        int64_t x = dist_sample(d, &rng);
        total += x;
        int b = 0;
        while (b < nb && !(x >= t[b].lo && x < t[b].hi)) b++;
        if (b == nb) fail_msg("%s: length %lld is in no bucket", spec, (long long)x);
        b_count[b]++, b_sum[b] += (double)x, b_lo[b] += x == t[b].lo;
        for (int f = 0; f < n_facts; f++)
            if (x >= facts[f].lo && x <= facts[f].hi) count[f]++, tok[f] += x;
    }
    dist_free(d);
    // every bucket: how often, its mean length, and how often its first length (all within 5 s.e.)
    for (int b = 0; b < nb; b++) {
        double n = FIT_SAMPLES, frac = (double)b_count[b] / n;
        assert_close(frac, be[b].mass, 0, 5 * sqrt(be[b].mass * (1 - be[b].mass) / n) + 1e-12);
        assert_close(b_sum[b] / (double)b_count[b], be[b].mean, 1e-12, 5 * sqrt(be[b].var / (double)b_count[b]));
        assert_close((double)b_lo[b] / n, be[b].p_lo, 0, 5 * sqrt(be[b].p_lo / n) + 2.0 / n);
    }
    print_message("%s: %d samples, %lld tokens, mean length %.1f (fit %.1f)\n", spec, FIT_SAMPLES, (long long)total,
                  (double)total / FIT_SAMPLES, mean);
    for (int f = 0; f < n_facts; f++) {
        double v = facts[f].tokens ? (double)tok[f] / (double)total : (double)count[f] / FIT_SAMPLES;
        double se = e[f].sd1 / sqrt(FIT_SAMPLES);
        print_message("  %-26s stated %7.3f%%  fit %9.5f%%  measured %8.4f%%  (s.e. %.4f pp)\n", facts[f].what,
                      100 * facts[f].stated, 100 * e[f].value, 100 * v, 100 * se);
        assert_close(v, facts[f].stated, 0, 0.01);  // within one percentage point, as asked
        assert_close(v, e[f].value, 0, 5 * se);     // and within 5 standard errors of the fit
    }
}

static void test_fit_facts_sampled(void **state) {
    (void)state;
    check_sampled_facts("byted", BYTED_FACTS, 6, 2025);
    check_sampled_facts("github", GITHUB_FACTS, 2, 2026);
}

// Issue 8: a batch is bounded (16M sequences, 2^40 tokens), so a 1-token context or a lengths file
// of huge numbers is refused at once instead of allocating gigabytes and planning for minutes.
static void test_batch_limits(void **state) {
    (void)state;
    GlobalBatch b;
    assert_int_equal(batch_generate(&b, "fixed:8", 1, 1 << 25, 1), -1);
    assert_non_null(strstr(bs_errmsg(), "a batch holds at most 16777216"));
    assert_int_equal(batch_generate(&b, "fixed:1", 1, ((int64_t)1 << 24) + 1, 0), -1);
    assert_non_null(strstr(bs_errmsg(), "a batch holds at most 16777216"));
    assert_int_equal(batch_init(&b, 0), 0);
    assert_int_equal(batch_push(&b, 0, (int64_t)1 << 40, -1), 0);
    assert_int_equal(batch_push(&b, 1, 1, -1), -1);
    assert_non_null(strstr(bs_errmsg(), "a batch holds at most 1099511627776"));
    // one sequence of 2^40 tokens cut to 2 tokens: 2^39 pieces, refused before allocating them
    assert_int_equal(batch_cut(&b, 2), -1);
    assert_non_null(strstr(bs_errmsg(), "a batch holds at most 16777216"));
    batch_free(&b);
    const char *dir = test_tmpdir("batch_limits");
    char path[600];
    snprintf(path, sizeof path, "%s/huge.txt", dir);
    const char *text = "9223372036854775807\n";
    assert_int_equal(file_write_atomic(path, text, strlen(text)), 0);
    assert_int_equal(batch_read_file(&b, path), -1);
    assert_non_null(strstr(bs_errmsg(), "huge.txt:1"));
    assert_non_null(strstr(bs_errmsg(), "a batch holds at most 1099511627776"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_lines_and_json),
        cmocka_unit_test(test_read_bad_inputs_name_the_place),
        cmocka_unit_test(test_cut_matches_naive_expansion),
        cmocka_unit_test(test_generate_budget_order_and_seed),
        cmocka_unit_test(test_parse_specs),
        cmocka_unit_test(test_uniform_and_fixed_moments),
        cmocka_unit_test(test_lognormal_moments),
        cmocka_unit_test(test_fit_tables_follow_from_the_facts),
        cmocka_unit_test(test_fit_facts_exact_in_expectation),
        cmocka_unit_test(test_fit_facts_sampled),
        cmocka_unit_test(test_batch_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
