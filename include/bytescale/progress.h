// progress.h: one progress line on stderr for every long-running command.
//
// On a terminal the line redraws in place ("\r") at most 10 times a second; into a file or pipe
// it prints a plain line at most every 5 seconds, so logs stay readable. Shows done/total, percent,
// rate, ETA, and a caller-supplied note (loss, tokens/s, ...).
#ifndef BYTESCALE_PROGRESS_H
#define BYTESCALE_PROGRESS_H

#include <stdint.h>
#include <stdlib.h>

typedef struct {
    char label[48];
    int64_t total;      // units of work (steps, files, bytes); 0 = unknown
    double t_start;
    double t_last;      // last time a line was drawn
    int tty;            // stderr is a terminal
    int quiet;          // draw nothing (BS_QUIET=1 or set by the caller)
} Progress;

// BS_QUIET=1: scripts that start many runs set it to hide progress lines and one-time notes.
static inline int progress_env_quiet(void) {
    const char *q = getenv("BS_QUIET");
    return q && q[0] == '1';
}

void progress_start(Progress *p, const char *label, int64_t total);
// Redraw if enough time has passed. note may be NULL.
void progress_update(Progress *p, int64_t done, const char *note);
// Draw the final line and end it with a newline.
void progress_finish(Progress *p, int64_t done, const char *note);

#endif
