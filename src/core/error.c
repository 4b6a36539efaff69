// error.c: thread-local error messages (see error.h).
#include "bytescale/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char errbuf[1024];

int bs_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    return -1;
}

int bs_fail_ctx(const char *fmt, ...) {
    char old[sizeof errbuf];
    memcpy(old, errbuf, sizeof errbuf);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    // append ": <old message>", cut to fit
    size_t used = strlen(errbuf), room = sizeof errbuf - 1 - used;
    if (room < 3) return -1;
    memcpy(errbuf + used, ": ", 2);
    used += 2, room -= 2;
    size_t n = strlen(old);
    if (n > room) n = room;
    memcpy(errbuf + used, old, n);
    errbuf[used + n] = '\0';
    return -1;
}

const char *bs_errmsg(void) { return errbuf[0] ? errbuf : "unknown error"; }

void bs_error_clear(void) { errbuf[0] = '\0'; }

void *bs_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) bs_fail("out of memory allocating %zu bytes", n);
    return p;
}

void *bs_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) bs_fail("out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *bs_realloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) bs_fail("out of memory growing a buffer to %zu bytes", n);
    return q;
}

_Noreturn void bs_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("bytescale: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

_Noreturn void bs_die_errmsg(void) { bs_die("%s", bs_errmsg()); }
