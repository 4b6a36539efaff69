// tier_memory.c: the host-memory tier of activation offloading (offload.h) - the stand-in for a GPU
// build's pinned host buffers - and the failing tier the tests put around another tier.
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/offload.h"

// ---- host memory -------------------------------------------------------------------------------------

typedef struct {
    pthread_mutex_t mu;  // the writer may grow a buffer while the reader copies out of it
    uint8_t *buf[OFFLOAD_MAX_SETS];  // one per activation set
    size_t cap[OFFLOAD_MAX_SETS];
} MemTier;

static int bad_set(int set) {
    if (set >= 0 && set < OFFLOAD_MAX_SETS) return 0;
    return bs_fail("activation set %d: the memory tier serves sets 0 .. %d", set, OFFLOAD_MAX_SETS - 1);
}

static int mem_write(void *ctx, int set, const void *buf, size_t n, uint64_t off) {
    MemTier *m = ctx;
    if (bad_set(set)) return -1;
    pthread_mutex_lock(&m->mu);
    int rc = 0;
    if (off + n > m->cap[set]) {  // grow geometrically: a step's layers arrive at increasing offsets
        size_t cap = m->cap[set] ? m->cap[set] : 1 << 20;
        while (cap < off + n) cap *= 2;
        uint8_t *b = realloc(m->buf[set], cap);
        if (b) m->buf[set] = b, m->cap[set] = cap;
        else rc = bs_fail("writing %zu bytes at offset %llu of set %d: out of memory growing the buffer to %zu bytes",
                          n, (unsigned long long)off, set, cap);
    }
    if (rc == 0) memcpy(m->buf[set] + off, buf, n);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static int mem_read(void *ctx, int set, void *buf, size_t n, uint64_t off) {
    MemTier *m = ctx;
    if (bad_set(set)) return -1;
    pthread_mutex_lock(&m->mu);
    int rc = 0;
    if (off + n > m->cap[set])
        rc = bs_fail("reading %zu bytes at offset %llu of set %d: never written", n, (unsigned long long)off, set);
    else memcpy(buf, m->buf[set] + off, n);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static void mem_close(void *ctx) {
    MemTier *m = ctx;
    pthread_mutex_destroy(&m->mu);
    for (int s = 0; s < OFFLOAD_MAX_SETS; s++) free(m->buf[s]);
    free(m);
}

int offload_tier_memory(OffloadTier *t) {
    memset(t, 0, sizeof *t);
    MemTier *m = bs_calloc(1, sizeof *m);
    if (!m) return -1;
    pthread_mutex_init(&m->mu, NULL);
    snprintf(t->name, sizeof t->name, "host memory");
    t->write = mem_write;
    t->read = mem_read;
    t->close = mem_close;
    t->ctx = m;
    return 0;
}

// ---- failing on demand (tests) --------------------------------------------------------------------------

typedef struct {
    OffloadTier inner;
    char op;             // 'w' or 'r'
    int fail_at, err;
    int count;           // operations of kind op so far (only op's thread touches it)
} FailTier;

static int fail_now(FailTier *f, char op) {
    if (op != f->op || ++f->count < f->fail_at) return 0;
    errno = f->err;
    return 1;
}

static int fail_write(void *ctx, int set, const void *buf, size_t n, uint64_t off) {
    FailTier *f = ctx;
    if (fail_now(f, 'w'))
        return bs_fail("writing %zu bytes at offset %llu: %s (injected)", n, (unsigned long long)off, strerror(f->err));
    return f->inner.write(f->inner.ctx, set, buf, n, off);
}

static int fail_read(void *ctx, int set, void *buf, size_t n, uint64_t off) {
    FailTier *f = ctx;
    if (fail_now(f, 'r'))
        return bs_fail("reading %zu bytes at offset %llu: %s (injected)", n, (unsigned long long)off, strerror(f->err));
    return f->inner.read(f->inner.ctx, set, buf, n, off);
}

static void fail_close(void *ctx) {
    FailTier *f = ctx;
    offload_tier_close(&f->inner);
    free(f);
}

int offload_tier_failing(OffloadTier *t, OffloadTier inner, char op, int fail_at, int err) {
    memset(t, 0, sizeof *t);
    if ((op != 'w' && op != 'r') || fail_at < 1) {
        offload_tier_close(&inner);
        return bs_fail("failing tier: op must be 'w' or 'r' and fail_at >= 1 (got '%c', %d)", op, fail_at);
    }
    FailTier *f = bs_calloc(1, sizeof *f);
    if (!f) {
        offload_tier_close(&inner);
        return -1;
    }
    *f = (FailTier){.inner = inner, .op = op, .fail_at = fail_at, .err = err};
    snprintf(t->name, sizeof t->name, "%s (test: %s number %d and later fail with %s)", inner.name,
             op == 'w' ? "write" : "read", fail_at, strerror(err));
    t->write = fail_write;
    t->read = fail_read;
    t->close = fail_close;
    t->ctx = f;
    return 0;
}
