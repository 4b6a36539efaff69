// test_keep.c: the blocks the planner keeps between plans (bytescale/keep.h), against what malloc
// would do: contents and zeroing as promised, reuse only of freed blocks that fit, any thread's free.
#include "test_util.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/keep.h"
#include "bytescale/rng.h"

#define BIG ((size_t)1 << 20)  // above keep.c's KEEP_MIN (128 KiB)

static void test_freed_block_is_reused_when_it_fits(void **state) {
    (void)state;
    bs_keep_release();
    uint8_t *a = bs_keep_alloc(BIG);
    assert_non_null(a);
    memset(a, 7, BIG);
    bs_keep_free(a);
    assert_int_equal(bs_keep_spare_bytes(), BIG);
    uint8_t *b = bs_keep_alloc(BIG - 4096);  // fits: the same block, its pages already there
    assert_ptr_equal(a, b);
    assert_int_equal(bs_keep_spare_bytes(), 0);
    uint8_t *c = bs_keep_alloc(BIG);  // nothing spare: a new block
    assert_ptr_not_equal(b, c);
    bs_keep_free(b);
    uint8_t *d = bs_keep_alloc(BIG / 8);  // the spare one is more than 4x too big for it: not taken
    assert_ptr_not_equal(d, b);
    assert_int_equal(bs_keep_spare_bytes(), BIG);
    bs_keep_free(c);
    bs_keep_free(d);
    bs_keep_release();
    assert_int_equal(bs_keep_spare_bytes(), 0);
}

static void test_calloc_zeroes_a_reused_block(void **state) {
    (void)state;
    bs_keep_release();
    uint8_t *a = bs_keep_alloc(BIG);
    memset(a, 0xAB, BIG);
    bs_keep_free(a);
    uint64_t *z = bs_keep_calloc(BIG / 8, 8);
    assert_ptr_equal(z, a);
    for (size_t i = 0; i < BIG / 8; i++)
        if (z[i] != 0) fail_msg("word %zu of a reused calloc block is %llx", i, (unsigned long long)z[i]);
    bs_keep_free(z);
    bs_keep_release();
}

// Random allocations, growths and frees of blocks small and large, each filled with a pattern
// that names it: every block must still hold its own pattern when it is checked and freed.
static void test_random_use_keeps_every_block_intact(void **state) {
    (void)state;
    enum { SLOTS = 24, STEPS = 3000 };
    uint8_t *p[SLOTS] = {0};
    size_t n[SLOTS] = {0};
    Rng r;
    rng_seed(&r, 5);
    bs_keep_release();
    for (int step = 0; step < STEPS; step++) {
        int k = (int)rng_below(&r, SLOTS);
        if (p[k]) {  // check its pattern, then free or grow it
            for (size_t i = 0; i < n[k]; i += 4093)
                if (p[k][i] != (uint8_t)(k * 31 + n[k])) fail_msg("slot %d byte %zu changed", k, i);
            if (rng_below(&r, 2)) {
                bs_keep_free(p[k]);
                p[k] = NULL;
                continue;
            }
            size_t grown = n[k] + (size_t)rng_below(&r, 3 * BIG);
            uint8_t *q = bs_keep_realloc(p[k], grown);
            assert_non_null(q);
            for (size_t i = 0; i < n[k]; i += 4093)
                if (q[i] != (uint8_t)(k * 31 + n[k])) fail_msg("slot %d byte %zu lost in a realloc", k, i);
            p[k] = q, n[k] = grown;
        } else {
            n[k] = rng_below(&r, 2) ? (size_t)rng_below(&r, 4096) + 1 : (size_t)rng_below(&r, 4 * BIG) + 1;
            p[k] = bs_keep_alloc(n[k]);
            assert_non_null(p[k]);
        }
        memset(p[k], (uint8_t)(k * 31 + n[k]), n[k]);
    }
    for (int k = 0; k < SLOTS; k++) bs_keep_free(p[k]);
    bs_keep_release();
}

// A plain malloc'd block goes through bs_keep_free and bs_keep_realloc as malloc's own would.
static void test_plain_malloc_blocks_are_accepted(void **state) {
    (void)state;
    char *small = malloc(100), *big = malloc(BIG);
    strcpy(small, "small");
    memset(big, 3, BIG);
    char *grown = bs_keep_realloc(big, 2 * BIG);
    assert_non_null(grown);
    assert_int_equal(grown[BIG - 1], 3);
    bs_keep_free(small);
    bs_keep_free(grown);
    bs_keep_free(NULL);
    bs_keep_release();
}

static void *free_it(void *p) {
    bs_keep_free(p);
    return NULL;
}

// A block made on one thread and freed on another is kept all the same (one table for all threads).
static void test_free_on_another_thread(void **state) {
    (void)state;
    bs_keep_release();
    void *a = bs_keep_alloc(BIG);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, free_it, a), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(bs_keep_spare_bytes(), BIG);
    assert_ptr_equal(bs_keep_alloc(BIG), a);
    bs_keep_free(a);
    bs_keep_release();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_freed_block_is_reused_when_it_fits),
        cmocka_unit_test(test_calloc_zeroes_a_reused_block),
        cmocka_unit_test(test_random_use_keeps_every_block_intact),
        cmocka_unit_test(test_plain_malloc_blocks_are_accepted),
        cmocka_unit_test(test_free_on_another_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
