// test_corpus.h: a small Go-like corpus made inside a test, prepared byte-level, for the training
// tests (one process and MPI). Returns 0, or -1 with an error message (error.h).
#ifndef BYTESCALE_TEST_CORPUS_H
#define BYTESCALE_TEST_CORPUS_H

#include <stdio.h>
#include <stdlib.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/prepare.h"
#include "bytescale/rng.h"

// n files of random lengths in [lo, hi) of Go-like text from a small word list, in <dir>/in,
// prepared into <dir>/data, whose path is written to out.
static inline int test_corpus_make(const char *dir, int n, int lo, int hi, uint64_t seed, char *out, size_t cap) {
    static const char *words[] = {"func ", "return ", "if ", "err ", "!= ", "nil ", "{\n", "}\n", "x ", ":= ",
                                  "for ", "range ", "i ", "package ", "main\n", "(", ")", "\t", "int ", "// note\n"};
    char path[700], in[600];
    snprintf(in, sizeof in, "%s/in", dir);
    if (make_dirs(in) != 0) return -1;
    Rng rng;
    rng_seed(&rng, seed);
    char *text = bs_malloc((size_t)hi + 16);
    if (!text) return -1;
    for (int f = 0; f < n; f++) {
        int len = lo + (int)rng_below(&rng, (uint64_t)(hi - lo)), at = 0;
        while (at < len) {
            const char *w = words[rng_below(&rng, sizeof words / sizeof words[0])];
            for (const char *c = w; *c && at < len; c++) text[at++] = *c;
        }
        snprintf(path, sizeof path, "%s/f%03d.go", in, f);
        if (file_write_atomic(path, text, (size_t)len) != 0) {
            free(text);
            return -1;
        }
    }
    free(text);
    snprintf(out, cap, "%s/data", dir);
    const char *inputs[] = {in};
    PrepareConfig pc = {.inputs = inputs, .n_inputs = 1, .tokenizer = "byte", .out_dir = out, .quiet = 1};
    PrepareStats st;
    if (prepare_run(&pc, &st) != 0) return -1;
    return st.n_files == n ? 0 : bs_fail("prepared %lld files of %d", (long long)st.n_files, n);
}

#endif
