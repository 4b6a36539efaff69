// rng.h: xoshiro256** seeded by splitmix64. Small, fast, and its whole state is 32 bytes,
// so checkpoints save it and resume the exact stream.
#ifndef BYTESCALE_RNG_H
#define BYTESCALE_RNG_H

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

BS_API_END

#endif
