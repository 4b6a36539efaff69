// shard_write.c: write token shards and the document index (layout in docs/data-format.md), beside
// the dataset already in the directory, then switch to the new one by renaming its index into place.
// It reads what is there with shard_read.c (the index it appends beside, the token width), never
// the other way round.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/shard.h"
#include "data/format.h"

enum { CONVERT_TOKENS = 1 << 18 };  // ids converted to file bytes per write

static void join_path(char *out, size_t cap, const char *dir, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

// ---- the output directory --------------------------------------------------------------------

// Digits at s into *v (at least one, no overflow): the end of them, or NULL.
static const char *parse_digits(const char *s, int64_t *v) {
    if (*s < '0' || *s > '9') return NULL;
    int64_t x = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (x > (INT64_MAX - 9) / 10) return NULL;
        x = 10 * x + (*s - '0');
    }
    *v = x;
    return s;
}

// s is exactly ".tmp.<pid>": what atomic_open appends to a file's name.
static int is_tmp_suffix(const char *s) {
    int64_t pid;
    if (strncmp(s, ".tmp.", 5) != 0) return 0;
    s = parse_digits(s + 5, &pid);
    return s && *s == '\0';
}

enum { NAME_OTHER, NAME_SHARD, NAME_TMP };

// What a directory entry is to a writer: a shard ("shard-g<gen>-<n>.bin", or "shard-<n>.bin" as the
// first version named them: generation 0), a temporary file of ours (a shard's or the index's name
// + ".tmp.<pid>"), or anything else, which is never touched. *gen: the shard's generation.
static int classify_name(const char *name, int64_t *gen) {
    *gen = 0;
    size_t ix = strlen(INDEX_FILE);
    if (strncmp(name, INDEX_FILE, ix) == 0 && is_tmp_suffix(name + ix)) return NAME_TMP;
    if (strncmp(name, "shard-", 6) != 0) return NAME_OTHER;
    const char *p = name + 6;
    int64_t n;
    if (*p == 'g') {
        p = parse_digits(p + 1, gen);
        if (!p || *p != '-') return NAME_OTHER;
        p++;
    }
    p = parse_digits(p, &n);
    if (!p || strncmp(p, ".bin", 4) != 0) return NAME_OTHER;
    p += 4;
    if (*p == '\0') return NAME_SHARD;
    return is_tmp_suffix(p) ? NAME_TMP : NAME_OTHER;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

// Remove our temporary files, and, when remove_shards, every shard file not in keep. Called with the
// directory locked, so no live writer owns any of them. *max_gen: the highest generation of the
// complete shards in the directory, removed or not, so the next run's names are new to any reader
// that still holds an old index. Best effort: a file that cannot be removed stays (it is not part of
// any dataset either way).
static void sweep_dir(const ShardWriter *w, const ShardInfo *keep, int n_keep, int remove_shards, int64_t *max_gen) {
    *max_gen = 0;
    int fd = dup(w->dir_fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return;
    }
    rewinddir(d);  // a dup'ed descriptor shares its position with dir_fd: an earlier sweep left it at the end
    // the names to keep, sorted for bsearch: a dataset may have many thousands of shards
    const char **names = n_keep > 0 ? bs_malloc((size_t)n_keep * sizeof *names) : NULL;
    if (n_keep > 0 && !names) remove_shards = 0;  // out of memory: remove no shard rather than a wrong one
    for (int s = 0; names && s < n_keep; s++) names[s] = keep[s].name;
    if (names) qsort(names, (size_t)n_keep, sizeof *names, cmp_name);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t gen;
        int kind = classify_name(e->d_name, &gen);
        if (kind == NAME_OTHER) continue;
        if (kind == NAME_SHARD && gen > *max_gen) *max_gen = gen;
        const char *name = e->d_name;
        int kept = names && bsearch(&name, names, (size_t)n_keep, sizeof *names, cmp_name);
        if (kind == NAME_TMP || (remove_shards && !kept))
            unlinkat(w->dir_fd, e->d_name, 0);  // a directory of that name fails here, and stays
    }
    free(names);
    closedir(d);
}

static void writer_free(ShardWriter *w) {
    free(w->buf);
    free(w->shards);
    free(w->docs);
    free(w->path_blob);
    free(w->path_off);
    w->buf = NULL, w->shards = NULL, w->docs = NULL, w->path_blob = NULL, w->path_off = NULL;
    if (w->dir_fd >= 0) close(w->dir_fd);  // and so unlock
    w->dir_fd = -1;
}

// The index in dir now: absent (*have = 0), read (*have = 1, ix filled), or present but unreadable
// (*have = -1: damaged, or from a newer version). A file there that is not a bytescale index at all
// is refused: replacing it would destroy something that is not ours.
static int current_index(const char *dir, DocIndex *ix, int *have) {
    char path[4200];
    join_path(path, sizeof path, dir, INDEX_FILE);
    *have = 0;
    struct stat st;
    if (stat(path, &st) != 0) return errno == ENOENT ? 0 : bs_fail("%s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return bs_fail("%s is not a regular file: refusing to replace it", path);
    char head[8] = {0};
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(head, 1, sizeof head, f) : 0;
    if (f) fclose(f);
    // a short file may be an index cut short (a crash under an older version): ours, damaged
    if (got == sizeof head && memcmp(head, INDEX_MAGIC, sizeof head) != 0)
        return bs_fail("%s exists and is not a bytescale index: refusing to replace it (choose another --out)", path);
    *have = docindex_read(ix, dir) == 0 ? 1 : -1;
    return 0;
}

int shard_writer_open(ShardWriter *w, const char *dir, const Tokenizer *tok, int64_t shard_bytes) {
    memset(w, 0, sizeof *w);
    w->dir_fd = -1;
    if (strlen(dir) >= sizeof w->dir - 64) return bs_fail("%s: output directory path too long", dir);
    if (shard_bytes <= 0) return bs_fail("shard size must be positive (got %lld bytes)", (long long)shard_bytes);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    w->tokenizer = tokenizer_kind(tok);
    w->vocab = tokenizer_vocab_size(tok);
    w->width = token_width(w->vocab);
    w->shard_tokens = shard_bytes / w->width > 0 ? shard_bytes / w->width : 1;
    if (make_dirs(dir) != 0) return -1;
    // the lock is the directory itself (no lock file to leave behind); it ends when dir_fd closes,
    // so a killed run never leaves it taken
    w->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (w->dir_fd < 0) return bs_fail("%s: cannot open the output directory: %s", dir, strerror(errno));
    if (flock(w->dir_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        writer_free(w);
        if (e == EWOULDBLOCK) return bs_fail("%s: another prepare is writing into this directory", dir);
        return bs_fail("%s: cannot lock the output directory: %s", dir, strerror(e));
    }
    DocIndex cur;
    int have;
    if (current_index(dir, &cur, &have) != 0) {
        writer_free(w);
        return -1;
    }
    // Leftovers of killed runs: temporary files, and complete shards that the index does not name
    // (a run killed before its index was in place, or after, before it removed the old shards).
    // With an index that does not read, which shards it meant is unknown: they stay until this run's
    // index replaces it.
    int64_t max_gen;
    sweep_dir(w, have == 1 ? cur.shards : NULL, have == 1 ? cur.n_shards : 0, have >= 0, &max_gen);
    if (have == 1) docindex_free(&cur);
    bs_error_clear();  // an unreadable old index is not this run's error
    w->gen = max_gen + 1;
    w->buf = bs_malloc((size_t)CONVERT_TOKENS * w->width);
    if (!w->buf) {
        writer_free(w);
        return -1;
    }
    return 0;
}

static int shard_begin(ShardWriter *w) {
    if (w->n_shards == w->cap_shards) {
        int cap = w->cap_shards ? 2 * w->cap_shards : 8;
        ShardInfo *s = bs_realloc(w->shards, (size_t)cap * sizeof *s);
        if (!s) return -1;
        w->shards = s;
        w->cap_shards = cap;
    }
    ShardInfo *info = &w->shards[w->n_shards];
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "shard-g%lld-%05d.bin", (long long)w->gen, w->n_shards);
    char path[4200];
    join_path(path, sizeof path, w->dir, info->name);
    if (atomic_open(&w->file, path) != 0) return -1;
    w->open = 1;
    w->cur_tokens = 0;
    w->cur_crc = 0;
    // room for the header; it is filled in when the shard is complete and its checksum known
    uint8_t zero[HEADER_BYTES] = {0};
    return atomic_write(&w->file, zero, sizeof zero);
}

static int shard_end(ShardWriter *w) {
    ShardInfo *info = &w->shards[w->n_shards];
    info->n_tokens = w->cur_tokens;
    info->crc = w->cur_crc;
    uint8_t h[HEADER_BYTES] = {0};
    memcpy(h + SH_MAGIC, SHARD_MAGIC, sizeof SHARD_MAGIC);
    put_u32(h + SH_VERSION, SHARD_VERSION);
    put_u32(h + SH_TOKENIZER, (uint32_t)w->tokenizer);
    put_u32(h + SH_VOCAB, w->vocab);
    put_u32(h + SH_WIDTH, w->width);
    put_u64(h + SH_NTOKENS, (uint64_t)w->cur_tokens);
    put_u32(h + SH_CRC, w->cur_crc);
    put_u32(h + HEADER_CRC_AT, checksum_crc32(0, h, HEADER_CRC_AT));
    if (!w->file.failed && fseek(w->file.f, 0, SEEK_SET) != 0) {
        w->file.failed = 1;
        bs_fail("%s: cannot seek back to write the header: %s", w->file.tmp, strerror(errno));
    }
    int rc = atomic_write(&w->file, h, sizeof h);
    w->open = 0;
    if (atomic_close(&w->file) != 0 || rc != 0) return -1;
    w->n_shards++;
    return 0;
}

static int write_tokens(ShardWriter *w, const uint32_t *ids, int64_t n) {
    uint32_t width = w->width;
    for (int64_t done = 0; done < n;) {
        int64_t m = n - done < CONVERT_TOKENS ? n - done : CONVERT_TOKENS;
        uint8_t *p = w->buf;
        for (int64_t i = 0; i < m; i++) {
            uint32_t id = ids[done + i];
            if (id >= w->vocab)
                return bs_fail("token %lld: id %u out of range for vocab %u", (long long)(done + i), id, w->vocab);
            for (uint32_t k = 0; k < width; k++) *p++ = (uint8_t)(id >> (8 * k));
        }
        size_t bytes = (size_t)(p - w->buf);
        w->cur_crc = checksum_crc32(w->cur_crc, w->buf, bytes);
        if (atomic_write(&w->file, w->buf, bytes) != 0) return -1;
        done += m;
    }
    return 0;
}

static int add_path(ShardWriter *w, const char *source) {
    size_t len = strlen(source) + 1;
    if (w->path_used + (int64_t)len > w->path_cap) {
        int64_t cap = w->path_cap ? w->path_cap : 4096;
        while (cap < w->path_used + (int64_t)len) cap *= 2;
        char *b = bs_realloc(w->path_blob, (size_t)cap);
        if (!b) return -1;
        w->path_blob = b;
        w->path_cap = cap;
    }
    w->path_off[w->n_docs] = w->path_used;
    memcpy(w->path_blob + w->path_used, source, len);
    w->path_used += (int64_t)len;
    return 0;
}

int shard_writer_add(ShardWriter *w, const uint32_t *ids, int64_t n, const char *source) {
    if (w->open && w->cur_tokens > 0 && w->cur_tokens + n > w->shard_tokens && shard_end(w) != 0) return -1;
    if (!w->open && shard_begin(w) != 0) return -1;
    if (w->n_docs == w->cap_docs) {
        int64_t cap = w->cap_docs ? 2 * w->cap_docs : 1024;
        DocEntry *d = bs_realloc(w->docs, (size_t)cap * sizeof *d);
        if (!d) return -1;
        w->docs = d;
        int64_t *o = bs_realloc(w->path_off, (size_t)cap * sizeof *o);
        if (!o) return -1;
        w->path_off = o;
        w->cap_docs = cap;
    }
    if (write_tokens(w, ids, n) != 0) return bs_fail_ctx("%s", source ? source : w->file.path);
    if (add_path(w, source ? source : "") != 0) return -1;
    w->docs[w->n_docs] = (DocEntry){.shard = (uint32_t)w->n_shards, .offset = w->cur_tokens, .len = n};
    w->n_docs++;
    w->cur_tokens += n;
    return 0;
}

// The index file's bytes (layout in docs/data-format.md).
static uint8_t *index_bytes(const ShardWriter *w, size_t *size) {
    size_t paths = 0;
    for (int64_t d = 0; d < w->n_docs; d++) paths += 4 + strlen(w->path_blob + w->path_off[d]);
    size_t body = (size_t)w->n_shards * SHARD_ENTRY_BYTES + (size_t)w->n_docs * DOC_ENTRY_BYTES + paths;
    uint8_t *b = bs_calloc(1, HEADER_BYTES + body);
    if (!b) return NULL;
    uint8_t *p = b + HEADER_BYTES;
    int64_t total = 0;
    for (int s = 0; s < w->n_shards; s++, p += SHARD_ENTRY_BYTES) {
        memcpy(p, w->shards[s].name, strlen(w->shards[s].name));
        put_u64(p + 48, (uint64_t)w->shards[s].n_tokens);
        put_u32(p + 56, w->shards[s].crc);
        total += w->shards[s].n_tokens;
    }
    for (int64_t d = 0; d < w->n_docs; d++, p += DOC_ENTRY_BYTES) {
        put_u32(p, w->docs[d].shard);
        put_u64(p + 8, (uint64_t)w->docs[d].offset);
        put_u64(p + 16, (uint64_t)w->docs[d].len);
    }
    for (int64_t d = 0; d < w->n_docs; d++) {
        const char *s = w->path_blob + w->path_off[d];
        uint32_t len = (uint32_t)strlen(s);
        put_u32(p, len);
        memcpy(p + 4, s, len);
        p += 4 + len;
    }
    memcpy(b + IX_MAGIC, INDEX_MAGIC, sizeof INDEX_MAGIC);
    put_u32(b + IX_VERSION, INDEX_VERSION);
    put_u32(b + IX_TOKENIZER, (uint32_t)w->tokenizer);
    put_u32(b + IX_VOCAB, w->vocab);
    put_u32(b + IX_WIDTH, w->width);
    put_u32(b + IX_NSHARDS, (uint32_t)w->n_shards);
    put_u32(b + IX_FLAGS, INDEX_HAS_PATHS);
    put_u64(b + IX_NDOCS, (uint64_t)w->n_docs);
    put_u64(b + IX_NTOKENS, (uint64_t)total);
    put_u64(b + IX_BODY_BYTES, body);
    put_u32(b + IX_BODY_CRC, checksum_crc32(0, b + HEADER_BYTES, body));
    put_u32(b + HEADER_CRC_AT, checksum_crc32(0, b, HEADER_CRC_AT));
    *size = HEADER_BYTES + body;
    return b;
}

int shard_writer_finish(ShardWriter *w) {
    if (w->open && shard_end(w) != 0) {
        shard_writer_abort(w);
        return -1;
    }
    // the shards' directory entries must be on disk before an index that names them can be (a
    // power cut may otherwise keep the rename of the index and lose those of the shards)
    if (fsync(w->dir_fd) != 0) {
        bs_fail("%s: cannot sync the output directory: %s", w->dir, strerror(errno));
        shard_writer_abort(w);
        return -1;
    }
    size_t size;
    uint8_t *bytes = index_bytes(w, &size);
    char path[4200];
    join_path(path, sizeof path, w->dir, INDEX_FILE);
    // the commit point: rename(2) puts the whole new index in place of the whole old one
    int rc = bytes ? file_write_atomic(path, bytes, size) : -1;
    free(bytes);
    if (rc != 0) {
        shard_writer_abort(w);
        return -1;
    }
    fsync(w->dir_fd);  // the switch made durable; it has happened whatever this returns
    // The old dataset's shards, now named by no index. A reader that opened the old dataset keeps its
    // mappings (an unlinked file lives on while mapped).
    int64_t max_gen;
    sweep_dir(w, w->shards, w->n_shards, 1, &max_gen);
    writer_free(w);
    return 0;
}

void shard_writer_abort(ShardWriter *w) {
    if (w->open) atomic_abort(&w->file);
    w->open = 0;
    // only this run's shards: their generation is new, so no index names them
    char path[4200];
    for (int s = 0; s < w->n_shards; s++) {
        join_path(path, sizeof path, w->dir, w->shards[s].name);
        unlink(path);
    }
    w->n_shards = 0;
    writer_free(w);
}
