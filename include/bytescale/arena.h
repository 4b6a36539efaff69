// arena.h: one allocation sized up front, handed out in 64-byte aligned pieces.
// Hot loops take their buffers from an arena made before the loop; nothing is freed piecewise.
//
// A page arena (arena_init_pages) is mapped from the system instead of the heap: its base is
// page-aligned, a page takes memory only once something is written to it, and arena_discard gives
// pages back while the arena stays, so the resident set can shrink and grow again (activation
// offloading, docs/model.md).
#ifndef BYTESCALE_ARENA_H
#define BYTESCALE_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *base;
    size_t cap;   // bytes reserved
    size_t used;  // bytes handed out (including alignment padding)
    size_t peak;  // most bytes ever in use, for memory reports
    size_t mapped;  // page arenas: bytes mapped (cap rounded up to pages); 0 = a heap arena
} Arena;

int arena_init(Arena *a, size_t cap);          // -1 + error when the memory is not there
// A page arena of cap bytes (rounded up to 64): zero-filled, resident only where written.
int arena_init_pages(Arena *a, size_t cap);
void *arena_alloc(Arena *a, size_t n);         // NULL + error when the arena is full
float *arena_floats(Arena *a, size_t n);       // zeroed
size_t arena_mark(const Arena *a);             // remember a point ...
void arena_release(Arena *a, size_t mark);     // ... and give back everything after it
void arena_reset(Arena *a);
void arena_free(Arena *a);

// The system's page size, and n rounded up to a multiple of it.
size_t arena_page_size(void);
size_t arena_page_round(size_t n);
// Give the memory of the whole pages in [p, p + n) of a page arena back to the system: they read
// as zeros afterwards and take memory again when written. p and n must be page multiples. Safe to
// call from any thread (the offload worker does). -1 + error.
int arena_discard(void *p, size_t n);

#endif
