// policy_flexsp.h: the pieces of flexsp (policy_flexsp.c) its tests look at (internal to src/plan).
#ifndef BYTESCALE_POLICY_FLEXSP_H
#define BYTESCALE_POLICY_FLEXSP_H

#include <stdint.h>

#include "bytescale/policy.h"

enum { FLEXSP_MAX_SIZES = 31, FLEXSP_MAX_BUCKETS = 16 };

// What solving one wave's program found (docs/peers.md, "flexsp").
typedef struct {
    double T;            // the least largest group time found feasible (seconds, the program's estimate)
    double T_lo;         // the largest time found infeasible, or the lower bound it started from
    double ranks_used;   // the program's objective at T (ranks in groups), <= n_ranks
    double ranks_bound;  // GLPK's best bound on that objective
    double gap;          // GLPK's relative gap at the end of that program (0: proven optimal)
    int n_milps;         // programs solved in the bisection
    int timed_out;       // a program stopped at its time limit (its best solution stands)
    int n_sizes;         // group sizes 1, 2, 4, ... 2^(n_sizes - 1)
    int32_t groups[FLEXSP_MAX_SIZES];  // groups of size 2^k
    int n_buckets;
    int32_t y[FLEXSP_MAX_BUCKETS][FLEXSP_MAX_SIZES];  // sequences of bucket b in groups of size 2^k
} FlexspSolve;

// Solve the program for one wave of n sequences (lengths lens, any order) on R ranks of capacity C.
// 1 with *out filled, 0 when no set of groups holds them, -1 + error (memory, the solver).
int flexsp_solve(const CostModel *cm, const int64_t *lens, int32_t n, int32_t R, int64_t C, FlexspSolve *out);

// The simple greedy flexsp is never worse than: the same waves, every group of one size (the next
// power of two of the longest sequence's ceil(s / C)), sequences longest first to the least-loaded
// group with room (homogeneous Ulysses SP).
int policy_flexsp_greedy(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);

// flexsp without its exact search of small waves and without the greedy guard: every wave by the
// program and its placement (what the tests compare with the exhaustive optimum).
int policy_flexsp_program(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm);

#endif
