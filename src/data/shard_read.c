// shard_read.c: open and validate a prepared dataset, then read token ranges from it.
//
// Everything is checked before anything is used: magic, version, sizes, both checksums of every
// file, and that the index and the shards agree. So a reader never meets a half-written, truncated
// or mixed-up dataset later, in the middle of training.
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/shard.h"
#include "data/format.h"

// (shard.h) Here, not beside the writer: a reader checks every file's width, and the writer builds on
// the reader (it reads the index it appends beside), so the two never need each other.
uint32_t token_width(uint32_t vocab) {
    if (vocab <= 256) return 1;
    if (vocab <= 65536) return 2;
    return 4;
}

// ---- the index -------------------------------------------------------------------------------

// Split path into the index file and its directory: a directory means <dir>/index.bin.
static int locate_index(const char *path, char *dir, size_t dir_cap, char *file, size_t file_cap) {
    struct stat st;
    if (stat(path, &st) != 0) return bs_fail("%s: cannot open dataset: %s", path, strerror(errno));
    if (strlen(path) + sizeof INDEX_FILE + 2 > dir_cap || strlen(path) + sizeof INDEX_FILE + 2 > file_cap)
        return bs_fail("%s: path too long", path);
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, dir_cap, "%s", path);
        snprintf(file, file_cap, "%s/%s", path, INDEX_FILE);
        return 0;
    }
    snprintf(file, file_cap, "%s", path);
    snprintf(dir, dir_cap, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, dir_cap, ".");
    return 0;
}

// Checks shared by both headers: size, magic, version, header checksum.
static int check_header(const char *file, const uint8_t *h, size_t size, const char *magic, uint32_t version,
                        const char *what) {
    if (size < HEADER_BYTES)
        return bs_fail("%s: truncated: expected at least %d header bytes, got %zu", file, HEADER_BYTES, size);
    if (memcmp(h, magic, 8) != 0) return bs_fail("%s: bad magic: not a bytescale %s", file, what);
    uint32_t v = get_u32(h + 8);
    if (v != version) return bs_fail("%s: unsupported version %u (this build reads version %u)", file, v, version);
    uint32_t want = get_u32(h + HEADER_CRC_AT), got = checksum_crc32(0, h, HEADER_CRC_AT);
    if (want != got) return bs_fail("%s: header checksum mismatch (stored %08x, computed %08x)", file, want, got);
    return 0;
}

static int check_tokenizer(const char *file, uint32_t kind, uint32_t vocab, uint32_t width) {
    if (kind < TOKENIZER_BYTE || kind > TOKENIZER_HF) return bs_fail("%s: unknown tokenizer id %u", file, kind);
    if (vocab == 0 || width != token_width(vocab))
        return bs_fail("%s: token width %u does not fit vocab size %u", file, width, vocab);
    return 0;
}

static int parse_index(DocIndex *ix, const char *file, const uint8_t *b, size_t size) {
    if (check_header(file, b, size, INDEX_MAGIC, INDEX_VERSION, "document index") != 0) return -1;
    ix->tokenizer = (TokenizerKind)get_u32(b + IX_TOKENIZER);
    ix->vocab = get_u32(b + IX_VOCAB);
    ix->width = get_u32(b + IX_WIDTH);
    if (check_tokenizer(file, (uint32_t)ix->tokenizer, ix->vocab, ix->width) != 0) return -1;
    uint32_t n_shards = get_u32(b + IX_NSHARDS), flags = get_u32(b + IX_FLAGS);
    uint64_t n_docs = get_u64(b + IX_NDOCS), n_tokens = get_u64(b + IX_NTOKENS), body = get_u64(b + IX_BODY_BYTES);
    if (body != size - HEADER_BYTES)
        return bs_fail("%s: truncated: expected %llu bytes, got %zu", file, (unsigned long long)(HEADER_BYTES + body), size);
    uint32_t want = get_u32(b + IX_BODY_CRC), got = checksum_crc32(0, b + HEADER_BYTES, body);
    if (want != got) return bs_fail("%s: checksum mismatch (stored %08x, computed %08x)", file, want, got);
    // the fixed tables must fit in the body (the checksum matched, but be safe against a bad writer)
    uint64_t fixed = (uint64_t)n_shards * SHARD_ENTRY_BYTES;
    if (n_docs > body / DOC_ENTRY_BYTES || fixed + n_docs * DOC_ENTRY_BYTES > body)
        return bs_fail("%s: %u shards and %llu documents do not fit in %llu body bytes", file, n_shards,
                       (unsigned long long)n_docs, (unsigned long long)body);
    ix->n_shards = (int)n_shards;
    ix->n_docs = (int64_t)n_docs;
    ix->n_tokens = (int64_t)n_tokens;
    ix->shards = bs_calloc(n_shards, sizeof *ix->shards);
    ix->docs = bs_calloc((size_t)n_docs, sizeof *ix->docs);
    if (!ix->shards || !ix->docs) return -1;

    const uint8_t *p = b + HEADER_BYTES;
    int64_t base = 0;
    for (uint32_t s = 0; s < n_shards; s++, p += SHARD_ENTRY_BYTES) {
        ShardInfo *sh = &ix->shards[s];
        memcpy(sh->name, p, SHARD_NAME_MAX);
        // a plain file name in the index's directory: NUL-terminated, not empty, no '/'
        if (!memchr(sh->name, '\0', SHARD_NAME_MAX) || !sh->name[0] || strchr(sh->name, '/') ||
            !strcmp(sh->name, "..") || !strcmp(sh->name, "."))
            return bs_fail("%s: shard %u has an invalid file name", file, s);
        sh->n_tokens = (int64_t)get_u64(p + 48);
        sh->crc = get_u32(p + 56);
        if (sh->n_tokens < 0) return bs_fail("%s: shard %u: bad token count", file, s);
        sh->base = base;
        if (sh->n_tokens > INT64_MAX - base)
            return bs_fail("%s: shards 0 to %u hold more than %lld tokens", file, s, (long long)INT64_MAX);
        base += sh->n_tokens;
    }
    if (base != ix->n_tokens)
        return bs_fail("%s: shards hold %lld tokens but the header says %lld", file, (long long)base,
                       (long long)ix->n_tokens);
    int64_t sum = 0;
    for (int64_t d = 0; d < ix->n_docs; d++, p += DOC_ENTRY_BYTES) {
        DocEntry *e = &ix->docs[d];
        e->shard = get_u32(p);
        e->offset = (int64_t)get_u64(p + 8);
        e->len = (int64_t)get_u64(p + 16);
        if (e->shard >= n_shards) return bs_fail("%s: document %lld: shard %u out of range [0, %u)", file, (long long)d, e->shard, n_shards);
        const ShardInfo *sh = &ix->shards[e->shard];
        if (e->offset < 0 || e->len < 0 || e->offset > sh->n_tokens || e->len > sh->n_tokens - e->offset)
            return bs_fail("%s: document %lld: index points past the end of shard %u (%s: %lld tokens at %lld, "
                           "of %lld)",
                           file, (long long)d, e->shard, sh->name, (long long)e->len, (long long)e->offset,
                           (long long)sh->n_tokens);
        e->start = sh->base + e->offset;
        // documents may overlap in a damaged index, so their sum is not bounded by the shards
        if (e->len > INT64_MAX - sum)
            return bs_fail("%s: documents 0 to %lld hold more than %lld tokens", file, (long long)d,
                           (long long)INT64_MAX);
        sum += e->len;
    }
    if (sum > ix->n_tokens)
        return bs_fail("%s: documents hold %lld tokens, more than the %lld in the shards", file, (long long)sum,
                       (long long)ix->n_tokens);
    if (!(flags & INDEX_HAS_PATHS)) {
        if (p != b + size) return bs_fail("%s: %zu unexpected bytes after the document table", file, (size_t)(b + size - p));
        return 0;
    }
    // path table: per document, u32 length + bytes; stored here NUL-terminated
    size_t left = (size_t)(b + size - p);
    ix->path_blob = bs_malloc(left + (size_t)n_docs);
    ix->path_off = bs_malloc((size_t)n_docs * sizeof *ix->path_off + 1);
    if (!ix->path_blob || !ix->path_off) return -1;
    int64_t used = 0;
    for (int64_t d = 0; d < ix->n_docs; d++) {
        if ((size_t)(b + size - p) < 4) return bs_fail("%s: path table ends at document %lld", file, (long long)d);
        uint32_t len = get_u32(p);
        p += 4;
        if ((size_t)(b + size - p) < len) return bs_fail("%s: path table ends at document %lld", file, (long long)d);
        ix->path_off[d] = used;
        memcpy(ix->path_blob + used, p, len);
        ix->path_blob[used + len] = '\0';
        used += len + 1;
        p += len;
    }
    if (p != b + size) return bs_fail("%s: %zu unexpected bytes after the path table", file, (size_t)(b + size - p));
    return 0;
}

int docindex_read(DocIndex *ix, const char *path) {
    memset(ix, 0, sizeof *ix);
    char file[4200];
    if (locate_index(path, ix->dir, sizeof ix->dir, file, sizeof file) != 0) return -1;
    char *data;
    size_t size;
    if (file_read_all(file, &data, &size) != 0) return -1;
    int rc = parse_index(ix, file, (const uint8_t *)data, size);
    free(data);
    if (rc != 0) docindex_free(ix);
    return rc;
}

void docindex_free(DocIndex *ix) {
    free(ix->shards);
    free(ix->docs);
    free(ix->path_blob);
    free(ix->path_off);
    ix->shards = NULL, ix->docs = NULL, ix->path_blob = NULL, ix->path_off = NULL;
}

const char *docindex_source(const DocIndex *ix, int64_t doc) {
    if (!ix->path_blob || doc < 0 || doc >= ix->n_docs) return NULL;
    return ix->path_blob + ix->path_off[doc];
}

int docindex_check_trainable(const DocIndex *ix) {
    int64_t nonempty = 0, labelled = 0;
    for (int64_t d = 0; d < ix->n_docs; d++) {
        nonempty += ix->docs[d].len > 0;
        labelled += ix->docs[d].len >= 2;
    }
    if (ix->n_docs <= 0) return bs_fail("%s: the dataset holds no documents; nothing to train on", ix->dir);
    if (nonempty == 0)
        return bs_fail("%s: all %lld documents are empty (0 tokens); nothing to train on", ix->dir,
                       (long long)ix->n_docs);
    if (labelled == 0)
        return bs_fail("%s: every one of the %lld documents has a single token, so no token has a next one to "
                       "predict: no labelled token to train on (documents need at least 2 tokens)",
                       ix->dir, (long long)ix->n_docs);
    return 0;
}

// ---- shards ------------------------------------------------------------------------------------

// Map shard s and check it against its own header and against the index.
static int open_shard(Dataset *ds, int s) {
    const DocIndex *ix = &ds->index;
    const ShardInfo *sh = &ix->shards[s];
    char file[4200];
    snprintf(file, sizeof file, "%s/%s", ix->dir, sh->name);
    // O_NONBLOCK: opening a FIFO put in a shard's place must not wait for a writer; it is refused
    // below, as is a directory (neither can be mapped, and their st_size means nothing)
    int fd = open(file, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return bs_fail("%s: cannot open shard %d: %s", file, s, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return bs_fail("%s: cannot stat: %s", file, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return bs_fail("%s: shard %d is %s, not a regular file", file, s,
                       S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a special file");
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            close(fd);
            return bs_fail("%s: cannot map: %s", file, strerror(errno));
        }
    }
    close(fd);  // the mapping stays valid
    ds->maps[s] = map;
    ds->map_len[s] = size;
    ds->file_id[2 * s] = (uint64_t)st.st_dev;
    ds->file_id[2 * s + 1] = (uint64_t)st.st_ino;
    const uint8_t *h = map;
    if (check_header(file, h, size, SHARD_MAGIC, SHARD_VERSION, "token shard") != 0) return -1;
    uint32_t kind = get_u32(h + SH_TOKENIZER), vocab = get_u32(h + SH_VOCAB), width = get_u32(h + SH_WIDTH);
    if (check_tokenizer(file, kind, vocab, width) != 0) return -1;
    if (kind != (uint32_t)ix->tokenizer || vocab != ix->vocab || width != ix->width)
        return bs_fail("%s: tokenizer %u / vocab %u / width %u, but the index says %u / %u / %u", file, kind, vocab,
                       width, (uint32_t)ix->tokenizer, ix->vocab, ix->width);
    uint64_t n = get_u64(h + SH_NTOKENS);
    if (n != (uint64_t)sh->n_tokens)
        return bs_fail("%s: holds %llu tokens but the index expects %lld (shard and index come from different runs?)",
                       file, (unsigned long long)n, (long long)sh->n_tokens);
    // n comes from the file: n * width must not wrap around to a size that happens to match
    if (n > (UINT64_MAX - HEADER_BYTES) / width)
        return bs_fail("%s: header says %llu tokens, more than any file holds", file, (unsigned long long)n);
    uint64_t want = HEADER_BYTES + n * width;
    if (size != want)
        return bs_fail("%s: %s: expected %llu bytes, got %zu", file, size < want ? "truncated" : "trailing bytes",
                       (unsigned long long)want, size);
    uint32_t crc = checksum_crc32(0, h + HEADER_BYTES, size - HEADER_BYTES);
    if (crc != get_u32(h + SH_CRC))
        return bs_fail("%s: checksum mismatch in the tokens (stored %08x, computed %08x)", file, get_u32(h + SH_CRC), crc);
    if (crc != sh->crc)
        return bs_fail("%s: checksum %08x differs from the index's %08x (shard and index come from different runs?)",
                       file, crc, sh->crc);
    ds->payload[s] = h + HEADER_BYTES;
    return 0;
}

static void install_sigbus_handler(void);

int dataset_open(Dataset *ds, const char *path) {
    memset(ds, 0, sizeof *ds);
    if (docindex_read(&ds->index, path) != 0) return -1;
    install_sigbus_handler();
    int n = ds->index.n_shards;
    ds->payload = bs_calloc((size_t)n, sizeof *ds->payload);
    ds->maps = bs_calloc((size_t)n, sizeof *ds->maps);
    ds->map_len = bs_calloc((size_t)n, sizeof *ds->map_len);
    ds->file_id = bs_calloc((size_t)n * 2, sizeof *ds->file_id);
    if (!ds->payload || !ds->maps || !ds->map_len || !ds->file_id) {
        dataset_close(ds);
        return -1;
    }
    for (int s = 0; s < n; s++) {
        if (open_shard(ds, s) != 0) {
            dataset_close(ds);
            return -1;
        }
    }
    return 0;
}

void dataset_close(Dataset *ds) {
    for (int s = 0; ds->maps && s < ds->index.n_shards; s++)
        if (ds->maps[s]) munmap(ds->maps[s], ds->map_len[s]);
    free(ds->payload);
    free(ds->maps);
    free(ds->map_len);
    free(ds->file_id);
    docindex_free(&ds->index);
    memset(ds, 0, sizeof *ds);
}

// ---- reading -----------------------------------------------------------------------------------
//
// The shards are mapped, so a shard file truncated in place while a job reads it (a dataset that
// changed under the job: not `bytescale prepare`, which never writes into a shard in use) would
// raise SIGBUS on a page past its new end, and read zeros on the part of its last page past it. A
// read therefore copies under a guard (a SIGBUS in the copying thread jumps back out of the copy),
// then checks that the file it copied from still has its size: either way the read fails with an
// error naming the shard, which ends a training run like any other data error (its newest
// checkpoint intact). A SIGBUS anywhere else goes to the handler that was there before, or kills.

static _Thread_local sigjmp_buf *bus_jump;  // set while this thread copies from a mapping
static struct sigaction bus_before;

static void on_sigbus(int sig, siginfo_t *info, void *uc) {
    sigjmp_buf *jump = bus_jump;
    if (jump) siglongjmp(*jump, 1);
    if ((bus_before.sa_flags & SA_SIGINFO) && bus_before.sa_sigaction) {
        bus_before.sa_sigaction(sig, info, uc);
    } else if (!(bus_before.sa_flags & SA_SIGINFO) && bus_before.sa_handler != SIG_DFL &&
               bus_before.sa_handler != SIG_IGN) {
        bus_before.sa_handler(sig);
    } else {
        signal(sig, SIG_DFL);  // the faulting access runs again on return, and the default action ends it
    }
}

// Ours, unless it is already: at every dataset_open, since a program (a test harness) may have put
// another handler in its place since the last one.
static void install_sigbus_handler(void) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) == 0 && !((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        bus_before = cur;
        sigaction(SIGBUS, &sa, NULL);
    }
    pthread_mutex_unlock(&lock);
}

// The error of a read from shard s, whose file is now now_size bytes.
static int dataset_changed(const Dataset *ds, uint32_t s, long long now_size) {
    const DocIndex *ix = &ds->index;
    return bs_fail("%s/%s: the dataset changed while it was in use: shard %u was truncated (now %lld bytes, %zu "
                   "when it was opened and checked); prepare the dataset again (bytescale prepare replaces a dataset "
                   "whole, never a shard in use), then resume from the newest checkpoint",
                   ix->dir, ix->shards[s].name, s, now_size, ds->map_len[s]);
}

// After a copy from shard s: is the file it was mapped from still whole? Replaced or removed, the
// mapping still holds the file that was opened, so only a shrunk file of the same inode is an error.
static int shard_unchanged(const Dataset *ds, uint32_t s) {
    char file[4200];
    snprintf(file, sizeof file, "%s/%s", ds->index.dir, ds->index.shards[s].name);
    struct stat st;
    if (stat(file, &st) != 0) return 0;
    if ((uint64_t)st.st_dev != ds->file_id[2 * s] || (uint64_t)st.st_ino != ds->file_id[2 * s + 1]) return 0;
    if ((size_t)st.st_size < ds->map_len[s]) return dataset_changed(ds, s, (long long)st.st_size);
    return 0;
}

static void copy_tokens(const Dataset *ds, uint32_t shard, int64_t offset, int64_t n, uint32_t *out) {
    const uint8_t *p = ds->payload[shard] + (size_t)offset * ds->index.width;
    switch (ds->index.width) {
    case 1:
        for (int64_t i = 0; i < n; i++) out[i] = p[i];
        break;
    case 2:
        for (int64_t i = 0; i < n; i++) out[i] = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
        break;
    default:
        for (int64_t i = 0; i < n; i++) out[i] = get_u32(p + 4 * i);
        break;
    }
}

// copy_tokens under the SIGBUS guard, then the size check.
static int copy_checked(const Dataset *ds, uint32_t shard, int64_t offset, int64_t n, uint32_t *out) {
    if (n <= 0) return 0;
    sigjmp_buf jump;
    if (sigsetjmp(jump, 1) != 0) {  // a SIGBUS in the copy: the file shrank under the mapping
        bus_jump = NULL;
        if (shard_unchanged(ds, shard) != 0) return -1;  // it did: how much
        // (or the file is not the one mapped any more, or the disk failed to read a page)
        return bs_fail("%s/%s: shard %u could not be read through its mapping (SIGBUS): the dataset changed while "
                       "it was in use, or the disk failed",
                       ds->index.dir, ds->index.shards[shard].name, shard);
    }
    bus_jump = &jump;
    copy_tokens(ds, shard, offset, n, out);
    bus_jump = NULL;
    return shard_unchanged(ds, shard);
}

int dataset_read(const Dataset *ds, int64_t doc, int64_t first, int64_t n, uint32_t *out) {
    if (doc < 0 || doc >= ds->index.n_docs)
        return bs_fail("%s: read: document %lld out of range [0, %lld)", ds->index.dir, (long long)doc,
                       (long long)ds->index.n_docs);
    const DocEntry *e = &ds->index.docs[doc];
    if (first < 0 || n < 0 || first > e->len || n > e->len - first)
        return bs_fail("%s: read: tokens [%lld, %lld) outside document %lld of %lld tokens", ds->index.dir,
                       (long long)first, (long long)(first + n), (long long)doc, (long long)e->len);
    return copy_checked(ds, e->shard, e->offset + first, n, out);
}

int dataset_read_span(const Dataset *ds, int64_t doc, int64_t src, int64_t n, uint32_t *out, int64_t *got) {
    *got = 0;
    if (doc < 0 || doc >= ds->index.n_docs)
        return bs_fail("%s: read: document %lld out of range [0, %lld)", ds->index.dir, (long long)doc,
                       (long long)ds->index.n_docs);
    const DocEntry *e = &ds->index.docs[doc];
    if (n < 0 || src < e->start || src > e->start + e->len)
        return bs_fail("%s: read: offset %lld is not inside document %lld (tokens [%lld, %lld))", ds->index.dir,
                       (long long)src, (long long)doc, (long long)e->start, (long long)(e->start + e->len));
    int64_t first = src - e->start, m = e->len - first < n ? e->len - first : n;
    if (copy_checked(ds, e->shard, e->offset + first, m, out) != 0) return -1;
    *got = m;
    return 0;
}
