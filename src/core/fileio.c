// fileio.c: whole-file reads and write-to-temp-then-rename (see fileio.h).
#include "bytescale/fileio.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "bytescale/error.h"

// Pipes, FIFOs, /dev/stdin and /proc files report no useful size (0, or a directory's "size"):
// they are read as a stream into a doubling buffer, and this bounds how much a stream may hold.
#define STREAM_READ_MAX ((size_t)1 << 32)

int file_open_read(const char *path, FILE **out, struct stat *st) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return bs_fail("%s: cannot open: %s", path, strerror(errno));
    if (fstat(fileno(f), st) != 0) {
        int e = errno;
        fclose(f);
        return bs_fail("%s: cannot stat: %s", path, strerror(e));
    }
    // fopen opens a directory for reading on Linux and ftell then says LONG_MAX: refuse it by name
    if (S_ISDIR(st->st_mode)) {
        fclose(f);
        return bs_fail("%s: is a directory", path);
    }
    *out = f;
    return 0;
}

int file_read_all(const char *path, char **data, size_t *size) {
    *data = NULL;
    *size = 0;
    FILE *f;
    struct stat st;
    if (file_open_read(path, &f, &st) != 0) return -1;
    // A regular file's size is the first guess; anything else starts small and grows. Either way
    // we read to EOF, so a file that grows or shrinks meanwhile is still read whole and consistent.
    int regular = S_ISREG(st.st_mode);
    size_t limit = regular ? (size_t)SIZE_MAX / 2 : STREAM_READ_MAX;
    if (regular && (uint64_t)st.st_size >= limit) {
        fclose(f);
        return bs_fail("%s: %lld bytes is too large to read into memory", path, (long long)st.st_size);
    }
    // (/proc files are "regular" with st_size 0: they start small and grow like streams)
    size_t cap = regular && st.st_size > 0 ? (size_t)st.st_size + 1 : (size_t)1 << 16, n = 0;
    char *buf = bs_malloc(cap);
    int rc = -1;
    if (!buf) {
        bs_fail_ctx("%s", path);
        goto out;
    }
    for (;;) {
        if (n + 1 == cap) {  // full but for the NUL: grow (a regular file's first read ends here exactly)
            int c = fgetc(f);
            if (c == EOF) break;
            if (cap >= limit) {
                bs_fail("%s: more than %zu bytes; refusing to read it into memory", path, limit - 1);
                goto out;
            }
            size_t ncap = cap > limit / 2 ? limit : cap * 2;
            char *nb = bs_realloc(buf, ncap);
            if (!nb) {
                bs_fail_ctx("%s", path);
                goto out;
            }
            buf = nb;
            cap = ncap;
            buf[n++] = (char)c;
        }
        size_t want = cap - 1 - n, got = fread(buf + n, 1, want, f);
        n += got;
        if (got < want) break;  // fread stops short only at EOF or on an error (ferror below)
    }
    if (ferror(f)) {
        bs_fail("%s: read failed after %zu bytes: %s", path, n, strerror(errno));
        goto out;
    }
    buf[n] = '\0';
    *data = buf;
    *size = n;
    buf = NULL;
    rc = 0;
out:
    free(buf);
    fclose(f);
    return rc;
}

int atomic_open(AtomicFile *af, const char *path) {
    memset(af, 0, sizeof *af);
    if (strlen(path) >= sizeof af->path) return bs_fail("%s: path too long", path);
    strcpy(af->path, path);
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%ld", path, (long)getpid());
    af->f = fopen(af->tmp, "wb");
    if (!af->f) return bs_fail("%s: cannot create: %s", af->tmp, strerror(errno));
    return 0;
}

int atomic_write(AtomicFile *af, const void *data, size_t n) {
    if (af->failed) return -1;
    if (n && fwrite(data, 1, n, af->f) != n) {
        af->failed = 1;
        return bs_fail("%s: write failed: %s", af->tmp, strerror(errno));
    }
    return 0;
}

int atomic_close(AtomicFile *af) {
    if (!af->f) return bs_fail("%s: not open", af->path);
    // ferror catches failed writes made straight to af->f (fprintf), not only through atomic_write
    int ok = !af->failed && fflush(af->f) == 0 && !ferror(af->f) && fsync(fileno(af->f)) == 0;
    int saved = errno;
    if (fclose(af->f) != 0) ok = 0;
    af->f = NULL;
    if (!ok) {
        unlink(af->tmp);
        return af->failed ? -1 : bs_fail("%s: flush failed: %s", af->tmp, strerror(saved));
    }
    if (rename(af->tmp, af->path) != 0) {
        saved = errno;
        unlink(af->tmp);
        return bs_fail("%s: cannot rename into place: %s", af->path, strerror(saved));
    }
    return 0;
}

void atomic_abort(AtomicFile *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    unlink(af->tmp);
}

int file_write_atomic(const char *path, const void *data, size_t n) {
    AtomicFile af;
    if (atomic_open(&af, path) != 0) return -1;
    if (atomic_write(&af, data, n) != 0) {
        atomic_abort(&af);
        return -1;
    }
    return atomic_close(&af);
}

uint32_t checksum_crc32(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    // zlib takes uInt lengths; feed huge buffers in pieces
    while (n > 0) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return crc;
}

int make_dirs(const char *path) {
    char buf[4096];
    if (strlen(path) >= sizeof buf) return bs_fail("%s: path too long", path);
    strcpy(buf, path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return bs_fail("%s: cannot create directory: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return bs_fail("%s: cannot create directory: %s", buf, strerror(errno));
    return 0;
}

int file_find_source(const char *rel, char *out, size_t cap) {
    snprintf(out, cap, "%s", rel);
    if (access(out, R_OK) == 0) return 0;
    const char *src = getenv("BS_SOURCE_DIR");
    if (src) {
        snprintf(out, cap, "%s/%s", src, rel);
        if (access(out, R_OK) == 0) return 0;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        for (int up = 0; up < 2; up++) {  // drop the program's name, then the build directory
            char *slash = strrchr(exe, '/');
            if (slash) *slash = '\0';
        }
        snprintf(out, cap, "%s/%s", exe, rel);
        if (access(out, R_OK) == 0) return 0;
    }
    return bs_fail("cannot find %s in the current directory, $BS_SOURCE_DIR or the source tree", rel);
}
