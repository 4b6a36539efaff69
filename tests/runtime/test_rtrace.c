// test_rtrace.c: the per-rank event log - parts from three fake ranks merged into one Chrome trace
// that reads back with the right tracks, times and names; tracing off writes nothing; the event cap
// drops and counts; a missing or damaged part fails the merge by name and leaves no trace behind.
#include "test_util.h"

#include <dirent.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/json.h"
#include "bytescale/rtrace.h"

#define ORIGIN 1000.0
#define BIG_ARG ((int64_t)1 << 40)  // beyond 32 bits, still exact as a JSON (double) number

// Files in dir, not counting "." and "..".
static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

static int exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

// Rank r's known events: r + 2 of them, event i at ORIGIN + r + 0.25 i seconds lasting 0.1 (i + 1)
// ms. Event 0 has no argument, event 1 a big one, the rest their index. Rank 2's last name has a
// quote, a backslash and a newline in it, to check the escaping round-trips.
static const char *ev_name(int r, int i) {
    static const char *names[] = {"pack", "ring fwd block", "ring wait", "grad sync"};
    if (r == 2 && i == 3) return "odd \"name\" \\ with\nnewline";
    return names[i];
}
static const char *ev_cat(int i) {
    static const char *cats[] = {"data", "compute", "wait", "comm"};
    return cats[i];
}
static double ev_t0(int r, int i) { return ORIGIN + r + 0.25 * i; }
static double ev_dur(int i) { return 1e-4 * (i + 1); }
static int64_t ev_arg(int i) { return i == 0 ? -1 : i == 1 ? BIG_ARG : i; }

static void write_rank(const char *path, int r, int n_ranks) {
    RtTrace t;
    assert_int_equal(rtrace_init(&t, path, r, n_ranks, ORIGIN), 0);
    assert_true(rtrace_on(&t));
    for (int i = 0; i < r + 2; i++) rtrace_add(&t, ev_name(r, i), ev_cat(i), ev_t0(r, i), ev_t0(r, i) + ev_dur(i), ev_arg(i));
    assert_int_equal(t.n, r + 2);
    assert_int_equal(t.dropped, 0);
    assert_int_equal(rtrace_write_part(&t), 0);
    rtrace_free(&t);
}

static void test_merge_three_ranks(void **state) {
    (void)state;
    const char *dir = test_tmpdir("rtrace_merge");
    char path[600], part[700];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    for (int r = 0; r < 3; r++) write_rank(path, r, 3);
    assert_int_equal(count_files(dir), 3);
    if (rtrace_merge(path, 3) != 0) fail_msg("%s", bs_errmsg());

    // the parts are gone; only the trace is left
    for (int r = 0; r < 3; r++) {
        snprintf(part, sizeof part, "%s.rank%d.part", path, r);
        assert_false(exists(part));
    }
    assert_int_equal(count_files(dir), 1);

    cJSON *root;
    if (json_read_file(path, &root) != 0) fail_msg("%s", bs_errmsg());
    const cJSON *unit = cJSON_GetObjectItemCaseSensitive(root, "displayTimeUnit");
    assert_true(cJSON_IsString(unit));
    assert_string_equal(unit->valuestring, "ms");
    const cJSON *other = cJSON_GetObjectItemCaseSensitive(root, "otherData");
    assert_true(cJSON_IsObject(other));
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(other, "events")->valuedouble, 2 + 3 + 4);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(other, "dropped")->valuedouble, 0);
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    assert_true(cJSON_IsArray(evs));

    int n_x[3] = {0}, thread_name[3] = {0}, sort_index[3] = {0};
    const cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        const char *ph = cJSON_GetObjectItemCaseSensitive(e, "ph")->valuestring;
        const char *name = cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring;
        assert_int_equal(cJSON_GetObjectItemCaseSensitive(e, "pid")->valuedouble, 0);
        int tid = (int)cJSON_GetObjectItemCaseSensitive(e, "tid")->valuedouble;
        assert_true(tid >= 0 && tid < 3);
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        if (strcmp(ph, "M") == 0) {
            if (strcmp(name, "thread_name") == 0) {
                char want[32];
                snprintf(want, sizeof want, "rank %d", tid);
                assert_string_equal(cJSON_GetObjectItemCaseSensitive(args, "name")->valuestring, want);
                thread_name[tid]++;
            } else if (strcmp(name, "thread_sort_index") == 0) {
                assert_int_equal(cJSON_GetObjectItemCaseSensitive(args, "sort_index")->valuedouble, tid);
                sort_index[tid]++;
            }
            continue;
        }
        assert_string_equal(ph, "X");
        // events come out in recording order per rank: the i-th X event on a track is event i
        int i = n_x[tid]++;
        assert_true(i < tid + 2);
        assert_string_equal(name, ev_name(tid, i));
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(e, "cat")->valuestring, ev_cat(i));
        assert_close(cJSON_GetObjectItemCaseSensitive(e, "ts")->valuedouble, (ev_t0(tid, i) - ORIGIN) * 1e6, 0, 1e-3);
        assert_close(cJSON_GetObjectItemCaseSensitive(e, "dur")->valuedouble, ev_dur(i) * 1e6, 0, 1e-3);
        if (ev_arg(i) == -1) {
            assert_null(args);
        } else {
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(args, "arg");
            assert_true(cJSON_IsNumber(a));
            assert_true(a->valuedouble == (double)ev_arg(i));
        }
    }
    for (int r = 0; r < 3; r++) {
        assert_int_equal(n_x[r], r + 2);
        assert_int_equal(thread_name[r], 1);
        assert_int_equal(sort_index[r], 1);
    }
    cJSON_Delete(root);
}

static void test_off_is_noop(void **state) {
    (void)state;
    const char *dir = test_tmpdir("rtrace_off");
    const char *paths[] = {"", NULL};
    for (int k = 0; k < 2; k++) {
        RtTrace t;
        assert_int_equal(rtrace_init(&t, paths[k], 0, 1, ORIGIN), 0);
        assert_false(rtrace_on(&t));
        for (int i = 0; i < 100; i++) rtrace_add(&t, "pack", "data", 1.0, 2.0, i);
        assert_int_equal(t.n, 0);
        assert_int_equal(t.dropped, 0);
        assert_null(t.ev);
        assert_int_equal(rtrace_write_part(&t), 0);
        rtrace_free(&t);
        assert_int_equal(rtrace_merge(paths[k], 1), 0);
    }
    assert_false(rtrace_on(NULL));
    rtrace_add(NULL, "pack", "data", 1.0, 2.0, 0);  // a NULL trace is off too
    assert_int_equal(count_files(dir), 0);
    assert_false(exists(".rank0.part"));  // where an off trace would have put its part, had it written one
}

static void test_bad_init(void **state) {
    (void)state;
    RtTrace t;
    assert_int_equal(rtrace_init(&t, "x.json", 3, 3, 0), -1);
    assert_non_null(strstr(bs_errmsg(), "rank 3"));
    assert_int_equal(rtrace_init(&t, "x.json", -1, 3, 0), -1);
}

static void test_cap_drops_and_counts(void **state) {
    (void)state;
    const char *dir = test_tmpdir("rtrace_cap");
    char path[600];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    RtTrace t;
    assert_int_equal(rtrace_init(&t, path, 0, 1, ORIGIN), 0);
    assert_int_equal(t.max_events, 2000000);
    t.max_events = 10;
    for (int i = 0; i < 25; i++) rtrace_add(&t, "step", "step", ORIGIN + i, ORIGIN + i + 0.5, i);
    assert_int_equal(t.n, 10);
    assert_int_equal(t.dropped, 15);
    assert_int_equal(rtrace_write_part(&t), 0);
    rtrace_free(&t);
    if (rtrace_merge(path, 1) != 0) fail_msg("%s", bs_errmsg());

    cJSON *root;
    assert_int_equal(json_read_file(path, &root), 0);
    const cJSON *other = cJSON_GetObjectItemCaseSensitive(root, "otherData");
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(other, "events")->valuedouble, 10);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(other, "dropped")->valuedouble, 15);
    int n_x = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "traceEvents")) {
        if (strcmp(cJSON_GetObjectItemCaseSensitive(e, "ph")->valuestring, "X") != 0) continue;
        // the first ten are kept, not the last
        assert_int_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "args"), "arg")->valuedouble,
                         n_x);
        n_x++;
    }
    assert_int_equal(n_x, 10);
    cJSON_Delete(root);
}

static void test_missing_part(void **state) {
    (void)state;
    const char *dir = test_tmpdir("rtrace_missing");
    char path[600], part[700];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    write_rank(path, 0, 3);
    write_rank(path, 2, 3);
    assert_int_equal(rtrace_merge(path, 3), -1);
    snprintf(part, sizeof part, "%s.rank1.part", path);
    if (!strstr(bs_errmsg(), part)) fail_msg("message does not name %s: %s", part, bs_errmsg());
    assert_false(exists(path));
    assert_int_equal(count_files(dir), 2);  // the parts that exist are kept for a retry
}

// Replace path's contents with its first n bytes, or flip the byte at offset -n-1 when n < 0.
static void damage(const char *path, long n) {
    char *data;
    size_t size;
    assert_int_equal(file_read_all(path, &data, &size), 0);
    if (n >= 0) {
        assert_true((size_t)n < size);
        size = (size_t)n;
    } else {
        data[-n - 1] ^= 0x40;
    }
    assert_int_equal(file_write_atomic(path, data, size), 0);
    free(data);
}

static void test_damaged_part(void **state) {
    (void)state;
    const char *dir = test_tmpdir("rtrace_damaged");
    char path[600], part[700];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    snprintf(part, sizeof part, "%s.rank1.part", path);
    // cut at the end (the checksum), in the middle of the events, inside the header; flip an event's byte
    long cuts[] = {-1, 0, 10, 60, -61};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        for (int r = 0; r < 3; r++) write_rank(path, r, 3);
        char *data;
        size_t size;
        assert_int_equal(file_read_all(part, &data, &size), 0);
        free(data);
        damage(part, cuts[k] == -1 ? (long)size - 3 : cuts[k]);
        assert_int_equal(rtrace_merge(path, 3), -1);
        if (!strstr(bs_errmsg(), part)) fail_msg("message does not name %s: %s", part, bs_errmsg());
        assert_false(exists(path));
        assert_int_equal(count_files(dir), 3);  // the three parts, no temp file left behind
    }
}

// A part left over from a run with another rank count is refused, not merged into this one.
static void test_stale_part(void **state) {
    (void)state;
    const char *dir = test_tmpdir("rtrace_stale");
    char path[600];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    write_rank(path, 0, 2);
    write_rank(path, 1, 4);
    assert_int_equal(rtrace_merge(path, 2), -1);
    assert_non_null(strstr(bs_errmsg(), "rank1.part"));
    assert_false(exists(path));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_three_ranks), cmocka_unit_test(test_off_is_noop),
        cmocka_unit_test(test_bad_init),          cmocka_unit_test(test_cap_drops_and_counts),
        cmocka_unit_test(test_missing_part),      cmocka_unit_test(test_damaged_part),
        cmocka_unit_test(test_stale_part),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
