// rtrace.h: the training run's timeline, one track per rank (Chrome trace JSON, Perfetto).
//
// Each rank records what it did and when ("pack", "ring fwd block", "ring wait", "grad sync") into
// its own RtTrace, in memory and without locks or communication, so tracing costs a store per
// event. At the end every rank writes its events to a part file next to the trace, and rank 0
// merges the parts into ONE JSON file with a track per rank, which opens in Perfetto
// (ui.perfetto.dev) or chrome://tracing. Parts go through the file system rather than MPI so the
// merge works the same on one process and on many, and a rank that crashed still leaves a clear
// "part missing" error instead of a hang.
#ifndef BYTESCALE_RTRACE_H
#define BYTESCALE_RTRACE_H

#include <stdint.h>

typedef struct {
    const char *name;   // static string: "pack", "ring", "ring fwd block", "ring wait", "grad sync", ...
    const char *cat;    // static string category: "compute", "comm", "wait", "data", "step"
    double t0, t1;      // seconds (now_seconds() clock, include/bytescale/timer.h)
    int64_t arg;        // one integer argument shown in the viewer (item index, step, bytes); -1 = none
} RtEvent;

typedef struct {
    int rank, n_ranks;
    double origin;          // subtracted from every time (the run's start, aligned across ranks by the caller)
    RtEvent *ev;
    int64_t n, cap;
    int64_t max_events;     // stop recording (and count drops) beyond this many; default 2,000,000
    int64_t dropped;
    char path[1024];        // the final trace file ("" = tracing off)
} RtTrace;

#define RTRACE_DEFAULT_MAX_EVENTS 2000000

// path "" or NULL => off (all calls become no-ops). -1 + error for a bad rank or a too-long path.
int rtrace_init(RtTrace *t, const char *path, int rank, int n_ranks, double origin);
void rtrace_free(RtTrace *t);
static inline int rtrace_on(const RtTrace *t) { return t && t->path[0]; }
// Record one event. No-op when off; never fails: beyond max_events or out of memory the event is
// dropped and counted (the count shows in the merged file), so tracing can't break a run.
void rtrace_add(RtTrace *t, const char *name, const char *cat, double t0, double t1, int64_t arg);
// Write this rank's events to "<path>.rank<R>.part" (atomically: temp + rename). 0 when off.
// -1 + error.
int rtrace_write_part(const RtTrace *t);
// On rank 0, after every rank's part exists: merge all n_ranks parts into ONE JSON file at path
// (atomically), {"traceEvents":[...], "displayTimeUnit":"ms", "otherData":{...}}, complete events
// ("ph":"X", ts/dur in microseconds, pid 0, tid = rank) plus "M" metadata events naming each
// track "rank R" (thread_name) and sorting them by rank (thread_sort_index), then delete the parts.
// A missing or damaged part is an error naming the file; the final file is then not written.
int rtrace_merge(const char *path, int n_ranks);

#endif
