// rng.h: xoshiro256** seeded by splitmix64. Small, fast, and its whole state is 32 bytes,
// so checkpoints save it and resume the exact stream. Also a counter-based generator: the value at
// (seed, key, index) is a pure function of the three, so a process draws any slice of a stream
// without drawing what comes before it (the initial weights of one shard of a model).
#ifndef BYTESCALE_RNG_H
#define BYTESCALE_RNG_H

#include <stddef.h>
#include <stdint.h>
#include "bytescale/export.h"

BS_API_BEGIN

typedef struct {
    uint64_t s[4];
} Rng;

void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_next(Rng *r);
double rng_uniform(Rng *r);               // [0, 1), 53 random bits
uint64_t rng_below(Rng *r, uint64_t n);   // uniform in [0, n), no modulo bias; n > 0
double rng_normal(Rng *r);                // standard normal (Box-Muller, one value per call)

// Counter-based: 64 random bits at position index of stream key under seed. Streams of different
// keys or seeds are unrelated (two rounds of the splitmix64 finaliser over the three words).
uint64_t rng_at(uint64_t seed, uint64_t key, uint64_t index);
// out[j] = scale * z(first + j) for j in [0, n): z(i) the standard normals of stream (seed, key),
// Box-Muller on the pairs (2p, 2p + 1) of uniforms rng_at(seed, key, 2p) and rng_at(seed, key, 2p + 1)
// (cos for the even element, sin for the odd one). Any slice gives the same numbers as the whole.
void rng_normal_fill(uint64_t seed, uint64_t key, uint64_t first, size_t n, double scale, float *out);

BS_API_END

#endif
