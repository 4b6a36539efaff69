// arena.c: bump allocation out of one block (see arena.h).
#include "bytescale/arena.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

int arena_init_pages(Arena *a, size_t cap) {
    memset(a, 0, sizeof *a);
    cap = (cap + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    size_t len = arena_page_round(cap ? cap : 1);
    // MAP_NORESERVE: the reservation is address space; memory is taken page by page as written
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return bs_fail("cannot map an arena of %zu bytes: %s", len, strerror(errno));
    a->base = p;
    a->cap = cap;
    a->mapped = len;
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
    if (a->mapped) munmap(a->base, a->mapped);
    else free(a->base);
    memset(a, 0, sizeof *a);
}

size_t arena_page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

size_t arena_page_round(size_t n) {
    size_t p = arena_page_size();
    return (n + p - 1) / p * p;
}

int arena_discard(void *p, size_t n) {
    size_t page = arena_page_size();
    if ((uintptr_t)p % page || n % page)
        return bs_fail("internal error: discarding %zu bytes at %p, not whole pages", n, p);
    // MADV_DONTNEED on private anonymous memory: the pages are freed now, and read as zeros later
    if (n && madvise(p, n, MADV_DONTNEED) != 0) return bs_fail("releasing %zu bytes of memory: %s", n, strerror(errno));
    return 0;
}
