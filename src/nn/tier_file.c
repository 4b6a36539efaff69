// tier_file.c: the file tier of activation offloading (offload.h): one unlinked file on local
// disk per activation set, written and read with O_DIRECT at page-aligned offsets, so every byte
// really goes to the disk and back instead of staying in the page cache.
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/offload.h"

typedef struct {
    pthread_mutex_t mu;            // the writer makes a set's file while the reader looks another up
    int fd[OFFLOAD_MAX_SETS];      // -1: not made yet
    char dir[1024];
    char path[1024];               // set 0's name, for messages (it is unlinked)
} FileTier;

// A new unlinked file in f->dir, O_DIRECT where the file system allows it: the fd, or -1 + error.
// *direct says which.
static int make_file(FileTier *f, char *path, size_t cap, int *direct) {
    int n = snprintf(path, cap, "%s/bytescale-offload-XXXXXX", f->dir);
    if (n < 0 || (size_t)n >= cap) return bs_fail("offload directory %s: the path is too long", f->dir);
    int fd = mkstemp(path);
    if (fd < 0) return bs_fail("offload directory %s: cannot create a file there: %s", f->dir, strerror(errno));
    // nameless from now on: the space comes back when the process ends, however it ends
    unlink(path);
    int fl = fcntl(fd, F_GETFL);
    *direct = fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
    return fd;
}

// The file of a set, made on its first use (a set is read only after it was written).
static int set_fd(FileTier *f, int set) {
    if (set < 0 || set >= OFFLOAD_MAX_SETS)
        return bs_fail("activation set %d: the file tier serves sets 0 .. %d", set, OFFLOAD_MAX_SETS - 1);
    pthread_mutex_lock(&f->mu);
    int fd = f->fd[set];
    if (fd < 0) {
        char path[1024];
        int direct;
        fd = f->fd[set] = make_file(f, path, sizeof path, &direct);
    }
    pthread_mutex_unlock(&f->mu);
    return fd;
}

// pwrite / pread until all n bytes moved. A short transfer that leaves the next one unaligned for
// O_DIRECT is reported as what it is rather than as the EINVAL the next call would give.
static int file_io(FileTier *f, int set, int writing, void *buf, size_t n, uint64_t off) {
    int fd = set_fd(f, set);
    if (fd < 0) return -1;
    uint8_t *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t k = writing ? pwrite(fd, p + done, n - done, (off_t)(off + done))
                            : pread(fd, p + done, n - done, (off_t)(off + done));
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

static int file_write(void *ctx, int set, const void *buf, size_t n, uint64_t off) {
    return file_io(ctx, set, 1, (void *)buf, n, off);
}
static int file_read(void *ctx, int set, void *buf, size_t n, uint64_t off) { return file_io(ctx, set, 0, buf, n, off); }

static void file_close(void *ctx) {
    FileTier *f = ctx;
    for (int s = 0; s < OFFLOAD_MAX_SETS; s++)
        if (f->fd[s] >= 0) close(f->fd[s]);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

int offload_tier_file(OffloadTier *t, const char *dir) {
    memset(t, 0, sizeof *t);
    if (!dir || !*dir) dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    FileTier *f = bs_calloc(1, sizeof *f);
    if (!f) return -1;
    for (int s = 0; s < OFFLOAD_MAX_SETS; s++) f->fd[s] = -1;
    if ((size_t)snprintf(f->dir, sizeof f->dir, "%s", dir) >= sizeof f->dir) {
        free(f);
        return bs_fail("offload directory %s: the path is too long", dir);
    }
    // set 0's file now: a directory that cannot take one is refused before training starts
    int direct;
    f->fd[0] = make_file(f, f->path, sizeof f->path, &direct);
    if (f->fd[0] < 0) {
        free(f);
        return -1;
    }
    pthread_mutex_init(&f->mu, NULL);
    const char *mode = direct ? "O_DIRECT" : "buffered: the file system refuses O_DIRECT, so the page cache may hide the disk's cost";
    snprintf(t->name, sizeof t->name, "file %s (deleted, %s)", f->path, mode);
    t->write = file_write;
    t->read = file_read;
    t->close = file_close;
    t->ctx = f;
    return 0;
}
