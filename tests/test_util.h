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

// How many random cases a property test runs: n in the Release pass, a fifth of them under
// AddressSanitizer. That pass is there for memory errors, which the first cases reach as well as the
// last, and at the sanitizers' 3-10x cost the whole count would repeat for minutes what the Release
// pass has already checked (README.md, "Tests").
static inline int test_trials(int n) {
#ifdef __SANITIZE_ADDRESS__
    return n >= 50 ? n / 5 : n;
#else
    return n;
#endif
}

// A fresh scratch directory under the build tree for one test; returns its path (static buffer).
static inline const char *test_tmpdir(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "test-tmp/%s", name);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", buf, buf);
    if (system(cmd) != 0) fail_msg("cannot create %s", buf);
    return buf;
}

// The tokenizer data that `make tokenizer` puts in data/tiktoken/ (under
// $BS_SOURCE_DIR, which ctest sets): the path of `name` there, or NULL when it is absent.
static inline const char *test_tokenizer_path(const char *name) {
    static char buf[4096];
    const char *root = getenv("BS_SOURCE_DIR");
    snprintf(buf, sizeof buf, "%s/data/tiktoken/%s", root ? root : ".", name);
    FILE *f = fopen(buf, "rb");
    if (!f) return NULL;
    fclose(f);
    return buf;
}

// A GPT-2 case needs the tokenizer data: without it the case is skipped (cmocka's SKIPPED line, after
// this one saying why). The Makefile's test targets (`make test`, `make test-fast`, `make asan`)
// fetch the data first, so there every GPT-2 case runs; a bare ctest on a clone without `make
// tokenizer` skips them instead of failing.
#define TEST_TOKENIZER_OR_SKIP(name)                                                               \
    do {                                                                                           \
        if (!test_tokenizer_path(name)) {                                                          \
            print_message("[  SKIP    ] data/tiktoken/%s is missing (`make tokenizer` makes it): " \
                          "this GPT-2 case is skipped\n", (name));                                 \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

#endif
