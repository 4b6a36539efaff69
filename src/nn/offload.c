// offload.c: the two copier threads of activation offloading (offload.h). Each has a one-job
// mailbox: the model starts a copy, computes, and later waits for it; at most one copy per
// direction is in flight, so the mailbox never queues.
#include "bytescale/offload.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/arena.h"
#include "bytescale/error.h"
#include "bytescale/timer.h"

typedef struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    OffloadDir dir;
    OffloadTier *tier;
    int started, busy, stop;  // the thread runs; a job is posted and not finished; the thread must end
    // the job
    int set, layer;
    void *p;
    size_t n;
    uint64_t off;
    int rc;
    char err[1024];
} Copier;

struct Offloader {
    OffloadTier tier;
    Copier copier[2];  // [OFFLOAD_OUT], [OFFLOAD_IN]
};

// The copy itself, on the copier's thread. The tier's message (thread-local, error.h) is kept in the
// job for the waiting thread.
static void run_job(Copier *c) {
    int rc;
    if (c->dir == OFFLOAD_OUT) {
        rc = c->tier->write(c->tier->ctx, c->set, c->p, c->n, c->off);
        // the bytes are safe in the tier: their pages go back to the system (the resident set shrinks)
        if (rc == 0) rc = arena_discard(c->p, c->n);
    } else {
        rc = c->tier->read(c->tier->ctx, c->set, c->p, c->n, c->off);
    }
    c->rc = rc;
    if (rc != 0) snprintf(c->err, sizeof c->err, "%s", bs_errmsg());
}

static void *copier_main(void *arg) {
    Copier *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->busy && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
        if (!c->busy) break;  // stop, nothing left to do
        pthread_mutex_unlock(&c->mu);
        run_job(c);
        pthread_mutex_lock(&c->mu);
        c->busy = 0;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static int copier_init(Copier *c, OffloadDir dir, OffloadTier *tier) {
    memset(c, 0, sizeof *c);
    c->dir = dir;
    c->tier = tier;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (pthread_create(&c->thread, NULL, copier_main, c) != 0)
        return bs_fail("cannot start the offload %s thread", dir == OFFLOAD_OUT ? "writer" : "reader");
    c->started = 1;
    return 0;
}

static void copier_free(Copier *c) {
    if (c->started) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

int offloader_init(Offloader **out, OffloadTier tier) {
    *out = NULL;
    Offloader *o = bs_calloc(1, sizeof *o);
    if (!o) {
        offload_tier_close(&tier);
        return -1;
    }
    o->tier = tier;
    if (copier_init(&o->copier[OFFLOAD_OUT], OFFLOAD_OUT, &o->tier) != 0 ||
        copier_init(&o->copier[OFFLOAD_IN], OFFLOAD_IN, &o->tier) != 0) {
        offloader_free(o);
        return -1;
    }
    *out = o;
    return 0;
}

void offloader_free(Offloader *o) {
    if (!o) return;
    copier_free(&o->copier[OFFLOAD_OUT]);
    copier_free(&o->copier[OFFLOAD_IN]);
    offload_tier_close(&o->tier);
    free(o);
}

const char *offloader_name(const Offloader *o) { return o->tier.name; }

void offload_start(Offloader *o, OffloadDir dir, int set, int layer, void *p, size_t n, uint64_t off) {
    Copier *c = &o->copier[dir];
    pthread_mutex_lock(&c->mu);
    while (c->busy) pthread_cond_wait(&c->cv, &c->mu);  // never, when callers wait first (offload.h)
    c->set = set, c->layer = layer, c->p = p, c->n = n, c->off = off, c->rc = 0, c->err[0] = '\0';
    c->busy = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

int offload_wait(Offloader *o, OffloadDir dir, double *waited) {
    Copier *c = &o->copier[dir];
    double t0 = now_seconds();
    pthread_mutex_lock(&c->mu);
    while (c->busy) pthread_cond_wait(&c->cv, &c->mu);
    int rc = c->rc;
    c->rc = 0;  // reported once
    pthread_mutex_unlock(&c->mu);
    if (waited) *waited += now_seconds() - t0;
    if (rc == 0) return 0;
    // set 0 is all there is without pipeline stages: only the others are worth naming
    char set[32] = "";
    if (c->set) snprintf(set, sizeof set, " (activation set %d)", c->set);
    return bs_fail("layer %d%s: copying %zu bytes of activations %s %s: %s", c->layer, set, c->n,
                   dir == OFFLOAD_OUT ? "out to" : "back from", o->tier.name, c->err);
}

void offload_drain(Offloader *o) {
    if (!o) return;
    for (int d = 0; d < 2; d++) {
        Copier *c = &o->copier[d];
        pthread_mutex_lock(&c->mu);
        while (c->busy) pthread_cond_wait(&c->cv, &c->mu);
        c->rc = 0;
        pthread_mutex_unlock(&c->mu);
    }
}

void offload_tier_close(OffloadTier *t) {
    if (t->close) t->close(t->ctx);
    memset(t, 0, sizeof *t);
}
