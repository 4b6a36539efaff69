// progress.c: a rate-limited progress line (see progress.h).
#include "bytescale/progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bytescale/timer.h"

void progress_start(Progress *p, const char *label, int64_t total) {
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->t_start = p->t_last = now_seconds();
    p->tty = isatty(fileno(stderr));
    p->quiet = progress_env_quiet();
}

static void fmt_duration(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e7) snprintf(buf, n, "?");
    else if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, n, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

static void draw(Progress *p, int64_t done, const char *note, int final) {
    double t = now_seconds(), el = t - p->t_start;
    char eta[32] = "", elapsed[32];
    fmt_duration(elapsed, sizeof elapsed, el);
    if (p->total > 0 && !final) {
        double left = done > 0 ? el * (double)(p->total - done) / (double)done : -1;
        char d[24];
        fmt_duration(d, sizeof d, left);
        snprintf(eta, sizeof eta, " eta %s", d);
    }
    char bar[24] = "";
    if (p->total > 0) {
        int w = 20, fill = (int)(w * (double)done / (double)p->total);
        if (fill > w) fill = w;
        bar[0] = '[';
        for (int i = 0; i < w; i++) bar[1 + i] = i < fill ? '#' : '.';
        bar[w + 1] = ']';
        bar[w + 2] = '\0';
        fprintf(stderr, "%s%s %s %lld/%lld %3.0f%% %s%s%s%s", p->tty ? "\r\033[K" : "", p->label, bar, (long long)done,
                (long long)p->total, 100.0 * (double)done / (double)p->total, elapsed, eta, note ? "  " : "",
                note ? note : "");
    } else {
        fprintf(stderr, "%s%s %lld %s%s%s", p->tty ? "\r\033[K" : "", p->label, (long long)done, elapsed,
                note ? "  " : "", note ? note : "");
    }
    if (!p->tty || final) fputc('\n', stderr);
    fflush(stderr);
    p->t_last = t;
}

void progress_update(Progress *p, int64_t done, const char *note) {
    if (p->quiet) return;
    double gap = p->tty ? 0.1 : 5.0;
    if (now_seconds() - p->t_last < gap) return;
    draw(p, done, note, 0);
}

void progress_finish(Progress *p, int64_t done, const char *note) {
    if (p->quiet) return;
    draw(p, done, note, 1);
}
