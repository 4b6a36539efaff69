// mpi_parallel.c: 3D training (tensor parallelism x pipeline stages x HDP) equals one process.
// For every layout (tp, pp, hdp) whose product is the job's size:
//   - the loss and every gradient tensor of the whole model (each process's ZeRO-1 shard of its
//     part, put together in the one full layout) equal a one-process run of the same batch with
//     every sequence in one pack, relative error <= 1e-5 per tensor, for static, balance and
//     elastic plans, with rings (context above the capacity) wherever hdp >= 2;
//   - the whole model's parameters after 3 optimizer steps equal the one-process run's;
//   - tp > 1: the backward's all-reduces overlapped and blocking give the same bits (2 steps);
// and checkpoints do not depend on the layout:
//   - np 8: 4 steps on (2, 2, 2) with a checkpoint after 2, resumed on one process: the last two
//     losses within 1e-5 of the uninterrupted run's;
//   - np 4: a one-process run's checkpoint resumed on (1, 2, 2): the same.
// ranks: 2 4 8
#include "mpi_train_util.h"

#include "bytescale/parallel.h"
#include "bytescale/rng.h"
#include "bytescale/sampler.h"

static int n_checks;

static const char *layout_name(int tp, int pp, int hdp) {
    static char buf[64];
    snprintf(buf, sizeof buf, "(tp %d, pp %d, hdp %d)", tp, pp, hdp);
    return buf;
}

// One batch on layout (tp, pp): loss and every gradient tensor against one process.
static void check_gradient(const char *data, const char *model, const char *policy, int tp, int pp, int64_t tokens,
                           int64_t context, int64_t C, uint64_t seed) {
    Trainer *a = malloc(sizeof *a), *ref = malloc(sizeof *ref);
    TrainConfig ca = mpi_config_3d(data, model, policy, tokens, context, C, tp, pp);
    TrainConfig cr = mpi_config_3d(data, model, "balance", tokens, context, context, 1, 1);
    ca.seed = cr.seed = seed;
    CHECK_OK(trainer_init_comm(a, &ca, mpi_comm));
    int lead = a->rank == 0;
    if (lead) CHECK_OK(trainer_init_comm(ref, &cr, comm_local()));
    Sampler s;
    GlobalBatch b;
    CHECK_OK(sampler_init(&s, &a->data.index, seed * 7 + 1));
    CHECK_OK(batch_init(&b, 16));
    CHECK_OK(sampler_next(&s, tokens, context, &b));
    StepStats sa, sr;
    CHECK_OK(trainer_grad(a, &b, &sa));
    float *g = gather_shards(a, a->zero.grad);
    if (lead) {
        CHECK_OK(trainer_grad(ref, &b, &sr));
        const char *worst;
        double err = max_tensor_error(&ref->llama, g, ref->llama.grads, &worst);
        double lerr = fabs(sa.loss - sr.loss) / fabs(sr.loss);
        CHECK(err <= 1e-5 && lerr <= 1e-5, "%s %s, C %lld, context %lld (%d items, %d rings): gradient of %s off by %.3g, "
              "loss %.9g vs %.9g", layout_name(tp, pp, a->hdp), policy, (long long)C, (long long)context, sa.n_items,
              sa.n_rings, worst, err, sa.loss, sr.loss);
        printf("  %-22s %-8s %-5s C %4lld context %5lld: %3d items, %2d rings: worst gradient tensor %.2e (%s), loss "
               "%.2e\n",
               layout_name(tp, pp, a->hdp), policy, model, (long long)C, (long long)context, sa.n_items, sa.n_rings, err,
               worst, lerr);
        trainer_free(ref);
    }
    n_checks++;
    free(g);
    sampler_free(&s);
    batch_free(&b);
    trainer_free(a);
    free(a);
    free(ref);
}

// Three optimizer steps: the whole model's parameters match the one-process run's.
static void check_steps(const char *data, const char *model, const char *policy, int tp, int pp, int64_t context,
                        int64_t C) {
    Trainer *a = malloc(sizeof *a), *ref = malloc(sizeof *ref);
    TrainConfig ca = mpi_config_3d(data, model, policy, 768, context, C, tp, pp);
    TrainConfig cr = mpi_config_3d(data, model, "balance", 768, context, context, 1, 1);
    ca.steps = cr.steps = 3;
    CHECK_OK(trainer_init_comm(a, &ca, mpi_comm));
    int lead = a->rank == 0;
    if (lead) CHECK_OK(trainer_init_comm(ref, &cr, comm_local()));
    for (int i = 0; i < 3; i++) {
        StepStats sa, sr;
        CHECK_OK(trainer_step(a, &sa));
        if (!lead) continue;
        CHECK_OK(trainer_step(ref, &sr));
        CHECK(fabs(sa.loss - sr.loss) <= 1e-5 * fabs(sr.loss), "%s %s step %d: loss %.9g vs %.9g",
              layout_name(tp, pp, a->hdp), policy, i + 1, sa.loss, sr.loss);
    }
    float *p = gather_shards(a, a->llama.params + a->zero.begin);
    if (lead) {
        const char *worst;
        double err = max_tensor_error(&ref->llama, p, ref->llama.params, &worst);
        // 5e-5, not the gradients' 1e-5: AdamW divides by sqrt(v), which magnifies the fp32 rounding of
        // a gradient component near zero into its parameter (1.2e-5 seen on one CPU's OpenBLAS kernels
        // for (tp 2, pp 2, hdp 2) balance, whose gradients agree within 6.5e-7)
        CHECK(err <= 5e-5, "%s %s: parameters after 3 steps: %s off by %.3g", layout_name(tp, pp, a->hdp), policy,
              worst, err);
        printf("  %-22s %-8s 3 steps: worst parameter tensor %.2e (%s)\n", layout_name(tp, pp, a->hdp), policy, err,
               worst);
        trainer_free(ref);
    }
    n_checks++;
    free(p);
    trainer_free(a);
    free(a);
    free(ref);
}

// tp > 1: the backward's all-reduces overlapped with the weight gradients (the default) and blocking
// (tp_blocking) give the same losses and parameters, bit for bit, over 2 steps; every rank's exposed
// all-reduce time is at most the total, and the two are one figure when blocking.
static void check_overlap(const char *data, const char *model, int tp, int pp, int64_t context, int64_t C) {
    Trainer *t[2];
    for (int k = 0; k < 2; k++) {
        TrainConfig c = mpi_config_3d(data, model, "balance", 768, context, C, tp, pp);
        c.steps = 2;
        c.tp_blocking = k;
        t[k] = malloc(sizeof *t[k]);
        CHECK(t[k], "out of memory");
        CHECK_OK(trainer_init_comm(t[k], &c, mpi_comm));
    }
    double total = 0;
    for (int i = 0; i < 2; i++) {
        StepStats st[2];
        for (int k = 0; k < 2; k++) {
            CHECK_OK(trainer_step(t[k], &st[k]));
            for (int r = 0; r < st[k].n_ranks; r++) {
                const RankTimes *x = &st[k].ranks[r];
                CHECK(x->tp_seconds <= x->tp_total_seconds * (1 + 1e-12) && (k == 0 || x->tp_seconds == x->tp_total_seconds),
                      "%s %s step %d rank %d: exposed tp all-reduce %.9g s, total %.9g s", layout_name(tp, pp, t[k]->hdp),
                      k ? "blocking" : "overlapped", i + 1, r, x->tp_seconds, x->tp_total_seconds);
                if (k == 0) total += x->tp_total_seconds;
            }
        }
        CHECK(memcmp(&st[0].loss, &st[1].loss, sizeof st[0].loss) == 0, "%s step %d: loss %.17g overlapped, %.17g blocking",
              layout_name(tp, pp, t[0]->hdp), i + 1, st[0].loss, st[1].loss);
    }
    CHECK(total > 0, "%s: the overlapped run timed no tp all-reduce", layout_name(tp, pp, t[0]->hdp));
    size_t n = t[0]->llama.n_params;
    CHECK(memcmp(t[0]->llama.params, t[1]->llama.params, n * sizeof(float)) == 0,
          "%s: parameters after 2 steps differ between the overlapped and the blocking tp all-reduces",
          layout_name(tp, pp, t[0]->hdp));
    if (mpi_comm->rank == 0)
        printf("  %-22s overlapped tp all-reduces = blocking, bit for bit, 2 steps\n", layout_name(tp, pp, t[0]->hdp));
    n_checks++;
    for (int k = 0; k < 2; k++) trainer_free(t[k]), free(t[k]);
}

// A checkpoint written on layout `from` resumed on layout `to` (a layout of 1 x 1 x 1 runs on rank 0
// alone): its last two steps' losses against the uninterrupted run's.
static void check_resume(const char *dir, const char *data, const int from[2], const int to[2], int64_t context,
                         int64_t C) {
    char ckpt[700];
    snprintf(ckpt, sizeof ckpt, "%s/mid-%d%d-%d%d.bin", dir, from[0], from[1], to[0], to[1]);
    double loss[4];
    int lead = mpi_comm->rank == 0;
    Trainer *t = malloc(sizeof *t);
    // the uninterrupted run, checkpointed after step 2
    int from_one = from[0] * from[1] == 1 && mpi_comm->size > 1, to_one = to[0] * to[1] == 1 && mpi_comm->size > 1;
    TrainConfig c = mpi_config_3d(data, "tiny", "balance", 1024, context, C, from[0], from[1]);
    if (!from_one || lead) {
        CHECK_OK(trainer_init_comm(t, &c, from_one ? comm_local() : mpi_comm));
        for (int i = 0; i < 4; i++) {
            StepStats st;
            CHECK_OK(trainer_step(t, &st));
            loss[i] = st.loss;
            if (i == 1) CHECK_OK(trainer_save(t, ckpt));
        }
        trainer_free(t);
    }
    CHECK_OK(comm_bcast(mpi_comm, loss, sizeof loss, 0));
    // resumed on the other layout
    c.tp = to[0], c.pp = to[1];
    if (!to_one || lead) {
        CHECK_OK(trainer_init_comm(t, &c, to_one ? comm_local() : mpi_comm));
        CHECK_OK(trainer_load(t, ckpt));
        for (int i = 2; i < 4; i++) {
            StepStats st;
            CHECK_OK(trainer_step(t, &st));
            CHECK(fabs(st.loss - loss[i]) <= 1e-5 * fabs(loss[i]),
                  "checkpoint of tp %d pp %d resumed on tp %d pp %d, step %d: loss %.9g, uninterrupted %.9g", from[0],
                  from[1], to[0], to[1], i + 1, st.loss, loss[i]);
        }
        if (lead)
            printf("  resume: tp %d pp %d (%s) -> tp %d pp %d (%s): steps 3-4 within 1e-5 of the uninterrupted run\n",
                   from[0], from[1], from_one ? "1 process" : "the job", to[0], to[1], to_one ? "1 process" : "the job");
        trainer_free(t);
    }
    CHECK_OK(comm_barrier(mpi_comm));
    n_checks++;
    free(t);
}

int main(int argc, char **argv) {
    mpi_test_init(&argc, &argv);
    int N = mpi_comm->size;
    const char *dir = mpi_tmpdir("mpi_parallel");
    char data[600];
    mpi_make_dataset(dir, 40, 10, 900, 3, data, sizeof data);
    // the layouts of the issue, by job size: {tp, pp}
    static const int layouts2[][2] = {{2, 1}, {1, 2}};
    static const int layouts4[][2] = {{2, 1}, {1, 2}, {1, 4}, {2, 2}};
    static const int layouts8[][2] = {{1, 2}, {2, 2}};
    const int(*layouts)[2] = N == 2 ? layouts2 : N == 4 ? layouts4 : layouts8;
    int n_layouts = N == 2 ? 2 : N == 4 ? 4 : 2;
    CHECK(N == 2 || N == 4 || N == 8, "run with 2, 4 or 8 ranks (got %d)", N);
    static const char *policies[] = {"static", "balance", "elastic"};
    for (int l = 0; l < n_layouts; l++) {
        int tp = layouts[l][0], pp = layouts[l][1], hdp = N / (tp * pp);
        // 4 stages need 4 layers: the `small` model; tiny (2 layers) elsewhere
        const char *model = pp > 2 ? "small" : "tiny";
        int64_t C = 96;
        // rings of up to hdp ranks where there are 2 or more, packs only on one HDP rank
        int64_t context = hdp > 1 ? C * hdp : C;
        for (int p = 0; p < 3; p++) check_gradient(data, model, policies[p], tp, pp, 768, context, C, 100 + l);
        // half a micro-batch per HDP rank: elastic widens sequences of C tokens into rings
        if (hdp > 1) check_gradient(data, model, "elastic", tp, pp, 64 * hdp, 128, 128, 300 + l);
        check_steps(data, model, "balance", tp, pp, context, C);
        if (tp > 1) check_overlap(data, model, tp, pp, context, C);
    }
    // packs only (context = capacity): one process takes part too
    if (N == 8) check_resume(dir, data, (const int[2]){2, 2}, (const int[2]){1, 1}, 96, 96);
    if (N == 4) check_resume(dir, data, (const int[2]){1, 1}, (const int[2]){1, 2}, 96, 96);
    return mpi_test_done("3D training", n_checks);
}
