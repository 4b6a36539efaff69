// offload.h: selective activation offloading - the slower tier that activations are copied to and
// back from, and the two background copiers the model drives (docs/model.md, "Offloading").
//
// The model keeps each layer's saved activations in one page-aligned block. For a micro-batch with
// offload ratio r, the page-aligned tail r x (block bytes) of layers 0 .. L-3 is written to the tier
// while the next layer computes, and its pages are released; during the backward it is read back
// into the same addresses while the layer above runs its backward. A pipeline stage holds several
// micro-batches between their forward and backward, each in an activation set of its own (pipeline.h):
// every copy names its set, and each set has an address space of its own in the tier, so the sets
// in flight never share bytes. The tier is the one thing a new
// backend provides: a GPU build implements OffloadTier with pinned host memory and asynchronous
// device-host copies on their own streams, and nothing else changes.
#ifndef BYTESCALE_OFFLOAD_H
#define BYTESCALE_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

// OFFLOAD_MAX_SETS: activation sets one tier serves (a stage of up to 256 pipeline stages holds at
// most that many micro-batches at once).
enum { OFFLOAD_NAME_MAX = 1200, OFFLOAD_MAX_SETS = 256 };

// The slower memory. write / read copy n bytes between buf and byte offset off of activation set
// `set` (0 .. OFFLOAD_MAX_SETS-1; each set its own space, made on its first write); buf, n and off
// are multiples of the page size (what O_DIRECT needs). 0, or -1 + error (error.h) saying what
// failed ("writing 4096 bytes at offset 0 of set 1: No space left on device"; the caller adds the
// name). One thread writes and another reads at the same time, never the same bytes at once.
typedef struct {
    int (*write)(void *ctx, int set, const void *buf, size_t n, uint64_t off);
    int (*read)(void *ctx, int set, void *buf, size_t n, uint64_t off);
    void (*close)(void *ctx);  // frees ctx and what the tier holds
    void *ctx;
    char name[OFFLOAD_NAME_MAX];  // what and where, for messages: "file /tmp/bytescale-offload-x1Yz (O_DIRECT)"
} OffloadTier;

// A file per activation set, made in dir (NULL or "": $TMPDIR, else /tmp) and unlinked as soon as it
// is open, so nothing is left behind, even after kill -9; set 0's is made here, the others on their
// first write. Opened with O_DIRECT, so the page cache cannot hide what the
// disk costs; where the file system refuses O_DIRECT (tmpfs) it falls back to ordinary I/O and its
// name says so ("... (buffered: the file system refuses O_DIRECT)").
int offload_tier_file(OffloadTier *t, const char *dir);
// Host memory that grows as needed: what a GPU backend's pinned host buffers are.
int offload_tier_memory(OffloadTier *t);
// A test tier around inner: its fail_at-th write (op 'w') or read (op 'r'), counting from 1, and
// every later one of that kind fails with errno err; everything else goes to inner. Takes inner.
int offload_tier_failing(OffloadTier *t, OffloadTier inner, char op, int fail_at, int err);
void offload_tier_close(OffloadTier *t);

// The copiers: one thread writes to the tier, another reads from it (pthreads; MPI stays on the
// caller's thread).
typedef struct Offloader Offloader;
typedef enum { OFFLOAD_OUT = 0, OFFLOAD_IN = 1 } OffloadDir;

// Start both threads on tier. The offloader owns the tier from now on (closed by offloader_free,
// and on failure here). -1 + error.
int offloader_init(Offloader **out, OffloadTier tier);
void offloader_free(Offloader *o);  // NULL is fine
const char *offloader_name(const Offloader *o);
// Start copying layer's n bytes at p: OFFLOAD_OUT writes them to the tier at off of activation set
// `set` and then releases their pages (arena_discard: p is in a page arena); OFFLOAD_IN reads them
// back from there into p. One copy per direction at a time: wait for one before starting the next
// (the sets of a pipeline stage take turns: a micro-batch's copies are all done when its forward or
// backward returns).
void offload_start(Offloader *o, OffloadDir dir, int set, int layer, void *p, size_t n, uint64_t off);
// Wait for the direction's copy (none started: returns at once); *waited += the seconds blocked.
// -1 + "layer L: copying N bytes out to <tier>: <cause>" when the copy failed.
int offload_wait(Offloader *o, OffloadDir dir, double *waited);
// Wait for both directions and forget how they ended (failure paths: nothing may touch the
// activations once the caller returns).
void offload_drain(Offloader *o);

#endif
