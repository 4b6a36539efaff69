// mpi_train.c: the distributed trainer equals the one-process trainer. For random global batches,
// every policy (elastic with batches too small for the ranks too, so that it widens rings past
// ceil(s/C)) and capacities that make rings of every size beside packs, on N ranks:
//   - the loss and every gradient (each rank's ZeRO-1 shard) equal a one-process run of the same
//     batch with every sequence in one pack (relative error <= 1e-5);
//   - the parameters after 3 optimizer steps match the one-process run's;
//   - a run checkpointed and resumed on the same N reproduces the uninterrupted run bit for bit,
//     and the same checkpoint resumed on one process continues it (loss within fp32 rounding).
// ranks: 1 2 3 4 5 8
// sanitizer ranks: 1 3 8
#include "mpi_train_util.h"

#include "bytescale/fileio.h"
#include "bytescale/policy.h"
#include "bytescale/prepare.h"
#include "bytescale/rng.h"
#include "bytescale/sampler.h"
#include "bytescale/train.h"
#include "runtime/train_internal.h"

static int n_checks;
static int n_wide;  // rings wider than ceil(s/C) the checks ran (elastic's)

// Rings wider than ceil(s/C) in the plan trainer t makes of batch b: members holding fewer than C
// tokens each, what elastic adds to what the runtime runs.
static int wide_rings(const Trainer *t, const GlobalBatch *b) {
    PlanConfig pc = {.n_ranks = t->n_ranks, .capacity = t->capacity, .context = t->cfg.context, .pp = 1,
                     .offload = train_plans_offload(&t->cfg)};
    Plan p;
    CHECK_OK(policy_plan(&p, t->cfg.policy, b, &pc, &t->cost));
    int n = 0;
    for (int32_t k = 0; k < p.n_items; k++) {
        const Item *it = &p.items[k];
        n += it->n_ranks > 1 && it->n_ranks > (it->tokens + p.capacity - 1) / p.capacity;
    }
    plan_free(&p);
    return n;
}

// The one-process reference runs on rank 0 alone and its results go to every rank: with the job's N
// processes on fewer cores, N copies of the same run cost N times its time for the same numbers.
static int ref_rank0(Trainer *ref, const TrainConfig *cr) {
    int lead = mpi_comm->rank == 0;
    if (lead) CHECK_OK(trainer_init_comm(ref, cr, comm_local()));
    return lead;
}

// Rank 0's n floats of x (NULL elsewhere) and its m doubles of d, on every rank (malloc'd floats).
static float *from_rank0(const float *x, size_t n, double *d, int m) {
    float *all = malloc((n ? n : 1) * sizeof(float));
    CHECK(all != NULL, "out of memory");
    if (mpi_comm->rank == 0) memcpy(all, x, n * sizeof(float));
    CHECK_OK(comm_bcast(mpi_comm, all, n * sizeof(float), 0));
    CHECK_OK(comm_bcast(mpi_comm, d, (size_t)m * sizeof(double), 0));
    return all;
}

// One batch: the N-rank gradient shard and loss against one process with everything packed.
static void check_gradient(const char *data, const char *policy, int64_t tokens, int64_t context, int64_t C,
                           uint64_t seed) {
    Trainer *a = malloc(sizeof *a), *ref = malloc(sizeof *ref);
    TrainConfig ca = mpi_train_config(data, policy, tokens, context, C);
    TrainConfig cr = mpi_train_config(data, "balance", tokens, context, context);
    ca.seed = cr.seed = seed;
    CHECK_OK(trainer_init_comm(a, &ca, mpi_comm));
    int lead = ref_rank0(ref, &cr);
    // the same random batch on every rank: a sampler of its own, seeded
    Sampler s;
    GlobalBatch b;
    CHECK_OK(sampler_init(&s, &a->data.index, seed * 7 + 1));
    CHECK_OK(batch_init(&b, 16));
    CHECK_OK(sampler_next(&s, tokens, context, &b));
    StepStats sa, sr;
    CHECK_OK(trainer_grad(a, &b, &sa));
    if (lead) CHECK_OK(trainer_grad(ref, &b, &sr));
    float *ref_grads = from_rank0(lead ? ref->llama.grads : NULL, a->llama.n_params, &sr.loss, 1);
    size_t n = a->zero.end - a->zero.begin;
    double err = rel_error_all(a->zero.grad, ref_grads + a->zero.begin, n);
    double lerr = fabs(sa.loss - sr.loss) / fabs(sr.loss);
    free(ref_grads);
    int32_t rings = sa.n_rings, items = sa.n_items, wide = wide_rings(a, &b);
    if (!strcmp(policy, "elastic")) n_wide += wide;
    CHECK(err <= 1e-5 && lerr <= 1e-5,
          "%s, C %lld, context %lld, seed %llu (%d items, %d rings): gradient error %.3g, loss %.9g vs %.9g", policy,
          (long long)C, (long long)context, (unsigned long long)seed, items, rings, err, sa.loss, sr.loss);
    if (mpi_comm->rank == 0)
        printf("  %-8s C %4lld context %5lld: %3d items, %2d rings (%d wider than ceil(s/C)), longest %5lld: gradient "
               "error %.2e, loss error %.2e\n",
               policy, (long long)C, (long long)context, items, rings, wide, (long long)sa.longest, err, lerr);
    n_checks++;
    sampler_free(&s);
    batch_free(&b);
    trainer_free(a);
    if (lead) trainer_free(ref);
    free(a);
    free(ref);
}

// Three optimizer steps: the parameters on every rank match the one-process run's.
static void check_steps(const char *data, const char *policy, int64_t context, int64_t C) {
    Trainer *a = malloc(sizeof *a), *ref = malloc(sizeof *ref);
    TrainConfig ca = mpi_train_config(data, policy, 1024, context, C);
    TrainConfig cr = mpi_train_config(data, "balance", 1024, context, context);
    ca.steps = cr.steps = 3;
    CHECK_OK(trainer_init_comm(a, &ca, mpi_comm));
    int lead = ref_rank0(ref, &cr);
    double ref_loss[3];
    for (int i = 0; lead && i < 3; i++) {
        StepStats sr;
        CHECK_OK(trainer_step(ref, &sr));
        ref_loss[i] = sr.loss;
    }
    size_t np = a->llama.n_params;
    float *ref_params = from_rank0(lead ? ref->llama.params : NULL, np, ref_loss, 3);
    for (int i = 0; i < 3; i++) {
        StepStats sa;
        CHECK_OK(trainer_step(a, &sa));
        CHECK(fabs(sa.loss - ref_loss[i]) <= 1e-5 * fabs(ref_loss[i]), "%s step %d: loss %.9g vs %.9g", policy, i + 1,
              sa.loss, ref_loss[i]);
    }
    double d = 0, p = 0;
    for (size_t i = 0; i < np; i++) {
        double x = (double)a->llama.params[i] - ref_params[i];
        d += x * x;
        p += (double)ref_params[i] * ref_params[i];
    }
    free(ref_params);
    CHECK(sqrt(d / p) <= 1e-5, "%s: parameters after 3 steps differ by %.3g (relative)", policy, sqrt(d / p));
    if (mpi_comm->rank == 0) printf("  %-8s 3 steps: parameters relative error %.2e\n", policy, sqrt(d / p));
    n_checks++;
    trainer_free(a);
    if (lead) trainer_free(ref);
    free(a);
    free(ref);
}

// Checkpoint after 2 of 4 steps; resume on the same ranks (bit for bit) and on one process.
static void check_resume(const char *dir, const char *data, int64_t context, int64_t C) {
    char ckpt[700];
    snprintf(ckpt, sizeof ckpt, "%s/mid.bin", dir);
    Trainer *t = malloc(sizeof *t);
    TrainConfig c = mpi_train_config(data, "balance", 1024, context, C);
    double loss[4];
    float *params = malloc(sizeof(float) * 1);
    // the uninterrupted run
    CHECK_OK(trainer_init_comm(t, &c, mpi_comm));
    for (int i = 0; i < 4; i++) {
        StepStats st;
        CHECK_OK(trainer_step(t, &st));
        loss[i] = st.loss;
        if (i == 1) CHECK_OK(trainer_save(t, ckpt));
    }
    size_t np = t->llama.n_params;
    params = realloc(params, np * sizeof(float));
    memcpy(params, t->llama.params, np * sizeof(float));
    trainer_free(t);
    // resumed on the same ranks
    CHECK_OK(trainer_init_comm(t, &c, mpi_comm));
    CHECK_OK(trainer_load(t, ckpt));
    for (int i = 2; i < 4; i++) {
        StepStats st;
        CHECK_OK(trainer_step(t, &st));
        CHECK(st.loss == loss[i], "resumed step %d: loss %.17g, uninterrupted %.17g", i + 1, st.loss, loss[i]);
    }
    CHECK(memcmp(params, t->llama.params, np * sizeof(float)) == 0, "resumed parameters differ from the "
                                                                   "uninterrupted run's");
    trainer_free(t);
    // resumed on one process: rank 0's (every rank's would be the same run of the same file)
    if (mpi_comm->rank == 0) {
        CHECK_OK(trainer_init_comm(t, &c, comm_local()));
        CHECK_OK(trainer_load(t, ckpt));
        for (int i = 2; i < 4; i++) {
            StepStats st;
            CHECK_OK(trainer_step(t, &st));
            CHECK(fabs(st.loss - loss[i]) <= 1e-5 * fabs(loss[i]), "resumed on 1 process, step %d: loss %.9g vs %.9g",
                  i + 1, st.loss, loss[i]);
        }
        trainer_free(t);
        printf("  resume: bit-exact on %d ranks, within 1e-5 on 1 process\n", mpi_comm->size);
    }
    n_checks += 2;
    free(t);
    free(params);
}

int main(int argc, char **argv) {
    mpi_test_init(&argc, &argv);
    int N = mpi_comm->size;
    const char *dir = mpi_tmpdir("mpi_train");
    char data[600];
    mpi_make_dataset(dir, 40, 10, 900, 3, data, sizeof data);

    // elastic: rings wider than ceil(s/C), whose members hold fewer than C tokens each
    static const char *policies[] = {"static", "naive", "balance", "elastic"};
    enum { N_POL = sizeof policies / sizeof policies[0] };
    Rng rng;
    rng_seed(&rng, 99);
    static const int64_t caps[] = {64, 96, 128, 200};
    for (int trial = 0; trial < 8; trial++) {
        int64_t C = caps[rng_below(&rng, 4)];
        // the longest sequence needs up to N ranks: rings of every size up to N
        int64_t context = C * (1 + (int64_t)rng_below(&rng, (uint64_t)N));
        if (trial == 0) context = C * N;
        for (int p = 0; p < N_POL; p++) check_gradient(data, policies[p], 1024 + 256 * trial, context, C, 100 + trial);
    }
    for (int p = 0; p < N_POL; p++) check_steps(data, policies[p], 96 * N, 96);
    // half a micro-batch of work per rank: elastic runs the sequences of C tokens as rings of 2 ranks or
    // more (a ring wider than ceil(s/C) = 1), and the runtime must run them as such
    for (int trial = 0; N > 1 && trial < 3; trial++) check_gradient(data, "elastic", 64 * N, 128, 128, 300 + trial);
    CHECK(N == 1 || n_wide > 0, "elastic widened no ring on %d ranks", N);
    check_resume(dir, data, 128, 128);
    return mpi_test_done("distributed training", n_checks);
}
