// arena.h: one allocation sized up front, handed out in 64-byte aligned pieces.
// Hot loops take their buffers from an arena made before the loop; nothing is freed piecewise.
#ifndef BYTESCALE_ARENA_H
#define BYTESCALE_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *base;
    size_t cap;   // bytes reserved
    size_t used;  // bytes handed out (including alignment padding)
    size_t peak;  // most bytes ever in use, for memory reports
} Arena;

int arena_init(Arena *a, size_t cap);          // -1 + error when the memory is not there
void *arena_alloc(Arena *a, size_t n);         // NULL + error when the arena is full
float *arena_floats(Arena *a, size_t n);       // zeroed
size_t arena_mark(const Arena *a);             // remember a point ...
void arena_release(Arena *a, size_t mark);     // ... and give back everything after it
void arena_reset(Arena *a);
void arena_free(Arena *a);

#endif
