// keep.c: large blocks kept for the next plan (keep.h says why).
//
// Two small tables under one mutex: the blocks handed out (so that a free knows the block is ours
// and how big it is) and the spare ones. Both are scanned linearly: a plan has a few dozen blocks
// this large, each of them at least KEEP_MIN bytes of work for its owner.
#include "bytescale/keep.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"

// Under AddressSanitizer a spare block is poisoned, so that a use after bs_keep_free is still caught
// although the block is not freed; it is unpoisoned when it is handed out again or freed.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define KEEP_POISON(b) ASAN_POISON_MEMORY_REGION((b).p, (b).cap)
#define KEEP_UNPOISON(b) ASAN_UNPOISON_MEMORY_REGION((b).p, (b).cap)
#else
#define KEEP_POISON(b) ((void)0)
#define KEEP_UNPOISON(b) ((void)0)
#endif

#define KEEP_MIN ((size_t)128 << 10)         // smaller: plain malloc (glibc maps blocks from 128 KiB on)
#define KEEP_LIVE 256                        // blocks tracked in use at once; more are plain malloc
#define KEEP_SPARE 32                        // spare blocks kept
#define KEEP_SPARE_BYTES ((size_t)2 << 30)   // and at most this many bytes of them
#define KEEP_WASTE 4                         // a spare block serves a request of at least 1/4 its size

typedef struct {
    void *p;
    size_t cap;
} Block;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static Block live[KEEP_LIVE], spare[KEEP_SPARE];
static int n_live, n_spare;
static size_t spare_bytes;

// Under mu: the index of p among the live blocks, or -1.
static int live_find(const void *p) {
    for (int i = 0; i < n_live; i++)
        if (live[i].p == p) return i;
    return -1;
}

// Under mu: track a block in use (untracked when the table is full: then it is plain malloc's).
static void live_add(void *p, size_t cap) {
    if (n_live < KEEP_LIVE) live[n_live++] = (Block){p, cap};
}

// Under mu: the smallest spare block of at least n bytes and at most KEEP_WASTE x n, taken out.
static Block spare_take(size_t n) {
    int best = -1;
    for (int i = 0; i < n_spare; i++)
        if (spare[i].cap >= n && spare[i].cap / KEEP_WASTE <= n && (best < 0 || spare[i].cap < spare[best].cap))
            best = i;
    if (best < 0) return (Block){NULL, 0};
    Block b = spare[best];
    spare[best] = spare[--n_spare];
    spare_bytes -= b.cap;
    KEEP_UNPOISON(b);
    return b;
}

// Under mu: keep b as a spare, freeing the smallest spares (b itself, if it is the smallest) while
// the table is over its count or its bytes.
static void spare_put(Block b) {
    KEEP_POISON(b);
    spare[n_spare++] = b;  // there is room: the table is never left full
    spare_bytes += b.cap;
    while (n_spare == KEEP_SPARE || (spare_bytes > KEEP_SPARE_BYTES && n_spare > 0)) {
        int small = 0;
        for (int i = 1; i < n_spare; i++)
            if (spare[i].cap < spare[small].cap) small = i;
        KEEP_UNPOISON(spare[small]);
        free(spare[small].p);
        spare_bytes -= spare[small].cap;
        spare[small] = spare[--n_spare];
    }
}

void *bs_keep_alloc(size_t n) {
    if (n < KEEP_MIN) return bs_malloc(n);
    pthread_mutex_lock(&mu);
    Block b = spare_take(n);
    if (b.p) live_add(b.p, b.cap);
    pthread_mutex_unlock(&mu);
    if (b.p) return b.p;
    void *p = bs_malloc(n);
    if (!p) return NULL;
    pthread_mutex_lock(&mu);
    live_add(p, n);
    pthread_mutex_unlock(&mu);
    return p;
}

void *bs_keep_calloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) {
        bs_fail("out of memory allocating %zu x %zu bytes", count, size);
        return NULL;
    }
    size_t n = count * size;
    if (n < KEEP_MIN) return bs_calloc(count, size);
    void *p = bs_keep_alloc(n);
    if (p) memset(p, 0, n);
    return p;
}

void *bs_keep_realloc(void *p, size_t n) {
    if (!p) return bs_keep_alloc(n);
    pthread_mutex_lock(&mu);
    int i = live_find(p);
    size_t cap = i >= 0 ? live[i].cap : 0;
    pthread_mutex_unlock(&mu);
    if (i < 0) {  // not ours: malloc's realloc, tracked from now on when it is large
        void *q = bs_realloc(p, n);
        if (q && n >= KEEP_MIN) {
            pthread_mutex_lock(&mu);
            live_add(q, n);
            pthread_mutex_unlock(&mu);
        }
        return q;
    }
    if (cap >= n) return p;
    void *q = bs_keep_alloc(n);
    if (!q) return NULL;
    memcpy(q, p, cap);
    bs_keep_free(p);
    return q;
}

void bs_keep_free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&mu);
    int i = live_find(p);
    if (i >= 0) {
        Block b = live[i];
        live[i] = live[--n_live];
        spare_put(b);
    }
    pthread_mutex_unlock(&mu);
    if (i < 0) free(p);
}

void bs_keep_release(void) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_spare; i++) {
        KEEP_UNPOISON(spare[i]);
        free(spare[i].p);
    }
    n_spare = 0;
    spare_bytes = 0;
    pthread_mutex_unlock(&mu);
}

size_t bs_keep_spare_bytes(void) {
    pthread_mutex_lock(&mu);
    size_t n = spare_bytes;
    pthread_mutex_unlock(&mu);
    return n;
}
