// sweep.c: sweeps over context length or cluster size, the paper grid, and their plots.
//
// Every result is written as CSV first, then plotted by a gnuplot script that carries its own
// data (datablocks), so the .gp file next to the PNG / SVG redraws them on its own.
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/progress.h"
#include "bytescale/scenario.h"
#include "bytescale/seeds.h"

static const int64_t sweep_contexts[] = {256 << 10, 512 << 10, 1 << 20, 2 << 20};
enum { N_SWEEP = 4 };

int sim_gnuplot(const char *script_path) {
    // the scripts name their outputs relative to themselves: run gnuplot in the script's directory
    if (strchr(script_path, '\'')) return bs_fail("%s: cannot pass a path with a quote to gnuplot", script_path);
    if (system("gnuplot --version >/dev/null 2>&1") != 0)
        return bs_fail("cannot draw %s: gnuplot is not installed or not on PATH (apt-get install gnuplot-nox); "
                       "the data next to it is written",
                       script_path);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", script_path);
    char *slash = strrchr(dir, '/');
    const char *file = script_path;
    if (slash) {
        *slash = '\0';
        file = script_path + (slash - dir) + 1;
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "cd '%s' && gnuplot '%s'", dir[0] ? dir : "/", file);
    int rc = system(cmd);
    if (rc != 0) return bs_fail("gnuplot failed on %s (exit status %d)", script_path, rc);
    return 0;
}

// The preamble every plot script shares: PNG (cairo when there is one) first, SVG by replot.
static void gp_png(FILE *f, const char *png, int width, int height) {
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, \"pngcairo\") > 0) { set terminal pngcairo size %d,%d noenhanced } "
               "else { set terminal png size %d,%d noenhanced }\n",
            width, height, width, height);
    fprintf(f, "set output \"%s\"\n", png);
}

static void gp_svg(FILE *f, const char *svg, int width, int height) {
    fprintf(f, "set terminal svg size %d,%d noenhanced\nset output \"%s\"\n", width, height, svg);
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

// The CSV of sweeps and the grid: per (point, policy) the seeds and every metric as mean, min, max.
static void csv_header(FILE *f, const char *x) {
    fprintf(f, "%s,policy,seeds", x);
    for (int m = 0; m < SIM_N_METRICS; m++) {
        const char *c = sim_metric_info(m)->csv;
        if (c[0]) fprintf(f, ",%s_mean,%s_min,%s_max", c, c, c);
    }
    fprintf(f, ",run_tokens_per_s,first_flush_share\n");  // a run's numbers, one each
}

static void csv_rows(FILE *f, const char *x, const SimSeedsResult *r) {
    for (int j = 0; j < r->n_v; j++) {
        const SimSeedStats *st = &r->v[j];
        if (!st->ok) continue;
        fprintf(f, "%s,%s,%d", x, st->variant.label, r->n_seeds);
        for (int m = 0; m < SIM_N_METRICS; m++) {
            const SimMetricInfo *mi = sim_metric_info(m);
            const SimStat *t = &st->stat[m];
            if (!mi->csv[0]) continue;
            if (isnan(t->mean)) fprintf(f, ",,,");  // no static to compare with
            else fprintf(f, ",%.6g,%.6g,%.6g", t->mean * mi->csv_scale, t->min * mi->csv_scale, t->max * mi->csv_scale);
        }
        fprintf(f, ",%.6g,%.6g\n", sim_seed_stats_run_tokens_per_s(st), st->first_flush_share);
    }
}

// Run every variant on one scenario over the seeds and log its table. -1 when the set-up failed
// (the point is skipped); *done then still counts all of the point's runs.
static int run_point(SimSeedsResult *r, const Scenario *sc, const SimVariant *v, int n_v, uint64_t seed, int n_seeds,
                     Progress *pr, int64_t *done, FILE *log) {
    int64_t end = *done + (int64_t)n_seeds * n_v;
    SimSeedsConfig cfg = {seed, n_seeds, NULL, pr, done, NULL, NULL};
    if (sim_seeds_run(r, sc, v, n_v, &cfg) != 0) {
        *done = end;
        if (log) fprintf(log, "%s: skipped: %s\n\n", sc->name, bs_errmsg());
        return -1;
    }
    if (!log) return 0;
    sim_seeds_describe(log, r);
    int any = 0;
    for (int j = 0; j < n_v; j++) {
        if (!r->v[j].ok) fprintf(log, "  %s: skipped: %s\n", v[j].label, r->v[j].why);
        any |= r->v[j].ok;
    }
    if (any) sim_seeds_table_print(log, r);
    fprintf(log, "\n");
    return 0;
}

// ---- sweeps -----------------------------------------------------------------------------------------

typedef struct {
    double x;        // plotted x (context in K tokens, or GPUs)
    SimStat y[16];   // tokens/s per variant over the seeds, NAN where it did not run
} SweepPoint;

static int write_sweep_plot(const char *dir, const char *stem, SimSweep kind, const SimVariant *v, int n_v,
                            const SweepPoint *pts, int n_pts, const char *title) {
    char gp[4096], png[4096], svg[4096];
    snprintf(gp, sizeof gp, "%s/%s.gp", dir, stem);
    snprintf(png, sizeof png, "%s/%s.png", dir, stem);
    snprintf(svg, sizeof svg, "%s/%s.svg", dir, stem);
    AtomicFile af;
    if (atomic_open(&af, gp) != 0) return -1;
    FILE *f = af.f;
    fprintf(f, "# %s: tokens/s per policy, mean over the seeds with min-max bars (written by bytescale simulate "
               "--sweep; run from this directory)\n",
            stem);
    for (int j = 0; j < n_v; j++) {
        fprintf(f, "$d%d << EOD\n", j);  // x mean min max
        for (int i = 0; i < n_pts; i++)
            if (!isnan(pts[i].y[j].mean))
                fprintf(f, "%g %.6g %.6g %.6g\n", pts[i].x, pts[i].y[j].mean, pts[i].y[j].min, pts[i].y[j].max);
        fprintf(f, "EOD\n");
    }
    // tokens/s falls with the context and grows with the GPUs: the key goes where the curves are low
    fprintf(f, "set title \"%s\"\nset grid\nset key %s\nset yrange [0:*]\nset logscale x 2\n", title,
            kind == SIM_SWEEP_CONTEXTS ? "top right" : "top left");
    fprintf(f, "set offsets graph 0.05, graph 0.05, 0, 0\n");
    fprintf(f, "set xlabel \"%s\"\nset ylabel \"tokens/s\"\nset xtics (",
            kind == SIM_SWEEP_CONTEXTS ? "context" : "GPUs");
    for (int i = 0; i < n_pts; i++) {
        if (kind == SIM_SWEEP_CONTEXTS && pts[i].x >= 1024)
            fprintf(f, "%s\"%gM\" %g", i ? ", " : "", pts[i].x / 1024, pts[i].x);
        else if (kind == SIM_SWEEP_CONTEXTS) fprintf(f, "%s\"%gK\" %g", i ? ", " : "", pts[i].x, pts[i].x);
        else fprintf(f, "%s\"%g\" %g", i ? ", " : "", pts[i].x, pts[i].x);
    }
    fprintf(f, ")\n");
    gp_png(f, base_name(png), 900, 600);
    fprintf(f, "plot ");
    for (int j = 0; j < n_v; j++)
        fprintf(f, "%s$d%d using 1:2:3:4 with yerrorlines lw 2 title \"%s\"", j ? ", " : "", j, v[j].label);
    fprintf(f, "\n");
    gp_svg(f, base_name(svg), 900, 600);
    fprintf(f, "replot\n");
    if (atomic_close(&af) != 0) return -1;
    return sim_gnuplot(gp);
}

int sim_sweep_run(const Scenario *base, SimSweep kind, const SimVariant *v, int n_v, uint64_t seed, int n_seeds,
                  const char *dir, int plot, FILE *log) {
    if (n_v < 1 || n_v > 16) return bs_fail("sweep: 1 to 16 policies (got %d)", n_v);
    if (n_seeds < 1 || n_seeds > SIM_SEEDS_MAX) return bs_fail("sweep: 1 to %d seeds (got %d)", SIM_SEEDS_MAX, n_seeds);
    if (make_dirs(dir) != 0) return -1;
    int64_t xs[N_SWEEP];
    for (int i = 0; i < N_SWEEP; i++)
        xs[i] = kind == SIM_SWEEP_CONTEXTS ? sweep_contexts[i] : (int64_t)base->gpus * (1 << i) / 4;
    char stem[128], csv[4096];
    snprintf(stem, sizeof stem, "%s-%s", base->name, kind == SIM_SWEEP_CONTEXTS ? "contexts" : "gpus");
    snprintf(csv, sizeof csv, "%s/%s.csv", dir, stem);
    AtomicFile af;
    if (atomic_open(&af, csv) != 0) return -1;
    csv_header(af.f, kind == SIM_SWEEP_CONTEXTS ? "context" : "gpus");
    SweepPoint pts[N_SWEEP];
    int n_pts = 0;
    Progress pr;
    progress_start(&pr, "sweep", (int64_t)N_SWEEP * n_seeds * n_v);
    int64_t done = 0;
    for (int i = 0; i < N_SWEEP; i++) {
        Scenario sc = *base;
        char x[32];
        if (kind == SIM_SWEEP_CONTEXTS) {
            sc.context = xs[i];
            snprintf(sc.name, sizeof sc.name, "%s@ctx%lldk", base->name, (long long)(xs[i] >> 10));
        } else {
            if (xs[i] < 1 || xs[i] > 1 << 30) {  // fewer than 4 GPUs: no quarter of them
                done += (int64_t)n_seeds * n_v;
                continue;
            }
            sc.gpus = (int)xs[i];
            snprintf(sc.name, sizeof sc.name, "%s@%lldgpus", base->name, (long long)xs[i]);
        }
        snprintf(x, sizeof x, "%lld", (long long)xs[i]);
        SimSeedsResult r;
        if (run_point(&r, &sc, v, n_v, seed, n_seeds, &pr, &done, log) != 0) continue;
        SweepPoint *pt = &pts[n_pts++];
        pt->x = kind == SIM_SWEEP_CONTEXTS ? (double)(xs[i] >> 10) : (double)xs[i];
        for (int j = 0; j < n_v; j++) pt->y[j] = r.v[j].stat[SIM_M_TOKENS_PER_S];
        csv_rows(af.f, x, &r);
        sim_seeds_free(&r);
    }
    progress_finish(&pr, done, NULL);
    if (atomic_close(&af) != 0) return -1;
    if (n_pts == 0) return bs_fail("sweep %s: no point could be simulated (see the messages above)", stem);
    if (log) fprintf(log, "wrote %s\n", csv);
    if (!plot) return 0;
    char title[200], ctx[24], seeds[48];
    if (n_seeds == 1) snprintf(seeds, sizeof seeds, "seed %llu", (unsigned long long)seed);
    else snprintf(seeds, sizeof seeds, "mean of %d seeds", n_seeds);
    if (kind == SIM_SWEEP_CONTEXTS)
        snprintf(title, sizeof title, "%s: %s, %s, %d GPUs, %s", stem, base->model, base->dataset, base->gpus, seeds);
    else
        snprintf(title, sizeof title, "%s: %s, %s, context %s, %s", stem, base->model, base->dataset,
                 sim_tokens_text(ctx, sizeof ctx, base->context), seeds);
    if (write_sweep_plot(dir, stem, kind, v, n_v, pts, n_pts, title) != 0) return -1;
    if (log) fprintf(log, "wrote %s/%s.png and %s/%s.svg\n", dir, stem, dir, stem);
    return 0;
}

// ---- the paper grid ---------------------------------------------------------------------------------

typedef struct {
    Scenario sc;
    int hdp_ranks;
    SimStat tps[16];      // tokens/s over the seeds; NAN: did not run
    SimStat speedup[16];  // the per-seed ratio over static's tokens/s; NAN: no static to compare with
    SimStat over_lb[16];  // planner makespan / the policy-independent lower bound
    SimStat over_hdp[16]; // planner makespan / the HDP-aware bound (a sequence on <= ceil(s/C) ranks)
    char why[16][256];    // why not
} GridRow;

static int find_label(const SimVariant *v, int n_v, const char *label) {
    for (int j = 0; j < n_v; j++)
        if (!strcmp(v[j].label, label)) return j;
    return -1;
}

// A cell: the mean, and with several seeds the min-max over them in brackets.
static void md_cell(FILE *f, SimStat x, double scale, const char *fmt, const char *unit, int n_seeds) {
    if (isnan(x.mean)) {
        fprintf(f, " - |");
        return;
    }
    fprintf(f, " ");
    fprintf(f, fmt, x.mean * scale);
    fprintf(f, "%s", unit);
    if (n_seeds > 1) {
        fprintf(f, " [");
        fprintf(f, fmt, x.min * scale);
        fprintf(f, "-");
        fprintf(f, fmt, x.max * scale);
        fprintf(f, "]");
    }
    fprintf(f, " |");
}

static int write_grid_md(const char *path, const GridRow *rows, int n_rows, const SimVariant *v, int n_v,
                         uint64_t seed, int n_seeds, const char *command) {
    AtomicFile af;
    if (atomic_open(&af, path) != 0) return -1;
    FILE *f = af.f;
    int js = find_label(v, n_v, "static"), jn = find_label(v, n_v, "naive"), jb = find_label(v, n_v, "balance");
    int je = find_label(v, n_v, "elastic");
    fprintf(f, "# The ByteScale paper grid, simulated\n\n");
    fprintf(f, "Regenerate with:\n\n```\n%s\n```\n\n", command);
    if (n_seeds == 1)
        fprintf(f, "One simulated step per cell (seed %llu): ", (unsigned long long)seed);
    else
        fprintf(f, "Every cell is the mean over %d seeds (seeds %llu..%llu), one simulated step each, with the min-max "
                   "over the seeds in brackets: ",
                n_seeds, (unsigned long long)seed, (unsigned long long)(seed + (uint64_t)n_seeds - 1));
    fprintf(f, "the global batch of 32M tokens is drawn from the dataset's "
               "length distribution and cut at the context, planned by each policy and run on the modelled "
               "cluster by `bytescale simulate` (model, assumptions and limits: [docs/simulator.md](../simulator.md)). "
               "Throughput is in millions of tokens per second of the whole cluster; the speedups are over "
               "`static` on the same batch%s. The last three columns are planned makespans over the bounds of "
               "[docs/planner.md](../planner.md): `balance`'s over the policy-independent lower bound and over "
               "the HDP-aware bound, in which no sequence uses more than ceil(s/C) ranks (the 5%% target for "
               "`balance` is against the latter), and `elastic`'s over the lower bound (it widens rings past "
               "what the HDP-aware bound assumes). The case study of the paper (`--scenario case-study`) is the "
               "row llama-7b / byted / 2M.\n\n",
            n_seeds > 1 ? " (the mean of the per-seed ratios)" : "");
    fprintf(f, "Policies:");
    for (int j = 0; j < n_v; j++) fprintf(f, "%s `%s` (%s)", j ? ";" : "", v[j].label, v[j].summary);
    fprintf(f, ".\n");
    // the speedups over static in one line per policy: range and geometric mean over the cells
    if (js >= 0 && n_v > 1) fprintf(f, "\n");
    for (int j = 0; js >= 0 && j < n_v; j++) {
        if (j == js) continue;
        double lo = INFINITY, hi = 0, lo_seed = INFINITY, hi_seed = 0, logsum = 0;
        int n = 0;
        for (int i = 0; i < n_rows; i++) {
            SimStat x = rows[i].speedup[j];
            if (isnan(x.mean) || !(x.mean > 0)) continue;
            lo = fmin(lo, x.mean), hi = fmax(hi, x.mean), logsum += log(x.mean), n++;
            lo_seed = fmin(lo_seed, x.min), hi_seed = fmax(hi_seed, x.max);
        }
        if (n == 0) continue;
        fprintf(f, "- `%s` over `static`: %.2fx to %.2fx", v[j].label, lo, hi);
        if (n_seeds > 1) fprintf(f, " (cell means; single seeds %.2fx to %.2fx)", lo_seed, hi_seed);
        fprintf(f, ", geometric mean %.2fx over %d cells\n", exp(logsum / n), n);
    }
    const Scenario *prev = NULL;
    for (int i = 0; i < n_rows; i++) {
        const GridRow *row = &rows[i];
        if (!prev || strcmp(prev->model, row->sc.model) != 0) {
            fprintf(f, "\n## %s, %d GPUs (tp %d, pp %d, %d HDP ranks, C = %lldK, hardware %s)\n\n", row->sc.model,
                    row->sc.gpus, row->sc.tp, row->sc.pp, row->hdp_ranks, (long long)(row->sc.capacity >> 10),
                    row->sc.hardware);
            fprintf(f, "| dataset | context |");
            for (int j = 0; j < n_v; j++) fprintf(f, " %s |", v[j].label);
            fprintf(f, " naive vs static | balance vs static | elastic vs static | balance makespan / lower bound | "
                       "balance makespan / HDP bound | elastic makespan / lower bound |\n|---|---|");
            for (int j = 0; j < n_v + 6; j++) fprintf(f, "---:|");
            fprintf(f, "\n");
        }
        prev = &row->sc;
        char c[24];
        fprintf(f, "| %s | %s |", row->sc.dataset, sim_tokens_text(c, sizeof c, row->sc.context));
        for (int j = 0; j < n_v; j++) {
            if (isnan(row->tps[j].mean)) fprintf(f, " failed |");
            else md_cell(f, row->tps[j], 1e-6, "%.3f", "", n_seeds);
        }
        SimStat none = {NAN, NAN, NAN};
        md_cell(f, jn >= 0 ? row->speedup[jn] : none, 1, "%.2f", "x", n_seeds);
        md_cell(f, jb >= 0 ? row->speedup[jb] : none, 1, "%.2f", "x", n_seeds);
        md_cell(f, je >= 0 ? row->speedup[je] : none, 1, "%.2f", "x", n_seeds);
        md_cell(f, jb >= 0 ? row->over_lb[jb] : none, 1, "%.3f", "", n_seeds);
        md_cell(f, jb >= 0 ? row->over_hdp[jb] : none, 1, "%.3f", "", n_seeds);
        md_cell(f, je >= 0 ? row->over_lb[je] : none, 1, "%.3f", "", n_seeds);
        fprintf(f, "\n");
    }
    int n_fail = 0;
    for (int i = 0; i < n_rows; i++)
        for (int j = 0; j < n_v; j++) n_fail += isnan(rows[i].tps[j].mean);
    if (n_fail) {
        fprintf(f, "\n## Cells that did not run\n\n");
        for (int i = 0; i < n_rows; i++)
            for (int j = 0; j < n_v; j++)
                if (isnan(rows[i].tps[j].mean))
                    fprintf(f, "- %s, %s: %s\n", rows[i].sc.name, v[j].label, rows[i].why[j]);
    }
    fprintf(f, "\n![speedup of balance%s over static](paper-grid.png)\n", je >= 0 ? " and elastic" : "");
    return atomic_close(&af);
}

// One datablock of a model's speedups over the contexts (context mean min max).
static void grid_block(FILE *f, const char *name, int b, const GridRow *rows, int first, int n_rows, int j) {
    fprintf(f, "$%s%d << EOD\n", name, b);
    for (int k = first; k < n_rows && !strcmp(rows[k].sc.model, rows[first].sc.model) &&
                     !strcmp(rows[k].sc.dataset, rows[first].sc.dataset);
         k++) {
        SimStat x = rows[k].speedup[j];
        if (!isnan(x.mean)) fprintf(f, "%lld %.4f %.4f %.4f\n", (long long)(rows[k].sc.context >> 10), x.mean, x.min, x.max);
    }
    fprintf(f, "EOD\n");
}

static int write_grid_plot(const char *dir, const GridRow *rows, int n_rows, const SimVariant *v, int n_v) {
    int js = find_label(v, n_v, "static"), jb = find_label(v, n_v, "balance"), je = find_label(v, n_v, "elastic");
    if (js < 0 || jb < 0) return 0;  // nothing to plot without both
    char gp[4096];
    snprintf(gp, sizeof gp, "%s/paper-grid.gp", dir);
    AtomicFile af;
    if (atomic_open(&af, gp) != 0) return -1;
    FILE *f = af.f;
    fprintf(f, "# speedup of balance (solid) and elastic (dashed, when simulated) over static per model, one panel per "
               "dataset, mean over the seeds with min-max bars (bytescale simulate --grid)\n");
    // one datablock per (dataset, model) and policy: the rows come model-major, dataset, context
    int block = 0;
    char titles[64][48];
    int ds_of[64];
    for (int i = 0; i < n_rows && block < 64; i++) {
        int same = i > 0 && !strcmp(rows[i - 1].sc.model, rows[i].sc.model) &&
                   !strcmp(rows[i - 1].sc.dataset, rows[i].sc.dataset);
        if (same) continue;
        grid_block(f, "d", block, rows, i, n_rows, jb);
        if (je >= 0) grid_block(f, "e", block, rows, i, n_rows, je);
        snprintf(titles[block], sizeof titles[block], "%s", rows[i].sc.model);
        ds_of[block] = !strcmp(rows[i].sc.dataset, "github");
        block++;
    }
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0) gp_png(f, "paper-grid.png", 1400, 560);
        else gp_svg(f, "paper-grid.svg", 1400, 560);
        fprintf(f, "set multiplot layout 1,2\nset grid\nset logscale x 2\nset key top left box opaque\n");
        fprintf(f, "set yrange [0:*]\n");
        fprintf(f, "set offsets graph 0.05, graph 0.05, 0, 0\n");
        fprintf(f, "set xtics (\"256K\" 256, \"512K\" 512, \"1M\" 1024, \"2M\" 2048)\n");
        fprintf(f, "set xlabel \"context\"\nset ylabel \"tokens/s over static: %s\"\n",
                je >= 0 ? "balance (solid), elastic (dashed)" : "balance");
        for (int ds = 0; ds < 2; ds++) {
            fprintf(f, "set title \"%s\"\nplot ", ds ? "GitHub" : "Byted");
            int first = 1, color = 0;
            for (int b = 0; b < block; b++) {
                if (ds_of[b] != ds) continue;
                color++;
                fprintf(f, "%s$d%d using 1:2:3:4 with yerrorlines lw 2 lc %d title \"%s\"", first ? "" : ", ", b, color,
                        titles[b]);
                if (je >= 0) fprintf(f, ", $e%d using 1:2:3:4 with yerrorlines lw 2 dt 2 lc %d notitle", b, color);
                first = 0;
            }
            if (first) fprintf(f, "1 notitle");
            fprintf(f, "\n");
        }
        fprintf(f, "unset multiplot\n");
    }
    if (atomic_close(&af) != 0) return -1;
    return sim_gnuplot(gp);
}

int sim_grid_run(const SimVariant *v, int n_v, uint64_t seed, int n_seeds, const char *hardware, int part, int parts,
                 const char *dir, const char *command, int plot, FILE *log) {
    if (n_v < 1 || n_v > 16) return bs_fail("grid: 1 to 16 policies (got %d)", n_v);
    if (n_seeds < 1 || n_seeds > SIM_SEEDS_MAX) return bs_fail("grid: 1 to %d seeds (got %d)", SIM_SEEDS_MAX, n_seeds);
    int n_all = scenario_grid_count();
    if (parts < 1 || parts > n_all || part < 1 || part > parts)
        return bs_fail("grid: part %d of %d: give 1 <= part <= parts <= %d (the cells)", part, parts, n_all);
    if (make_dirs(dir) != 0) return -1;
    int n_rows = (n_all - part + parts) / parts;  // the cells part - 1, part - 1 + parts, ...
    GridRow *rows = bs_calloc((size_t)n_rows, sizeof *rows);
    if (!rows) return -1;
    char csv[4096], md[4096];
    snprintf(csv, sizeof csv, "%s/paper-grid.csv", dir);
    snprintf(md, sizeof md, "%s/paper-grid.md", dir);
    AtomicFile af;
    if (atomic_open(&af, csv) != 0) {
        free(rows);
        return -1;
    }
    csv_header(af.f, "scenario");
    Progress pr;
    progress_start(&pr, "grid", (int64_t)n_rows * n_seeds * n_v);
    int64_t done = 0;
    for (int i = 0; i < n_rows; i++) {
        GridRow *row = &rows[i];
        if (scenario_get(part - 1 + i * parts, &row->sc) != 0) break;
        if (hardware) snprintf(row->sc.hardware, sizeof row->sc.hardware, "%s", hardware);
        row->hdp_ranks = row->sc.gpus / (row->sc.tp * row->sc.pp);
        for (int j = 0; j < n_v; j++)
            row->tps[j] = row->speedup[j] = row->over_lb[j] = row->over_hdp[j] = (SimStat){NAN, NAN, NAN};
        SimSeedsResult r;
        if (run_point(&r, &row->sc, v, n_v, seed, n_seeds, &pr, &done, log) != 0) {
            for (int j = 0; j < n_v; j++) snprintf(row->why[j], sizeof row->why[j], "%s", bs_errmsg());
            continue;
        }
        for (int j = 0; j < n_v; j++) {
            row->tps[j] = r.v[j].stat[SIM_M_TOKENS_PER_S];
            row->speedup[j] = r.v[j].stat[SIM_M_SPEEDUP];
            row->over_lb[j] = r.v[j].stat[SIM_M_MAKESPAN_RATIO];
            row->over_hdp[j] = r.v[j].stat[SIM_M_MAKESPAN_HDP];
            snprintf(row->why[j], sizeof row->why[j], "%s", r.v[j].why);
        }
        csv_rows(af.f, row->sc.name, &r);
        sim_seeds_free(&r);
    }
    progress_finish(&pr, done, NULL);
    int rc = atomic_close(&af);
    if (rc == 0) rc = write_grid_md(md, rows, n_rows, v, n_v, seed, n_seeds, command);
    if (rc == 0 && plot) rc = write_grid_plot(dir, rows, n_rows, v, n_v);
    if (rc == 0 && log) fprintf(log, "wrote %s, %s%s\n", md, csv, plot ? " and paper-grid.png / .svg" : "");
    free(rows);
    return rc;
}
