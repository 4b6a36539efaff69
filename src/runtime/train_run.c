// train_run.c: the whole run - steps, metrics lines, progress line, periodic checkpoints, the trace
// (train.h). Every rank runs the loop (steps and checkpoints are collective); rank 0 alone writes
// the metrics, the progress line and the checkpoint files.
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/progress.h"
#include "bytescale/timer.h"
#include "bytescale/train.h"
#include "runtime/train_internal.h"

// Checkpoints this run wrote, oldest first, so all but the newest ckpt_keep can be removed.
typedef struct {
    int64_t *steps;  // (keep,) a ring
    int keep, n, head;
} Kept;

static int save_checkpoint(Trainer *t, Kept *k, TrainSummary *sum) {
    const TrainConfig *c = &t->cfg;
    char path[TRAIN_PATH_MAX + 32];
    train_ckpt_path(path, sizeof path, c->ckpt_dir, t->step);
    double t0 = now_seconds();
    if (trainer_save(t, path) != 0) return bs_fail_ctx("checkpoint at step %lld", (long long)t->step);
    if (t->trace) rtrace_add(t->trace, "checkpoint", "data", t0, now_seconds(), t->step);
    snprintf(sum->last_ckpt, sizeof sum->last_ckpt, "%s", path);
    if (k->keep <= 0 || t->rank != 0) return 0;
    if (k->n == k->keep) {  // drop the oldest; the new one is safely on disk
        char old[TRAIN_PATH_MAX + 32];
        train_ckpt_path(old, sizeof old, c->ckpt_dir, k->steps[k->head]);
        if (unlink(old) != 0 && errno != ENOENT)
            return bs_fail("cannot remove old checkpoint %s: %s", old, strerror(errno));
        k->head = (k->head + 1) % k->keep;
        k->n--;
    }
    k->steps[(k->head + k->n) % k->keep] = t->step;
    k->n++;
    return 0;
}

int trainer_run(Trainer *t, TrainSummary *sum) {
    const TrainConfig *c = &t->cfg;
    memset(sum, 0, sizeof *sum);
    sum->first_step = sum->last_step = t->step;
    FILE *metrics = NULL;
    Kept kept = {.keep = c->ckpt_keep};
    // a resumed run with nothing left to do touches nothing: no metrics rewritten, no checkpoint
    if (t->step >= c->steps) return 0;
    int lead = t->rank == 0;  // the rank that writes files and the progress line
    // everything the run writes is checked and locked now, not found broken at the first checkpoint
    TrainPaths paths = {.ckpt_lock = -1, .metrics_lock = -1};
    if (lead && train_paths_open(&paths, c) != 0) return -1;
    if (kept.keep > 0 && !(kept.steps = bs_calloc((size_t)kept.keep, sizeof *kept.steps))) {
        train_paths_close(&paths);
        return -1;
    }
    if (lead && c->metrics[0] && train_metrics_open(&metrics, c->metrics, t->step > 0 ? t->step : -1) != 0) {
        free(kept.steps);
        train_paths_close(&paths);
        return -1;
    }
    RtTrace trace;
    if (rtrace_init(&trace, c->trace, t->rank, t->n_ranks, t->trace_origin) != 0) {
        free(kept.steps);
        if (metrics) fclose(metrics);
        train_paths_close(&paths);
        return bs_fail_ctx("--trace");
    }
    if (rtrace_on(&trace)) train_trace_attach(t, &trace);

    Progress pr;
    progress_start(&pr, "train", c->steps > t->step ? c->steps - t->step : 0);
    if (c->quiet || !lead) pr.quiet = 1;
    double recent[TRAIN_RECENT_STEPS];
    int64_t saved = -1;
    int rc = 0;
    while (rc == 0 && t->step < c->steps) {
        StepStats st;
        if (trainer_step(t, &st) != 0) {
            rc = -1;
            break;
        }
        if (metrics && train_metrics_write(metrics, &st) != 0) rc = bs_fail_ctx("%s", c->metrics);
        int64_t done = t->step - sum->first_step;
        if (done == 1) sum->first_loss = st.loss;
        sum->last_loss = st.loss;
        recent[(done - 1) % TRAIN_RECENT_STEPS] = st.loss;
        sum->tokens += st.tokens;
        sum->seconds += st.seconds;
        sum->last_step = t->step;
        char note[128];
        snprintf(note, sizeof note, "loss %.4f  lr %.2e  %.0f tok/s", st.loss, st.lr,
                 sum->seconds > 0 ? (double)sum->tokens / sum->seconds : 0.0);
        progress_update(&pr, done, note);
        if (rc == 0 && c->ckpt_dir[0] && c->ckpt_every > 0 && t->step % c->ckpt_every == 0) {
            rc = save_checkpoint(t, &kept, sum);
            saved = t->step;
        }
    }
    int64_t done = sum->last_step - sum->first_step;
    if (rc == 0 && c->ckpt_dir[0] && done > 0 && saved != t->step) rc = save_checkpoint(t, &kept, sum);
    int n_recent = done < TRAIN_RECENT_STEPS ? (int)done : TRAIN_RECENT_STEPS;
    for (int i = 0; i < n_recent; i++) sum->mean_last_loss += recent[i] / n_recent;
    char note[128];
    snprintf(note, sizeof note, "loss %.4f  %.0f tok/s", sum->last_loss,
             sum->seconds > 0 ? (double)sum->tokens / sum->seconds : 0.0);
    progress_finish(&pr, done, note);
    if (metrics && fclose(metrics) != 0 && rc == 0) rc = bs_fail("%s: closing: %s", c->metrics, strerror(errno));
    free(kept.steps);
    train_prefetch_stop(t);
    if (rtrace_on(&trace)) {
        train_trace_attach(t, NULL);
        // every rank's part on disk before rank 0 merges them (a failed run keeps its parts)
        if (rc == 0 && rtrace_write_part(&trace) != 0) rc = bs_fail_ctx("--trace");
        if (rc == 0 && comm_barrier(t->comm) != 0) rc = -1;
        if (rc == 0 && lead && rtrace_merge(c->trace, t->n_ranks) != 0) rc = bs_fail_ctx("--trace");
    }
    rtrace_free(&trace);
    train_paths_close(&paths);
    return rc;
}
