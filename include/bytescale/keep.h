// keep.h: large blocks kept for the next plan instead of handed back to the kernel.
//
// The planner makes tens of MB of plan and scratch arrays for every global batch, and a trainer
// plans every step. glibc gives blocks that large back to the kernel when they are freed (munmap,
// or a trim of the heap's top), and the next plan faults every page in again, zero-filled: at
// 16,384 ranks and 1G tokens that was about 40% of the planning time. bs_keep_* hand out blocks of
// at least KEEP_MIN bytes from the ones freed before (the smallest that fits, if it is no more
// than 4x too big), so a loop of plans of about the same size touches the same pages every time.
// Smaller blocks are plain malloc, whose heap reuses them anyway.
//
// A block from bs_keep_* must be freed or grown with bs_keep_free / bs_keep_realloc; those also
// take any malloc'd block (it is simply freed or realloc'd). At most KEEP_SPARE blocks and
// KEEP_SPARE_BYTES are kept (the smallest is freed first); bs_keep_release frees them all. One
// mutex guards the tables: a block may be freed on another thread than the one that made it.
#ifndef BYTESCALE_KEEP_H
#define BYTESCALE_KEEP_H

#include <stddef.h>

// Internal to the library (not installed, not exported), as arena.h.
void *bs_keep_alloc(size_t n);                    // NULL + error (bs_malloc's) without the memory
void *bs_keep_calloc(size_t count, size_t size);  // zeroed
void *bs_keep_realloc(void *p, size_t n);         // p's contents kept; NULL + error, p untouched
void bs_keep_free(void *p);
// Free every kept block (not the ones in use); what the planner holds between plans goes back.
void bs_keep_release(void);
// Bytes kept for reuse now (not in use), for memory reports and tests.
size_t bs_keep_spare_bytes(void);


#endif
