// lengths.c: length distributions for generated global batches: the paper's two datasets ("github",
// "byted") as fitted bucket tables, and the parametric forms uniform, lognormal and fixed.
#include "bytescale/batch.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"

// ---- the fitted tables ------------------------------------------------------------------------
//
// The paper states a few facts about each dataset (fractions of samples and of tokens
// above or below 4K, 128K, 256K, 2M). Each table cuts the lengths at those thresholds; inside a
// bucket the density of x falls as x^-a and a length is floor(x). The bucket masses and exponents
// were solved so that every stated fact holds exactly in expectation (for the integer lengths, not
// just the continuous density): the solver is fit_byted() / fit_github() in
// tests/plan/test_batch.c, which re-derives these numbers from the facts and fails if this table
// drifts from them (run the test with BS_PRINT_FIT=1 to print the tables). What was assumed beyond
// the facts, and why, is in docs/datasets.md:
//   both:   lengths >= 16; log-uniform below 4K; a power law between consecutive thresholds.
//   byted:  2M is the longest length and "reach 2M" means exactly 2M tokens (a point mass); the
//           density is continuous at 128K (at 4K and 256K the facts leave no freedom).
//   github: the longest length is 2M; one power law above 128K; continuous at 4K and 128K.
// Thresholds are integer-exact: "<= 4K" is [.., 4097), ">= 128K" is [131072, ..), "> 128K" is
// [131073, ..), "> 256K" is [262145, ..).

// {lo, hi, mass, a}: lengths lo .. hi-1, probability, exponent of the density inside
static const DistBucket BYTED[] = {
    {16, 4097, 0.8, 1},                                       // <= 4K: log-uniform (assumed)
    {4097, 131072, 0.19, 1.53986120296298},                   // (4K, 128K)
    {131072, 262145, 0.00393972825911883, 5.53441026613537},  // [128K, 256K]: continuous at 128K
    {262145, 2097152, 0.00556027174088117, 3.99539172848742}, // (256K, 2M): steps up at 256K
    {2097152, 2097153, 0.0005, 0},                            // exactly 2M
};

static const DistBucket GITHUB[] = {
    {16, 4097, 0.873044209992077, 1},                          // <= 4K: log-uniform (assumed)
    {4097, 131073, 0.125547621793314, 2.23673083750646},       // (4K, 128K]: continuous at 4K
    {131073, 262145, 0.000929539886582579, 2.51551192087126},  // (128K, 256K]: continuous at 128K
    {262145, 2097153, 0.000478628328026086, 2.51551192087126}, // (256K, 2M]: the same power law
};

#define N_OF(t) ((int)(sizeof(t) / sizeof((t)[0])))
#define MAX_BUCKETS 8
_Static_assert(N_OF(BYTED) <= MAX_BUCKETS && N_OF(GITHUB) <= MAX_BUCKETS, "raise MAX_BUCKETS");
#define MAX_LEN 9007199254740992.0  // 2^53: lognormal draws are clamped here (and the budget cuts them anyway)

// ---- the distribution -------------------------------------------------------------------------

enum { DIST_BUCKETS, DIST_UNIFORM, DIST_LOGNORMAL, DIST_FIXED };

typedef struct {
    double cum;           // P(the bucket is this one or an earlier one)
    double lo, hi;        // [lo, hi) as reals
    double g_lo, g_span;  // inverse CDF: x = (g_lo + u * g_span)^(1 / s) with s = 1 - a
    double inv_s;         // 1 / s; 0 marks the log-uniform case x = lo * exp(u * g_span)
} BucketSampler;

struct LengthDist {
    int kind;
    int64_t lo, hi;    // uniform: [lo, hi] inclusive; fixed: lo
    double mu, sigma;  // lognormal: of the natural log of the length
    const DistBucket *buckets;
    int n_buckets;
    BucketSampler s[MAX_BUCKETS];
};

static const char *VALID_FORMS =
    "valid forms: github, byted, uniform:LO:HI, lognormal:MU:SIGMA, fixed:LEN "
    "(LO, HI, LEN: integers >= 1, K and M suffixes allowed: 8K = 8192)";

static int spec_fail(const char *spec, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int spec_fail(const char *spec, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return bs_fail("length distribution \"%s\": %s; %s", spec, what, VALID_FORMS);
}

// "8192", "8K", "2M": a length >= 1.
static int parse_len(const char *spec, const char *part, const char *name, int64_t *out) {
    char *end;
    long long v = strtoll(part, &end, 10);
    int64_t mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1024, end++;
    else if (*end == 'M' || *end == 'm') mult = 1024 * 1024, end++;
    if (end == part || *end != '\0' || part[0] == '-' || part[0] == '+' || isspace((unsigned char)part[0]))
        return spec_fail(spec, "%s \"%s\" is not a length", name, part);
    if (v < 1) return spec_fail(spec, "%s must be at least 1, got \"%s\"", name, part);
    if (v > (long long)(MAX_LEN / (double)mult)) return spec_fail(spec, "%s \"%s\" is too large", name, part);
    *out = (int64_t)v * mult;
    return 0;
}

static int parse_real(const char *spec, const char *part, const char *name, double *out) {
    char *end;
    double v = strtod(part, &end);
    if (end == part || *end != '\0' || !isfinite(v)) return spec_fail(spec, "%s \"%s\" is not a number", name, part);
    *out = v;
    return 0;
}

static void buckets_prepare(LengthDist *d, const DistBucket *t, int n) {
    d->kind = DIST_BUCKETS;
    d->buckets = t;
    d->n_buckets = n;
    double total = 0, cum = 0;
    for (int i = 0; i < n; i++) total += t[i].mass;
    for (int i = 0; i < n; i++) {
        BucketSampler *s = &d->s[i];
        cum += t[i].mass / total;
        s->cum = cum;
        s->lo = (double)t[i].lo;
        s->hi = (double)t[i].hi;
        double e = 1.0 - t[i].a;
        if (fabs(e) < 1e-12) {
            s->inv_s = 0;
            s->g_lo = 0;
            s->g_span = log(s->hi / s->lo);
        } else {
            s->inv_s = 1.0 / e;
            s->g_lo = pow(s->lo, e);
            s->g_span = pow(s->hi, e) - s->g_lo;
        }
    }
    d->s[n - 1].cum = 1.0;  // rounding must not leave a gap at the top
}

int dist_parse(LengthDist **out, const char *spec) {
    *out = NULL;
    if (!spec) return spec_fail("(null)", "no distribution given");
    char buf[128];
    if (strlen(spec) >= sizeof buf) return spec_fail(spec, "too long");
    strcpy(buf, spec);
    // split at ':' into at most 4 parts (a 4th one is always an error)
    char *part[4] = {buf, NULL, NULL, NULL};
    int n_parts = 1;
    for (char *p = buf; *p && n_parts < 4; p++)
        if (*p == ':') *p = '\0', part[n_parts++] = p + 1;
    LengthDist *d = bs_calloc(1, sizeof *d);
    if (!d) return -1;
    const char *name = part[0];
    int want = -1;  // parameters the form takes
    int rc = 0;
    if (strcmp(name, "github") == 0 || strcmp(name, "byted") == 0) {
        want = 0;
        if (name[0] == 'g') buckets_prepare(d, GITHUB, N_OF(GITHUB));
        else buckets_prepare(d, BYTED, N_OF(BYTED));
    } else if (strcmp(name, "uniform") == 0) {
        want = 2;
        d->kind = DIST_UNIFORM;
        if (n_parts == 3) {
            rc = parse_len(spec, part[1], "LO", &d->lo);
            if (rc == 0) rc = parse_len(spec, part[2], "HI", &d->hi);
            if (rc == 0 && d->hi < d->lo) rc = spec_fail(spec, "HI (%s) is below LO (%s)", part[2], part[1]);
        }
    } else if (strcmp(name, "lognormal") == 0) {
        want = 2;
        d->kind = DIST_LOGNORMAL;
        if (n_parts == 3) {
            rc = parse_real(spec, part[1], "MU", &d->mu);
            if (rc == 0) rc = parse_real(spec, part[2], "SIGMA", &d->sigma);
            if (rc == 0 && d->sigma < 0) rc = spec_fail(spec, "SIGMA must be >= 0, got \"%s\"", part[2]);
        }
    } else if (strcmp(name, "fixed") == 0) {
        want = 1;
        d->kind = DIST_FIXED;
        if (n_parts == 2) rc = parse_len(spec, part[1], "LEN", &d->lo);
    } else {
        rc = spec_fail(spec, "unknown name \"%s\"", name);
    }
    if (rc == 0 && n_parts != want + 1)
        rc = want == 0 ? spec_fail(spec, "%s takes no parameters", name)
                       : spec_fail(spec, "%s takes %d parameter%s, got %d", name, want, want > 1 ? "s" : "", n_parts - 1);
    if (rc != 0) {
        free(d);
        return -1;
    }
    *out = d;
    return 0;
}

void dist_free(LengthDist *d) { free(d); }

int dist_buckets(const LengthDist *d, const DistBucket **out) {
    *out = d->kind == DIST_BUCKETS ? d->buckets : NULL;
    return d->kind == DIST_BUCKETS ? d->n_buckets : 0;
}

static int64_t sample_buckets(const LengthDist *d, Rng *rng) {
    double u = rng_uniform(rng);
    int i = 0;
    while (i < d->n_buckets - 1 && u >= d->s[i].cum) i++;
    const BucketSampler *s = &d->s[i];
    double v = rng_uniform(rng);
    double x = s->inv_s == 0 ? s->lo * exp(v * s->g_span) : pow(s->g_lo + v * s->g_span, s->inv_s);
    // floor(x), kept inside the bucket against the last bit of rounding
    int64_t len = (int64_t)x;
    int64_t lo = d->buckets[i].lo, hi = d->buckets[i].hi;
    return len < lo ? lo : len >= hi ? hi - 1 : len;
}

int64_t dist_sample(const LengthDist *d, Rng *rng) {
    switch (d->kind) {
    case DIST_BUCKETS: return sample_buckets(d, rng);
    case DIST_UNIFORM: return d->lo + (int64_t)rng_below(rng, (uint64_t)(d->hi - d->lo) + 1);
    case DIST_FIXED: return d->lo;
    default: {
        double x = exp(d->mu + d->sigma * rng_normal(rng));
        if (!(x < MAX_LEN)) return (int64_t)MAX_LEN;
        int64_t len = (int64_t)llround(x);
        return len < 1 ? 1 : len;
    }
    }
}
