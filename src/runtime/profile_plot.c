// profile_plot.c: the layer fit as a picture (profile.h, `bytescale profile --plot`): a gnuplot
// script beside its PNG and SVG, the measured medians with min-max bars against the fit and the
// `cpu` profile's line.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bytescale/fileio.h"
#include "bytescale/scenario.h"
#include "profile_internal.h"

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

int profile_plot(const Profile *p, const char *prefix) {
    char gp[PROFILE_PATH_MAX + 8], png[PROFILE_PATH_MAX + 8], svg[PROFILE_PATH_MAX + 8];
    snprintf(gp, sizeof gp, "%s.gp", prefix);
    snprintf(png, sizeof png, "%s.png", prefix);
    snprintf(svg, sizeof svg, "%s.svg", prefix);
    const CostModel *cm = &p->cm, *d = &p->derived;
    AtomicFile af;
    if (atomic_open(&af, gp) != 0) return -1;
    FILE *f = af.f;
    fprintf(f, "# %s: bytescale profile, model %s: one layer's forward + backward time, measured (median, min-max "
               "bars) and fitted\n# (written by bytescale profile --plot; run from this directory)\n",
            base_name(prefix), p->cfg.model->name);
    for (int held = 0; held < 2; held++) {
        fprintf(f, "$%s << EOD\n", held ? "held" : "fit");  // s, median ms, min ms, max ms
        for (int i = 0; i < p->n_pts; i++) {
            const ProfilePoint *pt = &p->pts[i];
            if (pt->held_out != held) continue;
            double lo = INFINITY, hi = -INFINITY;
            for (int j = 0; j < pt->n_samples; j++) lo = fmin(lo, pt->samples[j]), hi = fmax(hi, pt->samples[j]);
            fprintf(f, "%lld %.6g %.6g %.6g\n", (long long)pt->s, 1e3 * pt->measured, 1e3 * fmax(lo, 1e-9), 1e3 * hi);
        }
        fprintf(f, "EOD\n");
    }
    // cost_layer_time: one attention block, so its floor attn_step on top of layer_const
    fprintf(f, "fit(x) = 1e3 * (%.17g * x * (x + 1) / 2 + %.17g * x + %.17g)\n", cm->attn_pair, cm->lin_token,
            cm->layer_const + cm->attn_step);
    fprintf(f, "cpu(x) = 1e3 * (%.17g * x * (x + 1) / 2 + %.17g * x + %.17g)\n", d->attn_pair, d->lin_token,
            d->layer_const + d->attn_step);
    int n_held = 0;
    for (int i = 0; i < p->n_pts; i++) n_held += p->pts[i].held_out;
    double lo = (double)p->pts[0].s / 1.25, hi = (double)p->pts[p->n_pts - 1].s * 1.25;
    fprintf(f, "set title \"%s: one layer, forward + backward (%d rank%s, %s)\"\n", p->cfg.model->name, p->n_ranks,
            p->n_ranks > 1 ? "s" : "", p->date);
    fprintf(f, "set logscale xy\nset grid\nset key top left\nset samples 200\nset xrange [%g:%g]\n", lo, hi);
    fprintf(f, "set xlabel \"sequence length s (tokens)\"\nset ylabel \"ms per layer\"\nset xtics (");
    for (int i = 0; i < p->n_pts; i++) {  // the measured lengths: a log axis over a few octaves has few tics
        int64_t x = p->pts[i].s;
        if (x >= 1024 && x % 1024 == 0)
            fprintf(f, "%s\"%lldK\" %lld", i ? ", " : "", (long long)x / 1024, (long long)x);
        else if (x >= 1024) fprintf(f, "%s\"%.1fK\" %lld", i ? ", " : "", (double)x / 1024, (long long)x);
        else fprintf(f, "%s\"%lld\" %lld", i ? ", " : "", (long long)x, (long long)x);
    }
    fprintf(f, ")\n");
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, \"pngcairo\") > 0) { set terminal pngcairo size 800,500 noenhanced } "
               "else { set terminal png size 800,500 noenhanced }\n");
    fprintf(f, "set output \"%s\"\n", base_name(png));
    fprintf(f, "plot fit(x) with lines lw 2 lc rgb \"#08519c\" title \"fit: T(s) = %.3g s^2 + %.3g s + %.3g\", \\\n",
            cm->attn_pair / 2, cm->lin_token + cm->attn_pair / 2, cm->layer_const + cm->attn_step);
    fprintf(f, "     cpu(x) with lines dt 2 lc rgb \"#969696\" title \"cpu profile (derived, not measured)\", \\\n");
    fprintf(f, "     $fit using 1:2:3:4 with yerrorbars pt 7 lc rgb \"#e6550d\" title \"measured (fitted)\"%s\n",
            n_held ? ", \\" : "");
    if (n_held)
        fprintf(f, "     $held using 1:2:3:4 with yerrorbars pt 6 ps 1.5 lc rgb \"#31a354\" title \"measured (held "
                   "out)\"\n");
    fprintf(f, "set terminal svg size 800,500 noenhanced\nset output \"%s\"\nreplot\n", base_name(svg));
    if (atomic_close(&af) != 0) return -1;
    return sim_gnuplot(gp);
}
