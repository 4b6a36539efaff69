// arena.c: bump allocation out of one block (see arena.h).
#include "bytescale/arena.h"

#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"

enum { ARENA_ALIGN = 64 };  // a cache line, and enough for any SIMD load

int arena_init(Arena *a, size_t cap) {
    memset(a, 0, sizeof *a);
    cap = (cap + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    a->base = aligned_alloc(ARENA_ALIGN, cap ? cap : ARENA_ALIGN);
    if (!a->base) return bs_fail("out of memory reserving an arena of %zu bytes", cap);
    a->cap = cap;
    return 0;
}

void *arena_alloc(Arena *a, size_t n) {
    size_t start = (a->used + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (start > a->cap || n > a->cap - start) {
        bs_fail("arena full: %zu bytes requested, %zu of %zu in use", n, a->used, a->cap);
        return NULL;
    }
    a->used = start + n;
    if (a->used > a->peak) a->peak = a->used;
    return a->base + start;
}

float *arena_floats(Arena *a, size_t n) {
    float *p = arena_alloc(a, n * sizeof(float));
    if (p) memset(p, 0, n * sizeof(float));
    return p;
}

size_t arena_mark(const Arena *a) { return a->used; }
void arena_release(Arena *a, size_t mark) { a->used = mark; }
void arena_reset(Arena *a) { a->used = 0; }

void arena_free(Arena *a) {
    free(a->base);
    memset(a, 0, sizeof *a);
}
