// loader.c: the remote data loader's three roles (loader.h, docs/loader.md).
//
// Messages, all on the loader's communicator (a duplicate of the world):
//   META   server -> scheduler, once: int64 header (status, n_docs, first, end, vocab, tokenizer,
//          width, n_shards, n_tokens), per shard (n_tokens, crc, base), per document of the part
//          (shard, offset, len, start); status < 0: the text of the error instead. A server of text
//          files sends n_tokens and every start as -1: the scheduler places the documents
//   BASE   scheduler -> server, once: int64 the global offset of the part's first document, the
//          number of fetching clients f, then their f world ranks (only they ask, docs/loader.md)
//   REQ    client -> server, once per step: int64 k, then k ranges (doc, src, n): tokens
//          [src, src + n) of document doc
//   REPLY  server -> client: int64 status and k, int64 got of every range, then the tokens back to
//          back (uint32); status < 0: an error text instead
//   ROWS   a tp group's fetching client -> the group's other members, once per step: int64 status
//          and k, per range (doc, src, got), then the tokens back to back; status < 0: an error text
//   DONE   fetching client -> server: this client will ask nothing more
// Nothing here blocks in MPI: a blocking MPI call spins on its core, and a data server or a
// waiting prefetch thread shares its core with training. Waits poll with a short sleep instead.
#include "bytescale/loader.h"

#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/prepare.h"
#include "bytescale/tokenizer.h"

enum { TAG_META = 7101, TAG_REQ = 7102, TAG_REPLY = 7103, TAG_DONE = 7104, TAG_BASE = 7105, TAG_ROWS = 7106 };
enum { META_HEAD = 9, ERR_TEXT = 1024 };

static MPI_Comm loader_comm(void) { return *(MPI_Comm *)comm_mpi_loader_handle(); }

// Sleep a little, longer the longer nothing has come: a wait costs (almost) no core. While requests
// come one after another (a client reading a step's rows) an answer is at most ~10 us late; a
// server idle for longer (~20 ms) polls every 100 us.
static void backoff(int *spins) {
    long ns = *spins < 50 ? 0 : *spins < 2000 ? 10000 : 100000;
    (*spins)++;
    if (ns > 0) nanosleep(&(struct timespec){0, ns}, NULL);
}

// Wait for a message with this tag from src (MPI_ANY_SOURCE: any) without spinning; its status.
static int probe(int src, int tag, MPI_Status *st) {
    int flag = 0, spins = 0;
    while (!flag) {
        int err = MPI_Iprobe(src, tag, loader_comm(), &flag, st);
        if (err != MPI_SUCCESS) return bs_fail("data loader: MPI_Iprobe failed (%d)", err);
        if (!flag) backoff(&spins);
    }
    return 0;
}

// ---- what a server holds ----------------------------------------------------------------------------

// The first of n_docs documents whose start reaches `at`; start(d) ascends.
static int64_t first_from(int64_t (*start)(const void *, int64_t), const void *ctx, int64_t n_docs, double at) {
    int64_t lo = 0, hi = n_docs;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((double)start(ctx, mid) >= at) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

// Part i of n: the documents whose first token (or byte) lies in the i-th n-th of `total`.
static void split(int64_t (*start)(const void *, int64_t), const void *ctx, int64_t n_docs, int64_t total, int i,
                  int n, int64_t *first, int64_t *end) {
    *first = i == 0 ? 0 : first_from(start, ctx, n_docs, (double)total * i / n);
    *end = i + 1 >= n ? n_docs : first_from(start, ctx, n_docs, (double)total * (i + 1) / n);
}

static int64_t index_start(const void *ctx, int64_t d) { return ((const DocIndex *)ctx)->docs[d].start; }
static int64_t array_at(const void *ctx, int64_t d) { return ((const int64_t *)ctx)[d]; }

void loader_part(const DocIndex *ix, int i, int n, int64_t *first, int64_t *end) {
    split(index_start, ix, ix->n_docs, ix->n_tokens, i, n, first, end);
}

// A server's documents [first, end): of a prepared dataset, or of a directory of text files it
// tokenizes itself, on the fly, keeping the most recently used documents' tokens in a bounded cache.
typedef struct {
    LoaderServeConfig cfg;
    int text;
    int64_t n_docs, first, end;
    Dataset ds;          // prepared
    char **files;        // text: (n_docs,) the corpus's files, in prepare's order
    Tokenizer *tok;
    int64_t *len;        // text: (end - first,) tokens of each of its documents
    int64_t *start;      // text: (end - first,) global offset of each (once the scheduler sent the base)
    Tokens *cache;       // text: (end - first,) tokenized documents; ids NULL = not held
    uint64_t *used;      // text: (end - first,) last use, for eviction
    uint64_t tick;
    int64_t cached;      // bytes of tokens held
} Part;

static void part_free(Part *p) {
    if (p->ds.index.docs) dataset_close(&p->ds);
    for (int64_t d = 0; p->files && d < p->n_docs; d++) free(p->files[d]);
    for (int64_t d = 0; p->cache && d < p->end - p->first; d++) tokens_free(&p->cache[d]);
    free(p->files), free(p->len), free(p->start), free(p->cache), free(p->used);
    tokenizer_free(p->tok);
    memset(p, 0, sizeof *p);
}

// Text document d (local index) tokenized, through the cache. A file whose tokens changed since
// the job started is an error: its length is in every plan already.
static int text_tokens(Part *p, int64_t d, const Tokens **out) {
    Tokens *t = &p->cache[d];
    p->used[d] = ++p->tick;
    if (!t->ids) {
        char *text;
        size_t n;
        const char *path = p->files[p->first + d];
        if (file_read_all(path, &text, &n) != 0) return -1;
        int rc = tokenizer_encode(p->tok, text, n, t);
        free(text);
        if (rc != 0) return bs_fail_ctx("tokenizing %s", path);
        if (p->len[d] >= 0 && t->n != p->len[d]) {
            tokens_free(t);
            return bs_fail("%s changed while the job runs: %lld tokens now, %lld when it started", path,
                           (long long)t->n, (long long)p->len[d]);
        }
        p->cached += t->n * (int64_t)sizeof(uint32_t);
        // over the budget: drop the least recently used documents (never the one just made)
        while (p->cached > p->cfg.cache_bytes) {
            int64_t victim = -1;
            for (int64_t k = 0; k < p->end - p->first; k++)
                if (k != d && p->cache[k].ids && (victim < 0 || p->used[k] < p->used[victim])) victim = k;
            if (victim < 0) break;
            p->cached -= p->cache[victim].n * (int64_t)sizeof(uint32_t);
            tokens_free(&p->cache[victim]);
        }
    }
    *out = t;
    return 0;
}

// Open part i of n of cfg->dir: a prepared dataset when it holds an index, else its text files.
static int part_open(Part *p, const LoaderServeConfig *cfg, int i, int n) {
    memset(p, 0, sizeof *p);
    p->cfg = *cfg;
    // a file is neither: read as a text corpus it would be trained on as one document of raw bytes
    struct stat dst;
    if (stat(cfg->dir, &dst) == 0 && !S_ISDIR(dst.st_mode))
        return bs_fail("%s is a file, not a directory: a data server's --data is a prepared dataset's directory "
                       "(`bytescale prepare --out DIR`) or a directory of text files",
                       cfg->dir);
    char index[4200];
    snprintf(index, sizeof index, "%s/%s", cfg->dir, INDEX_FILE);
    if (access(index, F_OK) == 0 || access(cfg->dir, F_OK) != 0) {
        if (dataset_open(&p->ds, cfg->dir) != 0) return -1;
        p->n_docs = p->ds.index.n_docs;
        loader_part(&p->ds.index, i, n, &p->first, &p->end);
        return 0;
    }
    // text: every server lists the same files and splits them by their sizes in bytes, so each
    // knows its documents before tokenizing any
    p->text = 1;
    const char *inputs[1] = {cfg->dir};
    if (prepare_list_files(inputs, 1, cfg->ext, &p->files, &p->n_docs) != 0) return -1;
    if (p->n_docs < 1) return bs_fail("%s: no text files%s%s", cfg->dir, cfg->ext ? " ending in " : "", cfg->ext ? cfg->ext : "");
    int64_t *cum = malloc(sizeof(int64_t) * (size_t)p->n_docs), total = 0;
    if (!cum) return bs_fail("out of memory");
    for (int64_t d = 0; d < p->n_docs; d++) {
        struct stat st;
        if (stat(p->files[d], &st) != 0) {
            free(cum);
            return bs_fail("%s: %s", p->files[d], strerror(errno));
        }
        cum[d] = total;
        total += st.st_size;
    }
    split(array_at, cum, p->n_docs, total, i, n, &p->first, &p->end);
    free(cum);
    if (tokenizer_open(&p->tok, cfg->tokenizer, cfg->bpe_ranks) != 0) return -1;
    int64_t k = p->end - p->first;
    p->len = malloc(sizeof(int64_t) * (size_t)(k > 0 ? k : 1));
    p->start = malloc(sizeof(int64_t) * (size_t)(k > 0 ? k : 1));
    p->cache = calloc((size_t)(k > 0 ? k : 1), sizeof *p->cache);
    p->used = calloc((size_t)(k > 0 ? k : 1), sizeof *p->used);
    if (!p->len || !p->start || !p->cache || !p->used) return bs_fail("out of memory");
    // the lengths are the metadata: every document is tokenized once now (the cache keeps what fits)
    for (int64_t d = 0; d < k; d++) {
        const Tokens *t;
        p->len[d] = -1;
        if (text_tokens(p, d, &t) != 0) return -1;
        p->len[d] = t->n;
    }
    return 0;
}

// Tokens [src, src + n) of document doc (src a global offset), clipped at its end.
static int part_read(Part *p, int64_t doc, int64_t src, int64_t n, uint32_t *out, int64_t *got) {
    if (!p->text) return dataset_read_span(&p->ds, doc, src, n, out, got);
    int64_t d = doc - p->first, at = src - p->start[d];
    if (at < 0 || at > p->len[d] || n < 0)
        return bs_fail("tokens [%lld, %lld) are not inside document %lld [%lld, %lld)", (long long)src,
                       (long long)(src + n), (long long)doc, (long long)p->start[d],
                       (long long)(p->start[d] + p->len[d]));
    const Tokens *t;
    if (text_tokens(p, d, &t) != 0) return -1;
    *got = at + n <= t->n ? n : t->n - at;
    if (*got > 0) memcpy(out, t->ids + at, sizeof(uint32_t) * (size_t)*got);
    return 0;
}

// ---- servers ---------------------------------------------------------------------------------------

static int send_error(int dst, int tag, const char *msg) {
    size_t len = strlen(msg) + 1;
    uint8_t *buf = malloc(16 + len);
    if (!buf) return bs_fail("out of memory");
    int64_t head[2] = {-1, (int64_t)len};
    memcpy(buf, head, 16);
    memcpy(buf + 16, msg, len);
    int err = MPI_Send(buf, (int)(16 + len), MPI_BYTE, dst, tag, loader_comm());
    free(buf);
    return err == MPI_SUCCESS ? 0 : bs_fail("data loader: MPI_Send failed (%d)", err);
}

// This server's part of the metadata to the scheduler. A text part does not know the global offsets
// of its documents (they follow the other servers' token counts): start -1 and n_tokens -1, which
// the scheduler fills in and answers with the part's base.
static int send_meta(const Part *p, const CommRoles *roles) {
    const DocIndex *ix = &p->ds.index;
    int n_shards = p->text ? 0 : ix->n_shards;
    size_t n = META_HEAD + 3 * (size_t)n_shards + 4 * (size_t)(p->end - p->first);
    int64_t *m = malloc(sizeof(int64_t) * n);
    if (!m) return bs_fail("out of memory");
    int64_t head[META_HEAD] = {0,
                               p->n_docs,
                               p->first,
                               p->end,
                               p->text ? tokenizer_vocab_size(p->tok) : ix->vocab,
                               p->text ? tokenizer_kind(p->tok) : ix->tokenizer,
                               p->text ? 4 : ix->width,
                               n_shards,
                               p->text ? -1 : ix->n_tokens};
    memcpy(m, head, sizeof head);
    int64_t *at = m + META_HEAD;
    for (int s = 0; s < n_shards; s++)
        *at++ = ix->shards[s].n_tokens, *at++ = ix->shards[s].crc, *at++ = ix->shards[s].base;
    for (int64_t d = p->first; d < p->end; d++) {
        if (p->text) {
            *at++ = 0, *at++ = 0, *at++ = p->len[d - p->first], *at++ = -1;
        } else {
            const DocEntry *e = &ix->docs[d];
            *at++ = e->shard, *at++ = e->offset, *at++ = e->len, *at++ = e->start;
        }
    }
    int rc = n * sizeof(int64_t) > (size_t)INT32_MAX
                 ? bs_fail("metadata of %lld documents is too large for one message", (long long)(p->end - p->first))
                 : 0;
    if (rc == 0 && MPI_Send(m, (int)(n * sizeof(int64_t)), MPI_BYTE, roles->scheduler, TAG_META, loader_comm()) !=
                       MPI_SUCCESS)
        rc = bs_fail("data server %d: sending its metadata failed", roles->index);
    free(m);
    return rc;
}

// From the scheduler: the global offset of the part's first document, and the world ranks of the
// clients that fetch (*fetchers (*n_fetchers,), malloc'ed): the only ones this server answers.
static int recv_base(Part *p, const CommRoles *roles, int64_t **fetchers, int64_t *n_fetchers) {
    MPI_Status st;
    if (probe(roles->scheduler, TAG_BASE, &st) != 0) return -1;
    int bytes = 0;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    int64_t *m = malloc((size_t)(bytes > 0 ? bytes : 1));
    if (!m) return bs_fail("out of memory");
    if (MPI_Recv(m, bytes, MPI_BYTE, roles->scheduler, TAG_BASE, loader_comm(), MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        free(m);
        return bs_fail("data server %d: receiving its base offset failed", roles->index);
    }
    int64_t words = bytes / (int64_t)sizeof(int64_t), base = words > 0 ? m[0] : -1, n = words > 1 ? m[1] : -1;
    if (n < 1 || words != 2 + n) {  // the scheduler failed (it ends the job, saying why), or not a BASE message
        free(m);
        return bs_fail("data server %d: the scheduler stopped before training started (%lld fetching clients)",
                       roles->index, (long long)n);
    }
    memmove(m, m + 2, sizeof(int64_t) * (size_t)n);
    *fetchers = m, *n_fetchers = n;
    if (!p->text) {
        if (p->first < p->end && base != p->ds.index.docs[p->first].start)
            return bs_fail("data server %d: the scheduler placed its documents at %lld, the index at %lld", roles->index,
                           (long long)base, (long long)p->ds.index.docs[p->first].start);
        return 0;
    }
    for (int64_t d = 0; d < p->end - p->first; d++) p->start[d] = base, base += p->len[d];
    return 0;
}

// One request of k ranges: read them all, answer with all of them. A range this server does not
// hold is an error answer (for the whole request), never tokens from somewhere else.
static int answer(Part *p, const CommRoles *roles, const MPI_Status *st, int64_t **req, int64_t *req_cap,
                  uint32_t **buf, int64_t *cap) {
    int bytes = 0;
    MPI_Get_count(st, MPI_BYTE, &bytes);
    int64_t words = bytes / (int64_t)sizeof(int64_t);
    if (words > *req_cap) {
        int64_t *r = realloc(*req, sizeof(int64_t) * (size_t)words);
        if (!r) return bs_fail("out of memory");
        *req = r, *req_cap = words;
    }
    if (MPI_Recv(*req, bytes, MPI_BYTE, st->MPI_SOURCE, TAG_REQ, loader_comm(), MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return bs_fail("data server %d: receiving a request failed", roles->index);
    char msg[ERR_TEXT];
    int64_t k = words > 0 ? (*req)[0] : -1, total = 0;
    if (k < 0 || words != 1 + 3 * k) {
        snprintf(msg, sizeof msg, "data server %d (world rank %d): a malformed request of %d bytes", roles->index,
                 roles->world_rank, bytes);
        return send_error(st->MPI_SOURCE, TAG_REPLY, msg);
    }
    for (int64_t i = 0; i < k; i++) {
        int64_t doc = (*req)[1 + 3 * i], n = (*req)[3 + 3 * i];
        if (doc < p->first || doc >= p->end) {
            snprintf(msg, sizeof msg,
                     "data server %d (world rank %d, %s) holds documents [%lld, %lld); document %lld is not one of them",
                     roles->index, roles->world_rank, p->cfg.dir, (long long)p->first, (long long)p->end,
                     (long long)doc);
            return send_error(st->MPI_SOURCE, TAG_REPLY, msg);
        }
        if (n < 0 || n > (1 << 28) || total > (1 << 28)) {
            snprintf(msg, sizeof msg, "data server %d (world rank %d): a request for %lld tokens", roles->index,
                     roles->world_rank, (long long)n);
            return send_error(st->MPI_SOURCE, TAG_REPLY, msg);
        }
        total += n;
    }
    // the reply: int64 status and k, int64 got of every range, then the tokens back to back
    int64_t head_words = 2 + k, need = 2 * head_words + total;
    if (need > *cap) {
        uint32_t *b = realloc(*buf, sizeof(uint32_t) * (size_t)need);
        if (!b) return bs_fail("out of memory");
        *buf = b, *cap = need;
    }
    int64_t *head = (int64_t *)(void *)*buf;
    uint32_t *at = *buf + 2 * head_words;
    head[0] = 0, head[1] = k;
    for (int64_t i = 0; i < k; i++) {
        int64_t got = 0;
        if (part_read(p, (*req)[1 + 3 * i], (*req)[2 + 3 * i], (*req)[3 + 3 * i], at, &got) != 0) {
            snprintf(msg, sizeof msg, "data server %d (world rank %d, %s): %s", roles->index, roles->world_rank,
                     p->cfg.dir, bs_errmsg());
            return send_error(st->MPI_SOURCE, TAG_REPLY, msg);
        }
        head[2 + i] = got;
        at += got;
    }
    size_t reply = sizeof(uint32_t) * (size_t)(at - *buf);
    if (reply > (size_t)INT32_MAX || MPI_Send(*buf, (int)reply, MPI_BYTE, st->MPI_SOURCE, TAG_REPLY, loader_comm()) !=
                                         MPI_SUCCESS)
        return bs_fail("data server %d: answering world rank %d failed", roles->index, st->MPI_SOURCE);
    return 0;
}

static int is_fetcher(const int64_t *fetchers, int64_t n, int world_rank) {
    for (int64_t i = 0; i < n; i++)
        if (fetchers[i] == world_rank) return 1;
    return 0;
}

int loader_serve(const LoaderServeConfig *cfg, const CommRoles *roles) {
    Part p;
    if (part_open(&p, cfg, roles->index, roles->n_servers) != 0) {
        char msg[ERR_TEXT];
        snprintf(msg, sizeof msg, "data server %d (world rank %d) cannot open its data: %s", roles->index,
                 roles->world_rank, bs_errmsg());
        send_error(roles->scheduler, TAG_META, msg);
        part_free(&p);
        return bs_fail("%s", msg);
    }
    int64_t *fetchers = NULL, n_fetchers = 0;
    int rc = send_meta(&p, roles);
    if (rc == 0) rc = recv_base(&p, roles, &fetchers, &n_fetchers);
    uint32_t *buf = NULL;
    int64_t *req = NULL, cap = 0, req_cap = 0;
    for (int64_t done = 0; rc == 0 && done < n_fetchers;) {
        MPI_Status st;
        if (probe(MPI_ANY_SOURCE, MPI_ANY_TAG, &st) != 0) rc = -1;
        else if (!is_fetcher(fetchers, n_fetchers, st.MPI_SOURCE))
            rc = bs_fail("data server %d: a message (tag %d) from world rank %d, which is not one of the job's %lld "
                         "fetching clients",
                         roles->index, st.MPI_TAG, st.MPI_SOURCE, (long long)n_fetchers);
        else if (st.MPI_TAG == TAG_REQ) rc = answer(&p, roles, &st, &req, &req_cap, &buf, &cap);
        else if (st.MPI_TAG == TAG_DONE) {
            char b;
            rc = MPI_Recv(&b, 1, MPI_BYTE, st.MPI_SOURCE, TAG_DONE, loader_comm(), MPI_STATUS_IGNORE) == MPI_SUCCESS
                     ? 0
                     : bs_fail("data server %d: receiving a goodbye failed", roles->index);
            done++;
        } else {
            rc = bs_fail("data server %d: an unexpected message (tag %d) from world rank %d", roles->index, st.MPI_TAG,
                         st.MPI_SOURCE);
        }
    }
    free(fetchers);
    free(buf);
    free(req);
    part_free(&p);
    return rc;
}

// ---- the scheduler ---------------------------------------------------------------------------------

// Receive one server's META into a malloc'ed buffer of *n int64 (or fail with its error text).
static int recv_meta(const CommRoles *roles, int i, int64_t **out, size_t *n) {
    int src = roles->servers[i];
    MPI_Status st;
    if (probe(src, TAG_META, &st) != 0) return -1;
    int bytes = 0;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    uint8_t *buf = malloc((size_t)bytes + 1);
    if (!buf) return bs_fail("out of memory");
    if (MPI_Recv(buf, bytes, MPI_BYTE, src, TAG_META, loader_comm(), MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        free(buf);
        return bs_fail("receiving data server %d's metadata failed", i);
    }
    int64_t head[2] = {0, 0};
    if (bytes >= 16) memcpy(head, buf, 16);
    if (head[0] < 0) {
        buf[bytes] = '\0';
        int rc = bs_fail("%s", bytes > 16 ? (char *)buf + 16 : "a data server failed");
        free(buf);
        return rc;
    }
    if (bytes < (int)(META_HEAD * sizeof(int64_t)) || bytes % (int)sizeof(int64_t) != 0) {
        free(buf);
        return bs_fail("data server %d sent %d bytes of metadata: not a metadata message", i, bytes);
    }
    *out = (int64_t *)buf;
    *n = (size_t)bytes / sizeof(int64_t);
    return 0;
}

// Every server learns where its documents start (a server of text files cannot know it) and which
// clients fetch; ix NULL (the scheduler failed): no clients, the server stops and the job ends.
static int send_bases(const CommRoles *roles, const int *fetchers, int n_fetchers, const DocIndex *ix,
                      const int32_t *doc_server) {
    int64_t *base = malloc(sizeof(int64_t) * (size_t)(2 + n_fetchers));
    if (!base) return bs_fail("out of memory");
    int rc = 0;
    for (int i = 0; i < roles->n_servers; i++) {
        base[0] = ix ? ix->n_tokens : -1, base[1] = ix ? n_fetchers : 0;
        for (int f = 0; f < n_fetchers; f++) base[2 + f] = fetchers[f];
        for (int64_t d = 0; ix && d < ix->n_docs; d++)
            if (doc_server[d] == i) {
                base[0] = ix->docs[d].start;
                break;
            }
        int bytes = (int)(sizeof *base * (size_t)(2 + base[1]));
        if (MPI_Send(base, bytes, MPI_BYTE, roles->servers[i], TAG_BASE, loader_comm()) != MPI_SUCCESS && rc == 0)
            rc = bs_fail("telling data server %d where its documents start failed", i);
    }
    free(base);
    return rc;
}

int loader_gather_index(const CommRoles *roles, const int *fetchers, int n_fetchers, DocIndex *ix,
                        int32_t **doc_server) {
    memset(ix, 0, sizeof *ix);
    *doc_server = NULL;
    int rc = 0;
    int64_t covered = 0;
    for (int i = 0; i < roles->n_servers; i++) {
        int64_t *m = NULL;
        size_t n = 0;
        // every server's message is received, even after an error, so no server is left waiting
        int r = recv_meta(roles, i, &m, &n);
        if (r != 0) {
            if (rc == 0) rc = bs_fail_ctx("data server %d (world rank %d)", i, roles->servers[i]);
            continue;
        }
        int64_t n_docs = m[1], first = m[2], end = m[3], n_shards = m[7];
        if (rc == 0 && i == 0) {  // the dataset as server 0 sees it
            ix->n_docs = n_docs, ix->vocab = (uint32_t)m[4], ix->tokenizer = (TokenizerKind)m[5];
            ix->width = (uint32_t)m[6], ix->n_shards = (int)n_shards, ix->n_tokens = m[8];
            snprintf(ix->dir, sizeof ix->dir, "%d data server%s", roles->n_servers, roles->n_servers > 1 ? "s" : "");
            ix->shards = calloc((size_t)(n_shards > 0 ? n_shards : 1), sizeof *ix->shards);
            ix->docs = calloc((size_t)(n_docs > 0 ? n_docs : 1), sizeof *ix->docs);
            *doc_server = malloc(sizeof(int32_t) * (size_t)(n_docs > 0 ? n_docs : 1));
            if (!ix->shards || !ix->docs || !*doc_server) rc = bs_fail("out of memory");
            for (int64_t d = 0; rc == 0 && d < n_docs; d++) (*doc_server)[d] = -1;
            for (int s = 0; rc == 0 && s < n_shards; s++) {
                const int64_t *e = m + META_HEAD + 3 * s;
                ix->shards[s].n_tokens = e[0], ix->shards[s].crc = (uint32_t)e[1], ix->shards[s].base = e[2];
            }
        }
        if (rc == 0 && (n_docs != ix->n_docs || m[4] != ix->vocab || m[5] != ix->tokenizer || m[8] != ix->n_tokens ||
                        n_shards != ix->n_shards))
            rc = bs_fail("data server %d (world rank %d) serves another dataset than server 0 (%lld documents, %lld "
                         "tokens vs %lld, %lld)",
                         i, roles->servers[i], (long long)n_docs, (long long)m[8], (long long)ix->n_docs,
                         (long long)ix->n_tokens);
        if (rc == 0 && (first < 0 || end < first || end > n_docs ||
                        n != META_HEAD + 3 * (size_t)n_shards + 4 * (size_t)(end - first)))
            rc = bs_fail("data server %d sent a malformed part [%lld, %lld)", i, (long long)first, (long long)end);
        for (int64_t d = first; rc == 0 && d < end; d++) {
            const int64_t *e = m + META_HEAD + 3 * n_shards + 4 * (d - first);
            if ((*doc_server)[d] >= 0) {
                rc = bs_fail("document %lld is held by data servers %d and %d", (long long)d, (*doc_server)[d], i);
                break;
            }
            ix->docs[d] = (DocEntry){.shard = (uint32_t)e[0], .offset = e[1], .len = e[2], .start = e[3]};
            (*doc_server)[d] = i;
            covered++;
        }
        free(m);
    }
    if (rc == 0 && covered != ix->n_docs)
        rc = bs_fail("the data servers hold %lld of the dataset's %lld documents", (long long)covered,
                     (long long)ix->n_docs);
    // text files: the documents follow one another in the files' order
    if (rc == 0 && ix->n_tokens < 0) {
        int64_t at = 0;
        for (int64_t d = 0; d < ix->n_docs; d++) ix->docs[d].start = at, at += ix->docs[d].len;
        ix->n_tokens = at;
    }
    if (send_bases(roles, fetchers, n_fetchers, rc == 0 ? ix : NULL, *doc_server) != 0 && rc == 0) rc = -1;
    if (rc != 0) {
        docindex_free(ix);
        free(*doc_server);
        *doc_server = NULL;
    }
    return rc;
}

// ---- clients -----------------------------------------------------------------------------------------

void load_plan_free(LoadPlan *lp) {
    free(lp->docs);
    free(lp->servers);
    memset(lp, 0, sizeof *lp);
}

static int server_of(const LoadPlan *lp, int64_t doc) {
    int64_t lo = 0, hi = lp->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (lp->docs[mid] < doc) lo = mid + 1;
        else hi = mid;
    }
    return lo < lp->n && lp->docs[lo] == doc ? lp->servers[lo] : -1;
}

// Recording: note the range, hand back zeros (the rows made from them are dropped).
static int record_read(void *ctx, int64_t doc, int64_t src, int64_t n, uint32_t *out, int64_t *got) {
    RemoteSource *rs = ctx;
    if (rs->n_ranges == rs->cap_ranges) {
        int64_t cap = rs->cap_ranges ? 2 * rs->cap_ranges : 64;
        LoadRange *r = realloc(rs->ranges, sizeof *r * (size_t)cap);
        if (!r) return bs_fail("out of memory");
        rs->ranges = r, rs->cap_ranges = cap;
    }
    int server = rs->plan ? server_of(rs->plan, doc) : -1;
    if (server < 0) return bs_fail("the loading plan names no data server for document %lld", (long long)doc);
    if (rs->misroute) server = (server + 1) % rs->roles->n_servers;
    rs->ranges[rs->n_ranges++] = (LoadRange){.doc = doc, .src = src, .n = n, .server = server};
    memset(out, 0, sizeof(uint32_t) * (size_t)n);
    *got = n;
    return 0;
}

// Replaying: the same calls in the same order, answered from what the servers sent.
static int replay_read(void *ctx, int64_t doc, int64_t src, int64_t n, uint32_t *out, int64_t *got) {
    RemoteSource *rs = ctx;
    if (rs->next >= rs->n_ranges) return bs_fail("the rows asked for more ranges than were fetched");
    const LoadRange *r = &rs->ranges[rs->next++];
    if (r->doc != doc || r->src != src || r->n != n)
        return bs_fail("the rows asked for document %lld [%lld, +%lld), fetched [%lld, +%lld) of %lld", (long long)doc,
                       (long long)src, (long long)n, (long long)r->src, (long long)r->n, (long long)r->doc);
    if (r->got > 0) memcpy(out, rs->tokens + r->at, sizeof(uint32_t) * (size_t)r->got);
    *got = r->got;
    return 0;
}

TokenSource loader_recorder(RemoteSource *src) {
    const char *m = getenv("BS_LOADER_MISROUTE");
    src->misroute = m && m[0] == '1';
    src->n_ranges = 0;
    return (TokenSource){.read = record_read, .ctx = src};
}

TokenSource loader_replayer(RemoteSource *src) {
    src->next = 0;
    return (TokenSource){.read = replay_read, .ctx = src};
}

// The answers go into one token buffer in recording order: range i at the sum of the ones before.
static int place_ranges(RemoteSource *rs) {
    int64_t all = 0;
    for (int64_t i = 0; i < rs->n_ranges; i++) rs->ranges[i].at = all, all += rs->ranges[i].n;
    if (all > rs->tokens_cap) {
        uint32_t *t = realloc(rs->tokens, sizeof(uint32_t) * (size_t)(all > 0 ? all : 1));
        if (!t) return bs_fail("out of memory");
        rs->tokens = t, rs->tokens_cap = all;
    }
    return 0;
}

// Wait for req without spinning.
static int wait_req(MPI_Request *q) {
    int done = 0, spins = 0;
    while (!done) {
        if (MPI_Test(q, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return -1;
        if (!done) backoff(&spins);
    }
    return 0;
}

// Every recorded range from its server: one request per server, all out at once.
static int fetch_from_servers(RemoteSource *rs) {
    const CommRoles *roles = rs->roles;
    int S = roles->n_servers;
    // per server: its ranges in recording order, one request, all requests out before any answer
    // is awaited, so the servers read in parallel
    int64_t *count = calloc((size_t)S, sizeof(int64_t)), *total = calloc((size_t)S, sizeof(int64_t));
    int64_t **req = calloc((size_t)S, sizeof(int64_t *));
    uint32_t **reply = calloc((size_t)S, sizeof(uint32_t *));
    MPI_Request *sq = malloc(sizeof(MPI_Request) * (size_t)S), *rq = malloc(sizeof(MPI_Request) * (size_t)S);
    int rc = count && total && req && reply && sq && rq ? 0 : bs_fail("out of memory");
    for (int64_t i = 0; rc == 0 && i < rs->n_ranges; i++)
        count[rs->ranges[i].server]++, total[rs->ranges[i].server] += rs->ranges[i].n;
    for (int s = 0; rc == 0 && s < S; s++) {
        sq[s] = rq[s] = MPI_REQUEST_NULL;
        if (!count[s]) continue;
        int64_t words = 2 + count[s];  // the reply: status, k, got per range, tokens
        size_t reply_bytes = sizeof(int64_t) * (size_t)words + sizeof(uint32_t) * (size_t)total[s] + ERR_TEXT;
        req[s] = malloc(sizeof(int64_t) * (size_t)(1 + 3 * count[s]));
        reply[s] = malloc(reply_bytes);
        if (!req[s] || !reply[s] || reply_bytes > (size_t)INT32_MAX) {
            rc = bs_fail("out of memory for %lld ranges", (long long)count[s]);
            break;
        }
        int64_t *w = req[s];
        *w++ = count[s];
        for (int64_t i = 0; i < rs->n_ranges; i++)
            if (rs->ranges[i].server == s) *w++ = rs->ranges[i].doc, *w++ = rs->ranges[i].src, *w++ = rs->ranges[i].n;
        int dst = roles->servers[s];
        if (MPI_Irecv(reply[s], (int)reply_bytes, MPI_BYTE, dst, TAG_REPLY, loader_comm(), &rq[s]) != MPI_SUCCESS ||
            MPI_Isend(req[s], (int)(sizeof(int64_t) * (size_t)(1 + 3 * count[s])), MPI_BYTE, dst, TAG_REQ,
                      loader_comm(), &sq[s]) != MPI_SUCCESS)
            rc = bs_fail("asking data server %d (world rank %d) failed", s, dst);
    }
    if (rc == 0) rc = place_ranges(rs);
    for (int s = 0; s < S; s++) {
        if (!count || !count[s] || rq[s] == MPI_REQUEST_NULL) continue;
        int dst = roles->servers[s];
        if (wait_req(&sq[s]) != 0 || wait_req(&rq[s]) != 0) {
            if (rc == 0) rc = bs_fail("receiving from data server %d (world rank %d) failed", s, dst);
            continue;
        }
        if (rc != 0) continue;
        const int64_t *head = (const int64_t *)(const void *)reply[s];
        if (head[0] < 0) {
            char *text = (char *)reply[s] + 16;
            text[ERR_TEXT - 1] = '\0';
            rc = bs_fail("%s", text);
            continue;
        }
        if (head[1] != count[s]) {
            rc = bs_fail("data server %d answered %lld ranges of %lld", s, (long long)head[1], (long long)count[s]);
            continue;
        }
        const uint32_t *tok = reply[s] + 2 * (2 + count[s]);
        int64_t j = 0, at = 0;
        for (int64_t i = 0; rc == 0 && i < rs->n_ranges; i++) {
            LoadRange *r = &rs->ranges[i];
            if (r->server != s) continue;
            int64_t got = head[2 + j++];
            if (got < 0 || got > r->n) {
                rc = bs_fail("data server %d answered %lld tokens for a range of %lld", s, (long long)got, (long long)r->n);
                break;
            }
            r->got = got;
            if (got > 0) memcpy(rs->tokens + r->at, tok + at, sizeof(uint32_t) * (size_t)got);
            at += got;
        }
        rs->fetched += (double)at * sizeof(uint32_t);
    }
    for (int s = 0; s < S && req; s++) free(req[s]), free(reply[s]);
    free(count), free(total), free(req), free(reply), free(sq), free(rq);
    return rc;
}

// ---- a tp group: one member fetches, the others take the answers from it ----------------------------

// What the leader fetched (or its error, failed != 0) to every member: ROWS. The members recorded
// the same ranges (the same rows of the same plan); each range travels with its document and start
// so that a member checks it is answered what it asked.
static int send_rows(RemoteSource *rs, int failed) {
    int64_t k = rs->n_ranges, tokens = 0;
    for (int64_t i = 0; !failed && i < k; i++) tokens += rs->ranges[i].got;
    size_t head = sizeof(int64_t) * (size_t)(2 + 3 * k), bytes = failed ? 16 + ERR_TEXT : head + sizeof(uint32_t) * (size_t)tokens;
    uint8_t *buf = calloc(1, bytes);  // an error text's tail is sent too: zeros
    MPI_Request *q = malloc(sizeof(MPI_Request) * (size_t)rs->n_members);
    int rc = buf && q && bytes <= (size_t)INT32_MAX ? 0 : bs_fail("out of memory for the rows of %lld ranges", (long long)k);
    if (rc == 0 && failed) {
        int64_t h[2] = {-1, ERR_TEXT};
        memcpy(buf, h, 16);
        snprintf((char *)buf + 16, ERR_TEXT, "%s", bs_errmsg());
    } else if (rc == 0) {
        int64_t *w = (int64_t *)(void *)buf;
        uint32_t *tok = (uint32_t *)(void *)(buf + head);
        *w++ = 0, *w++ = k;
        for (int64_t i = 0; i < k; i++) {
            const LoadRange *r = &rs->ranges[i];
            *w++ = r->doc, *w++ = r->src, *w++ = r->got;
            if (r->got > 0) memcpy(tok, rs->tokens + r->at, sizeof(uint32_t) * (size_t)r->got);
            tok += r->got;
        }
    }
    for (int m = 0; rc == 0 && m < rs->n_members; m++)
        if (MPI_Isend(buf, (int)bytes, MPI_BYTE, rs->members[m], TAG_ROWS, loader_comm(), &q[m]) != MPI_SUCCESS) {
            for (int j = 0; j < m; j++) wait_req(&q[j]);
            rc = bs_fail("handing the fetched rows to world rank %d failed", rs->members[m]);
        }
    for (int m = 0; rc == 0 && m < rs->n_members; m++)
        if (wait_req(&q[m]) != 0) rc = bs_fail("handing the fetched rows to world rank %d failed", rs->members[m]);
    free(buf);
    free(q);
    return rc;
}

// A member: the leader's answers to the ranges this client recorded (ROWS), into rs->tokens.
static int recv_rows(RemoteSource *rs) {
    MPI_Status st;
    int bytes = 0;
    if (place_ranges(rs) != 0 || probe(rs->leader, TAG_ROWS, &st) != 0) return -1;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    uint8_t *buf = malloc((size_t)bytes + 1);
    MPI_Request q;
    if (!buf) return bs_fail("out of memory");
    if (MPI_Irecv(buf, bytes, MPI_BYTE, rs->leader, TAG_ROWS, loader_comm(), &q) != MPI_SUCCESS || wait_req(&q) != 0) {
        free(buf);
        return bs_fail("receiving the rows fetched by world rank %d failed", rs->leader);
    }
    int64_t h[2] = {-1, 0}, k = rs->n_ranges;
    if (bytes >= 16) memcpy(h, buf, 16);
    int rc = 0;
    if (h[0] < 0) {  // the leader failed: its message, whatever it was, ends this client's step too
        buf[bytes] = '\0';
        rc = bs_fail("world rank %d, which fetches for this tp group: %s", rs->leader,
                     bytes > 16 ? (char *)buf + 16 : "it failed");
    } else if (h[1] != k || (size_t)bytes < sizeof(int64_t) * (size_t)(2 + 3 * k)) {
        rc = bs_fail("world rank %d sent the rows of %lld ranges; this process asked for %lld", rs->leader,
                     (long long)h[1], (long long)k);
    }
    const int64_t *w = (const int64_t *)(const void *)buf + 2;
    const uint8_t *tok = buf + sizeof(int64_t) * (size_t)(2 + 3 * k), *end = buf + bytes;
    for (int64_t i = 0; rc == 0 && i < k; i++, w += 3) {
        LoadRange *r = &rs->ranges[i];
        size_t n = sizeof(uint32_t) * (size_t)(w[2] > 0 ? w[2] : 0);
        if (w[0] != r->doc || w[1] != r->src || w[2] < 0 || w[2] > r->n || n > (size_t)(end - tok))
            rc = bs_fail("world rank %d answered document %lld [%lld, +%lld) for document %lld [%lld, +%lld)",
                         rs->leader, (long long)w[0], (long long)w[1], (long long)w[2], (long long)r->doc,
                         (long long)r->src, (long long)r->n);
        else if (n > 0)
            memcpy(rs->tokens + r->at, tok, n), tok += n;
        if (rc == 0) r->got = w[2];
    }
    free(buf);
    return rc;
}

int loader_fetch(RemoteSource *rs) {
    rs->fetched = 0;
    if (rs->leader >= 0) return recv_rows(rs);
    int rc = fetch_from_servers(rs);
    // the members wait for this: they get the answers, or this process's error
    if (rs->n_members > 0 && send_rows(rs, rc != 0) != 0 && rc == 0) rc = -1;
    return rc;
}

int loader_world_rank(const CommRoles *roles, int client) {
    for (int w = 0, c = 0; w < roles->world_size; w++) {
        int server = 0;
        for (int i = 0; i < roles->n_servers && !server; i++) server = roles->servers[i] == w;
        if (!server && c++ == client) return w;
    }
    return -1;
}

int loader_client_done(const CommRoles *roles) {
    char b = 0;
    for (int i = 0; i < roles->n_servers; i++)
        if (MPI_Send(&b, 1, MPI_BYTE, roles->servers[i], TAG_DONE, loader_comm()) != MPI_SUCCESS)
            return bs_fail("telling data server %d that this client is done failed", i);
    return 0;
}
