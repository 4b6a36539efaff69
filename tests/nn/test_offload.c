// test_offload.c: selective activation offloading in the model (offload.h, llama.h). For random
// small models and micro-batches and r in {0, 0.25, 0.5, 0.75, 1}, losses and gradients with the
// memory and the file tier are bitwise those without offloading; the model's accounting reaches and
// never exceeds llama_resident_bytes; the process's peak RSS drops by about the bytes offloading
// saves; a failing tier (injected, and a real EFBIG from RLIMIT_FSIZE) gives an error naming the
// layer and the file, with the gradients untouched when the copy out fails; the budget refuses a
// micro-batch that does not fit, before anything runs; the tiers themselves, with several activation
// sets; a pipeline stage's sets (views) sharing one offloader, forwards and backwards interleaved.
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bytescale/arena.h"
#include "bytescale/error.h"
#include "bytescale/llama.h"
#include "bytescale/offload.h"
#include "bytescale/procmem.h"
#include "bytescale/rng.h"

#define TMP "test-tmp/nn_offload"

static const double RATIOS[] = {0, 0.25, 0.5, 0.75, 1};
enum { N_RATIOS = 5 };

// ---- helpers -----------------------------------------------------------------------------------------

// A random dense model small enough to run often, with 3 to 6 layers (0 .. L-3 offload).
static ModelConfig random_config(Rng *rng) {
    ModelConfig c = {0};
    snprintf(c.name, sizeof c.name, "rand");
    c.n_layers = 3 + (int)rng_below(rng, 4);
    c.n_kv_heads = 1 + (int)rng_below(rng, 2);
    c.n_heads = c.n_kv_heads * (1 + (int)rng_below(rng, 2));
    c.head_dim = 8 << rng_below(rng, 2);
    c.d_model = 32 + 16 * (int)rng_below(rng, 3);
    c.d_ff = 48 + 16 * (int)rng_below(rng, 4);
    c.vocab_size = 64 + (int)rng_below(rng, 200);
    c.n_experts = 1, c.top_k = 1;
    c.rope_theta = 10000.0, c.norm_eps = 1e-5;
    return c;
}

// T tokens in documents of random lengths, random positions (chunks of longer documents), labels
// -1 at some document ends.
typedef struct {
    int32_t *tokens, *targets, *pos, *seg;
    int T;
} Rows;

static Rows random_rows(Rng *rng, int T, int V) {
    Rows r = {malloc(sizeof(int32_t) * (size_t)T), malloc(sizeof(int32_t) * (size_t)T),
              malloc(sizeof(int32_t) * (size_t)T), malloc(sizeof(int32_t) * (size_t)T), T};
    int seg = 0, left = 0, p = 0;
    for (int t = 0; t < T; t++) {
        if (left == 0) {
            left = 1 + (int)rng_below(rng, (uint64_t)T);
            p = (int)rng_below(rng, 1000);
            seg++;
        }
        r.tokens[t] = (int32_t)rng_below(rng, (uint64_t)V);
        r.pos[t] = p++;
        r.seg[t] = seg;
        left--;
        r.targets[t] = left == 0 && rng_below(rng, 2) ? -1 : (int32_t)rng_below(rng, (uint64_t)V);
    }
    return r;
}

static void rows_free(Rows *r) {
    free(r->tokens), free(r->targets), free(r->pos), free(r->seg);
}

static MicroBatch view(const Rows *r) {
    return (MicroBatch){.tokens = r->tokens, .targets = r->targets, .pos = r->pos, .seg = r->seg, .T = r->T};
}

static Offloader *offloader(int file) {
    OffloadTier tier;
    if (file) {
        test_tmpdir("nn_offload");
        assert_int_equal(offload_tier_file(&tier, TMP), 0);
    } else {
        assert_int_equal(offload_tier_memory(&tier), 0);
    }
    Offloader *o;
    assert_int_equal(offloader_init(&o, tier), 0);
    return o;
}

// One forward + backward at ratio r: the loss, and the gradients into grads (n_params floats).
static void step(Llama *m, const Rows *r, double ratio, double *loss, float *grads) {
    MicroBatch mb = view(r);
    llama_zero_grad(m);
    m->offload_ratio = (float)ratio;
    if (llama_forward_backward(m, &mb, 1.0f / 64, loss, NULL) != 0) fail_msg("%s", bs_errmsg());
    if (grads) memcpy(grads, m->grads, m->n_params * sizeof(float));
}

// ---- bitwise equality, and the accounting -------------------------------------------------------------

static void test_same_bits_with_offloading(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 2024);
    int checked = 0;
    for (int trial = 0; trial < 6; trial++) {
        ModelConfig cfg = random_config(&rng);
        int max_T = 64 + (int)rng_below(&rng, 300);
        Llama plain, off;
        assert_int_equal(llama_init(&plain, &cfg, max_T), 0);
        assert_int_equal(llama_init(&off, &cfg, max_T), 0);
        llama_init_weights(&plain, 7 + (uint64_t)trial);
        llama_init_weights(&off, 7 + (uint64_t)trial);
        float *want = malloc(plain.n_params * sizeof(float)), *got = malloc(plain.n_params * sizeof(float));
        for (int file = 0; file < 2; file++) {
            off.offload = offloader(file);
            // micro-batches of several sizes one after another, every ratio, through the same model:
            // what one micro-batch leaves in the arena never shows in the next
            for (int k = 0; k < 3; k++) {
                int T = k == 0 ? max_T : 1 + (int)rng_below(&rng, (uint64_t)max_T);
                Rows r = random_rows(&rng, T, cfg.vocab_size);
                double lw, lg;
                step(&plain, &r, 0, &lw, want);
                for (int i = 0; i < N_RATIOS; i++) {
                    double ratio = RATIOS[(i + k) % N_RATIOS];
                    off.act.peak = 0;
                    uint64_t before = off.act.offloaded;
                    step(&off, &r, ratio, &lg, got);
                    if (memcmp(&lw, &lg, sizeof lw) != 0)
                        fail_msg("%d layers, T %d, r %g, %s tier: loss %.17g, without offloading %.17g", cfg.n_layers,
                                 T, ratio, file ? "file" : "memory", lg, lw);
                    if (memcmp(want, got, plain.n_params * sizeof(float)) != 0)
                        fail_msg("%d layers, T %d, r %g, %s tier: the gradients differ", cfg.n_layers, T, ratio,
                                 file ? "file" : "memory");
                    // the accounting reaches what llama_resident_bytes predicts, and never more
                    size_t predicted = llama_resident_bytes(&cfg, T, ratio);
                    assert_int_equal(off.act.peak, predicted);
                    // every offloaded layer moved its tail: r of its block, rounded up to pages
                    uint64_t moved = off.act.offloaded - before;
                    size_t block = off.lay.block;
                    if (ratio == 0) {
                        assert_true(moved == 0);
                    } else {
                        assert_true(moved % (uint64_t)(cfg.n_layers - 2) == 0);
                        uint64_t tail = moved / (uint64_t)(cfg.n_layers - 2);
                        assert_true(tail >= ratio * (double)block && tail < ratio * (double)block + (double)arena_page_size());
                        assert_true(predicted < llama_resident_bytes(&cfg, T, 0));
                    }
                    checked++;
                }
                rows_free(&r);
            }
            offloader_free(off.offload);
            off.offload = NULL;
        }
        free(want);
        free(got);
        llama_free(&plain);
        llama_free(&off);
    }
    assert_int_equal(checked, 6 * 2 * 3 * N_RATIOS);
}

// The closed form against Eq. 3's (2 + (1 - r)(L - 2)) blocks: equal up to page rounding and the x
// of the next layer the forward writes while the last kept part is still held. With all = G + L B
// (r = 0) and r1 = G + 2 B + x (r = 1), G and the block size B follow.
static void test_resident_bytes_formula(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 5);
    double page = (double)arena_page_size();
    for (int trial = 0; trial < 200; trial++) {
        ModelConfig cfg = random_config(&rng);
        int T = 1 + (int)rng_below(&rng, 4000), L = cfg.n_layers;
        size_t all = llama_resident_bytes(&cfg, T, 0), prev = all;
        assert_int_equal(all, llama_activation_bytes(&cfg, T));  // r = 0 holds everything
        double x = (double)arena_page_round((size_t)T * (size_t)cfg.d_model * sizeof(float));
        double B = ((double)all - (double)llama_resident_bytes(&cfg, T, 1) + x) / (L - 2), G = (double)all - L * B;
        assert_true(B > 0 && G > 0 && fmod(B, page) == 0);
        for (int i = 1; i < N_RATIOS; i++) {
            double r = RATIOS[i], got = (double)llama_resident_bytes(&cfg, T, r);
            assert_true(got <= (double)prev);  // more offloading, never more memory
            prev = (size_t)got;
            double eq3 = G + (2 + (1 - r) * (L - 2)) * B;
            if (got > eq3 + x || got < eq3 - (L - 2) * page)
                fail_msg("%d layers, T %d, r %g: %.0f bytes, Eq. 3's form %.0f", L, T, r, got, eq3);
        }
    }
    // two layers or fewer never offload
    const ModelConfig *tiny = model_find("tiny");
    assert_int_equal(llama_resident_bytes(tiny, 500, 1), llama_resident_bytes(tiny, 500, 0));
    assert_int_equal(llama_resident_bytes(tiny, 500, 0), llama_activation_bytes(tiny, 500));
}

// ---- the resident set really shrinks --------------------------------------------------------------------

// A model whose activations dwarf everything else a step touches: wide MLP, narrow rest, 6 layers,
// 1,024 tokens: 103 MB of activations against a few of BLAS buffers and stacks (3,072 tokens, 310 MB,
// met the model's accounting within 1 MB at 3x the time). Fresh model per ratio, the file tier
// (O_DIRECT: the page cache is not the process's anyway): the step's peak RSS above the RSS before it
// is the activations it holds.
static void test_rss_drops(void **state) {
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    skip();  // ASan's shadow memory and quarantine move RSS by more than the tolerance
#endif
    ModelConfig cfg = {.name = "wide", .n_layers = 6, .n_heads = 2, .n_kv_heads = 1, .d_model = 64, .head_dim = 16,
                       .d_ff = 1536, .vocab_size = 64, .n_experts = 1, .top_k = 1, .rope_theta = 1e4, .norm_eps = 1e-5};
    int T = 1024;
    Rng rng;
    rng_seed(&rng, 77);
    Rows r = random_rows(&rng, T, cfg.vocab_size);
    double peak_kb[N_RATIOS], loss;
    {  // warm up the BLAS and the threads' first touches on a small model
        Llama w;
        assert_int_equal(llama_init(&w, &cfg, 256), 0);
        Rows s = random_rows(&rng, 256, cfg.vocab_size);
        w.offload = offloader(1);
        step(&w, &s, 1, &loss, NULL);
        offloader_free(w.offload);
        llama_free(&w);
        rows_free(&s);
    }
    for (int i = 0; i < N_RATIOS; i++) {
        Llama m;
        assert_int_equal(llama_init(&m, &cfg, T), 0);
        llama_init_weights(&m, 3);
        llama_zero_grad(&m);  // the gradients' pages are touched before the measurement
        m.offload = offloader(1);
        long before = procmem_status_kb("VmRSS:");
        if (!procmem_reset_peak()) {
            offloader_free(m.offload);
            llama_free(&m);
            rows_free(&r);
            skip();  // no /proc/self/clear_refs: nothing to measure with
        }
        step(&m, &r, RATIOS[i], &loss, NULL);
        peak_kb[i] = (double)(procmem_status_kb("VmHWM:") - before);
        print_message("r %.2f: peak RSS above the start %.1f MB, accounted %.1f MB\n", RATIOS[i], peak_kb[i] / 1024,
                      (double)llama_resident_bytes(&cfg, T, RATIOS[i]) / 1048576);
        offloader_free(m.offload);
        llama_free(&m);
    }
    rows_free(&r);
    double full = (double)llama_resident_bytes(&cfg, T, 0) / 1024;
    for (int i = 0; i < N_RATIOS; i++) {
        double want = (double)llama_resident_bytes(&cfg, T, RATIOS[i]) / 1024;
        // what the step held above its start is what the model accounts, within 10% of the whole
        // activation memory (BLAS buffers, thread stacks, allocator slack)
        if (fabs(peak_kb[i] - want) > 0.10 * full)
            fail_msg("r %g: peak RSS rose %.0f KB, the model accounts %.0f KB (all activations %.0f KB)", RATIOS[i],
                     peak_kb[i], want, full);
        // and it drops by about the bytes offloading saves
        double saved = full - want, dropped = peak_kb[0] - peak_kb[i];
        if (fabs(dropped - saved) > 0.10 * full)
            fail_msg("r %g: peak RSS dropped %.0f KB, offloading saves %.0f KB", RATIOS[i], dropped, saved);
    }
    assert_true(peak_kb[N_RATIOS - 1] < 0.7 * peak_kb[0]);
}

// ---- failures -------------------------------------------------------------------------------------------

static Offloader *failing(char op, int at, int err) {
    OffloadTier inner, t;
    assert_int_equal(offload_tier_memory(&inner), 0);
    assert_int_equal(offload_tier_failing(&t, inner, op, at, err), 0);
    Offloader *o;
    assert_int_equal(offloader_init(&o, t), 0);
    return o;
}

static void test_failing_tier(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 11);
    ModelConfig cfg = random_config(&rng);
    cfg.n_layers = 5;
    int T = 200;
    Llama m, plain;
    assert_int_equal(llama_init(&m, &cfg, T), 0);
    assert_int_equal(llama_init(&plain, &cfg, T), 0);
    llama_init_weights(&m, 1);
    llama_init_weights(&plain, 1);
    Rows r = random_rows(&rng, T, cfg.vocab_size);
    MicroBatch mb = view(&r);
    float *want = malloc(m.n_params * sizeof(float));
    double lw, loss;
    step(&plain, &r, 0, &lw, want);

    // a copy out fails (the second one: layer 1): found before the backward, gradients untouched
    m.offload = failing('w', 2, ENOSPC);
    m.offload_ratio = 0.5f;
    for (size_t i = 0; i < m.n_params; i++) m.grads[i] = (float)i;
    float *before = malloc(m.n_params * sizeof(float));
    memcpy(before, m.grads, m.n_params * sizeof(float));
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f / 64, &loss, NULL), -1);
    const char *e = bs_errmsg();
    if (!strstr(e, "layer 1") || !strstr(e, "out to host memory") || !strstr(e, strerror(ENOSPC)))
        fail_msg("unclear message: %s", e);
    assert_memory_equal(m.grads, before, m.n_params * sizeof(float));
    offloader_free(m.offload);

    // a copy back fails (layer 2, the first read): the error names it; the step must not be applied
    m.offload = failing('r', 1, EIO);
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f / 64, &loss, NULL), -1);
    e = bs_errmsg();
    if (!strstr(e, "layer 2") || !strstr(e, "back from host memory") || !strstr(e, strerror(EIO)))
        fail_msg("unclear message: %s", e);
    offloader_free(m.offload);

    // the model is whole afterwards: the next micro-batch, with a good tier, is exact again
    m.offload = offloader(0);
    float *got = malloc(m.n_params * sizeof(float));
    step(&m, &r, 0.75, &loss, got);
    assert_true(loss == lw);
    assert_memory_equal(got, want, m.n_params * sizeof(float));
    offloader_free(m.offload);

    // a real file-system error: the file tier under RLIMIT_FSIZE gets EFBIG, named with the file
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);  // else the signal ends the process
    m.offload = offloader(1);
    struct rlimit lim = {.rlim_cur = 4096, .rlim_max = old.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = llama_forward_backward(&m, &mb, 1.0f / 64, &loss, NULL);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    assert_int_equal(rc, -1);
    e = bs_errmsg();
    if (!strstr(e, "layer 0") || !strstr(e, "bytescale-offload-") || !strstr(e, strerror(EFBIG)))
        fail_msg("unclear message: %s", e);
    offloader_free(m.offload);

    free(want), free(got), free(before);
    rows_free(&r);
    llama_free(&m);
    llama_free(&plain);
}

// ---- the budget ----------------------------------------------------------------------------------------

static void test_budget(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 12);
    ModelConfig cfg = random_config(&rng);
    int T = 300;
    Llama m;
    assert_int_equal(llama_init(&m, &cfg, T), 0);
    llama_init_weights(&m, 2);
    Rows r = random_rows(&rng, T, cfg.vocab_size);
    MicroBatch mb = view(&r);
    double loss;
    size_t need = llama_resident_bytes(&cfg, T, 0.5);
    m.act_budget = need - 1;
    m.offload = offloader(0);
    m.offload_ratio = 0.5f;
    // one byte short: refused before anything runs (no gradient, no copy)
    llama_zero_grad(&m);
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f, &loss, NULL), -1);
    if (!strstr(bs_errmsg(), "memory budget") || !strstr(bs_errmsg(), "300 tokens"))
        fail_msg("unclear message: %s", bs_errmsg());
    for (size_t i = 0; i < m.n_params; i++) assert_true(m.grads[i] == 0);
    assert_true(m.act.offloaded == 0);
    // exactly enough: runs, and never holds more
    m.act_budget = need;
    m.act.peak = 0;
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f, &loss, NULL), 0);
    assert_true(m.act.peak <= m.act_budget);
    // without a tier the same ratio keeps everything resident: the budget refuses, and says why
    offloader_free(m.offload);
    m.offload = NULL;
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f, &loss, NULL), -1);
    assert_non_null(strstr(bs_errmsg(), "offloading is off"));
    // a ratio outside [0, 1] is refused
    m.act_budget = 0;
    m.offload_ratio = 1.5f;
    assert_int_equal(llama_forward_backward(&m, &mb, 1.0f, &loss, NULL), -1);
    assert_non_null(strstr(bs_errmsg(), "offload ratio"));
    rows_free(&r);
    llama_free(&m);
}

// ---- the tiers ------------------------------------------------------------------------------------------

static int files_in(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static void test_tiers(void **state) {
    (void)state;
    size_t page = arena_page_size(), n = 3 * page;
    Arena a;
    assert_int_equal(arena_init_pages(&a, 8 * page), 0);
    assert_true((uintptr_t)a.base % page == 0);
    for (size_t i = 0; i < n; i++) a.base[i] = (uint8_t)(i * 7 + 1);
    for (int kind = 0; kind < 2; kind++) {
        OffloadTier t;
        if (kind) {
            test_tmpdir("nn_offload");
            assert_int_equal(offload_tier_file(&t, TMP), 0);
            assert_int_equal(files_in(TMP), 0);  // unlinked at once: nothing to leave behind
            assert_non_null(strstr(t.name, TMP "/bytescale-offload-"));
        } else {
            assert_int_equal(offload_tier_memory(&t), 0);
        }
        // out at an offset, released, back: the same bytes at the same addresses
        assert_int_equal(t.write(t.ctx, 0, a.base, n, 5 * page), 0);
        assert_int_equal(arena_discard(a.base, n), 0);
        assert_true(a.base[0] == 0 && a.base[n - 1] == 0);  // released pages read as zeros
        // other activation sets at the same offset keep their own bytes (a pipeline stage's
        // micro-batches in flight mirror arenas of the same layout)
        for (int set = 1; set < 4; set++) {
            for (size_t i = 0; i < n; i++) a.base[i] = (uint8_t)(i * 3 + (size_t)set * 11);
            assert_int_equal(t.write(t.ctx, set * 85, a.base, n, 5 * page), 0);
        }
        if (kind) assert_int_equal(files_in(TMP), 0);  // each set's file unlinked too
        assert_int_equal(t.read(t.ctx, 0, a.base, n, 5 * page), 0);
        for (size_t i = 0; i < n; i++) assert_true(a.base[i] == (uint8_t)(i * 7 + 1));
        for (int set = 3; set >= 1; set--) {
            assert_int_equal(t.read(t.ctx, set * 85, a.base, n, 5 * page), 0);
            for (size_t i = 0; i < n; i++) assert_true(a.base[i] == (uint8_t)(i * 3 + (size_t)set * 11));
        }
        // a set outside the tier's range is refused, naming it
        assert_int_equal(t.write(t.ctx, OFFLOAD_MAX_SETS, a.base, n, 0), -1);
        assert_non_null(strstr(bs_errmsg(), "activation set 256"));
        for (size_t i = 0; i < n; i++) a.base[i] = (uint8_t)(i * 7 + 1);
        offload_tier_close(&t);
    }
    // a directory that is not there: the message names it
    OffloadTier t;
    assert_int_equal(offload_tier_file(&t, TMP "/missing"), -1);
    assert_non_null(strstr(bs_errmsg(), TMP "/missing"));
    // discarding is page-granular
    assert_int_equal(arena_discard(a.base + 1, page), -1);
    arena_free(&a);
}

// ---- a pipeline stage's activation sets --------------------------------------------------------------

// A stage holds several micro-batches between forward and backward, each in a view of its own
// (pipeline.c): the views share one offloader, each in its own set of the tier. Forwards and
// backwards interleaved as 1F1B runs them (k forwards ahead, then one backward per forward) give
// the losses and gradients of the same micro-batches run one after another without offloading, bit
// for bit, and each set's accounting is the one micro-batch's llama_resident_bytes.
static void test_views_share_the_offloader(void **state) {
    (void)state;
    Rng rng;
    rng_seed(&rng, 77);
    for (int trial = 0; trial < 4; trial++) {
        ModelConfig cfg = random_config(&rng);
        int max_T = 64 + (int)rng_below(&rng, 200), n = 2 + (int)rng_below(&rng, 4), sets = 2 + trial % 3;
        int file = trial % 2;
        double ratio = RATIOS[1 + rng_below(&rng, N_RATIOS - 1)];
        Llama plain, owner, views[4];
        assert_int_equal(llama_init(&plain, &cfg, max_T), 0);
        assert_int_equal(llama_init(&owner, &cfg, max_T), 0);
        llama_init_weights(&plain, 5 + (uint64_t)trial);
        llama_init_weights(&owner, 5 + (uint64_t)trial);
        Rows r[6];
        double want[6], got[6];
        for (int i = 0; i < n; i++) r[i] = random_rows(&rng, 1 + (int)rng_below(&rng, (uint64_t)max_T), cfg.vocab_size);
        llama_zero_grad(&plain);
        for (int i = 0; i < n; i++) {
            MicroBatch mb = view(&r[i]);
            assert_int_equal(llama_forward_backward(&plain, &mb, 1.0f / 64, &want[i], NULL), 0);
        }
        owner.offload = offloader(file);
        Llama *set[4] = {&owner};
        for (int v = 1; v < sets; v++) {
            assert_int_equal(llama_init_view(&views[v], &owner, max_T), 0);
            views[v].offload = owner.offload, views[v].offload_set = v;
            set[v] = &views[v];
        }
        llama_zero_grad(&owner);
        // 1F1B on a stage with `sets` in flight: forward i runs while backward i - sets has not
        for (int fi = 0, bi = 0; bi < n;) {
            int fwd = fi < n && fi - bi < sets;
            int i = fwd ? fi++ : bi++;
            Llama *m = set[i % sets];
            MicroBatch mb = view(&r[i]);
            if (fwd) {
                m->offload_ratio = (float)ratio;
                m->act.peak = 0;
                if (llama_stage_forward(m, &mb, NULL, 1.0f / 64, &got[i], NULL, NULL) != 0) fail_msg("%s", bs_errmsg());
            } else {
                if (llama_stage_backward(m, &mb, NULL, NULL) != 0) fail_msg("%s", bs_errmsg());
                assert_int_equal(m->act.peak, llama_resident_bytes(&cfg, r[i].T, ratio));
            }
        }
        for (int i = 0; i < n; i++)
            if (memcmp(&want[i], &got[i], sizeof want[i]) != 0)
                fail_msg("%d sets, %s tier, micro-batch %d: loss %.17g, one at a time %.17g", sets,
                         file ? "file" : "memory", i, got[i], want[i]);
        if (memcmp(plain.grads, owner.grads, plain.n_params * sizeof(float)) != 0)
            fail_msg("%d sets, %s tier: the gradients differ", sets, file ? "file" : "memory");
        uint64_t moved = owner.act.offloaded;
        for (int v = 1; v < sets; v++) moved += views[v].act.offloaded;
        assert_true(moved > 0);
        for (int v = 1; v < sets; v++) llama_free(&views[v]);
        offloader_free(owner.offload);
        owner.offload = NULL;
        for (int i = 0; i < n; i++) rows_free(&r[i]);
        llama_free(&plain);
        llama_free(&owner);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits_with_offloading),
        cmocka_unit_test(test_resident_bytes_formula),
        cmocka_unit_test(test_rss_drops),
        cmocka_unit_test(test_failing_tier),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_tiers),
        cmocka_unit_test(test_views_share_the_offloader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
