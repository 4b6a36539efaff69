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

static void csv_header(FILE *f, const char *x) {
    fprintf(f, "%s,policy,step_s,tokens_per_s,speedup_vs_static,mfu,busy_median_s,comm_median_s,wait_median_s,"
               "wait_max_s,sync_s,ring_tb,offload_tb,items,rings\n",
            x);
}

static void csv_row(FILE *f, const char *x, const SimOutcome *o, double base_tps) {
    const SimResult *r = &o->res;
    fprintf(f, "%s,%s,%.6g,%.6g,", x, o->variant.label, r->step_time, r->tokens_per_s);
    if (base_tps > 0) fprintf(f, "%.4f", r->tokens_per_s / base_tps);
    fprintf(f, ",%.4f,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%d,%d\n", r->mfu, r->busy_spread.median, r->comm_spread.median,
            r->wait_spread.median, r->wait_spread.max, r->sync_time, r->ring_bytes / 1e12, r->offload_bytes / 1e12,
            o->n_items, r->n_rings);
}

static double static_tps(const SimOutcome *o, const int *ok, int n) {
    for (int j = 0; j < n; j++)
        if (ok[j] && !strcmp(o[j].variant.label, "static")) return o[j].res.tokens_per_s;
    return 0;
}

// Run all variants on one scenario. ok[j] says which ran; a set-up failure fails the point.
static int run_point(const Scenario *sc, uint64_t seed, const SimVariant *v, int n_v, SimOutcome *out, int *ok,
                     char (*why)[96], Progress *pr, int64_t *done, FILE *log) {
    SimSetup s;
    if (sim_setup_init(&s, sc, seed) != 0) {
        sim_setup_free(&s);
        return -1;
    }
    if (log) sim_setup_describe(log, &s);
    int any = 0;
    for (int j = 0; j < n_v; j++) {
        ok[j] = sim_setup_run(&s, &v[j], &out[j], NULL) == 0;
        if (!ok[j] && why) snprintf(why[j], sizeof why[j], "%s", bs_errmsg());
        if (!ok[j] && log) fprintf(log, "  %s: skipped: %s\n", v[j].label, bs_errmsg());
        any |= ok[j];
        progress_update(pr, ++*done, sc->name);
    }
    if (log && any) {
        SimOutcome *rows = calloc((size_t)n_v, sizeof *rows);
        int n = 0;
        for (int j = 0; j < n_v && rows; j++)
            if (ok[j]) rows[n++] = out[j];
        if (rows) sim_table_print(log, rows, n);
        free(rows);
        fprintf(log, "\n");
    }
    sim_setup_free(&s);
    return 0;
}

static void free_point(SimOutcome *o, const int *ok, int n) {
    for (int j = 0; j < n; j++)
        if (ok[j]) sim_outcome_free(&o[j]);
}

// ---- sweeps -----------------------------------------------------------------------------------------

typedef struct {
    double x;       // plotted x (context in K tokens, or GPUs)
    double y[16];   // tokens/s per variant, NAN where it did not run
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
    fprintf(f, "# %s: tokens/s per policy (written by bytescale simulate --sweep; run from this directory)\n", stem);
    for (int j = 0; j < n_v; j++) {
        fprintf(f, "$d%d << EOD\n", j);
        for (int i = 0; i < n_pts; i++)
            if (!isnan(pts[i].y[j])) fprintf(f, "%g %.6g\n", pts[i].x, pts[i].y[j]);
        fprintf(f, "EOD\n");
    }
    fprintf(f, "set title \"%s\"\nset grid\nset key top left\nset yrange [0:*]\nset logscale x 2\n", title);
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
        fprintf(f, "%s$d%d using 1:2 with linespoints lw 2 title \"%s\"", j ? ", " : "", j, v[j].label);
    fprintf(f, "\n");
    gp_svg(f, base_name(svg), 900, 600);
    fprintf(f, "replot\n");
    if (atomic_close(&af) != 0) return -1;
    return sim_gnuplot(gp);
}

int sim_sweep_run(const Scenario *base, SimSweep kind, const SimVariant *v, int n_v, uint64_t seed, const char *dir,
                  int plot, FILE *log) {
    if (n_v < 1 || n_v > 16) return bs_fail("sweep: 1 to 16 policies (got %d)", n_v);
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
    SimOutcome out[16];
    int ok[16];
    SweepPoint pts[N_SWEEP];
    int n_pts = 0;
    Progress pr;
    progress_start(&pr, "sweep", (int64_t)N_SWEEP * n_v);
    int64_t done = 0;
    for (int i = 0; i < N_SWEEP; i++) {
        Scenario sc = *base;
        char x[32];
        if (kind == SIM_SWEEP_CONTEXTS) {
            sc.context = xs[i];
            snprintf(sc.name, sizeof sc.name, "%s@ctx%lldk", base->name, (long long)(xs[i] >> 10));
        } else {
            if (xs[i] < 1 || xs[i] > 1 << 30) {  // fewer than 4 GPUs: no quarter of them
                done += n_v;
                continue;
            }
            sc.gpus = (int)xs[i];
            snprintf(sc.name, sizeof sc.name, "%s@%lldgpus", base->name, (long long)xs[i]);
        }
        snprintf(x, sizeof x, "%lld", (long long)xs[i]);
        if (run_point(&sc, seed, v, n_v, out, ok, NULL, &pr, &done, log) != 0) {
            if (log) fprintf(log, "%s: skipped: %s\n\n", sc.name, bs_errmsg());
            done += n_v;
            continue;
        }
        double base_tps = static_tps(out, ok, n_v);
        SweepPoint *pt = &pts[n_pts++];
        pt->x = kind == SIM_SWEEP_CONTEXTS ? (double)(xs[i] >> 10) : (double)xs[i];
        for (int j = 0; j < n_v; j++) {
            pt->y[j] = ok[j] ? out[j].res.tokens_per_s : NAN;
            if (ok[j]) csv_row(af.f, x, &out[j], base_tps);
        }
        free_point(out, ok, n_v);
    }
    progress_finish(&pr, done, NULL);
    if (atomic_close(&af) != 0) return -1;
    if (n_pts == 0) return bs_fail("sweep %s: no point could be simulated (see the messages above)", stem);
    if (log) fprintf(log, "wrote %s\n", csv);
    if (!plot) return 0;
    char title[160], ctx[24];
    if (kind == SIM_SWEEP_CONTEXTS)
        snprintf(title, sizeof title, "%s: %s, %s, %d GPUs", stem, base->model, base->dataset, base->gpus);
    else
        snprintf(title, sizeof title, "%s: %s, %s, context %s", stem, base->model, base->dataset,
                 sim_tokens_text(ctx, sizeof ctx, base->context));
    if (write_sweep_plot(dir, stem, kind, v, n_v, pts, n_pts, title) != 0) return -1;
    if (log) fprintf(log, "wrote %s/%s.png and %s/%s.svg\n", dir, stem, dir, stem);
    return 0;
}

// ---- the paper grid ---------------------------------------------------------------------------------

typedef struct {
    Scenario sc;
    int hdp_ranks;
    double tps[16];   // NAN: did not run
    char why[16][96]; // why not
} GridRow;

static int find_label(const SimVariant *v, int n_v, const char *label) {
    for (int j = 0; j < n_v; j++)
        if (!strcmp(v[j].label, label)) return j;
    return -1;
}

static void md_speedup(FILE *f, const GridRow *row, int j, int js) {
    if (j < 0 || js < 0 || isnan(row->tps[j]) || isnan(row->tps[js]) || row->tps[js] <= 0) fprintf(f, " - |");
    else fprintf(f, " %.2fx |", row->tps[j] / row->tps[js]);
}

static int write_grid_md(const char *path, const GridRow *rows, int n_rows, const SimVariant *v, int n_v,
                         uint64_t seed, const char *command) {
    AtomicFile af;
    if (atomic_open(&af, path) != 0) return -1;
    FILE *f = af.f;
    int js = find_label(v, n_v, "static"), jn = find_label(v, n_v, "naive"), jb = find_label(v, n_v, "balance");
    fprintf(f, "# The ByteScale paper grid, simulated\n\n");
    fprintf(f, "Regenerate with:\n\n```\n%s\n```\n\n", command);
    fprintf(f, "One simulated step per cell (seed %llu): the global batch of 32M tokens is drawn from the dataset's "
               "length distribution and cut at the context, planned by each policy and run on the modelled "
               "cluster by `bytescale simulate` (model, assumptions and limits: [docs/simulator.md](../simulator.md)). "
               "Throughput is in millions of tokens per second of the whole cluster; the speedups are over "
               "`static` on the same batch. The case study of the paper (`--scenario case-study`) is the row "
               "llama-7b / byted / 2M.\n\n",
            (unsigned long long)seed);
    fprintf(f, "Policies:");
    for (int j = 0; j < n_v; j++) fprintf(f, "%s `%s` (%s)", j ? ";" : "", v[j].label, v[j].summary);
    fprintf(f, ".\n");
    // the speedups over static in one line per policy: range and geometric mean over the cells
    if (js >= 0 && n_v > 1) fprintf(f, "\n");
    for (int j = 0; js >= 0 && j < n_v; j++) {
        if (j == js) continue;
        double lo = INFINITY, hi = 0, logsum = 0;
        int n = 0;
        for (int i = 0; i < n_rows; i++) {
            if (isnan(rows[i].tps[j]) || isnan(rows[i].tps[js]) || !(rows[i].tps[js] > 0)) continue;
            double x = rows[i].tps[j] / rows[i].tps[js];
            lo = fmin(lo, x), hi = fmax(hi, x), logsum += log(x), n++;
        }
        if (n > 0)
            fprintf(f, "- `%s` over `static`: %.2fx to %.2fx, geometric mean %.2fx over %d cells\n", v[j].label, lo, hi,
                    exp(logsum / n), n);
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
            fprintf(f, " naive vs static | balance vs static |\n|---|---|");
            for (int j = 0; j < n_v + 2; j++) fprintf(f, "---:|");
            fprintf(f, "\n");
        }
        prev = &row->sc;
        char c[24];
        fprintf(f, "| %s | %s |", row->sc.dataset, sim_tokens_text(c, sizeof c, row->sc.context));
        for (int j = 0; j < n_v; j++) {
            if (isnan(row->tps[j])) fprintf(f, " failed |");
            else fprintf(f, " %.3f |", row->tps[j] / 1e6);
        }
        md_speedup(f, row, jn, js);
        md_speedup(f, row, jb, js);
        fprintf(f, "\n");
    }
    int n_fail = 0;
    for (int i = 0; i < n_rows; i++)
        for (int j = 0; j < n_v; j++) n_fail += isnan(rows[i].tps[j]);
    if (n_fail) {
        fprintf(f, "\n## Cells that did not run\n\n");
        for (int i = 0; i < n_rows; i++)
            for (int j = 0; j < n_v; j++)
                if (isnan(rows[i].tps[j])) fprintf(f, "- %s, %s: %s\n", rows[i].sc.name, v[j].label, rows[i].why[j]);
    }
    fprintf(f, "\n![speedup of balance over static](paper-grid.png)\n");
    return atomic_close(&af);
}

static int write_grid_plot(const char *dir, const GridRow *rows, int n_rows, const SimVariant *v, int n_v) {
    int js = find_label(v, n_v, "static"), jb = find_label(v, n_v, "balance");
    if (js < 0 || jb < 0) return 0;  // nothing to plot without both
    char gp[4096];
    snprintf(gp, sizeof gp, "%s/paper-grid.gp", dir);
    AtomicFile af;
    if (atomic_open(&af, gp) != 0) return -1;
    FILE *f = af.f;
    fprintf(f, "# speedup of balance over static per model, one panel per dataset (bytescale simulate --grid)\n");
    // one datablock per (dataset, model): the rows come model-major, dataset, context
    int block = 0;
    char titles[64][48];
    int ds_of[64];
    for (int i = 0; i < n_rows && block < 64; i++) {
        int same = i > 0 && !strcmp(rows[i - 1].sc.model, rows[i].sc.model) &&
                   !strcmp(rows[i - 1].sc.dataset, rows[i].sc.dataset);
        if (same) continue;
        fprintf(f, "$d%d << EOD\n", block);
        for (int k = i; k < n_rows && !strcmp(rows[k].sc.model, rows[i].sc.model) &&
                        !strcmp(rows[k].sc.dataset, rows[i].sc.dataset);
             k++)
            if (!isnan(rows[k].tps[jb]) && !isnan(rows[k].tps[js]) && rows[k].tps[js] > 0)
                fprintf(f, "%lld %.4f\n", (long long)(rows[k].sc.context >> 10), rows[k].tps[jb] / rows[k].tps[js]);
        fprintf(f, "EOD\n");
        snprintf(titles[block], sizeof titles[block], "%s", rows[i].sc.model);
        ds_of[block] = !strcmp(rows[i].sc.dataset, "github");
        block++;
    }
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0) gp_png(f, "paper-grid.png", 1400, 560);
        else gp_svg(f, "paper-grid.svg", 1400, 560);
        fprintf(f, "set multiplot layout 1,2\nset grid\nset logscale x 2\nset key bottom right box opaque\n");
        fprintf(f, "set yrange [0:*]\n");
        fprintf(f, "set offsets graph 0.05, graph 0.05, 0, 0\n");
        fprintf(f, "set xtics (\"256K\" 256, \"512K\" 512, \"1M\" 1024, \"2M\" 2048)\n");
        fprintf(f, "set xlabel \"context\"\nset ylabel \"tokens/s, balance / static\"\n");
        for (int ds = 0; ds < 2; ds++) {
            fprintf(f, "set title \"%s\"\nplot ", ds ? "GitHub" : "Byted");
            int first = 1;
            for (int b = 0; b < block; b++) {
                if (ds_of[b] != ds) continue;
                fprintf(f, "%s$d%d using 1:2 with linespoints lw 2 title \"%s\"", first ? "" : ", ", b, titles[b]);
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

int sim_grid_run(const SimVariant *v, int n_v, uint64_t seed, const char *hardware, const char *dir,
                 const char *command, int plot, FILE *log) {
    if (n_v < 1 || n_v > 16) return bs_fail("grid: 1 to 16 policies (got %d)", n_v);
    if (make_dirs(dir) != 0) return -1;
    int n_rows = scenario_grid_count();
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
    progress_start(&pr, "grid", (int64_t)n_rows * n_v);
    int64_t done = 0;
    SimOutcome out[16];
    int ok[16];
    for (int i = 0; i < n_rows; i++) {
        GridRow *row = &rows[i];
        if (scenario_get(i, &row->sc) != 0) break;
        if (hardware) snprintf(row->sc.hardware, sizeof row->sc.hardware, "%s", hardware);
        for (int j = 0; j < n_v; j++) row->tps[j] = NAN;
        if (run_point(&row->sc, seed, v, n_v, out, ok, row->why, &pr, &done, log) != 0) {
            for (int j = 0; j < n_v; j++) snprintf(row->why[j], sizeof row->why[j], "%s", bs_errmsg());
            if (log) fprintf(log, "%s: skipped: %s\n\n", row->sc.name, bs_errmsg());
            done += n_v;
            continue;
        }
        row->hdp_ranks = row->sc.gpus / (row->sc.tp * row->sc.pp);
        double base_tps = static_tps(out, ok, n_v);
        for (int j = 0; j < n_v; j++) {
            if (!ok[j]) continue;
            row->tps[j] = out[j].res.tokens_per_s;
            csv_row(af.f, row->sc.name, &out[j], base_tps);
        }
        free_point(out, ok, n_v);
    }
    progress_finish(&pr, done, NULL);
    int rc = atomic_close(&af);
    if (rc == 0) rc = write_grid_md(md, rows, n_rows, v, n_v, seed, command);
    if (rc == 0 && plot) rc = write_grid_plot(dir, rows, n_rows, v, n_v);
    if (rc == 0 && log) fprintf(log, "wrote %s, %s%s\n", md, csv, plot ? " and paper-grid.png / .svg" : "");
    free(rows);
    return rc;
}
