// plan_example.c: plan a small global batch with a policy and print the summary: a program that uses
// the installed library (README.md, "Using the library").
//
//   cc -o plan_example plan_example.c $(pkg-config --cflags --libs bytescale)
//   or find_package(bytescale) in CMake (examples/CMakeLists.txt)
//
// usage: plan_example [policy] (default balance)
#include <stdio.h>
#include <stdlib.h>

#include <bytescale/bytescale.h>

int main(int argc, char **argv) {
    const char *policy = argc > 1 ? argv[1] : "balance";
    // A long-tailed batch: two sequences longer than one rank holds (rings), many short ones (packs).
    int64_t lengths[64];
    int n = 0;
    lengths[n++] = 30000;
    lengths[n++] = 12000;
    for (int i = 0; n < 64; i++) lengths[n++] = 200 + (i * 397) % 3800;

    // LLaMA-7B on H800s, 2 GPUs per rank (tensor parallel), 8 HDP ranks of 8K tokens each
    const int32_t ranks = 8;
    const int64_t capacity = 8192;
    CostModel *cm = bs_cost_derive("llama-7b", "h800-sxm", 2, 1, ranks, capacity);
    if (!cm) {
        fprintf(stderr, "plan_example: %s\n", bs_errmsg());
        return 1;
    }
    Plan *p = bs_plan_lengths(lengths, n, policy, ranks, capacity, 0, 1, 1, cm);
    if (!p) {
        fprintf(stderr, "plan_example: %s\n", bs_errmsg());
        bs_cost_free(cm);
        return 1;
    }
    // the struct API works on the same plan: a Plan from the flat API is an ordinary finalized plan
    PlanStats st;
    if (plan_stats(p, cm, &st) != 0) {
        fprintf(stderr, "plan_example: %s\n", bs_errmsg());
        return 1;
    }
    printf("bytescale %s, policy %s: %d sequences (%lld tokens) on %d ranks, C = %lld\n", bs_version(), p->policy,
           (int)p->batch.n, (long long)p->batch.n_tokens, p->n_ranks, (long long)p->capacity);
    printf("items %d: %d packs, %d rings\n", p->n_items, st.n_packs, st.n_rings);
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        if (it->n_ranks < 2) continue;
        printf("ring: sequence %d (%lld tokens) on ranks", p->segs[it->seg_begin].seq, (long long)it->tokens);
        for (int32_t j = 0; j < it->n_ranks; j++) printf(" %d", p->ranks[it->rank_begin + j]);
        printf(", offload %.2f\n", it->offload);
    }
    printf("makespan %.4f s, lower bound %.4f s (ratio %.3f)\n", p->makespan, p->lower_bound,
           p->lower_bound > 0 ? p->makespan / p->lower_bound : 1.0);

    // one simulated step of the plan on the same hardware
    BsSim *s = bs_simulate(p, "llama-7b", "h800-sxm", 2, 0, NULL);
    BsSimInfo si;
    if (!s || bs_sim_info(s, &si, sizeof si) != 0) {
        fprintf(stderr, "plan_example: %s\n", bs_errmsg());
        return 1;
    }
    printf("simulated step %.4f s on %lld GPUs, %.0f tokens/s, MFU %.1f%%\n", si.step_time, (long long)si.n_gpus,
           si.tokens_per_s, 100 * si.mfu);
    bs_sim_free(s);
    bs_plan_free(p);
    bs_cost_free(cm);
    return 0;
}
