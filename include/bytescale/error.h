// error.h: how bytescale reports failure.
//
// Library functions return 0 on success and -1 on failure. On failure they leave a message saying
// what was wrong and where ("plan.json: item 12: rank 70 out of range [0, 64)") in a thread-local
// buffer that bs_errmsg() returns. Nothing in the library prints or exits; the command line does.
#ifndef BYTESCALE_ERROR_H
#define BYTESCALE_ERROR_H

#include <stddef.h>
#include "bytescale/export.h"

BS_API_BEGIN

// Record a formatted message and return -1, so `return bs_fail("...", ...);` reads naturally.
int bs_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Prefix the current message with context: "<ctx>: <previous message>". Returns -1.
int bs_fail_ctx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *bs_errmsg(void);
void bs_error_clear(void);

// Allocation that records an error (and returns NULL) instead of crashing.
void *bs_malloc(size_t n);
void *bs_calloc(size_t count, size_t size);
void *bs_realloc(void *p, size_t n);

// Print "bytescale: error: <message>" to stderr and exit(1). For the command line and benches only.
_Noreturn void bs_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Die with the recorded library message.
_Noreturn void bs_die_errmsg(void);

BS_API_END

#endif
