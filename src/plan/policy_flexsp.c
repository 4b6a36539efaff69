// policy_flexsp.c: FlexSP's heterogeneous sequence-parallel groups (docs/peers.md, "flexsp": the
// paper's sections it follows and every choice we made).
//
// FlexSP runs Ulysses (all-to-all) sequence parallelism on groups of power-of-two sizes that change
// with every batch: long sequences get large groups, short ones small groups (size 1: no traffic).
//   1. The sequence blaster: the batch is cut into waves (FlexSP's micro-batches) of about equal
//      tokens, as few as the ranks' capacity allows (R x C tokens per wave, with 10% room); longest
//      first, each sequence to the wave with the fewest tokens.
//   2. For each wave, the program: how many groups of each size 2^k (n_k) and how many sequences of
//      each length bucket go to that size (y_bk), to minimise the largest group time T, subject to
//      every group's token capacity (a size-2^k group holds at most 2^k C tokens) and the ranks
//      (sum 2^k n_k <= R). Sequences are bucketed by length (ratio sqrt 2, at most 16 buckets), as
//      the paper does to keep the program small. Groups of one size are interchangeable, so their
//      time is written as their class's work over n_k (a group's constant c_k on top): with T
//      fixed this is linear, and T is found by bisection, each step a MILP (GLPK) that minimises
//      the ranks used: T is feasible when they fit. Every program has a time limit; the best
//      solution found stands.
//   3. The groups are laid out largest first from rank 0 (aligned power-of-two blocks); each
//      bucket's longest sequences go to the largest sizes the program gave it, and within a size,
//      longest first to the least-loaded group with room. A group runs its sequences as one packed
//      all-to-all item (Item.a2a; a pack on one rank).
//   4. A wave of at most FLEXSP_EXACT_MAX sequences skips the program: every partition of it into
//      groups is searched (wave_exact), which is the exact optimum the counted program can miss.
// A simple greedy (every group of one size, policy_flexsp_greedy) is planned too, and flexsp keeps
// whichever plan has the smaller makespan, so it is never worse than homogeneous Ulysses SP.
// Head limit: a Ulysses group splits the attention heads of a TP shard, so it has at most
// cm->a2a_heads members (LLaMA-7B at TP 2: 16; LLaMA-70B at TP 8: 8). Groups of more ranks, which
// the longest sequences need when a2a_heads x C tokens do not hold them, run as rings (ring
// attention, Item.a2a = 0) of the same power-of-two size: the program prices every size by what it
// would run (all-to-all up to the limit, ring beyond), so it may also pick such a ring for a shorter
// sequence where that is faster.
#include "plan/policy_flexsp.h"

#include <glpk.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "plan/policy_util.h"

#define FLEXSP_WAVE_FILL 0.9      // a wave holds at most this share of R x C tokens
// the shares of a group's token capacity the program may fill, tried in turn: the program counts a
// bucket's tokens by its mean length, so the placement of the real lengths may not fit at 1.0
static const double FLEXSP_CAP_FILLS[] = {1.0, 0.95, 0.9, 0.8, 0.7};
#define FLEXSP_MILP_MS 200        // time limit of one program, milliseconds
#define FLEXSP_MIP_GAP 1e-4       // GLPK's relative gap tolerance
#define FLEXSP_BISECT_TOL 1e-2    // stop when T_lo and T are this close (relative)
#define FLEXSP_BISECT_MAX 30
#define FLEXSP_EXACT_MAX 8        // a wave of at most this many sequences is solved exactly (wave_exact)

static int64_t next_pow2(int64_t x) {
    int64_t p = 1;
    while (p < x) p *= 2;
    return p;
}

// Ulysses scatters the attention heads of a TP shard over the group: a group of d ranks runs as an
// all-to-all group while d <= cm->a2a_heads (cost_a2a_max; any d when the head count is not known),
// and beyond that as a ring (context parallelism), the fallback docs/peers.md describes.
static int is_a2a(const CostModel *cm, int64_t d) { return d > 1 && d <= cost_a2a_max(cm, INT32_MAX); }

// One sequence of s tokens on a group of d ranks.
static double a2a_time(const CostModel *cm, int64_t s, int64_t d) {
    return is_a2a(cm, d) || d <= 1 ? cost_a2a_item_time(cm, &s, 1, (int)d, 0.0) : cost_item_time(cm, &s, 1, (int)d, 0.0);
}

// What one group of size d costs whatever it holds: the time of a group holding one token.
static double group_const(const CostModel *cm, int64_t d) { return a2a_time(cm, 1, d); }

// ---- the program ------------------------------------------------------------------------------------

typedef struct {
    int n_sizes, n_buckets;
    int64_t C;
    double fill;  // the share of a group's capacity the program may fill (FLEXSP_CAP_FILLS)
    int32_t R;
    int32_t cnt[FLEXSP_MAX_BUCKETS];
    double tok[FLEXSP_MAX_BUCKETS];                        // mean tokens of a sequence of the bucket
    int64_t longest[FLEXSP_MAX_BUCKETS];
    double t[FLEXSP_MAX_BUCKETS][FLEXSP_MAX_SIZES];        // mean marginal time at size 2^k
    double t_max[FLEXSP_MAX_BUCKETS][FLEXSP_MAX_SIZES];    // the longest's time at size 2^k
    double c[FLEXSP_MAX_SIZES];                            // group constant at size 2^k
} Program;

typedef struct {
    double bound;  // the best bound GLPK reported while searching
    double gap;
    int seen;
} Search;

static void on_search(glp_tree *tree, void *info) {
    Search *s = info;
    int r = glp_ios_reason(tree);
    if (r != GLP_IBINGO && r != GLP_ISELECT && r != GLP_IBRANCH) return;
    int node = glp_ios_best_node(tree);
    if (node > 0) s->bound = glp_ios_node_bound(tree, node), s->seen = 1;
    s->gap = glp_ios_mip_gap(tree);
}

// One MILP at time T: 1 feasible (groups and y filled), 0 infeasible, -1 + error.
static int solve_at(const Program *pg, double T, FlexspSolve *out) {
    int K = pg->n_sizes, B = pg->n_buckets;
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MIN);
    // columns: n_k (1 .. K), then y_bk (K + 1 + b K + k)
    glp_add_cols(lp, K + B * K);
    for (int k = 0; k < K; k++) {
        int64_t d = (int64_t)1 << k;
        glp_set_col_kind(lp, 1 + k, GLP_IV);
        glp_set_col_bnds(lp, 1 + k, GLP_DB, 0, (double)(pg->R / d));
        glp_set_obj_coef(lp, 1 + k, (double)d);
        for (int b = 0; b < B; b++) {
            int col = K + 1 + b * K + k;
            glp_set_col_kind(lp, col, GLP_IV);
            // a bucket may use a size only where its longest fits and finishes within T
            int allowed = pg->longest[b] <= d * pg->C && pg->t_max[b][k] + pg->c[k] <= T;
            if (allowed) glp_set_col_bnds(lp, col, GLP_DB, 0, pg->cnt[b]);
            else glp_set_col_bnds(lp, col, GLP_FX, 0, 0);
        }
    }
    // rows: ranks; every bucket placed; capacity per size; time per size
    int n_rows = 1 + B + 2 * K;
    glp_add_rows(lp, n_rows);
    glp_set_row_bnds(lp, 1, GLP_UP, 0, pg->R);
    for (int b = 0; b < B; b++) glp_set_row_bnds(lp, 2 + b, GLP_FX, pg->cnt[b], pg->cnt[b]);
    for (int k = 0; k < K; k++) {
        glp_set_row_bnds(lp, 2 + B + k, GLP_UP, 0, 0);
        glp_set_row_bnds(lp, 2 + B + K + k, GLP_UP, 0, 0);
    }
    int cap = 1 + K + 4 * B * K + 2 * K;
    int *ia = malloc((size_t)(cap + 1) * sizeof(int)), *ja = malloc((size_t)(cap + 1) * sizeof(int));
    double *ar = malloc((size_t)(cap + 1) * sizeof(double));
    if (!ia || !ja || !ar) {
        free(ia), free(ja), free(ar);
        glp_delete_prob(lp);
        return bs_fail("flexsp: out of memory building the program");
    }
    int nz = 0;
    for (int k = 0; k < K; k++) {
        double d = (double)((int64_t)1 << k);
        ++nz, ia[nz] = 1, ja[nz] = 1 + k, ar[nz] = d;                                // ranks
        ++nz, ia[nz] = 2 + B + k, ja[nz] = 1 + k, ar[nz] = -pg->fill * d * pg->C;  // capacity
        ++nz, ia[nz] = 2 + B + K + k, ja[nz] = 1 + k, ar[nz] = -(T - pg->c[k]);       // time
        for (int b = 0; b < B; b++) {
            int col = K + 1 + b * K + k;
            ++nz, ia[nz] = 2 + b, ja[nz] = col, ar[nz] = 1;
            ++nz, ia[nz] = 2 + B + k, ja[nz] = col, ar[nz] = pg->tok[b];
            ++nz, ia[nz] = 2 + B + K + k, ja[nz] = col, ar[nz] = pg->t[b][k];
        }
    }
    glp_load_matrix(lp, nz, ia, ja, ar);
    free(ia), free(ja), free(ar);
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    parm.presolve = GLP_ON;
    parm.tm_lim = FLEXSP_MILP_MS;
    parm.mip_gap = FLEXSP_MIP_GAP;
    Search search = {0, 0, 0};
    parm.cb_func = on_search;
    parm.cb_info = &search;
    glp_term_out(GLP_OFF);  // GLPK prints its progress unless told not to
    int err = glp_intopt(lp, &parm);
    int status = glp_mip_status(lp);
    if (err == GLP_EMIPGAP) err = 0;  // stopped within the gap tolerance: a solution
    out->n_milps++;
    int rc = 0;
    if (err == GLP_ETMLIM) out->timed_out = 1;
    if ((err == 0 || err == GLP_ETMLIM) && (status == GLP_OPT || status == GLP_FEAS)) {
        rc = 1;
        out->ranks_used = glp_mip_obj_val(lp);
        out->ranks_bound = search.seen ? fmin(search.bound, out->ranks_used) : out->ranks_used;
        out->gap = status == GLP_OPT && !search.seen ? 0 : search.gap;
        for (int k = 0; k < K; k++) out->groups[k] = (int32_t)llround(glp_mip_col_val(lp, 1 + k));
        for (int b = 0; b < B; b++)
            for (int k = 0; k < K; k++) out->y[b][k] = (int32_t)llround(glp_mip_col_val(lp, K + 1 + b * K + k));
    } else if (err != 0 && err != GLP_ENOPFS && err != GLP_ENODFS && err != GLP_ETMLIM) {
        rc = bs_fail("flexsp: GLPK's glp_intopt failed (code %d)", err);
    }
    glp_delete_prob(lp);
    return rc;
}

// Buckets by length: ratio sqrt 2 from the shortest, widened until at most FLEXSP_MAX_BUCKETS.
// sorted: the lengths ascending; bucket_of[i] for each.
static int make_buckets(const int64_t *sorted, int32_t n, int32_t *bucket_of) {
    for (double ratio = sqrt(2.0);; ratio *= ratio) {
        int nb = 0;
        double top = 0;
        for (int32_t i = 0; i < n; i++) {
            if (nb == 0 || (double)sorted[i] > top) {
                if (nb == FLEXSP_MAX_BUCKETS) break;
                nb++;
                top = (double)sorted[i] * ratio;
            }
            bucket_of[i] = nb - 1;
            if (i == n - 1) return nb;
        }
    }
}

static int cmp_len(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int solve_fill(const CostModel *cm, const int64_t *lens, int32_t n, int32_t R, int64_t C, double fill,
                      FlexspSolve *out) {
    memset(out, 0, sizeof *out);
    if (n < 1) return 1;
    int64_t *sorted = malloc((size_t)n * sizeof(int64_t));
    int32_t *bucket_of = malloc((size_t)n * sizeof(int32_t));
    if (!sorted || !bucket_of) {
        free(sorted), free(bucket_of);
        return bs_fail("flexsp: out of memory");
    }
    memcpy(sorted, lens, (size_t)n * sizeof(int64_t));
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_len);
    Program pg;
    memset(&pg, 0, sizeof pg);
    pg.C = C, pg.R = R, pg.fill = fill;
    while (pg.n_sizes < FLEXSP_MAX_SIZES && ((int64_t)1 << pg.n_sizes) <= R) pg.n_sizes++;
    pg.n_buckets = make_buckets(sorted, n, bucket_of);
    for (int k = 0; k < pg.n_sizes; k++) pg.c[k] = group_const(cm, (int64_t)1 << k);
    for (int32_t i = 0; i < n; i++) {
        int b = bucket_of[i];
        pg.cnt[b]++;
        pg.tok[b] += (double)sorted[i];
        pg.longest[b] = sorted[i];
        for (int k = 0; k < pg.n_sizes; k++) pg.t[b][k] += fmax(0.0, a2a_time(cm, sorted[i], (int64_t)1 << k) - pg.c[k]);
    }
    double lo = 0;  // no group finishes before the longest sequence at its fastest size
    for (int b = 0; b < pg.n_buckets; b++) {
        pg.tok[b] /= pg.cnt[b];
        double fastest = INFINITY;
        for (int k = 0; k < pg.n_sizes; k++) {
            pg.t[b][k] /= pg.cnt[b];
            pg.t_max[b][k] = fmax(0.0, a2a_time(cm, pg.longest[b], (int64_t)1 << k) - pg.c[k]);
            if (pg.longest[b] <= ((int64_t)1 << k) * C) fastest = fmin(fastest, pg.t_max[b][k] + pg.c[k]);
        }
        lo = fmax(lo, fastest);
    }
    free(sorted), free(bucket_of);
    out->n_sizes = pg.n_sizes, out->n_buckets = pg.n_buckets;
    if (!isfinite(lo)) return 0;  // a sequence longer than the largest group holds
    // an upper end: double from the lower bound until the program is feasible
    FlexspSolve best = *out, trial = *out;
    double hi = lo;
    int found = 0;
    for (int i = 0; i < 64 && !found; i++) {
        int r = solve_at(&pg, hi, &trial);
        if (r < 0) return -1;
        if (r == 1) found = 1, best = trial;
        else lo = hi, hi *= 2;
    }
    if (!found) return 0;
    for (int i = 0; i < FLEXSP_BISECT_MAX && hi - lo > FLEXSP_BISECT_TOL * hi; i++) {
        double mid = 0.5 * (lo + hi);
        int r = solve_at(&pg, mid, &trial);
        if (r < 0) return -1;
        if (r == 1) hi = mid, best = trial;
        else lo = mid;
    }
    best.n_milps = trial.n_milps;
    best.timed_out = trial.timed_out;
    *out = best;
    out->T = hi, out->T_lo = lo;
    return 1;
}

int flexsp_solve(const CostModel *cm, const int64_t *lens, int32_t n, int32_t R, int64_t C, FlexspSolve *out) {
    return solve_fill(cm, lens, n, R, C, FLEXSP_CAP_FILLS[0], out);
}

// ---- from a solution to items ----------------------------------------------------------------------

typedef struct {
    int32_t size;
    double time;   // the group's estimated time so far
    RingFill fill;
    int32_t n;     // sequences in it
} FGroup;

// Longest first into the least-loaded group of class [g0, g1) with room. 1 placed, 0 no room.
static int place_lpt(const CostModel *cm, FGroup *grp, int32_t g0, int32_t g1, int64_t s, int64_t C,
                     int32_t *group_of) {
    int32_t best = -1;
    for (int32_t g = g0; g < g1; g++)
        if (ring_fill_peek(&grp[g].fill, s) <= C && (best < 0 || grp[g].time < grp[best].time)) best = g;
    if (best < 0) return 0;
    ring_fill_add(&grp[best].fill, s);
    grp[best].time += a2a_time(cm, s, grp[best].size) - (grp[best].n > 0 ? group_const(cm, grp[best].size) : 0);
    grp[best].n++;
    *group_of = best;
    return 1;
}

// Make the wave's items: seqs[0 .. n) (batch indices, longest first), class_of[i] the size class
// (log2) each goes to, groups[k] groups of size 2^k. 1 done, 0 a sequence found no room, -1 + error.
static int emit_groups(Plan *out, const GlobalBatch *b, const CostModel *cm, const int32_t *seqs, int32_t n,
                       const int *class_of, const int32_t *groups, int n_sizes, int64_t C) {
    int32_t n_groups = 0;
    for (int k = 0; k < n_sizes; k++) n_groups += groups[k];
    FGroup *grp = malloc((size_t)(n_groups > 0 ? n_groups : 1) * sizeof(FGroup));
    int64_t *extra = calloc((size_t)out->n_ranks + 1, sizeof(int64_t));
    int32_t *group_of = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    int32_t *ranks = malloc((size_t)out->n_ranks * sizeof(int32_t));
    Segment *segs = malloc((size_t)(n > 0 ? n : 1) * sizeof(Segment));
    int32_t class_begin[FLEXSP_MAX_SIZES + 1];
    int rc = -1;
    if (!grp || !extra || !group_of || !ranks || !segs) {
        bs_fail("flexsp: out of memory");
        goto out;
    }
    // groups largest first: class k occupies [class_begin[k], class_begin[k] + groups[k])
    int32_t at = 0, r_at = 0;
    for (int k = n_sizes - 1; k >= 0; k--) {
        class_begin[k] = at;
        for (int32_t j = 0; j < groups[k]; j++, at++) {
            int32_t d = (int32_t)1 << k;
            grp[at] = (FGroup){d, 0, {.D = d, .extra = extra + r_at}, 0};
            ring_fill_clear(&grp[at].fill);
            r_at += d;
        }
    }
    rc = 0;
    for (int32_t i = 0; i < n; i++) {
        int k = class_of[i];
        if (!place_lpt(cm, grp, class_begin[k], class_begin[k] + groups[k], b->seqs[seqs[i]].len, C, &group_of[i]))
            goto out;
    }
    // one item per group, ranks in layout order
    r_at = 0;
    for (int32_t g = 0; g < n_groups; g++) {
        int n_segs = 0;
        for (int32_t i = 0; i < n; i++)
            if (group_of[i] == g) segs[n_segs++] = (Segment){seqs[i], 0, b->seqs[seqs[i]].len};
        for (int32_t r = 0; r < grp[g].size; r++) ranks[r] = r_at + r;
        r_at += grp[g].size;
        if (n_segs == 0) continue;
        int32_t k = plan_add_item(out, segs, n_segs, ranks, grp[g].size, 0.0);
        if (k < 0) {
            rc = -1;
            goto out;
        }
        out->items[k].a2a = is_a2a(cm, grp[g].size);
    }
    rc = 1;
out:
    free(grp), free(extra), free(group_of), free(ranks), free(segs);
    return rc;
}

static int wave_fill(Plan *out, const GlobalBatch *b, const CostModel *cm, const int32_t *seqs, int32_t n,
                     const int64_t *lens, int *class_of, int64_t C, double fill);

// ---- small waves: the program solved exactly ------------------------------------------------------
//
// The program counts the groups of a size (n_k) and gives them their class's work on average, so it
// does not see how whole sequences split between the groups: on a small wave it can pick two groups
// of 1 for three sequences where one group of 2 is faster once the sequences are placed. A wave of at
// most FLEXSP_EXACT_MAX sequences is therefore solved exactly instead: every partition of its
// sequences into groups, each group at the power-of-two size that the least makespan needs (Bell(8) =
// 4140 partitions). Its optimum is the optimum of the paper's program, in which every group is a
// variable of its own.

// One group's time: lens packed on d ranks, all-to-all up to the head limit, a ring beyond.
static double group_time(const CostModel *cm, const int64_t *lens, int n, int64_t d) {
    return is_a2a(cm, d) || d <= 1 ? cost_a2a_item_time(cm, lens, n, (int)d, 0.0) : cost_item_time(cm, lens, n, (int)d, 0.0);
}

typedef struct {
    int32_t n, R;
    int n_sizes;           // sizes 1 .. 2^(n_sizes - 1) <= R
    const double *t;       // (2^n, n_sizes) the time of the group of each subset of sequences at each
                           // size, infinite where it does not fit the members' capacity
    int block_of[FLEXSP_EXACT_MAX];       // the partition being tried
    double best;                          // the least makespan found
    double best_work;                     // its groups' rank-seconds, the tie-break
    int best_of[FLEXSP_EXACT_MAX];        // its partition
    int32_t best_size[FLEXSP_EXACT_MAX];  // and each block's group size
} Exact;

// The time of every subset of the wave as one group of every size (t, as Exact.t): 2^8 x 31 at
// most, so that the partitions only look them up. extra: (R,) scratch of the members' fill.
static void exact_times(double *t, const CostModel *cm, const int64_t *lens, int32_t n, int n_sizes, int64_t C,
                        int64_t *extra) {
    for (uint32_t mask = 1; mask < (1u << n); mask++) {
        int64_t segs[FLEXSP_EXACT_MAX], tokens = 0;
        int m = 0;
        for (int32_t i = 0; i < n; i++)
            if (mask >> i & 1) segs[m++] = lens[i], tokens += lens[i];
        for (int k = 0; k < n_sizes; k++) {
            int64_t d = (int64_t)1 << k, most = tokens / d + 2 * m;  // a member holds at most this
            if (most > C && tokens <= d * C) {  // near the capacity: count the 2D-chunk layout exactly
                RingFill f = {.D = d, .extra = extra};
                ring_fill_clear(&f);
                for (int j = 0; j < m; j++) most = ring_fill_add(&f, segs[j]);
            }
            t[mask * (uint32_t)n_sizes + (uint32_t)k] = most <= C ? group_time(cm, segs, m, d) : INFINITY;
        }
    }
}

// The least makespan of one partition into m blocks: the smallest time T at which every block has a
// size finishing within T and the sizes fit the ranks. Records it when it beats the best.
static void exact_partition(Exact *e, int m) {
    const double *t[FLEXSP_EXACT_MAX];  // each block's times by size
    uint32_t mask[FLEXSP_EXACT_MAX] = {0};
    for (int32_t i = 0; i < e->n; i++) mask[e->block_of[i]] |= 1u << i;
    for (int blk = 0; blk < m; blk++) t[blk] = e->t + mask[blk] * (uint32_t)e->n_sizes;
    for (int cb = 0; cb < m; cb++)
        for (int ck = 0; ck < e->n_sizes; ck++) {
            double T = t[cb][ck];
            if (!(T <= e->best * (1 + 1e-12))) continue;
            int32_t size[FLEXSP_EXACT_MAX];
            int64_t ranks = 0;
            double work = 0;  // rank-seconds: of two plans as fast, the one that keeps fewer ranks busy
            for (int blk = 0; blk < m && ranks <= e->R; blk++) {
                int k = 0;  // the smallest size within T
                while (k < e->n_sizes && !(t[blk][k] <= T)) k++;
                size[blk] = k < e->n_sizes ? (int32_t)1 << k : 0;
                ranks += k < e->n_sizes ? size[blk] : (int64_t)e->R + 1;
                if (k < e->n_sizes) work += size[blk] * t[blk][k];
            }
            if (ranks > e->R || (T >= e->best * (1 - 1e-12) && work >= e->best_work)) continue;
            e->best = T, e->best_work = work;
            memcpy(e->best_of, e->block_of, sizeof e->best_of);
            memcpy(e->best_size, size, (size_t)m * sizeof size[0]);
        }
}

// Every partition of sequences i .. n-1 given blocks 0 .. m-1 so far (restricted growth strings).
static void exact_search(Exact *e, int32_t i, int m) {
    if (i == e->n) {
        exact_partition(e, m);
        return;
    }
    for (int blk = 0; blk <= m && blk < e->R; blk++) {
        e->block_of[i] = blk;
        exact_search(e, i + 1, blk == m ? m + 1 : m);
    }
}

// The best partition's items: groups largest first from rank 0 (aligned blocks, as emit_groups).
static int emit_exact(Plan *out, const GlobalBatch *b, const CostModel *cm, const int32_t *seqs, const Exact *e) {
    int m = 0;
    for (int32_t i = 0; i < e->n; i++) m = e->best_of[i] + 1 > m ? e->best_of[i] + 1 : m;
    int32_t *ranks = malloc((size_t)e->R * sizeof(int32_t));
    if (!ranks) return bs_fail("flexsp: out of memory");
    int32_t r_at = 0;
    for (int32_t d = (int32_t)1 << (e->n_sizes - 1); d >= 1; d /= 2)
        for (int blk = 0; blk < m; blk++) {
            if (e->best_size[blk] != d) continue;
            Segment segs[FLEXSP_EXACT_MAX];
            int n_segs = 0;
            for (int32_t i = 0; i < e->n; i++)
                if (e->best_of[i] == blk) segs[n_segs++] = (Segment){seqs[i], 0, b->seqs[seqs[i]].len};
            for (int32_t r = 0; r < d; r++) ranks[r] = r_at + r;
            r_at += d;
            int32_t k = plan_add_item(out, segs, n_segs, ranks, d, 0.0);
            if (k < 0) {
                free(ranks);
                return -1;
            }
            out->items[k].a2a = is_a2a(cm, d);
        }
    free(ranks);
    return 1;
}

// One wave of at most FLEXSP_EXACT_MAX sequences (seqs longest first) by exhaustive search. 1, 0, -1
// as wave_milp.
static int wave_exact(Plan *out, const GlobalBatch *b, const CostModel *cm, const int32_t *seqs, int32_t n,
                      int64_t C) {
    int64_t lens[FLEXSP_EXACT_MAX];
    for (int32_t i = 0; i < n; i++) lens[i] = b->seqs[seqs[i]].len;
    Exact e = {.n = n, .R = out->n_ranks, .best = INFINITY, .best_work = INFINITY};
    while (e.n_sizes < FLEXSP_MAX_SIZES && ((int64_t)1 << e.n_sizes) <= e.R) e.n_sizes++;
    int64_t *extra = malloc((size_t)e.R * sizeof(int64_t));
    double *t = malloc(((size_t)1 << n) * (size_t)e.n_sizes * sizeof(double));
    if (!extra || !t) {
        free(extra), free(t);
        return bs_fail("flexsp: out of memory");
    }
    exact_times(t, cm, lens, n, e.n_sizes, C, extra);
    e.t = t;
    exact_search(&e, 0, 0);
    free(extra), free(t);
    if (!isfinite(e.best)) return 0;
    return emit_exact(out, b, cm, seqs, &e);
}

// One wave by the program: 1 done, 0 no plan for it, -1 + error.
static int wave_milp(Plan *out, const GlobalBatch *b, const CostModel *cm, const int32_t *seqs, int32_t n, int64_t C) {
    int64_t *lens = malloc((size_t)n * sizeof(int64_t));
    int *class_of = malloc((size_t)n * sizeof(int));
    int rc = -1;
    if (!lens || !class_of) {
        bs_fail("flexsp: out of memory");
        goto out;
    }
    for (int32_t i = 0; i < n; i++) lens[i] = b->seqs[seqs[i]].len;
    // a solution whose sequences do not fit its groups (the program counts mean lengths) is solved
    // again with less of each group's capacity to fill
    for (size_t f = 0; f < sizeof FLEXSP_CAP_FILLS / sizeof FLEXSP_CAP_FILLS[0]; f++) {
        rc = wave_fill(out, b, cm, seqs, n, lens, class_of, C, FLEXSP_CAP_FILLS[f]);
        if (rc != 0) break;
    }
out:
    free(lens), free(class_of);
    return rc;
}

// wave_milp at one capacity fill: 1 done, 0 no solution or it does not fit, -1 + error.
static int wave_fill(Plan *out, const GlobalBatch *b, const CostModel *cm, const int32_t *seqs, int32_t n,
                     const int64_t *lens, int *class_of, int64_t C, double fill) {
    FlexspSolve sol;
    int rc = solve_fill(cm, lens, n, out->n_ranks, C, fill, &sol);
    if (rc != 1) return rc;
    // the same buckets as the program (lengths ascending, ratio sqrt 2); seqs come longest first, so
    // walk them from the back to number the buckets, then hand each bucket's longest to the largest
    // sizes the program gave it
    int64_t *asc = calloc((size_t)(n > 0 ? n : 1), sizeof(int64_t));
    int32_t *bucket_of = malloc((size_t)n * sizeof(int32_t));
    if (!asc || !bucket_of) {
        free(asc), free(bucket_of);
        return bs_fail("flexsp: out of memory");
    }
    for (int32_t i = 0; i < n; i++) asc[i] = lens[n - 1 - i];
    make_buckets(asc, n, bucket_of);
    int32_t left[FLEXSP_MAX_BUCKETS][FLEXSP_MAX_SIZES];
    memcpy(left, sol.y, sizeof left);
    for (int32_t i = 0; i < n; i++) {  // longest first
        int bk = bucket_of[n - 1 - i], k = sol.n_sizes - 1;
        while (k > 0 && left[bk][k] == 0) k--;
        left[bk][k]--;
        class_of[i] = k;
    }
    free(asc), free(bucket_of);
    return emit_groups(out, b, cm, seqs, n, class_of, sol.groups, sol.n_sizes, C);
}

// One wave by the greedy: every group of the size the longest needs. 1, 0, -1 as wave_milp.
static int wave_greedy(Plan *out, const GlobalBatch *b, const CostModel *cm, const int32_t *seqs, int32_t n,
                       int64_t C) {
    int64_t d = next_pow2((b->seqs[seqs[0]].len + C - 1) / C);
    if (d > out->n_ranks) return 0;
    int k = 0;
    while (((int64_t)1 << k) < d) k++;
    int32_t groups[FLEXSP_MAX_SIZES] = {0};
    groups[k] = (int32_t)(out->n_ranks / d);
    int *class_of = malloc((size_t)n * sizeof(int));
    if (!class_of) return bs_fail("flexsp: out of memory");
    for (int32_t i = 0; i < n; i++) class_of[i] = k;
    int rc = emit_groups(out, b, cm, seqs, n, class_of, groups, k + 1, C);
    free(class_of);
    return rc;
}

// How plan_waves plans a wave: flexsp's way (small waves exactly, the others by the program), the
// greedy alone (policy_flexsp_greedy), or the program alone (policy_flexsp_program).
typedef enum { FLEXSP_FULL, FLEXSP_GREEDY, FLEXSP_PROGRAM } WaveMode;

// The waves (the sequence blaster) and each wave's plan.
static int plan_waves(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm, WaveMode mode,
                      const char *name) {
    int64_t C = cfg->capacity, tokens = 0;
    int32_t n = (int32_t)b->n, R = cfg->n_ranks;
    for (int32_t i = 0; i < n; i++) tokens += b->seqs[i].len;
    int64_t block = 1;
    while (block * 2 <= R) block *= 2;
    for (int32_t i = 0; i < n; i++)
        if (b->seqs[i].len > block * C)
            return bs_fail("sequence %d (id %lld) of %lld tokens does not fit the largest power-of-two group (%lld "
                           "ranks of capacity %lld)",
                           i, (long long)b->seqs[i].id, (long long)b->seqs[i].len, (long long)block, (long long)C);
    int32_t *order = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    int32_t *wave_of = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    int32_t *seqs = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    double *key = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    int64_t *wave_tokens = NULL;
    int rc = -1;
    if (!order || !wave_of || !seqs || !key) {
        bs_fail("%s: out of memory", name);
        goto out;
    }
    int64_t longest = 0;
    for (int32_t i = 0; i < n; i++) longest = b->seqs[i].len > longest ? b->seqs[i].len : longest;
    for (int32_t i = 0; i < n; i++) key[i] = (double)(longest - b->seqs[i].len);  // longest first
    if (policy_order_by_time(key, n, order) != 0) goto out;
    // as few waves as R x C tokens (with room) allow, but never more waves than sequences: a wave of
    // one sequence always fits (it is no longer than the largest group holds, checked above), so
    // with few long sequences (4 of 2,048 tokens on 2 ranks of C = 1,100 ask for 5 waves) the
    // blaster gives each its own wave rather than finding no plan
    int64_t m = (int64_t)ceil((double)tokens / (FLEXSP_WAVE_FILL * (double)R * (double)C));
    if (m > n) m = n;
    if (m < 1) m = 1;
    for (int tries = 0;; tries++, m++) {
        if (tries == 64 || m > n) {
            bs_fail("%s: no plan found for %d sequences on %d ranks", name, n, R);
            goto out;
        }
        plan_free(out);
        if (plan_init(out, b, R, C, cfg->pp, name) != 0) goto out;
        free(wave_tokens);
        wave_tokens = calloc((size_t)m, sizeof(int64_t));
        if (!wave_tokens) goto out;
        for (int32_t i = 0; i < n; i++) {  // longest first to the wave with the fewest tokens
            int64_t w = 0;
            for (int64_t x = 1; x < m; x++)
                if (wave_tokens[x] < wave_tokens[w]) w = x;
            wave_of[order[i]] = (int32_t)w;
            wave_tokens[w] += b->seqs[order[i]].len;
        }
        int ok = 1;
        for (int64_t w = 0; w < m && ok; w++) {
            int32_t k = 0;
            for (int32_t i = 0; i < n; i++)
                if (wave_of[order[i]] == w) seqs[k++] = order[i];
            if (k == 0) continue;
            int r = mode == FLEXSP_GREEDY ? 0
                    : mode == FLEXSP_FULL && k <= FLEXSP_EXACT_MAX ? wave_exact(out, b, cm, seqs, k, C)
                                                                   : wave_milp(out, b, cm, seqs, k, C);
            if (r == 0) r = wave_greedy(out, b, cm, seqs, k, C);  // no program solution: the greedy's
            if (r < 0) goto out;
            ok = r == 1;
        }
        if (ok) break;
    }
    rc = 0;
out:
    free(order), free(wave_of), free(seqs), free(key), free(wave_tokens);
    return rc;
}

int policy_flexsp_greedy(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    memset(out, 0, sizeof *out);
    return plan_waves(out, b, cfg, cm, FLEXSP_GREEDY, "flexsp-greedy");
}

int policy_flexsp_program(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    memset(out, 0, sizeof *out);
    return plan_waves(out, b, cfg, cm, FLEXSP_PROGRAM, "flexsp-program");
}

int policy_flexsp(Plan *out, const GlobalBatch *b, const PlanConfig *cfg, const CostModel *cm) {
    memset(out, 0, sizeof *out);
    Plan greedy;
    memset(&greedy, 0, sizeof greedy);
    if (plan_waves(out, b, cfg, cm, FLEXSP_FULL, "flexsp") != 0) return -1;
    if (plan_finalize(out, cm) != 0) return -1;
    // never worse than homogeneous Ulysses: keep the greedy's plan where its makespan is smaller
    if (plan_waves(&greedy, b, cfg, cm, FLEXSP_GREEDY, "flexsp") != 0 || plan_finalize(&greedy, cm) != 0) {
        plan_free(&greedy);
        bs_error_clear();
        return 0;  // no greedy plan (its waves do not fit): the program's stands
    }
    if (greedy.makespan < out->makespan) {
        plan_free(out);
        *out = greedy;
    } else {
        plan_free(&greedy);
    }
    return 0;
}
