// test_core.c: rng, arena, file I/O and JSON helpers.
#include "test_util.h"

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bytescale/arena.h"
#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/json.h"
#include "bytescale/rng.h"

static void test_rng_reproducible_and_uniform(void **state) {
    (void)state;
    Rng a, b;
    rng_seed(&a, 42);
    rng_seed(&b, 42);
    for (int i = 0; i < 1000; i++) assert_int_equal(rng_next(&a), rng_next(&b));
    // mean and variance of U[0,1) and N(0,1) over 200k draws, against their exact values
    int n = 200000;
    double s = 0, s2 = 0, z = 0, z2 = 0;
    int counts[10] = {0};
    for (int i = 0; i < n; i++) {
        double u = rng_uniform(&a);
        assert_true(u >= 0 && u < 1);
        s += u, s2 += u * u;
        double g = rng_normal(&a);
        z += g, z2 += g * g;
        counts[rng_below(&a, 10)]++;
    }
    assert_close(s / n, 0.5, 0, 0.005);
    assert_close(s2 / n - (s / n) * (s / n), 1.0 / 12, 0, 0.002);
    assert_close(z / n, 0.0, 0, 0.01);
    assert_close(z2 / n, 1.0, 0, 0.02);
    for (int i = 0; i < 10; i++) assert_close(counts[i], n / 10, 0.03, 0);
}

static void test_arena_alignment_and_overflow(void **state) {
    (void)state;
    Arena a;
    assert_int_equal(arena_init(&a, 1000), 0);
    char *p = arena_alloc(&a, 3);
    float *q = arena_floats(&a, 10);
    assert_non_null(p);
    assert_non_null(q);
    assert_int_equal((uintptr_t)q % 64, 0);
    for (int i = 0; i < 10; i++) assert_true(q[i] == 0.0f);
    size_t m = arena_mark(&a);
    assert_null(arena_alloc(&a, 100000));  // too big: NULL and a message, no crash
    assert_non_null(strstr(bs_errmsg(), "arena full"));
    assert_non_null(arena_alloc(&a, 64));
    arena_release(&a, m);
    assert_int_equal(a.used, m);
    arena_free(&a);
}

static void test_atomic_write_keeps_old_file_on_failure(void **state) {
    (void)state;
    const char *dir = test_tmpdir("core_atomic");
    char path[600];
    snprintf(path, sizeof path, "%s/f.txt", dir);
    assert_int_equal(file_write_atomic(path, "hello", 5), 0);
    AtomicFile af;
    assert_int_equal(atomic_open(&af, path), 0);
    assert_int_equal(atomic_write(&af, "partial", 7), 0);
    atomic_abort(&af);  // an error mid-way: the old contents stay, no temp file is left
    char *data;
    size_t n;
    assert_int_equal(file_read_all(path, &data, &n), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(data, "hello", 5);
    free(data);
    assert_int_equal(access(af.tmp, F_OK), -1);
    assert_int_equal(file_read_all("/nonexistent/x", &data, &n), -1);
    assert_non_null(strstr(bs_errmsg(), "/nonexistent/x"));
}

static void test_crc32_known_value(void **state) {
    (void)state;
    // the standard CRC-32 check value of "123456789"
    assert_int_equal(checksum_crc32(0, "123456789", 9), 0xCBF43926u);
    uint32_t c = checksum_crc32(0, "12345", 5);
    assert_int_equal(checksum_crc32(c, "6789", 4), 0xCBF43926u);
}

static void test_json_errors_name_the_place(void **state) {
    (void)state;
    const char *dir = test_tmpdir("core_json");
    char path[600];
    snprintf(path, sizeof path, "%s/bad.json", dir);
    assert_int_equal(file_write_atomic(path, "{\n  \"a\": 1,\n  \"b\": [1, 2,, 3]\n}\n", 33), 0);
    cJSON *root;
    assert_int_equal(json_read_file(path, &root), -1);
    assert_non_null(strstr(bs_errmsg(), ":3:"));  // line 3 holds the syntax error
    snprintf(path, sizeof path, "%s/good.json", dir);
    const char *good = "{\"n\": 3, \"x\": 2.5, \"s\": \"hi\", \"f\": 1.5}";
    assert_int_equal(file_write_atomic(path, good, strlen(good)), 0);
    assert_int_equal(json_read_file(path, &root), 0);
    int64_t n;
    double x;
    const char *s;
    assert_int_equal(json_get_int(root, "n", &n, "good.json"), 0);
    assert_int_equal(n, 3);
    assert_int_equal(json_get_double(root, "x", &x, "good.json"), 0);
    assert_true(x == 2.5);
    assert_int_equal(json_get_string(root, "s", &s, "good.json"), 0);
    assert_string_equal(s, "hi");
    assert_int_equal(json_get_int(root, "f", &n, "good.json"), -1);
    assert_non_null(strstr(bs_errmsg(), "\"f\" must be an integer"));
    assert_int_equal(json_get_int(root, "missing", &n, "good.json"), -1);
    assert_non_null(strstr(bs_errmsg(), "missing \"missing\""));
    n = 7;
    assert_int_equal(json_opt_int(root, "absent", &n, "good.json"), 0);
    assert_int_equal(n, 7);
    cJSON_Delete(root);
}

// Issue 8: file_read_all on what is not a regular file. A directory is named as one (it used to be
// "out of memory allocating 9223372036854775808 bytes": ftell of a directory); a FIFO and a /proc
// file (st_size 0) are read to their end as streams.
static void test_read_all_directories_fifos_proc(void **state) {
    (void)state;
    const char *dir = test_tmpdir("core_read_all");
    char *data;
    size_t n;
    assert_int_equal(file_read_all(dir, &data, &n), -1);
    assert_non_null(strstr(bs_errmsg(), "core_read_all: is a directory"));
    // a FIFO with 200 KB behind it: more than the first stream buffer, so the buffer grows
    char fifo[600], cmd[1400];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    snprintf(cmd, sizeof cmd, "head -c 200000 /dev/zero | tr '\\0' x > '%s' &", fifo);
    assert_int_equal(system(cmd), 0);
    if (file_read_all(fifo, &data, &n) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(n, 200000);
    assert_int_equal(data[0], 'x');
    assert_int_equal(data[n - 1], 'x');
    assert_int_equal(data[n], '\0');
    free(data);
    unlink(fifo);
    // /proc files say st_size 0 but are not empty
    if (file_read_all("/proc/self/status", &data, &n) != 0) fail_msg("%s", bs_errmsg());
    assert_true(n > 0 && strstr(data, "Name:") != NULL);
    free(data);
    // a regular file still reads exactly, the empty one too
    char path[600];
    snprintf(path, sizeof path, "%s/empty", dir);
    assert_int_equal(file_write_atomic(path, "", 0), 0);
    assert_int_equal(file_read_all(path, &data, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(data[0], '\0');
    free(data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_reproducible_and_uniform),
        cmocka_unit_test(test_arena_alignment_and_overflow),
        cmocka_unit_test(test_atomic_write_keeps_old_file_on_failure),
        cmocka_unit_test(test_crc32_known_value),
        cmocka_unit_test(test_json_errors_name_the_place),
        cmocka_unit_test(test_read_all_directories_fifos_proc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
