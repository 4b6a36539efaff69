// trace.c: a Chrome-trace JSON of one simulated step (open it in Perfetto or chrome://tracing).
//
// One process per HDP rank ("rank 12"), one thread per pipeline stage. Each operation is drawn as
// consecutive slices on its track: its compute, then the ring communication and offload copies
// it could not hide (the simulator knows how long they are, not where inside the operation they
// fell), with gaps drawn as "wait". The step ends with the gradient sync and the optimizer.
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/sim.h"

typedef struct {
    FILE *f;
    int first;
} Writer;

static void event(Writer *w, const char *name, const char *cat, double t0, double dur, int pid, int tid,
                  const char *args) {
    if (dur < 1e-9) return;  // below the trace's resolution (ns): float noise, not an event
    fprintf(w->f,
            "%s\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,"
            "\"tid\":%d%s%s}",
            w->first ? "" : ",", name, cat, t0 * 1e6, dur * 1e6, pid, tid, args ? ",\"args\":" : "", args ? args : "");
    w->first = 0;
}

static void meta(Writer *w, const char *what, int pid, int tid, const char *name) {
    fprintf(w->f, "%s\n{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
            w->first ? "" : ",", what, pid, tid, name);
    w->first = 0;
}

static void rank_track(Writer *w, const SimResult *r, const Plan *p, int rank, int stage) {
    int res = rank * r->pp + stage;
    char label[64], args[160];
    double t = 0;
    for (int32_t k = r->res_begin[res]; k < r->res_begin[res + 1]; k++) {
        const SimOp *op = &r->ops[r->res_ops[k]];
        const Item *it = &p->items[op->item];
        event(w, "wait", "wait", t, op->start - t, rank, stage, NULL);
        snprintf(label, sizeof label, "%s item %d%s", op->bwd ? "bwd" : "fwd", op->item,
                 it->n_ranks > 1 ? " (ring)" : "");
        snprintf(args, sizeof args, "{\"item\":%d,\"ring_ranks\":%d,\"tokens_per_rank\":%lld,\"offload\":%.3f}",
                 op->item, it->n_ranks, (long long)(it->tokens / it->n_ranks), it->offload);
        double t0 = op->start;
        event(w, label, "compute", t0, op->cost.compute, rank, stage, args);
        t0 += op->cost.compute;
        event(w, "comm (exposed: ring, TP all-reduce)", "comm", t0, op->cost.comm, rank, stage, NULL);
        t0 += op->cost.comm;
        event(w, "offload (exposed)", "offload", t0, op->cost.offload, rank, stage, NULL);
        t = t0 + op->cost.offload;
    }
    double s0 = r->stage_sync_start[stage], s1 = s0 + r->stage_sync[stage];
    event(w, "wait", "wait", t, s0 - t, rank, stage, NULL);
    event(w, "gradient sync (ZeRO-1)", "sync", s0, r->stage_sync[stage], rank, stage, NULL);
    event(w, "optimizer", "compute", s1, r->optimizer_time, rank, stage, NULL);
    event(w, "wait", "wait", s1 + r->optimizer_time, r->step_time - s1 - r->optimizer_time, rank, stage, NULL);
}

int sim_trace_write(const SimResult *r, const Plan *p, const char *path, int max_ranks) {
    if (max_ranks <= 0) max_ranks = 64;
    int n = r->n_ranks < max_ranks ? r->n_ranks : max_ranks;
    AtomicFile af;
    if (atomic_open(&af, path) != 0) return -1;
    Writer w = {af.f, 1};
    fputc('[', af.f);
    for (int j = 0; j < n; j++) {
        // evenly spaced sample, first and last rank included (one rank: the first)
        int rank = n == r->n_ranks || n == 1 ? j : (int)((double)j * (r->n_ranks - 1) / (n - 1) + 0.5);
        char name[48];
        snprintf(name, sizeof name, "rank %d", rank);
        meta(&w, "process_name", rank, 0, name);
        for (int s = 0; s < r->pp; s++) {
            snprintf(name, sizeof name, "stage %d", s);
            meta(&w, "thread_name", rank, s, name);
            rank_track(&w, r, p, rank, s);
        }
    }
    fputs("\n]\n", af.f);
    return atomic_close(&af);
}
