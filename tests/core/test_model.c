// test_model.c: the model catalogue (shapes, parameter counts, FLOPs) and the hardware profiles.
#include "test_util.h"

#include <math.h>

#include "bytescale/cost.h"
#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/hw.h"
#include "bytescale/model.h"

static const char *all_names[] = {"llama-7b",      "llama-13b", "llama-30b", "llama-70b", "mixtral-8x7b",
                                  "mixtral-8x22b", "tiny",      "small",     "base"};
enum { N_NAMES = (int)(sizeof all_names / sizeof all_names[0]) };

static void test_catalogue_names_and_check(void **state) {
    (void)state;
    assert_int_equal(model_count(), N_NAMES);
    for (int i = 0; i < N_NAMES; i++) {
        const ModelConfig *m = model_find(all_names[i]);
        assert_non_null(m);
        assert_string_equal(m->name, all_names[i]);
        assert_int_equal(model_check(m), 0);
        // the attention width equals the hidden size everywhere but llama-30b (docs/cost-model.md)
        int uniform = m->d_model == m->n_heads * m->head_dim;
        assert_int_equal(uniform, strcmp(m->name, "llama-30b") != 0);
    }
    assert_null(model_at(N_NAMES));
    assert_null(model_at(-1));
    assert_null(model_find("llama-8b"));
    assert_non_null(strstr(bs_errmsg(), "llama-8b"));
    assert_non_null(strstr(bs_errmsg(), "mixtral-8x22b"));  // the message lists the known names

    // the shapes the paper gives (docs/architecture.md, "The paper: evaluation setup"):
    // layers, heads, kv groups, hidden
    const struct {
        const char *name;
        int layers, heads, kv, hidden;
    } paper[] = {{"llama-7b", 32, 32, 8, 4096},     {"llama-13b", 40, 40, 8, 5120},
                 {"llama-30b", 60, 56, 8, 6656},    {"llama-70b", 80, 64, 8, 8192},
                 {"mixtral-8x7b", 32, 32, 8, 4096}, {"mixtral-8x22b", 56, 48, 8, 6144}};
    for (int i = 0; i < 6; i++) {
        const ModelConfig *m = model_find(paper[i].name);
        assert_int_equal(m->n_layers, paper[i].layers);
        assert_int_equal(m->n_heads, paper[i].heads);
        assert_int_equal(m->n_kv_heads, paper[i].kv);
        assert_int_equal(m->d_model, paper[i].hidden);
    }
}

static void test_model_check_names_the_field(void **state) {
    (void)state;
    ModelConfig m = *model_find("tiny");
    m.n_kv_heads = 3;
    assert_int_equal(model_check(&m), -1);
    assert_non_null(strstr(bs_errmsg(), "n_kv_heads"));
    m = *model_find("tiny");
    m.d_ff = 0;
    assert_int_equal(model_check(&m), -1);
    assert_non_null(strstr(bs_errmsg(), "d_ff"));
    m = *model_find("mixtral-8x7b");
    m.top_k = 9;
    assert_int_equal(model_check(&m), -1);
    assert_non_null(strstr(bs_errmsg(), "top_k"));
    m = *model_find("tiny");
    m.norm_eps = 0;
    assert_int_equal(model_check(&m), -1);
    assert_non_null(strstr(bs_errmsg(), "norm_eps"));
}

// Parameters counted tensor by tensor, the way a weight file lists them.
static int64_t count_tensors(const ModelConfig *m, int experts) {
    int64_t d = m->d_model, q = (int64_t)m->n_heads * m->head_dim, kv = (int64_t)m->n_kv_heads * m->head_dim;
    int64_t n = 0;
    n += (int64_t)m->vocab_size * d;  // tok_emb
    for (int l = 0; l < m->n_layers; l++) {
        n += d;                                   // attn_norm
        n += q * d + kv * d + kv * d + d * q;     // wq, wk, wv, wo
        n += d;                                   // mlp_norm
        if (m->n_experts > 1) n += (int64_t)m->n_experts * d;  // router
        for (int e = 0; e < experts; e++) n += 3 * (int64_t)m->d_ff * d;  // w_gate, w_up, w_down
    }
    n += d;                              // final_norm
    n += (int64_t)m->vocab_size * d;     // lm_head (untied)
    return n;
}

static void test_param_counts_tensor_by_tensor(void **state) {
    (void)state;
    for (int i = 0; i < model_count(); i++) {
        const ModelConfig *m = model_at(i);
        assert_int_equal(model_params_total(m), count_tensors(m, m->n_experts));
        assert_int_equal(model_params_active(m), count_tensors(m, m->top_k));
        ModelConfig one = *m;
        one.n_layers = 1;
        ModelConfig none = *m;
        none.n_layers = 0;
        assert_int_equal(model_params_per_layer(m), count_tensors(&one, m->n_experts) - count_tensors(&none, 0));
    }
}

// Published sizes: LLaMA (Touvron et al. 2023, Table 2: 6.7B, 13.0B, 32.5B), Llama 2 70B (68.98B in its
// released configuration), Mixtral 8x7B (46.7B total, 12.9B active) and 8x22B (141B, 39B).
static void test_param_counts_match_published_sizes(void **state) {
    (void)state;
    // LLaMA-7B/13B are multi-head: the catalogue's 8 K/V groups (the paper's) remove exactly the
    // K/V weights of the other heads.
    ModelConfig m7 = *model_find("llama-7b");
    ModelConfig mha7 = m7;
    mha7.n_kv_heads = mha7.n_heads;
    assert_close(model_params_total(&mha7), 6.74e9, 0.02, 0);
    int64_t removed = (int64_t)m7.n_layers * 2 * m7.d_model * (int64_t)(m7.n_heads - m7.n_kv_heads) * m7.head_dim;
    assert_int_equal(model_params_total(&mha7) - model_params_total(&m7), removed);
    ModelConfig mha13 = *model_find("llama-13b");
    mha13.n_kv_heads = mha13.n_heads;
    assert_close(model_params_total(&mha13), 13.0e9, 0.02, 0);
    // LLaMA-33B as released: 52 multi-head heads of 128 = 6656
    ModelConfig l33 = *model_find("llama-30b");
    l33.n_heads = 52;
    l33.n_kv_heads = 52;
    assert_close(model_params_total(&l33), 32.5e9, 0.02, 0);
    assert_close(model_params_total(model_find("llama-70b")), 69.0e9, 0.02, 0);
    const ModelConfig *x7 = model_find("mixtral-8x7b"), *x22 = model_find("mixtral-8x22b");
    assert_close(model_params_total(x7), 46.7e9, 0.02, 0);
    assert_close(model_params_active(x7), 12.9e9, 0.02, 0);
    assert_close(model_params_total(x22), 141e9, 0.02, 0);
    assert_close(model_params_active(x22), 39e9, 0.02, 0);
    // dense models: active == total
    assert_int_equal(model_params_active(&m7), model_params_total(&m7));
}

// Each weight of a linear layer is used once per token in the forward pass: one multiply and one
// add. So the linear FLOPs per token are exactly 2x the active weights of a layer, norms excepted.
static void test_linear_flops_are_twice_the_active_weights(void **state) {
    (void)state;
    for (int i = 0; i < model_count(); i++) {
        const ModelConfig *m = model_at(i);
        int64_t outer = 2 * (int64_t)m->vocab_size * m->d_model + m->d_model;
        int64_t active_layer = (model_params_active(m) - outer) / m->n_layers;
        double expect = 2.0 * (double)(active_layer - 2 * m->d_model);
        assert_close(cost_linear_flops_per_token(m), expect, 1e-12, 0);
        assert_close(cost_head_flops_per_token(m), 2.0 * m->vocab_size * m->d_model, 1e-12, 0);
    }
}

// A naive attention loop over one visible pair: every query head does head_dim multiply-adds for
// its score and head_dim for its value accumulation. GQA shares K/V heads but not this work.
static void test_attention_flops_per_pair(void **state) {
    (void)state;
    for (int i = 0; i < model_count(); i++) {
        const ModelConfig *m = model_at(i);
        double flops = 0;
        for (int h = 0; h < m->n_heads; h++)
            for (int d = 0; d < m->head_dim; d++) flops += 2 /* q.k */ + 2 /* p*v */;
        assert_close(cost_attn_flops_per_pair(m), flops, 1e-12, 0);
        ModelConfig mha = *m;
        mha.n_kv_heads = mha.n_heads;
        assert_close(cost_attn_flops_per_pair(&mha), flops, 1e-12, 0);
    }
    // train FLOPs of a pack: 3 x (layers x (linear x tokens + attention x visible pairs) + head x tokens)
    const ModelConfig *m = model_find("small");
    int64_t segs[3] = {7, 100, 1};
    double pairs = 0;
    for (int k = 0; k < 3; k++)
        for (int64_t q = 0; q < segs[k]; q++)
            for (int64_t j = 0; j <= q; j++) pairs += 1;
    double expect = 3.0 * (m->n_layers * (cost_linear_flops_per_token(m) * 108 + cost_attn_flops_per_pair(m) * pairs) +
                           cost_head_flops_per_token(m) * 108);
    assert_close(cost_train_flops(m, segs, 3), expect, 1e-12, 0);
}

// ---- hardware profiles -------------------------------------------------------------------------

// Every field equal (exactly: JSON numbers round-trip), optionally ignoring the name.
static int hw_equal(const HardwareProfile *a, const HardwareProfile *b, int with_name) {
    return (!with_name || strcmp(a->name, b->name) == 0) && a->gpus_per_node == b->gpus_per_node &&
           a->peak_flops == b->peak_flops && a->efficiency == b->efficiency && a->mem_bytes == b->mem_bytes &&
           a->intra_bw == b->intra_bw && a->inter_bw == b->inter_bw && a->intra_lat == b->intra_lat &&
           a->inter_lat == b->inter_lat && a->host_bw == b->host_bw && a->elem_bytes == b->elem_bytes &&
           a->attn_efficiency == b->attn_efficiency && a->mem_bw == b->mem_bw;
}

static void test_builtin_profiles(void **state) {
    (void)state;
    const char *names[] = {"h100-sxm", "h100-measured", "h800-sxm", "cpu"};
    assert_int_equal(hw_count(), 4);
    for (int i = 0; i < 4; i++) {
        const HardwareProfile *h = hw_find(names[i]);
        assert_non_null(h);
        assert_int_equal(hw_check(h), 0);
    }
    assert_null(hw_find("a100"));
    assert_non_null(strstr(bs_errmsg(), "h800-sxm"));
    const HardwareProfile *h100 = hw_find("h100-sxm"), *h800 = hw_find("h800-sxm");
    // datasheet figures, converted: 1979 TFLOP/s bf16 "with sparsity" is twice the dense rate;
    // NVLink 900 / 400 GB/s are both directions together; a 400 Gb/s NIC moves 50 GB/s each way.
    assert_close(h100->peak_flops, 1979e12 / 2, 0.001, 0);
    assert_close(h100->intra_bw, 900e9 / 2, 1e-12, 0);
    assert_close(h800->intra_bw, 400e9 / 2, 1e-12, 0);
    assert_close(h100->inter_bw, 400e9 / 8, 1e-12, 0);
    assert_int_equal(h100->gpus_per_node, 8);
    assert_int_equal(h100->elem_bytes, 2);
    // H800: the same chip, only NVLink differs
    HardwareProfile b = *h800;
    assert_false(hw_equal(h100, &b, 0));
    b.intra_bw = h100->intra_bw;
    assert_true(hw_equal(h100, &b, 0));
    assert_int_equal(hw_find("cpu")->elem_bytes, 4);
}

static void write_text(const char *path, const char *text) {
    assert_int_equal(file_write_atomic(path, text, strlen(text)), 0);
}

static void test_profile_file_round_trip_and_errors(void **state) {
    (void)state;
    const char *dir = test_tmpdir("core_hw");
    char path[600];
    snprintf(path, sizeof path, "%s/h800.json", dir);
    HardwareProfile h;
    for (int i = 0; i < hw_count(); i++) {
        assert_int_equal(hw_save_file(hw_at(i), path), 0);
        memset(&h, 0xAB, sizeof h);
        assert_int_equal(hw_load_file(path, &h), 0);
        assert_true(hw_equal(&h, hw_at(i), 1));
    }

    // optional fields may be left out: 0
    const char *minimal = "{\"name\": \"lab\", \"gpus_per_node\": 4, \"peak_flops\": 1e14, \"efficiency\": 0.4,"
                          " \"mem_bytes\": 4e10, \"intra_bw\": 1e11, \"inter_bw\": 1e10, \"intra_lat\": 1e-6,"
                          " \"inter_lat\": 5e-6, \"host_bw\": 2e10, \"elem_bytes\": 2}";
    snprintf(path, sizeof path, "%s/lab.json", dir);
    write_text(path, minimal);
    assert_int_equal(hw_load_file(path, &h), 0);
    assert_string_equal(h.name, "lab");
    assert_true(h.attn_efficiency == 0 && h.mem_bw == 0);
    assert_int_equal(h.gpus_per_node, 4);

    // errors name the file and the field
    struct {
        const char *from, *to, *field;
    } bad[] = {
        {"\"host_bw\": 2e10, ", "", "host_bw"},              // missing
        {"\"inter_bw\": 1e10", "\"inter_bw\": -1e10", "inter_bw"},  // negative bandwidth
        {"\"efficiency\": 0.4", "\"efficiency\": 1.5", "efficiency"},
        {"\"elem_bytes\": 2", "\"elem_bytes\": 3", "elem_bytes"},
        {"\"gpus_per_node\": 4", "\"gpus_per_node\": 0", "gpus_per_node"},
        {"\"intra_lat\": 1e-6", "\"intra_lat\": \"fast\"", "intra_lat"},
        // positive and finite but no device's: refused by name, not left to make every plan infeasible
        {"\"inter_bw\": 1e10", "\"inter_bw\": 1e-300", "inter_bw is 1e-300 bytes/s, outside"},
        {"\"intra_bw\": 1e11", "\"intra_bw\": 1e300", "intra_bw is 1e+300 bytes/s, outside"},
        {"\"peak_flops\": 1e14", "\"peak_flops\": 3", "peak_flops is 3 FLOP/s, outside"},
        {"\"mem_bytes\": 4e10", "\"mem_bytes\": 1e20", "mem_bytes is 1e+20 bytes, outside"},
        {"\"inter_lat\": 5e-6", "\"inter_lat\": 500", "inter_lat is 500 s, outside"},
        {"\"host_bw\": 2e10", "\"host_bw\": 10", "host_bw is 10 bytes/s, outside"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[1024];
        const char *at = strstr(minimal, bad[i].from);
        assert_non_null(at);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - minimal), minimal, bad[i].to, at + strlen(bad[i].from));
        write_text(path, text);
        assert_int_equal(hw_load_file(path, &h), -1);
        assert_non_null(strstr(bs_errmsg(), bad[i].field));
        assert_non_null(strstr(bs_errmsg(), "lab.json"));
    }
    write_text(path, "{\"name\": \"lab\",\n \"gpus_per_node\": }");
    assert_int_equal(hw_load_file(path, &h), -1);
    assert_non_null(strstr(bs_errmsg(), "lab.json:2:"));
}

// --hardware's one rule (hw_resolve): a '/' or a .json ending makes the value a file, else a name.
static void test_resolve_name_or_file(void **state) {
    (void)state;
    const char *dir = test_tmpdir("core_hw_resolve");
    HardwareProfile h, lab = *hw_find("h100-sxm");
    snprintf(lab.name, sizeof lab.name, "lab");
    lab.inter_bw = 25e9;
    assert_int_equal(hw_resolve("h800-sxm", &h), 0);
    assert_true(hw_equal(&h, hw_find("h800-sxm"), 1));
    // a file by its .json ending, and one without it but with a '/'
    char path[600];
    snprintf(path, sizeof path, "%s/lab.json", dir);
    assert_int_equal(hw_save_file(&lab, path), 0);
    memset(&h, 0, sizeof h);
    assert_int_equal(hw_resolve(path, &h), 0);
    assert_true(hw_equal(&h, &lab, 1));
    snprintf(path, sizeof path, "%s/lab.profile", dir);
    assert_int_equal(hw_save_file(&lab, path), 0);
    memset(&h, 0, sizeof h);
    assert_int_equal(hw_resolve(path, &h), 0);
    assert_true(hw_equal(&h, &lab, 1));
    // a bare word is a name: the error lists the profiles and says how to name a file
    assert_int_equal(hw_resolve("lab.profile", &h), -1);
    assert_non_null(strstr(bs_errmsg(), "h100-sxm"));
    assert_non_null(strstr(bs_errmsg(), "./lab.profile"));
    assert_int_equal(hw_resolve("/nonexistent/lab.json", &h), -1);
    assert_non_null(strstr(bs_errmsg(), "/nonexistent/lab.json"));
    assert_int_equal(hw_resolve("", &h), -1);
    assert_int_equal(hw_resolve(NULL, &h), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_catalogue_names_and_check),
        cmocka_unit_test(test_model_check_names_the_field),
        cmocka_unit_test(test_param_counts_tensor_by_tensor),
        cmocka_unit_test(test_param_counts_match_published_sizes),
        cmocka_unit_test(test_linear_flops_are_twice_the_active_weights),
        cmocka_unit_test(test_attention_flops_per_pair),
        cmocka_unit_test(test_builtin_profiles),
        cmocka_unit_test(test_profile_file_round_trip_and_errors),
        cmocka_unit_test(test_resolve_name_or_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
