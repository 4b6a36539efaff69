// fuzz_util.h: property-based fuzzing of the file parsers. Valid inputs written by the project's own
// writers are mutated at random (bit flips, bytes set to 0 / 0xff / random, insertions, deletions,
// truncation, duplicated ranges, and in text: numbers replaced by extreme ones, quotes and brackets
// inserted); each mutant goes through the parser, which must either accept it or refuse it with a
// message - never crash, hang, or trip a sanitizer (the suite runs again under ASan + UBSan). The
// input being parsed is on disk as <dir>/current, so a crash leaves its reproducer behind; a parser
// that runs for more than FUZZ_SECONDS on one input is a hang and fails the test.
#ifndef BYTESCALE_TEST_FUZZ_UTIL_H
#define BYTESCALE_TEST_FUZZ_UTIL_H

#include <signal.h>
#include <unistd.h>

#include "test_util.h"

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/rng.h"

#define FUZZ_SECONDS 20

// A parser under test: 0 = accepted, -1 = refused (with a message). Frees what it made.
typedef int (*FuzzParse)(const char *path, void *ctx);

static const char *fuzz_current;  // the input being parsed, for the hang message

static void fuzz_alarm(int sig) {
    (void)sig;
    static const char msg[] = "fuzz: a parser ran too long on one input (a hang); the input is left as ";
    if (write(2, msg, sizeof msg - 1) < 0 || write(2, fuzz_current, strlen(fuzz_current)) < 0) _exit(3);
    _exit(3);
}

// Write a mutant to path, plainly: file_write_atomic's fsync (a checkpoint's durability) made each of
// the thousands of inputs wait for the disk, most of the fuzz tests' time, for nothing a parser sees.
static inline int fuzz_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return bs_fail("fuzz: cannot write %s", path);
    int ok = fwrite(data, 1, n, f) == n;
    if (fclose(f) != 0 || !ok) return bs_fail("fuzz: writing %s failed", path);
    return 0;
}

// A little-endian 32-bit word at p (repairing a mutant's checksums).
static inline void fuzz_put_u32(uint8_t *p, uint32_t x) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(x >> (8 * i));
}

// Numbers that break careless arithmetic.
static const char *const FUZZ_NUMBERS[] = {"0", "-1", "2147483647", "2147483648", "-2147483649",
                                           "9223372036854775807", "9223372036854775808", "18446744073709551616",
                                           "1e308", "-1e308", "1e-320", "nan", "inf", "1073741824", "4294967296",
                                           "1e19", "0.5", "-0", "99999999999999999999999"};
static const char *const FUZZ_TOKENS[] = {"\"", "{", "}", "[", "]", ",", ":", "null", "true", "\n", "#", " ",
                                          "\"\":", "{\"a\":[]}"};

// One random mutation of buf (n bytes, room for cap); returns the new length.
static size_t fuzz_mutate_once(Rng *r, uint8_t *buf, size_t n, size_t cap) {
    size_t at = n ? (size_t)rng_below(r, n) : 0;
    switch (rng_below(r, 9)) {
    case 0:  // flip a bit
        if (n) buf[at] ^= (uint8_t)(1u << rng_below(r, 8));
        return n;
    case 1: {  // set a byte to something interesting
        static const uint8_t v[] = {0, 0xff, 0x7f, 0x80, '0', '9', '-'};
        if (n) buf[at] = rng_below(r, 2) ? v[rng_below(r, sizeof v)] : (uint8_t)rng_below(r, 256);
        return n;
    }
    case 2:  // truncate
        return n ? (size_t)rng_below(r, n) : 0;
    case 3: {  // delete a range
        size_t len = n - at ? 1 + (size_t)rng_below(r, (n - at) < 64 ? n - at : 64) : 0;
        memmove(buf + at, buf + at + len, n - at - len);
        return n - len;
    }
    case 4: {  // duplicate a range
        size_t len = n - at ? 1 + (size_t)rng_below(r, (n - at) < 64 ? n - at : 64) : 0;
        if (n + len > cap) return n;
        memmove(buf + at + len, buf + at, n - at);
        return n + len;
    }
    case 5:
    case 6: {  // a number replaced by an extreme one (text formats), or inserted
        const char *num = FUZZ_NUMBERS[rng_below(r, sizeof FUZZ_NUMBERS / sizeof FUZZ_NUMBERS[0])];
        size_t len = strlen(num), start = at, end = at;
        while (start > 0 && ((buf[start - 1] >= '0' && buf[start - 1] <= '9') || buf[start - 1] == '.')) start--;
        while (end < n && ((buf[end] >= '0' && buf[end] <= '9') || buf[end] == '.' || buf[end] == 'e')) end++;
        if (n - (end - start) + len > cap) return n;
        memmove(buf + start + len, buf + end, n - end);
        memcpy(buf + start, num, len);
        return n - (end - start) + len;
    }
    case 7: {  // a JSON-ish token inserted
        const char *tok = FUZZ_TOKENS[rng_below(r, sizeof FUZZ_TOKENS / sizeof FUZZ_TOKENS[0])];
        size_t len = strlen(tok);
        if (n + len > cap) return n;
        memmove(buf + at + len, buf + at, n - at);
        memcpy(buf + at, tok, len);
        return n + len;
    }
    default: {  // a little-endian 32/64-bit word overwritten with an extreme value (binary formats)
        static const uint64_t words[] = {0, 1, 0x7fffffffULL, 0x80000000ULL, 0xffffffffULL,
                                         0x7fffffffffffffffULL, 0xffffffffffffffffULL, 1ULL << 40};
        uint64_t w = words[rng_below(r, sizeof words / sizeof words[0])];
        size_t width = rng_below(r, 2) ? 8 : 4;
        for (size_t i = 0; i < width && at + i < n; i++) buf[at + i] = (uint8_t)(w >> (8 * i));
        return n;
    }
    }
}

// Mutants of the seeds through parse: iters inputs, each from a random seed with 1..4 mutations.
// Returns how many the parser accepted. Fails the test on a refusal without a message.
static int fuzz_run(const char *dir, const char *name, const char *const *seeds, int n_seeds, int iters,
                    FuzzParse parse, void *ctx) {
    char path[700];
    snprintf(path, sizeof path, "%s/current", dir);
    fuzz_current = path;
    signal(SIGALRM, fuzz_alarm);
    Rng r;
    rng_seed(&r, 0xf022 + (uint64_t)strlen(name));
    int accepted = 0;
    for (int i = 0; i < iters; i++) {
        char *seed;
        size_t n;
        if (file_read_all(seeds[rng_below(&r, (uint64_t)n_seeds)], &seed, &n) != 0) fail_msg("%s", bs_errmsg());
        size_t cap = n * 2 + 256;
        uint8_t *buf = malloc(cap);
        memcpy(buf, seed, n);
        free(seed);
        int k = 1 + (int)rng_below(&r, 4);
        for (int m = 0; m < k; m++) n = fuzz_mutate_once(&r, buf, n, cap);
        if (fuzz_write(path, buf, n) != 0) fail_msg("%s: writing input %d: %s", name, i, bs_errmsg());
        free(buf);
        bs_error_clear();
        alarm(FUZZ_SECONDS);
        int rc = parse(path, ctx);
        alarm(0);
        if (rc == 0) accepted++;
        else if (rc != -1 || !bs_errmsg()[0] || !strcmp(bs_errmsg(), "unknown error"))
            fail_msg("%s: input %d (left in %s): returned %d without a message", name, i, path, rc);
    }
    print_message("fuzz %-22s %5d inputs, %4d accepted, %5d refused with a message, 0 crashes or hangs\n", name,
                  iters, accepted, iters - accepted);
    return accepted;
}

#endif
