// fileio.c: whole-file reads and write-to-temp-then-rename (see fileio.h).
#include "bytescale/fileio.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "bytescale/error.h"

int file_read_all(const char *path, char **data, size_t *size) {
    *data = NULL;
    *size = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return bs_fail("%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return bs_fail("%s: cannot seek: %s", path, strerror(errno));
    }
    long n = ftell(f);
    if (n < 0) {
        fclose(f);
        return bs_fail("%s: cannot tell size: %s", path, strerror(errno));
    }
    rewind(f);
    char *buf = bs_malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return bs_fail_ctx("%s", path);
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    int err = ferror(f);
    fclose(f);
    if (err || got != (size_t)n) {
        free(buf);
        return bs_fail("%s: read %zu of %ld bytes", path, got, n);
    }
    buf[n] = '\0';
    *data = buf;
    *size = (size_t)n;
    return 0;
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
