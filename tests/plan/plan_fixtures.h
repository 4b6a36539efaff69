// plan_fixtures.h: what the plan tests share: a cost model simple enough to work out by hand, and a
// batch of given lengths.
#ifndef BYTESCALE_TEST_PLAN_FIXTURES_H
#define BYTESCALE_TEST_PLAN_FIXTURES_H

#include "test_util.h"

#include "bytescale/batch.h"
#include "bytescale/cost.h"

// No attention term, no ring traffic time (bandwidth 0 = not modelled, latency 0), so an item of T
// tokens on D ranks takes n_layers * (lin_token * T / D + layer_const) = 2 (1e-3 T / D + 0.01)
// seconds: forward a third of that, backward two thirds. Two layers, so Eq. 3 cannot offload (two
// layers always stay resident): a sequence of s > C tokens needs exactly ceil(s / C) ranks.
static inline CostModel hand_model(void) {
    CostModel cm;
    memset(&cm, 0, sizeof cm);
    cm.lin_token = 1e-3;
    cm.layer_const = 0.01;
    cm.n_layers = 2;
    cm.act_token = 1;
    cm.kv_token = 10;
    cm.offload_bw = 1;
    return cm;
}

// A batch of sequences 0 .. n-1 with the given lengths (no source offsets).
static inline GlobalBatch make_batch(const int64_t *lens, int n) {
    GlobalBatch b;
    assert_int_equal(batch_init(&b, n), 0);
    for (int i = 0; i < n; i++) assert_int_equal(batch_push(&b, i, lens[i], -1), 0);
    return b;
}

#endif
