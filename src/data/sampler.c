// sampler.c: seeded epoch permutations of the documents, cut into fixed-size global batches.
#include "bytescale/sampler.h"

#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/rng.h"

int sampler_init(Sampler *s, const DocIndex *ix, uint64_t seed) {
    memset(s, 0, sizeof *s);
    if (ix->n_docs <= 0 || ix->n_tokens <= 0)
        return bs_fail("sampler: the dataset in %s holds no tokens (%lld documents)", ix->dir, (long long)ix->n_docs);
    // sampler_next walks the documents until it has its budget: with every document empty (the
    // shards may still hold tokens no document names) it would walk forever
    int64_t any = 0;
    for (int64_t d = 0; d < ix->n_docs && !any; d++) any = ix->docs[d].len > 0;
    if (!any)
        return bs_fail("sampler: all %lld documents of the dataset in %s are empty (0 tokens)", (long long)ix->n_docs,
                       ix->dir);
    s->perm = bs_malloc((size_t)ix->n_docs * sizeof *s->perm);
    if (!s->perm) return -1;
    s->index = ix;
    s->st = (SamplerState){.seed = seed, .n_docs = ix->n_docs};
    s->perm_epoch = -1;
    return 0;
}

void sampler_free(Sampler *s) {
    free(s->perm);
    memset(s, 0, sizeof *s);
}

// Fisher-Yates with a generator seeded from (seed, epoch) alone.
static void make_perm(Sampler *s) {
    int64_t n = s->index->n_docs;
    Rng rng;
    rng_seed(&rng, s->st.seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(s->st.epoch + 1)));
    for (int64_t i = 0; i < n; i++) s->perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)rng_below(&rng, (uint64_t)i + 1);
        int64_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    s->perm_epoch = s->st.epoch;
}

int sampler_next(Sampler *s, int64_t token_budget, int64_t max_ctx, GlobalBatch *out) {
    if (token_budget <= 0) return bs_fail("sampler: token budget must be positive (got %lld)", (long long)token_budget);
    out->n = 0;
    out->n_tokens = 0;
    SamplerState *st = &s->st;
    const DocEntry *docs = s->index->docs;
    int64_t need = token_budget;
    while (need > 0) {
        if (st->pos == s->index->n_docs) {
            st->epoch++;
            st->pos = 0;
            st->taken = 0;
        }
        if (s->perm_epoch != st->epoch) make_perm(s);
        int64_t d = s->perm[st->pos];
        int64_t left = docs[d].len - st->taken;
        int64_t take = left < need ? left : need;
        if (take > 0 && batch_push(out, d, take, docs[d].start + st->taken) != 0) return -1;
        need -= take;
        st->taken += take;
        if (st->taken == docs[d].len) {  // done with this document (or it was empty)
            st->pos++;
            st->taken = 0;
        }
    }
    if (max_ctx > 0 && batch_cut(out, max_ctx) != 0) return -1;
    return 0;
}

SamplerState sampler_state(const Sampler *s) { return s->st; }

int sampler_restore(Sampler *s, const SamplerState *st) {
    const DocIndex *ix = s->index;
    if (st->n_docs != ix->n_docs)
        return bs_fail("sampler: saved position is for %lld documents, the dataset in %s has %lld", (long long)st->n_docs,
                       ix->dir, (long long)ix->n_docs);
    if (st->epoch < 0 || st->pos < 0 || st->pos > ix->n_docs || st->taken < 0)
        return bs_fail("sampler: invalid saved position (epoch %lld, pos %lld, taken %lld)", (long long)st->epoch,
                       (long long)st->pos, (long long)st->taken);
    SamplerState old = s->st;
    s->st = *st;
    if (s->perm_epoch != st->epoch) make_perm(s);
    // the split document must still have tokens left
    if (st->taken > 0 && (st->pos == ix->n_docs || st->taken >= ix->docs[s->perm[st->pos]].len)) {
        s->st = old;
        s->perm_epoch = -1;
        return bs_fail("sampler: invalid saved position: %lld tokens taken of the document at position %lld",
                       (long long)st->taken, (long long)st->pos);
    }
    return 0;
}
