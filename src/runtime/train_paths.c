// train_paths.c: what a run writes, checked before its first step (train.h, docs/training.md "Run
// directories"). A run that would fail at its first checkpoint fails at its start instead; a file
// that is not one of ours is never overwritten; two runs never share a checkpoint directory or a
// metrics file; a checkpoint write that a crash interrupted leaves nothing behind for long.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/train.h"

// The directory part of path ("." when there is none) into out.
static void dir_of(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == out) out[1] = '\0';
    else *slash = '\0';
}

// The directory a file will go into: made if missing, and writable.
static int writable_dir(const char *dir, const char *flag) {
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return bs_fail("%s: %s is a file, not a directory", flag, dir);
    if (make_dirs(dir) != 0) return bs_fail_ctx("%s", flag);
    if (access(dir, W_OK | X_OK) != 0) return bs_fail("%s: cannot write into %s: %s", flag, dir, strerror(errno));
    return 0;
}

// An exclusive lock on lock_path, held while *fd stays open. Another run holding it: an error.
static int take_lock(const char *lock_path, const char *what, int *fd) {
    *fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) return bs_fail("cannot create the lock %s: %s", lock_path, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(*fd);
        *fd = -1;
        if (e == EWOULDBLOCK)
            return bs_fail("%s is in use by another run (it holds %s): two runs would overwrite each other's files",
                           what, lock_path);
        return bs_fail("cannot lock %s: %s", lock_path, strerror(e));
    }
    return 0;
}

int train_file_is_metrics(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char line[4096];
    size_t n = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    if (n == 0) return 1;  // empty: a run that had not finished a step yet
    line[n] = '\0';
    // ours when a complete line among the first few is a step record (one may be damaged)
    for (char *at = line, *nl; (nl = strchr(at, '\n')); at = nl + 1) {
        *nl = '\0';
        cJSON *o = cJSON_Parse(at);
        int ours = o && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "step")) &&
                   cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "loss"));
        cJSON_Delete(o);
        if (ours) return 1;
    }
    return 0;
}

// A file the run will replace: absent, or one that starts with what the run writes there.
static int replaceable(const char *path, const char *flag, const char *magic, int (*is_ours)(const char *)) {
    struct stat sb;
    if (stat(path, &sb) != 0) return errno == ENOENT ? 0 : bs_fail("%s: %s: %s", flag, path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return bs_fail("%s: %s is a directory", flag, path);
    if (!S_ISREG(sb.st_mode)) return bs_fail("%s: %s is not a regular file", flag, path);
    int ours = 0;
    if (is_ours) {
        ours = is_ours(path);
    } else {
        char head[64] = {0};
        FILE *f = fopen(path, "rb");
        size_t n = f ? fread(head, 1, strlen(magic), f) : 0;
        if (f) fclose(f);
        ours = sb.st_size == 0 || (n == strlen(magic) && memcmp(head, magic, n) == 0);
    }
    if (!ours)
        return bs_fail("%s: %s exists and is not a file this command writes: refusing to overwrite it (give another "
                       "path)",
                       flag, path);
    return 0;
}

int train_check_output(const char *path, const char *flag, const char *magic) {
    char dir[TRAIN_PATH_MAX];
    dir_of(path, dir, sizeof dir);
    if (writable_dir(dir, flag) != 0) return -1;
    return replaceable(path, flag, magic, NULL);
}

// Files a killed checkpoint write left: <dir>/ckpt-<step>.bin.tmp.<pid>. Called with the lock held,
// so no live run of ours is writing one.
static void remove_stale_tmp(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "ckpt-", 5) != 0 || !strstr(e->d_name, ".bin.tmp.")) continue;
        char path[TRAIN_PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

int train_paths_open(TrainPaths *p, const TrainConfig *c) {
    p->ckpt_lock = p->metrics_lock = -1;
    p->metrics_lock_path[0] = '\0';
    if (c->ckpt_dir[0]) {
        if (writable_dir(c->ckpt_dir, "--ckpt-dir") != 0) return -1;
        char lock[TRAIN_PATH_MAX + 16];
        snprintf(lock, sizeof lock, "%s/.lock", c->ckpt_dir);
        char what[TRAIN_PATH_MAX + 32];
        snprintf(what, sizeof what, "checkpoint directory %s", c->ckpt_dir);
        if (take_lock(lock, what, &p->ckpt_lock) != 0) return -1;
        remove_stale_tmp(c->ckpt_dir);
    }
    if (c->metrics[0]) {
        char dir[TRAIN_PATH_MAX];
        dir_of(c->metrics, dir, sizeof dir);
        if (writable_dir(dir, "--metrics") != 0 ||
            replaceable(c->metrics, "--metrics", NULL, train_file_is_metrics) != 0) {
            train_paths_close(p);
            return -1;
        }
        snprintf(p->metrics_lock_path, sizeof p->metrics_lock_path, "%s.lock", c->metrics);
        char what[TRAIN_PATH_MAX + 32];
        snprintf(what, sizeof what, "metrics file %s", c->metrics);
        if (take_lock(p->metrics_lock_path, what, &p->metrics_lock) != 0) {
            p->metrics_lock_path[0] = '\0';
            train_paths_close(p);
            return -1;
        }
    }
    if (c->trace[0] && train_check_output(c->trace, "--trace", "{\"traceEvents\"") != 0) {
        train_paths_close(p);
        return -1;
    }
    if (c->save_plans[0] && writable_dir(c->save_plans, "--save-plans") != 0) {
        train_paths_close(p);
        return -1;
    }
    return 0;
}

void train_paths_close(TrainPaths *p) {
    if (p->ckpt_lock >= 0) close(p->ckpt_lock);
    // the metrics lock file is ours alone: remove it while still holding it
    if (p->metrics_lock >= 0) {
        if (p->metrics_lock_path[0]) unlink(p->metrics_lock_path);
        close(p->metrics_lock);
    }
    p->ckpt_lock = p->metrics_lock = -1;
}
