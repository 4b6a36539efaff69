// test_util.h: what every cmocka test includes. cmocka needs these system headers first.
#ifndef BYTESCALE_TEST_UTIL_H
#define BYTESCALE_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

// Assert |a - b| <= atol + rtol * |b|, printing both values on failure.
#define assert_close(a, b, rtol, atol)                                                                   \
    do {                                                                                                 \
        double a_ = (double)(a), b_ = (double)(b);                                                       \
        double tol_ = (atol) + (rtol) * (b_ < 0 ? -b_ : b_);                                             \
        double d_ = a_ - b_;                                                                             \
        if (!(d_ <= tol_ && -d_ <= tol_)) fail_msg("%s = %.9g, %s = %.9g, |diff| = %.3g > %.3g", #a, a_, #b, b_, \
                                                   d_ < 0 ? -d_ : d_, tol_);                             \
    } while (0)

// A fresh scratch directory under the build tree for one test; returns its path (static buffer).
static inline const char *test_tmpdir(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "test-tmp/%s", name);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", buf, buf);
    if (system(cmd) != 0) fail_msg("cannot create %s", buf);
    return buf;
}

#endif
