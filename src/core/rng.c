// rng.c: xoshiro256** (Blackman and Vigna), seeded through splitmix64 as its authors recommend.
#include "bytescale/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void rng_seed(Rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next(Rng *r) {
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

double rng_uniform(Rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

uint64_t rng_below(Rng *r, uint64_t n) {
    // Lemire's method would be faster; rejection keeps it obviously unbiased.
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = rng_next(r);
    while (x >= limit);
    return x % n;
}

double rng_normal(Rng *r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;  // log(0) would be -inf
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

// ---- counter-based -----------------------------------------------------------------------------

// splitmix64's output function: a bijection of 64 bits with full avalanche.
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The stream's base depends on seed and key through two mixes, so (seed, key) and (key, seed) or
// neighbouring keys share nothing; within a stream, index i is splitmix64's i-th state mixed once
// more (the outer mix keeps streams whose bases differ by a multiple of the step from being shifts
// of one another).
static inline uint64_t stream_base(uint64_t seed, uint64_t key) {
    return mix64(mix64(seed ^ 0x6A09E667F3BCC909ull) + key * 0x9E3779B97F4A7C15ull + 0x3C6EF372FE94F82Bull);
}

static inline uint64_t stream_at(uint64_t base, uint64_t index) {
    return mix64(mix64(base + (index + 1) * 0x9E3779B97F4A7C15ull) ^ base);
}

uint64_t rng_at(uint64_t seed, uint64_t key, uint64_t index) { return stream_at(stream_base(seed, key), index); }

// (0, 1]: never 0, so the log of Box-Muller is finite
static inline double unit_open(uint64_t x) { return (double)((x >> 11) + 1) * 0x1.0p-53; }

void rng_normal_fill(uint64_t seed, uint64_t key, uint64_t first, size_t n, double scale, float *out) {
    uint64_t base = stream_base(seed, key), end = first + n;
    for (uint64_t p = first / 2; 2 * p < end; p++) {  // the pairs that [first, end) touches
        double r = scale * sqrt(-2.0 * log(unit_open(stream_at(base, 2 * p))));
        double a = 2.0 * M_PI * unit_open(stream_at(base, 2 * p + 1)), s, c;
        sincos(a, &s, &c);
        uint64_t e = 2 * p, o = 2 * p + 1;  // the pair's even (cos) and odd (sin) element
        if (e >= first) out[e - first] = (float)(r * c);
        if (o >= first && o < end) out[o - first] = (float)(r * s);
    }
}
