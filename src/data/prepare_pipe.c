// prepare_pipe.c: prepare's reader, workers and in-order writer (prepare_pipe.h).
//
// Chunks live in a ring of slots, each numbered by its place in the input (seq). A slot goes
// FREE -> READY (the reader filled it) -> BUSY (a worker took it) -> DONE (tokens ready) -> FREE
// (the writer wrote it). Workers take READY slots in seq order and the writer waits for seq order,
// so at most `slots` chunks are ever in memory. A failure anywhere sets `stop`: the writer reports
// the first failure in input order, so the error a run ends with does not depend on the timing.
#include "data/prepare_pipe.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/progress.h"
#include "bytescale/timer.h"
#include "data/jsonl.h"

enum { SLOT_FREE, SLOT_READY, SLOT_BUSY, SLOT_DONE };
enum { CHUNK_TEXT = 1 << 20, READ_STEP = 1 << 18, MSG_CAP = 1200 };

typedef struct {
    int state;
    int64_t seq;
    int64_t file;       // index into the files
    int jsonl;          // lines of a JSONL file; else the whole text of a one-document file
    int64_t line0;      // JSONL: the number of the chunk's first line, from 1
    char *text;         // the raw bytes (JSONL: whole lines)
    size_t n, cap;
    int64_t in_done;    // input bytes read once this chunk is written (progress)
    int read_failed;    // the reader failed after this chunk's text: msg says why
    // the worker's results
    Tokens ids;         // every document's tokens, back to back
    int64_t *doc_len, *doc_line;
    int64_t n_docs, cap_docs;
    int64_t n_skipped;
    int failed;
    char msg[MSG_CAP];  // the failure
    char skip_msg[PREPARE_SKIP_TEXT];  // skipping: the first few skipped lines, one a line
} Chunk;

typedef struct {
    const PipeConfig *cfg;
    Chunk *slots;
    int n_slots;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t next_work;  // the next seq a worker takes
    int64_t n_chunks;   // set by the reader when it is done: chunks 0..n_chunks-1 exist; -1 until then
    int stop;
    int64_t next_worker_id;
} Pipe;

// ---- the reader ------------------------------------------------------------------------------

static int is_stdin(const char *path) { return !strcmp(path, "-"); }

// A file as messages and the index name it.
static const char *shown(const PipeConfig *cfg, int64_t file) {
    return is_stdin(cfg->files[file]) ? cfg->stdin_name : cfg->files[file];
}

// Wait for slot seq's turn (FREE); NULL when the run stops.
static Chunk *slot_for_reader(Pipe *p, int64_t seq) {
    Chunk *c = &p->slots[seq % p->n_slots];
    pthread_mutex_lock(&p->mu);
    while (!p->stop && c->state != SLOT_FREE) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return p->stop ? NULL : c;
}

static void publish(Pipe *p, Chunk *c) {
    pthread_mutex_lock(&p->mu);
    c->state = SLOT_READY;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static int64_t count_lines(const char *s, size_t n) {
    int64_t k = 0;
    for (const char *q = s; (q = memchr(q, '\n', (size_t)(s + n - q))) != NULL; q++) k++;
    return k;
}

// The reader's carry: decompressed bytes not yet handed to a chunk.
typedef struct {
    char *buf;
    size_t n, cap;
    int64_t line;  // the number of buf's first line
} Carry;

// Hand carry[0, cut) to the next chunk: the chunk takes the carry's buffer and the carry keeps
// the rest in the chunk's old buffer (swapped, not copied, save the rest). -1 when the run stops,
// 1 out of memory (the error set).
static int emit_lines(Pipe *p, int64_t *seq, int64_t file, Carry *k, size_t cut, int64_t in_done) {
    Chunk *c = slot_for_reader(p, *seq);
    if (!c) return -1;
    size_t rest = k->n - cut, need = rest > READ_STEP ? rest : READ_STEP;
    if (c->cap < need) {
        char *b = bs_realloc(c->text, need);
        if (!b) return 1;
        c->text = b;
        c->cap = need;
    }
    memcpy(c->text, k->buf + cut, rest);
    char *tb = k->buf;
    size_t tcap = k->cap;
    k->buf = c->text, k->cap = c->cap, k->n = rest;
    c->text = tb, c->cap = tcap, c->n = cut;
    c->seq = (*seq)++, c->file = file, c->jsonl = 1, c->line0 = k->line, c->in_done = in_done, c->read_failed = 0;
    k->line += count_lines(c->text, cut);
    publish(p, c);
    return 0;
}

// A chunk that holds nothing but the reader's failure, at the line where it happened.
static int emit_failure(Pipe *p, int64_t *seq, int64_t file, int64_t line) {
    char msg[MSG_CAP];
    if (line > 0) snprintf(msg, sizeof msg, "%s:%lld: %s", shown(p->cfg, file), (long long)line, bs_errmsg());
    else snprintf(msg, sizeof msg, "%s", bs_errmsg());
    Chunk *c = slot_for_reader(p, *seq);
    if (!c) return -1;
    c->seq = (*seq)++, c->file = file, c->jsonl = 0, c->n = 0, c->read_failed = 1;
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    publish(p, c);
    return -1;
}

static int carry_grow(Carry *k, size_t need) {
    if (k->cap >= need) return 0;
    size_t cap = k->cap ? k->cap : 2 * READ_STEP;
    while (cap < need) cap *= 2;
    char *b = bs_realloc(k->buf, cap);
    if (!b) return -1;
    k->buf = b;
    k->cap = cap;
    return 0;
}

// A JSONL file, cut at line ends into chunks of about CHUNK_TEXT bytes (a longer line is a chunk
// of its own). Reading stops for the file at a read or decompression error, which becomes a chunk.
static int read_jsonl(Pipe *p, int64_t *seq, int64_t file, int64_t done_before) {
    InStream *in;
    if (instream_open(&in, is_stdin(p->cfg->files[file]) ? "/dev/stdin" : p->cfg->files[file]) != 0)
        return emit_failure(p, seq, file, 0);
    Carry k = {.line = 1};
    int eof = 0, rc = 0;
    while (rc == 0 && !(eof && k.n == 0)) {
        char *nl = k.n ? memrchr(k.buf, '\n', k.n) : NULL;
        if (!eof && (k.n < CHUNK_TEXT || !nl)) {
            size_t got = 0;
            if (carry_grow(&k, k.n + READ_STEP) != 0) rc = emit_failure(p, seq, file, 0);
            else if (instream_read(in, k.buf + k.n, READ_STEP, &got) != 0)
                rc = emit_failure(p, seq, file, k.line + count_lines(k.buf, k.n));
            k.n += got;
            eof = rc == 0 && got == 0;
            continue;
        }
        size_t cut = eof ? k.n : (size_t)(nl - k.buf) + 1;  // at the end: the last line, newline or not
        rc = emit_lines(p, seq, file, &k, cut, done_before + instream_offset(in));
        if (rc == 1) rc = emit_failure(p, seq, file, 0);
    }
    instream_close(in);
    free(k.buf);
    return rc;
}

// A one-document file: read whole, one chunk.
static int read_document(Pipe *p, int64_t *seq, int64_t file, int64_t in_done) {
    char *text;
    size_t size;
    if (file_read_all(p->cfg->files[file], &text, &size) != 0) return emit_failure(p, seq, file, 0);
    Chunk *c = slot_for_reader(p, *seq);
    if (!c) {
        free(text);
        return -1;
    }
    free(c->text);
    c->text = text, c->n = size, c->cap = size + 1;
    c->seq = (*seq)++, c->file = file, c->jsonl = 0, c->line0 = 0, c->in_done = in_done, c->read_failed = 0;
    publish(p, c);
    return 0;
}

static void *reader_main(void *arg) {
    Pipe *p = arg;
    int64_t seq = 0, done = 0;
    for (int64_t f = 0; f < p->cfg->n_files; f++) {
        struct stat st;
        int64_t size = stat(p->cfg->files[f], &st) == 0 ? (int64_t)st.st_size : 0;
        int jsonl = jsonl_is_jsonl(p->cfg->files[f]) || is_stdin(p->cfg->files[f]);
        int rc = jsonl ? read_jsonl(p, &seq, f, done) : read_document(p, &seq, f, done + size);
        if (rc != 0) break;
        done += size;
    }
    pthread_mutex_lock(&p->mu);
    p->n_chunks = seq;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

// ---- the workers -----------------------------------------------------------------------------

static int doc_push(Chunk *c, int64_t len, int64_t line) {
    if (c->n_docs == c->cap_docs) {
        int64_t cap = c->cap_docs ? 2 * c->cap_docs : 256;
        int64_t *a = bs_realloc(c->doc_len, (size_t)cap * sizeof *a), *b = a ? bs_realloc(c->doc_line, (size_t)cap * sizeof *b) : NULL;
        if (a) c->doc_len = a;
        if (!a || !b) return -1;
        c->doc_line = b;
        c->cap_docs = cap;
    }
    c->doc_len[c->n_docs] = len;
    c->doc_line[c->n_docs++] = line;
    return 0;
}

// One document's text: its tokens, then the end-of-document token when the text is not empty.
static int encode_doc(Tokenizer *tok, Chunk *c, const char *text, size_t n, int64_t line) {
    int64_t before = c->ids.n;
    if (tokenizer_encode(tok, text, n, &c->ids) != 0) return -1;
    if (n > 0 && tokenizer_eot(tok) >= 0 && tokens_push(&c->ids, (uint32_t)tokenizer_eot(tok)) != 0) return -1;
    return doc_push(c, c->ids.n - before, line);
}

static int encode_lines(const PipeConfig *cfg, Tokenizer *tok, Chunk *c, JsonlText *field) {
    const char *path = shown(cfg, c->file), *s = c->text, *end = c->text + c->n;
    char why[600];
    for (int64_t line = c->line0; s < end; line++) {
        const char *eol = memchr(s, '\n', (size_t)(end - s));
        if (!eol) eol = end;
        int rc = jsonl_field(s, (size_t)(eol - s), cfg->text_field, field, why, sizeof why);
        s = eol + 1;
        if (rc != 0 && !why[0]) return -1;  // out of memory
        if (rc != 0 && !cfg->skip_bad) {
            snprintf(c->msg, sizeof c->msg, "%s:%lld: %s", path, (long long)line, why);
            c->failed = 1;
            return 0;
        }
        if (rc != 0) {
            size_t used = strlen(c->skip_msg);
            if (c->n_skipped++ < PREPARE_SKIP_SHOWN)
                snprintf(c->skip_msg + used, sizeof c->skip_msg - used, "%s:%lld: %s\n", path, (long long)line, why);
            continue;
        }
        if (encode_doc(tok, c, field->s, field->n, line) != 0) return -1;
    }
    return 0;
}

static void work_chunk(const PipeConfig *cfg, Tokenizer *tok, Chunk *c, JsonlText *field) {
    c->ids.n = 0, c->n_docs = 0, c->n_skipped = 0, c->failed = 0, c->skip_msg[0] = '\0';
    if (c->read_failed) return;
    int rc = c->jsonl ? encode_lines(cfg, tok, c, field) : encode_doc(tok, c, c->text, c->n, 0);
    if (rc != 0) {
        snprintf(c->msg, sizeof c->msg, "%s: %s", shown(cfg, c->file), bs_errmsg());
        c->failed = 1;
    }
}

// The next chunk for a worker, the mutex held: NULL when there is none left or the run stops.
static Chunk *take_work(Pipe *p) {
    for (;;) {
        if (p->stop || (p->n_chunks >= 0 && p->next_work >= p->n_chunks)) return NULL;
        Chunk *c = &p->slots[p->next_work % p->n_slots];
        if (c->state == SLOT_READY && c->seq == p->next_work) {
            c->state = SLOT_BUSY;
            p->next_work++;
            pthread_cond_broadcast(&p->cv);  // the next READY slot is another worker's to take
            return c;
        }
        pthread_cond_wait(&p->cv, &p->mu);
    }
}

static void *worker_main(void *arg) {
    Pipe *p = arg;
    JsonlText field = {0};
    pthread_mutex_lock(&p->mu);
    Tokenizer *tok = p->cfg->toks[p->next_worker_id++];
    for (Chunk *c; (c = take_work(p)) != NULL;) {
        pthread_mutex_unlock(&p->mu);
        work_chunk(p->cfg, tok, c, &field);
        pthread_mutex_lock(&p->mu);
        c->state = SLOT_DONE;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    free(field.s);
    return NULL;
}

// ---- the writer (the calling thread) -----------------------------------------------------------

typedef struct {
    int64_t *lens;
    int64_t n, cap;
} WriteState;

static int write_chunk(const PipeConfig *cfg, Chunk *c, ShardWriter *w, PrepareStats *st, WriteState *ws) {
    if (c->read_failed || c->failed) return bs_fail("%s", c->msg);
    // the first PREPARE_SKIP_SHOWN skipped lines of the run, in input order
    for (const char *m = c->skip_msg; *m && st->n_skip_shown < PREPARE_SKIP_SHOWN; st->n_skip_shown++) {
        const char *nl = strchr(m, '\n');
        size_t used = strlen(st->skip_shown), len = (size_t)(nl - m) + 1;
        if (used + len < sizeof st->skip_shown) memcpy(st->skip_shown + used, m, len), st->skip_shown[used + len] = '\0';
        m = nl + 1;
    }
    st->n_skipped += c->n_skipped;
    if (ws->n + c->n_docs > ws->cap) {
        int64_t cap = ws->cap ? ws->cap : 4096;
        while (cap < ws->n + c->n_docs) cap *= 2;
        int64_t *l = bs_realloc(ws->lens, (size_t)cap * sizeof *l);
        if (!l) return -1;
        ws->lens = l, ws->cap = cap;
    }
    const char *path = shown(cfg, c->file);
    char source[4200];
    int64_t at = 0;
    for (int64_t d = 0; d < c->n_docs; d++) {
        if (c->jsonl) snprintf(source, sizeof source, "%s:%lld", path, (long long)c->doc_line[d]);
        if (shard_writer_add(w, c->ids.ids + at, c->doc_len[d], c->jsonl ? source : path) != 0) return -1;
        at += c->doc_len[d];
        ws->lens[ws->n++] = c->doc_len[d];
    }
    st->n_docs += c->n_docs;
    st->n_tokens += c->ids.n;
    st->n_bytes += (int64_t)c->n;
    return 0;
}

static int write_all(Pipe *p, ShardWriter *w, PrepareStats *st, WriteState *ws) {
    Progress prog;
    progress_start(&prog, "prepare", p->cfg->in_bytes);
    prog.quiet |= p->cfg->quiet;
    double t0 = now_seconds();
    int rc = 0;
    for (int64_t seq = 0; rc == 0; seq++) {
        Chunk *c = &p->slots[seq % p->n_slots];
        pthread_mutex_lock(&p->mu);
        while (!(c->state == SLOT_DONE && c->seq == seq) && !(p->n_chunks >= 0 && seq >= p->n_chunks))
            pthread_cond_wait(&p->cv, &p->mu);
        int end = c->state != SLOT_DONE || c->seq != seq;
        pthread_mutex_unlock(&p->mu);
        if (end) break;
        rc = write_chunk(p->cfg, c, w, st, ws);
        int64_t in_done = c->in_done;  // the slot is the reader's again once freed
        pthread_mutex_lock(&p->mu);
        c->state = SLOT_FREE;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        char note[128];
        double el = now_seconds() - t0;
        snprintf(note, sizeof note, "%lld docs  %lld tokens  %.1f MB/s of text", (long long)st->n_docs,
                 (long long)st->n_tokens, el > 0 ? (double)st->n_bytes / 1e6 / el : 0.0);
        if (rc == 0) progress_update(&prog, in_done, note);
    }
    if (rc == 0) {
        char note[96];
        snprintf(note, sizeof note, "%lld docs  %lld tokens", (long long)st->n_docs, (long long)st->n_tokens);
        progress_finish(&prog, p->cfg->in_bytes, note);
    }
    return rc;
}

int prepare_pipe_run(const PipeConfig *cfg, ShardWriter *w, PrepareStats *stats, int64_t **lens) {
    *lens = NULL;
    Pipe p = {.cfg = cfg, .n_slots = 2 * cfg->threads + 2, .n_chunks = -1};
    p.slots = bs_calloc((size_t)p.n_slots, sizeof *p.slots);
    if (!p.slots) return -1;
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    pthread_t reader, *workers = bs_calloc((size_t)cfg->threads, sizeof *workers);
    int n_started = 0, reader_started = 0, rc = workers ? 0 : -1;
    if (rc == 0) reader_started = pthread_create(&reader, NULL, reader_main, &p) == 0;
    for (int i = 0; rc == 0 && reader_started && i < cfg->threads; i++)
        if (pthread_create(&workers[i], NULL, worker_main, &p) == 0) n_started++;
    if (rc == 0 && (!reader_started || n_started == 0)) rc = bs_fail("prepare: cannot start threads");
    WriteState ws = {0};
    if (rc == 0) rc = write_all(&p, w, stats, &ws);
    // stop whoever is still running (a failure, or nothing left): they leave their loops
    pthread_mutex_lock(&p.mu);
    p.stop = 1;
    pthread_cond_broadcast(&p.cv);
    pthread_mutex_unlock(&p.mu);
    if (reader_started) pthread_join(reader, NULL);
    for (int i = 0; i < n_started; i++) pthread_join(workers[i], NULL);
    for (int i = 0; i < p.n_slots; i++) {
        free(p.slots[i].text);
        tokens_free(&p.slots[i].ids);
        free(p.slots[i].doc_len);
        free(p.slots[i].doc_line);
    }
    free(p.slots);
    free(workers);
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.cv);
    if (rc != 0) {
        free(ws.lens);
        return -1;
    }
    *lens = ws.lens;
    return 0;
}
