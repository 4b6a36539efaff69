// bench/wlb_queue.c: wlb's outlier queue over a run (docs/peers.md, "wlb": "The queue over a run").
//
//   bench_wlb_queue [--scenario NAME] [--steps N] [--seed S] [--csv FILE]
//
// Runs `wlb` for N steps (default 64) over a simulator preset (default 7b-1024-byted-2m): step k
// plans the sequences step k-1 delayed (first, in order) and then seed S + k's sampled batch, and the
// last step flushes, as `bytescale simulate --seeds N` runs it (seeds.h). Every document gets an id
// of its own over the run, and the run fails (exit 1) unless every one is trained exactly once.
//
// Prints, and writes as CSV, one row a step: the documents carried in, the step's own, trained, and
// delayed (the queue after the step, what the next step carries in), the delayed by outlier level
// (1: L/8..L/4, 2: L/4..L/2, 3: over L/2, L = d_cp C) and those not an outlier (short documents the
// packing could not fit: Algorithm 1's "remained"), the micro-batches the step's own tokens give (N,
// the release size), the tokens trained and the simulated step time. scripts/wlb_queue.sh plots it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/scenario.h"

typedef struct {
    int carried, own, trained, delayed, level[4];  // level[0]: delayed but no outlier
    int64_t n_release;                             // N: the step's own tokens' micro-batches
    double tokens, step_s;
} StepRow;

// Outlier level as policy_wlb.c has it: (L/8, L/4] 1, (L/4, L/2] 2, (L/2, L] 3, else 0.
static int level_of(int64_t s, int64_t L) { return s > L / 2 ? 3 : s > L / 4 ? 2 : s > L / 8 ? 1 : 0; }

// One step: plan and simulate carry + the seed's batch (ids renumbered from *next_id), count every
// trained document in trained[id], and leave the delayed ones in carry.
static int run_step(const Scenario *sc, uint64_t seed, int flush, GlobalBatch *carry, int64_t *next_id,
                    int **trained, int64_t *cap, StepRow *row) {
    SimSetup s;
    if (sim_setup_init(&s, sc, seed) != 0) return -1;
    SimSetup t = s;
    batch_init(&t.batch, carry->n + s.batch.n);
    for (int64_t i = 0; i < carry->n; i++) batch_push(&t.batch, carry->seqs[i].id, carry->seqs[i].len, -1);
    for (int64_t i = 0; i < s.batch.n; i++) batch_push(&t.batch, (*next_id)++, s.batch.seqs[i].len, -1);
    t.carried = carry->n, t.flush = flush;
    int64_t own_tokens = 0, L = sc->context / sc->capacity * sc->capacity;
    for (int64_t i = carry->n; i < t.batch.n; i++) own_tokens += t.batch.seqs[i].len;
    int d_dp = s.cluster.n_ranks / (int)(sc->context / sc->capacity);
    SimVariant v;
    SimOutcome o;
    Plan p;
    if (sim_variant_find("wlb", &v) != 0 || sim_setup_run(&t, &v, &o, &p) != 0) return -1;
    if (*next_id > *cap) {
        *trained = realloc(*trained, (size_t)*next_id * 2 * sizeof(int));
        memset(*trained + *cap, 0, (size_t)(*next_id * 2 - *cap) * sizeof(int));
        *cap = *next_id * 2;
    }
    memset(row, 0, sizeof *row);
    row->carried = (int)carry->n, row->own = (int)s.batch.n, row->delayed = p.n_delayed;
    for (int32_t k = 0; k < p.n_items; k++) row->trained += p.items[k].n_segs;
    for (int32_t g = 0; g < p.n_segs; g++) (*trained)[p.batch.seqs[p.segs[g].seq].id]++;
    batch_free(carry);
    batch_init(carry, p.n_delayed + 1);
    for (int32_t d = 0; d < p.n_delayed; d++) {
        const Sequence *q = &p.batch.seqs[p.delayed[d]];
        batch_push(carry, q->id, q->len, -1);
        row->level[level_of(q->len, L)]++;
    }
    int64_t N = (own_tokens + L - 1) / L;
    row->n_release = (N + d_dp - 1) / d_dp * d_dp;
    row->tokens = o.res.tokens, row->step_s = o.res.step_time;
    plan_free(&p);
    sim_outcome_free(&o);
    batch_free(&t.batch);
    sim_setup_free(&s);
    return 0;
}

int main(int argc, char **argv) {
    const char *name = "7b-1024-byted-2m", *csv = NULL;
    int steps = 64;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--scenario") && i + 1 < argc) name = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
        else {
            fprintf(stderr, "usage: bench_wlb_queue [--scenario NAME] [--steps N] [--seed S] [--csv FILE]\n");
            return 2;
        }
    }
    Scenario sc;
    if (steps < 1 || scenario_find(name, &sc) != 0) {
        fprintf(stderr, "bench_wlb_queue: %s\n", steps < 1 ? "--steps must be at least 1" : bs_errmsg());
        return 2;
    }
    FILE *f = csv ? fopen(csv, "w") : NULL;
    if (csv && !f) {
        fprintf(stderr, "bench_wlb_queue: cannot write %s\n", csv);
        return 1;
    }
    const char *head = "step,carried,own,trained,delayed,delayed_l1,delayed_l2,delayed_l3,delayed_short,n_release,tokens,step_s";
    if (f) fprintf(f, "%s\n", head);
    printf("%s: wlb, %d steps from seed %llu (the last flushes)\n", name, steps, (unsigned long long)seed);
    printf("%5s %7s %6s %7s %7s %4s %4s %4s %5s %4s %10s %8s\n", "step", "carried", "own", "trained", "delayed",
           "l1", "l2", "l3", "short", "N", "tokens", "step s");
    GlobalBatch carry;
    batch_init(&carry, 1);
    int64_t next_id = 0, cap = 0;
    int *trained = NULL, max_delayed = 0;
    for (int k = 0; k < steps; k++) {
        StepRow r;
        if (run_step(&sc, seed + (uint64_t)k, k == steps - 1, &carry, &next_id, &trained, &cap, &r) != 0) {
            fprintf(stderr, "bench_wlb_queue: step %d: %s\n", k, bs_errmsg());
            return 1;
        }
        if (r.delayed > max_delayed) max_delayed = r.delayed;
        printf("%5d %7d %6d %7d %7d %4d %4d %4d %5d %4lld %10.0f %8.2f\n", k, r.carried, r.own, r.trained, r.delayed,
               r.level[1], r.level[2], r.level[3], r.level[0], (long long)r.n_release, r.tokens, r.step_s);
        if (f)
            fprintf(f, "%d,%d,%d,%d,%d,%d,%d,%d,%d,%lld,%.0f,%.6f\n", k, r.carried, r.own, r.trained, r.delayed, r.level[1],
                    r.level[2], r.level[3], r.level[0], (long long)r.n_release, r.tokens, r.step_s);
    }
    if (f) fclose(f);
    int64_t bad = 0;
    for (int64_t id = 0; id < next_id; id++) bad += trained[id] != 1;
    printf("%lld documents, %lld not trained exactly once; the queue held at most %d\n", (long long)next_id,
           (long long)bad, max_delayed);
    free(trained);
    batch_free(&carry);
    return bad ? 1 : 0;
}
