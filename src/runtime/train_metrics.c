// train_metrics.c: the metrics file, one JSON object per step (JSONL), kept clean across a resume.
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/train.h"

// The step of one metrics line, or -1 when the line is not a complete step object (a crash in the
// middle of a write leaves such a line at the end).
static int64_t line_step(const char *line, size_t n) {
    cJSON *o = cJSON_ParseWithLength(line, n);
    if (!o) return -1;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
    // range-checked before the conversion: a damaged line may hold any number (1e300 would be UB)
    int64_t step = cJSON_IsNumber(s) && s->valuedouble >= 0 && s->valuedouble < 9e18 ? (int64_t)s->valuedouble : -1;
    cJSON_Delete(o);
    return step;
}

// Rewrite path with only its lines up to step keep_through (atomically: a crash now loses nothing).
// A damaged line (a crash mid-write, a stray edit) costs only itself; the lines after it stay.
static int keep_lines(const char *path, int64_t keep_through) {
    char *text;
    size_t size;
    FILE *probe = fopen(path, "rb");
    if (!probe) return errno == ENOENT ? 0 : bs_fail("%s: cannot open: %s", path, strerror(errno));
    fclose(probe);
    if (file_read_all(path, &text, &size) != 0) return -1;
    size_t kept = 0;  // the kept lines are moved down in place
    for (size_t at = 0; at < size;) {
        char *nl = memchr(text + at, '\n', size - at);
        if (!nl) break;  // an unfinished last line
        size_t len = (size_t)(nl - (text + at)) + 1;
        int64_t step = line_step(text + at, len - 1);
        if (step >= 0 && step <= keep_through) {  // past the checkpoint, or damaged: dropped
            memmove(text + kept, text + at, len);
            kept += len;
        }
        at += len;
    }
    int rc = kept == size ? 0 : file_write_atomic(path, text, kept);
    free(text);
    return rc;
}

int train_metrics_open(FILE **out, const char *path, int64_t keep_through) {
    *out = NULL;
    char dir[TRAIN_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {  // the file's directory, made if needed
        *slash = '\0';
        if (make_dirs(dir) != 0) return bs_fail_ctx("metrics");
    }
    if (keep_through < 0) {
        if (file_write_atomic(path, "", 0) != 0) return bs_fail_ctx("metrics");
    } else if (keep_lines(path, keep_through) != 0) {
        return bs_fail_ctx("metrics");
    }
    FILE *f = fopen(path, "a");
    if (!f) return bs_fail("metrics: cannot open %s for appending: %s", path, strerror(errno));
    setvbuf(f, NULL, _IOLBF, 0);  // each step's line reaches the file when it is written
    *out = f;
    return 0;
}

// JSON has no NaN or infinity: a diverged value is written as null.
static const char *num(char *buf, size_t cap, double x) {
    if (!isfinite(x)) snprintf(buf, cap, "null");
    else snprintf(buf, cap, "%.9g", x);
    return buf;
}

int train_metrics_write(FILE *f, const StepStats *s) {
    char loss[32], lr[32], norm[32], clip[32];
    int n = fprintf(f,
                    "{\"step\":%lld,\"loss\":%s,\"lr\":%s,\"grad_norm\":%s,\"clip_scale\":%s,\"tokens\":%lld,"
                    "\"targets\":%lld,\"seqs\":%lld,\"longest\":%lld,\"items\":%d,\"plan_items\":%d,\"plan_rings\":%d,"
                    "\"epoch\":%lld,\"est_seconds\":%.6g,\"seconds\":%.6g,\"tokens_per_s\":%.6g,\"sync_exposed\":%.6g,"
                    "\"data_wait\":%.6g",
                    (long long)s->step, num(loss, sizeof loss, s->loss), num(lr, sizeof lr, s->lr),
                    num(norm, sizeof norm, s->grad_norm), num(clip, sizeof clip, s->clip_scale), (long long)s->tokens,
                    (long long)s->targets, (long long)s->seqs, (long long)s->longest, s->items, s->n_items, s->n_rings,
                    (long long)s->epoch, s->est_seconds, s->seconds, s->tokens_per_s, s->sync_exposed, s->data_wait);
    // every rank's share: where its time went, and its throughput over the step
    if (n >= 0 && s->n_ranks > 0 && s->ranks) {
        n = fprintf(f, ",\"ranks\":[");
        for (int r = 0; r < s->n_ranks && n >= 0; r++) {
            const RankTimes *t = &s->ranks[r];
            n = fprintf(f,
                        "%s{\"rank\":%d,\"compute\":%.6g,\"comm\":%.6g,\"wait\":%.6g,\"items\":%d,\"rings\":%d,"
                        "\"tokens\":%lld,\"tokens_per_s\":%.6g,\"ring_bytes\":%.6g,\"act_peak_bytes\":%.0f,"
                        "\"offload_bytes\":%.0f,\"offload_wait\":%.6g,\"load_bytes\":%.0f,\"load_seconds\":%.6g,"
                        "\"core_share\":%.3f,\"stage\":%d,\"tp_rank\":%d,\"hdp_rank\":%d,\"p2p_wait\":%.6g,"
                        "\"p2p_bytes\":%.0f,\"bubble\":%.4f,\"tp_seconds\":%.6g,\"tp_total_seconds\":%.6g,\"fetch_bytes\":%.0f}",
                        r ? "," : "", r, t->compute, t->comm, t->wait, t->items, t->rings, (long long)t->tokens,
                        s->seconds > 0 ? (double)t->tokens / s->seconds : 0.0, t->ring_bytes, t->act_peak_bytes,
                        t->offload_bytes, t->offload_wait, t->load_bytes, t->load_seconds, t->core_share, t->stage,
                        t->tp_rank, t->hdp_rank, t->p2p_wait, t->p2p_bytes,
                        s->seconds > 0 ? t->p2p_wait / s->seconds : 0.0, t->tp_seconds,
                        t->tp_total_seconds, t->fetch_bytes);
        }
        if (n >= 0) n = fprintf(f, "]");
    }
    if (n >= 0) n = fprintf(f, "}\n");
    if (n < 0 || ferror(f)) return bs_fail("metrics: write failed: %s", strerror(errno));
    return 0;
}
