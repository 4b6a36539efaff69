// tier_file.c: the file tier of activation offloading (offload.h): one unlinked file on local
// disk, written and read with O_DIRECT at page-aligned offsets, so every byte really goes to the
// disk and back instead of staying in the page cache.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/offload.h"

typedef struct {
    int fd;
    char path[1024];  // the name it had, for messages (it is unlinked)
} FileTier;

// pwrite / pread until all n bytes moved. A short transfer that leaves the next one unaligned for
// O_DIRECT is reported as what it is rather than as the EINVAL the next call would give.
static int file_io(FileTier *f, int writing, void *buf, size_t n, uint64_t off) {
    uint8_t *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t k = writing ? pwrite(f->fd, p + done, n - done, (off_t)(off + done))
                            : pread(f->fd, p + done, n - done, (off_t)(off + done));
        if (k < 0 && errno == EINTR) continue;
        const char *what = writing ? "writing" : "reading";
        if (k < 0)
            return bs_fail("%s %zu bytes at offset %llu: %s", what, n - done, (unsigned long long)(off + done),
                           strerror(errno));
        if (k == 0)
            return bs_fail("%s %zu bytes at offset %llu: %s", what, n - done, (unsigned long long)(off + done),
                           writing ? "nothing written" : "unexpected end of file");
        done += (size_t)k;
        if (done < n && done % 512 != 0)
            return bs_fail("%s %zu bytes at offset %llu: a short transfer of %zu bytes", what, n,
                           (unsigned long long)off, done);
    }
    return 0;
}

static int file_write(void *ctx, const void *buf, size_t n, uint64_t off) { return file_io(ctx, 1, (void *)buf, n, off); }
static int file_read(void *ctx, void *buf, size_t n, uint64_t off) { return file_io(ctx, 0, buf, n, off); }

static void file_close(void *ctx) {
    FileTier *f = ctx;
    if (f->fd >= 0) close(f->fd);
    free(f);
}

int offload_tier_file(OffloadTier *t, const char *dir) {
    memset(t, 0, sizeof *t);
    if (!dir || !*dir) dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    FileTier *f = bs_calloc(1, sizeof *f);
    if (!f) return -1;
    int n = snprintf(f->path, sizeof f->path, "%s/bytescale-offload-XXXXXX", dir);
    if (n < 0 || (size_t)n >= sizeof f->path) {
        free(f);
        return bs_fail("offload directory %s: the path is too long", dir);
    }
    f->fd = mkstemp(f->path);
    if (f->fd < 0) {
        int e = errno;
        free(f);
        return bs_fail("offload directory %s: cannot create a file there: %s", dir, strerror(e));
    }
    // nameless from now on: the space comes back when the process ends, however it ends
    unlink(f->path);
    const char *mode = "O_DIRECT";
    int fl = fcntl(f->fd, F_GETFL);
    if (fl < 0 || fcntl(f->fd, F_SETFL, fl | O_DIRECT) != 0)
        mode = "buffered: the file system refuses O_DIRECT, so the page cache may hide the disk's cost";
    snprintf(t->name, sizeof t->name, "file %s (deleted, %s)", f->path, mode);
    t->write = file_write;
    t->read = file_read;
    t->close = file_close;
    t->ctx = f;
    return 0;
}
