// policy_elastic.h: the piece of elastic (policy_elastic.c) its tests look at (internal to src/plan).
#ifndef BYTESCALE_POLICY_ELASTIC_H
#define BYTESCALE_POLICY_ELASTIC_H

#include "bytescale/policy.h"

#define ELASTIC_GRID_MAX 256  // targets tried at most: the grid from the slowest sequence's time down

// How the search for the target may be run: as policy_elastic runs it (0), or without its short cuts,
// the way it ran before them, to show that they change nothing.
enum {
    ELASTIC_FULL_SEARCH = 1,      // every target of the grid predicted, even where the work sets the step
    ELASTIC_RING_AT_A_TIME = 2,   // predict places every ring by itself, alike short rings too
};

// What the search found (pp = 1).
typedef struct {
    double T;           // the target; 0: none, the plan is balance's
    double base;        // the predicted step with nothing widened (balance's)
    int work_sets_step; // 1: the bound said no target can pay, and the grid was not searched
    int n;              // targets predicted (0 when the grid was not searched)
    double grid[ELASTIC_GRID_MAX], pred[ELASTIC_GRID_MAX];  // those targets and their predicted steps
} ElasticSearch;

// elastic's search for the target of batch b (cfg->pp must be 1), run as flags say. -1 + error.
int elastic_search(ElasticSearch *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm, int flags);

#endif
