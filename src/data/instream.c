// instream.c: a plain, gzip or zstd file read as a stream of bytes (jsonl.h), a fixed buffer of
// compressed input at a time, so reading a file of any size takes the same memory.
//
// gzip is inflated with zlib's inflate() rather than gzread(): gzread reads a file that is not gzip
// as plain text (a mislabelled file would pass silently), and inflate says exactly when the file
// ends inside a member (a download cut short). Concatenated members (pigz, `cat a.gz b.gz`) are one
// stream, as gunzip reads them; so are concatenated zstd frames.
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "bytescale/error.h"
#include "data/jsonl.h"

enum { IN_BUF = 1 << 18 };

struct InStream {
    InstreamKind kind;
    int fd;
    int64_t offset;    // compressed bytes read
    int eof;           // the file has no more bytes
    uint8_t *in;       // compressed input: [in_at, in_n) not yet consumed
    size_t in_at, in_n;
    z_stream z;
    int z_open;
    int in_member;     // inside a gzip member or zstd frame (at the end of the file: truncated)
    ZSTD_DCtx *zd;
};

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && memcmp(s + n - k, suf, k) == 0;
}

InstreamKind instream_kind_of(const char *path) {
    if (has_suffix(path, ".gz")) return INSTREAM_GZIP;
    if (has_suffix(path, ".zst")) return INSTREAM_ZSTD;
    return INSTREAM_PLAIN;
}

int jsonl_is_jsonl(const char *path) {
    return has_suffix(path, ".jsonl") || has_suffix(path, ".jsonl.gz") || has_suffix(path, ".jsonl.zst");
}

// Refill the compressed buffer when it is empty. 0 also at the end of the file (s->eof set).
static int fill(InStream *s) {
    if (s->in_at < s->in_n || s->eof) return 0;
    ssize_t r;
    do r = read(s->fd, s->in, IN_BUF);
    while (r < 0 && errno == EINTR);
    if (r < 0) return bs_fail("read error: %s", strerror(errno));
    s->in_at = 0;
    s->in_n = (size_t)r;
    s->offset += r;
    s->eof = r == 0;
    return 0;
}

static int check_magic(InStream *s, const char *path) {
    if (fill(s) != 0) return bs_fail_ctx("%s", path);
    if (s->in_n == 0) return 0;  // an empty file is an empty stream
    static const uint8_t gz[2] = {0x1f, 0x8b}, zst[4] = {0x28, 0xb5, 0x2f, 0xfd};
    if (s->kind == INSTREAM_GZIP && (s->in_n < 2 || memcmp(s->in, gz, 2) != 0))
        return bs_fail("%s: not a gzip file (its name ends in .gz)", path);
    if (s->kind == INSTREAM_ZSTD && (s->in_n < 4 || memcmp(s->in, zst, 4) != 0))
        return bs_fail("%s: not a zstd file (its name ends in .zst)", path);
    return 0;
}

int instream_open(InStream **out, const char *path) {
    *out = NULL;
    InStream *s = bs_calloc(1, sizeof *s);
    if (!s) return -1;
    s->kind = instream_kind_of(path);
    s->fd = open(path, O_RDONLY | O_CLOEXEC);
    s->in = bs_malloc(IN_BUF);
    int rc = s->fd < 0 ? bs_fail("%s: cannot open: %s", path, strerror(errno)) : s->in ? 0 : -1;
    if (rc == 0 && s->kind == INSTREAM_GZIP) {
        // 16 + MAX_WBITS: a gzip header and trailer, not a raw zlib stream
        s->z_open = inflateInit2(&s->z, 16 + MAX_WBITS) == Z_OK;
        if (!s->z_open) rc = bs_fail("%s: zlib: out of memory", path);
    }
    if (rc == 0 && s->kind == INSTREAM_ZSTD) {
        s->zd = ZSTD_createDCtx();
        if (!s->zd) rc = bs_fail("%s: zstd: out of memory", path);
    }
    if (rc == 0) rc = check_magic(s, path);
    if (rc != 0) {
        instream_close(s);
        return -1;
    }
    *out = s;
    return 0;
}

static int read_gzip(InStream *s, void *buf, size_t cap, size_t *got) {
    while (*got == 0) {
        if (fill(s) != 0) return -1;
        if (s->in_at == s->in_n) {
            if (s->in_member) return bs_fail("truncated gzip stream: the file ends inside a compressed member");
            return 0;
        }
        s->z.next_in = s->in + s->in_at;
        s->z.avail_in = (uInt)(s->in_n - s->in_at);
        s->z.next_out = buf;
        s->z.avail_out = (uInt)cap;
        s->in_member = 1;
        int rc = inflate(&s->z, Z_NO_FLUSH);
        s->in_at = s->in_n - s->z.avail_in;
        *got = cap - s->z.avail_out;
        if (rc == Z_STREAM_END) {
            s->in_member = 0;
            inflateReset(&s->z);  // another member may follow
        } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
            return bs_fail("corrupt gzip stream: %s", s->z.msg ? s->z.msg : "inflate failed");
        }
    }
    return 0;
}

static int read_zstd(InStream *s, void *buf, size_t cap, size_t *got) {
    while (*got == 0) {
        if (fill(s) != 0) return -1;
        if (s->in_at == s->in_n) {
            if (s->in_member) return bs_fail("truncated zstd stream: the file ends inside a compressed frame");
            return 0;
        }
        ZSTD_inBuffer in = {s->in, s->in_n, s->in_at};
        ZSTD_outBuffer o = {buf, cap, 0};
        size_t rc = ZSTD_decompressStream(s->zd, &o, &in);
        if (ZSTD_isError(rc)) return bs_fail("corrupt zstd stream: %s", ZSTD_getErrorName(rc));
        s->in_at = in.pos;
        *got = o.pos;
        s->in_member = rc != 0;  // 0: a frame just ended
    }
    return 0;
}

int instream_read(InStream *s, void *buf, size_t cap, size_t *got) {
    *got = 0;
    if (s->kind == INSTREAM_GZIP) return read_gzip(s, buf, cap, got);
    if (s->kind == INSTREAM_ZSTD) return read_zstd(s, buf, cap, got);
    if (fill(s) != 0) return -1;
    size_t n = s->in_n - s->in_at < cap ? s->in_n - s->in_at : cap;
    memcpy(buf, s->in + s->in_at, n);
    s->in_at += n;
    *got = n;
    return 0;
}

int64_t instream_offset(const InStream *s) { return s->offset; }

void instream_close(InStream *s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    if (s->z_open) inflateEnd(&s->z);
    ZSTD_freeDCtx(s->zd);
    free(s->in);
    free(s);
}
