// test_sim_outputs.c: the cluster's placement and link costs by hand, the Chrome trace (it parses
// as JSON and its tracks add up to the step), the scenario presets and the runner.
#include "test_util.h"

#include "sim/sim_fixtures.h"

#include <math.h>

#include "bytescale/cluster.h"
#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/json.h"
#include "bytescale/plan.h"
#include "bytescale/policy.h"
#include "bytescale/scenario.h"
#include "bytescale/sim.h"

// ---- cluster ----------------------------------------------------------------------------------

static void test_cluster_placement_and_links(void **state) {
    (void)state;
    HardwareProfile hw = hand_hw(4);
    Cluster c;
    // 16 GPUs, tp 2: 8 HDP ranks, two per node; rank r on devices 2r, 2r+1, node r / 2
    assert_int_equal(cluster_init(&c, &hw, 16, 2, 1), 0);
    assert_int_equal(c.n_ranks, 8);
    assert_int_equal(cluster_device(&c, 3, 0), 6);
    assert_int_equal(cluster_node(&c, 3, 0), 1);
    // a message of 100 B: 100/200 + 0.001 inside a node, 100/100 + 0.01 across
    assert_close(cluster_msg_time(&c, 2, 0, 3, 0, 100), 0.501, 0, 1e-15);
    assert_close(cluster_msg_time(&c, 1, 0, 2, 0, 100), 1.01, 0, 1e-15);
    int32_t in[] = {4, 5}, across[] = {0, 1, 2}, wrap[] = {5, 4};
    assert_close(cluster_ring_hop_time(&c, in, 2, 0, 100), 0.501, 0, 1e-15);
    assert_close(cluster_ring_hop_time(&c, wrap, 2, 0, 100), 0.501, 0, 1e-15);
    assert_close(cluster_ring_hop_time(&c, across, 3, 0, 100), 1.01, 0, 1e-15);
    assert_close(cluster_ring_hop_time(&c, across, 1, 0, 100), 0, 0, 0);
    // gradient sync of 800 B per device over 8 ranks spread on 4 nodes: 2 * 7 steps of 100 B
    // across nodes (1.01 s each) = 14.14 s
    assert_close(cluster_sync_time(&c, 0, 800), 14.14, 0, 1e-12);
    // the same on 4 GPUs: 2 ranks on one node: 2 * 1 * (400/200 + 0.001) = 4.002
    assert_int_equal(cluster_init(&c, &hw, 4, 2, 1), 0);
    assert_close(cluster_sync_time(&c, 0, 800), 4.002, 0, 1e-12);
    assert_int_equal(cluster_init(&c, &hw, 2, 2, 1), 0);
    assert_close(cluster_sync_time(&c, 0, 800), 0, 0, 0);
    // PP: tp 2, pp 2 on nodes of 4: rank r = node r, stage s on devices 4r + 2s, 4r + 2s + 1;
    // tp 4, pp 2: each stage fills a node, so the stages of one pipeline talk across nodes
    assert_int_equal(cluster_init(&c, &hw, 16, 2, 2), 0);
    assert_int_equal(cluster_node(&c, 2, 1), 2);
    assert_close(cluster_msg_time(&c, 2, 0, 2, 1, 100), 0.501, 0, 1e-15);
    assert_int_equal(cluster_init(&c, &hw, 16, 4, 2), 0);
    assert_int_equal(cluster_node(&c, 1, 1), 3);
    assert_close(cluster_msg_time(&c, 1, 0, 1, 1, 100), 1.01, 0, 1e-15);
    // shapes that do not fit are errors that say why
    assert_int_equal(cluster_init(&c, &hw, 16, 3, 1), -1);
    assert_non_null(strstr(bs_errmsg(), "tp 3"));
    assert_int_equal(cluster_init(&c, &hw, 12, 4, 2), -1);
    assert_non_null(strstr(bs_errmsg(), "12 GPUs"));
}

// ---- trace ------------------------------------------------------------------------------------

static void test_trace_is_json_and_tracks_add_up(void **state) {
    (void)state;
    const ModelConfig *m = model_find("llama-7b");
    const HardwareProfile *hw = hw_find("h100-sxm");
    assert_non_null(m);
    assert_non_null(hw);
    // 100 HDP ranks (more than the 64 a trace shows) with PP 2
    Cluster c;
    assert_int_equal(cluster_init(&c, hw, 400, 2, 2), 0);
    assert_int_equal(c.n_ranks, 100);
    CostModel cm;
    assert_int_equal(cost_derive(&cm, m, hw, 2, 2, c.n_ranks, 8 << 10), 0);
    GlobalBatch b;
    assert_int_equal(batch_generate(&b, "byted", 5, 4 << 20, 512 << 10), 0);
    PlanConfig pc = {.n_ranks = c.n_ranks, .capacity = 8 << 10, .context = 512 << 10, .pp = 2, .offload = 1};
    Plan p;
    if (policy_plan(&p, "balance", &b, &pc, &cm) != 0) fail_msg("%s", bs_errmsg());
    SimConfig cfg = {&cm, &c, m, hw, 0};
    SimResult r;
    assert_int_equal(sim_run(&r, &p, &cfg), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/trace.json", test_tmpdir("sim_trace"));
    if (sim_trace_write(&r, &p, path, 0) != 0) fail_msg("%s", bs_errmsg());
    cJSON *root;
    if (json_read_file(path, &root) != 0) fail_msg("%s", bs_errmsg());
    assert_true(cJSON_IsArray(root));
    double track_sum[100][2] = {{0}};
    int seen_rank[100] = {0}, n_events = 0;
    const cJSON *ev;
    cJSON_ArrayForEach(ev, root) {
        const char *ph, *name;
        int64_t pid, tid;
        assert_int_equal(json_get_string(ev, "ph", &ph, "event"), 0);
        assert_int_equal(json_get_string(ev, "name", &name, "event"), 0);
        assert_int_equal(json_get_int(ev, "pid", &pid, "event"), 0);
        assert_int_equal(json_get_int(ev, "tid", &tid, "event"), 0);
        assert_true(pid >= 0 && pid < 100 && tid >= 0 && tid < 2);
        seen_rank[pid] = 1;
        if (!strcmp(ph, "M")) continue;
        assert_string_equal(ph, "X");
        const char *cat;
        double ts, dur;
        assert_int_equal(json_get_string(ev, "cat", &cat, "event"), 0);
        assert_int_equal(json_get_double(ev, "ts", &ts, "event"), 0);
        assert_int_equal(json_get_double(ev, "dur", &dur, "event"), 0);
        assert_true(!strcmp(cat, "compute") || !strcmp(cat, "comm") || !strcmp(cat, "offload") ||
                    !strcmp(cat, "wait") || !strcmp(cat, "sync"));
        assert_true(dur > 0 && ts >= 0);
        // consecutive slices on a track: each starts where the previous ended
        assert_close(ts, track_sum[pid][tid], 1e-9, 2e-3);
        track_sum[pid][tid] = ts + dur;
        n_events++;
    }
    // 64 ranks sampled evenly, first and last included; every track covers the whole step
    int n_ranks_seen = 0;
    for (int i = 0; i < 100; i++) n_ranks_seen += seen_rank[i];
    assert_int_equal(n_ranks_seen, 64);
    assert_true(seen_rank[0] && seen_rank[99]);
    for (int i = 0; i < 100; i++)
        for (int s = 0; s < 2; s++)
            if (seen_rank[i]) assert_close(track_sum[i][s], r.step_time * 1e6, 1e-9, 2e-3);
    assert_true(n_events > 64 * 2 * 3);
    cJSON_Delete(root);
    // one rank asked for: rank 0 alone (the spacing once divided by zero and read far out of bounds)
    if (sim_trace_write(&r, &p, path, 1) != 0) fail_msg("%s", bs_errmsg());
    if (json_read_file(path, &root) != 0) fail_msg("%s", bs_errmsg());
    cJSON_ArrayForEach(ev, root) {
        int64_t pid;
        assert_int_equal(json_get_int(ev, "pid", &pid, "event"), 0);
        assert_int_equal(pid, 0);
    }
    cJSON_Delete(root);
    sim_result_free(&r);
    plan_free(&p);
    batch_free(&b);
}

// ---- scenarios ----------------------------------------------------------------------------------

static void test_scenarios_are_the_papers_grid_and_fit(void **state) {
    (void)state;
    assert_int_equal(scenario_grid_count(), 6 * 2 * 4);
    assert_int_equal(scenario_count(), scenario_grid_count() + 1);
    for (int i = 0; i < scenario_count(); i++) {
        Scenario s, t;
        assert_int_equal(scenario_get(i, &s), 0);
        assert_int_equal(scenario_find(s.name, &t), 0);
        assert_int_equal(memcmp(&s, &t, sizeof s), 0);  // names are unique
        assert_int_equal(s.tokens, 32 << 20);
        const ModelConfig *m = model_find(s.model);
        const HardwareProfile *hw = hw_find(s.hardware);
        assert_non_null(m);
        assert_non_null(hw);
        Cluster c;
        assert_int_equal(cluster_init(&c, hw, s.gpus, s.tp, s.pp), 0);
        // every preset fits device memory, and the static mesh's d_cp ranks exist
        CostMemory mem;
        assert_int_equal(cost_memory(&mem, m, hw, s.tp, s.pp, c.n_ranks, s.capacity), 0);
        assert_true(mem.fits);
        int64_t d_cp = (s.context + s.capacity - 1) / s.capacity;
        assert_true(d_cp <= c.n_ranks && c.n_ranks % d_cp == 0);
    }
    // the case study: d_cp = 256 and 8 micro-batches of 2M per DP group
    Scenario cs;
    assert_int_equal(scenario_find("case-study", &cs), 0);
    int ranks = cs.gpus / (cs.tp * cs.pp), d_cp = (int)(cs.context / cs.capacity);
    assert_int_equal(d_cp, 256);
    assert_int_equal(cs.tokens / cs.context / (ranks / d_cp), 8);
    assert_string_equal(cs.model, "llama-7b");
    assert_int_equal(cs.gpus, 1024);
    Scenario s;
    assert_int_equal(scenario_find("7b-1024-byted-2m", &s), 0);
    assert_int_equal(s.context, 2 << 20);
    assert_int_equal(scenario_find("8x22b-16384-github-256k", &s), 0);
    assert_int_equal(s.gpus, 16384);
    assert_int_equal(scenario_find("7b-1000-byted-2m", &s), -1);
    assert_non_null(strstr(bs_errmsg(), "--scenario list"));
    SimVariant v;
    assert_int_equal(sim_variant_find("naive-nooff", &v), 0);
    assert_int_equal(v.offload, 0);
    assert_string_equal(v.policy, "naive");
    assert_int_equal(sim_variant_find("nonsense", &v), -1);
}

static void test_runner_runs_every_variant_on_a_small_scenario(void **state) {
    (void)state;
    Scenario sc;
    assert_int_equal(scenario_find("7b-1024-github-256k", &sc), 0);
    sc.gpus = 128;       // 64 HDP ranks
    sc.tokens = 4 << 20;  // a small batch keeps the test fast
    snprintf(sc.name, sizeof sc.name, "small");
    SimSetup s;
    if (sim_setup_init(&s, &sc, 3) != 0) fail_msg("%s", bs_errmsg());
    assert_int_equal(s.batch.n_tokens, 4 << 20);
    SimOutcome o[8];
    int n_v = sim_variant_count();
    assert_true(n_v <= 8);
    for (int i = 0; i < n_v; i++) {
        if (sim_setup_run(&s, sim_variant_at(i), &o[i], NULL) != 0) fail_msg("%s", bs_errmsg());
        assert_true(o[i].res.step_time >= o[i].lower_bound);
        assert_close(o[i].res.tokens_per_s * o[i].res.step_time, 4 << 20, 1e-12, 0);
    }
    // static cuts every micro-batch over d_cp = 32 ranks: it moves far more ring bytes than HDP
    assert_true(o[0].res.ring_bytes > o[1].res.ring_bytes);
    // without offloading nothing is copied
    assert_close(o[1].res.offload_bytes, 0, 0, 0);
    char path[600];
    snprintf(path, sizeof path, "%s/table.txt", test_tmpdir("sim_runner"));
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    sim_table_print(f, o, n_v);
    fclose(f);
    char *text;
    size_t n;
    assert_int_equal(file_read_all(path, &text, &n), 0);
    assert_non_null(strstr(text, "balance"));
    assert_non_null(strstr(text, "1.00x"));  // static against itself
    free(text);
    assert_string_equal(o[n_v - 2].variant.label, "balance");
    assert_string_equal(o[n_v - 1].variant.label, "elastic");
    assert_true(o[n_v - 1].planner_makespan <= o[n_v - 2].planner_makespan);  // never longer than balance
    cJSON *j = sim_outcome_json(&o[n_v - 1]);
    assert_non_null(j);
    double tps;
    assert_int_equal(json_get_double(j, "tokens_per_s", &tps, "outcome"), 0);
    assert_close(tps, o[n_v - 1].res.tokens_per_s, 0, 0);
    cJSON_Delete(j);
    for (int i = 0; i < n_v; i++) sim_outcome_free(&o[i]);
    sim_setup_free(&s);
}

// Issue 8: tp x pp used to overflow int (tp 4 x pp 2^30 = 0: a SIGFPE in the modulo); every size is
// now bounded by cluster.h's limits before any product is formed.
static void test_cluster_bounds(void **state) {
    (void)state;
    HardwareProfile hw = hand_hw(8);
    Cluster c;
    assert_int_equal(cluster_init(&c, &hw, 8, 4, 1 << 30), -1);
    assert_non_null(strstr(bs_errmsg(), "tp and pp must be in [1, 1024] (got tp 4, pp 1073741824)"));
    assert_int_equal(cluster_init(&c, &hw, 8, 1 << 30, 2), -1);
    assert_non_null(strstr(bs_errmsg(), "must be in [1, 1024]"));
    assert_int_equal(cluster_init(&c, &hw, INT32_MAX, 1, 1), -1);
    assert_non_null(strstr(bs_errmsg(), "--gpus must be in [1, 4194304] (got 2147483647)"));
    assert_int_equal(cluster_init(&c, &hw, 0, 1, 1), -1);
    // the largest cluster: 2^22 GPUs, tp 8, pp 1024 -> 512 ranks; devices up to 2^22 - 8
    assert_int_equal(cluster_init(&c, &hw, CLUSTER_MAX_GPUS, 8, CLUSTER_MAX_DEGREE), 0);
    assert_int_equal(c.n_ranks, 512);
    assert_int_equal(cluster_device(&c, 511, 1023), CLUSTER_MAX_GPUS - 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster_placement_and_links),
        cmocka_unit_test(test_trace_is_json_and_tracks_add_up),
        cmocka_unit_test(test_scenarios_are_the_papers_grid_and_fit),
        cmocka_unit_test(test_runner_runs_every_variant_on_a_small_scenario),
        cmocka_unit_test(test_cluster_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
