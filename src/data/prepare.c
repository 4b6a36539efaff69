// prepare.c: text files -> token shards + document index (see prepare.h).
#include "bytescale/prepare.h"

#include <dirent.h>
#include <sched.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/shard.h"
#include "bytescale/timer.h"
#include "bytescale/tokenizer.h"
#include "data/prepare_pipe.h"

// ---- listing the inputs ----------------------------------------------------------------------

typedef struct {
    char **paths;
    int64_t n, cap;
} PathList;

static int list_push(PathList *l, const char *path) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 256;
        char **p = bs_realloc(l->paths, (size_t)cap * sizeof *p);
        if (!p) return -1;
        l->paths = p;
        l->cap = cap;
    }
    size_t len = strlen(path) + 1;
    char *copy = bs_malloc(len);
    if (!copy) return -1;
    memcpy(copy, path, len);
    l->paths[l->n++] = copy;
    return 0;
}

static void list_free(PathList *l) {
    for (int64_t i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
    memset(l, 0, sizeof *l);
}

static int has_ext(const char *name, const char *ext) {
    if (!ext || !*ext) return 1;
    size_t n = strlen(name), e = strlen(ext);
    return n >= e && memcmp(name + n - e, ext, e) == 0;
}

// child is parent or lies under it (both absolute, resolved paths).
static int path_inside(const char *child, const char *parent) {
    size_t n = strlen(parent);
    if (n == 1 && parent[0] == '/') return 1;
    return strncmp(child, parent, n) == 0 && (child[n] == '\0' || child[n] == '/');
}

enum { WALK_DEPTH_MAX = 512 };

// One input directory being walked.
typedef struct {
    PathList *list;
    const char *ext;
    const char *input;     // as given, for messages
    const char *out_real;  // the output directory, resolved (resolve_dir); NULL = no check
    struct {
        dev_t dev;
        ino_t ino;
    } open[WALK_DEPTH_MAX];  // the directories from the input down to the current one
    int depth;
} Walk;

// Refuse an output directory that lies in a directory the walk reads: prepare would take its own
// shards (or the temporary files of this very run) as input.
static int check_out(const Walk *wk, const char *dir, const char *via) {
    if (!wk->out_real) return 0;
    char real[PATH_MAX];
    if (!realpath(dir, real)) return bs_fail("%s: cannot resolve: %s", dir, strerror(errno));
    if (!path_inside(wk->out_real, real)) return 0;
    return bs_fail("the output directory %s is inside the input %s%s%s%s: prepare would read its own shards; choose "
                   "an output outside every input",
                   wk->out_real, wk->input, via ? " (through the symbolic link " : "", via ? via : "", via ? ")" : "");
}

// Every file under dir whose name ends in ext, symbolic links followed: a link to a file is that
// file, a link to a directory is walked like one, except a link back to a directory the walk is
// already inside (a loop: its files are being taken already). What cannot be taken (a dangling
// link, a FIFO, a socket) and would have been is an error, never a silent omission.
static int walk(Walk *wk, const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) return bs_fail("%s: cannot stat: %s", dir, strerror(errno));
    for (int k = 0; k < wk->depth; k++)
        if (wk->open[k].dev == st.st_dev && wk->open[k].ino == st.st_ino) return 0;  // a loop
    if (wk->depth == WALK_DEPTH_MAX) return bs_fail("%s: directories nested more than %d deep", dir, WALK_DEPTH_MAX);
    wk->open[wk->depth].dev = st.st_dev;
    wk->open[wk->depth].ino = st.st_ino;
    wk->depth++;
    DIR *d = opendir(dir);
    int rc = d ? 0 : bs_fail("%s: cannot open directory: %s", dir, strerror(errno));
    struct dirent *ent;
    char path[4096];
    while (rc == 0 && (ent = readdir(d)) != NULL) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, ent->d_name) >= sizeof path) {
            rc = bs_fail("%s/%s: path too long", dir, ent->d_name);
            break;
        }
        int wanted = has_ext(ent->d_name, wk->ext);
        if (lstat(path, &st) != 0) {
            rc = bs_fail("%s: cannot stat: %s", path, strerror(errno));
            break;
        }
        int link = S_ISLNK(st.st_mode);
        if (link && stat(path, &st) != 0) {
            // dangling: whether it meant a file or a directory is unknown; only a name the filter
            // takes is worth stopping for
            if (wanted) rc = bs_fail("%s: symbolic link to a missing file: %s", path, strerror(errno));
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            if (link) rc = check_out(wk, path, path);
            if (rc == 0) rc = walk(wk, path);
        } else if (wanted) {
            if (S_ISREG(st.st_mode)) rc = list_push(wk->list, path);
            else rc = bs_fail("%s: not a regular file (a FIFO, socket or device cannot be a document)", path);
        }
    }
    if (d) closedir(d);
    wk->depth--;
    return rc;
}

static int cmp_path(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int list_files(const char *const *inputs, int n_inputs, const char *ext, const char *out_real, char ***files,
                      int64_t *n_files) {
    *files = NULL;
    *n_files = 0;
    PathList l = {0};
    Walk *wk = bs_malloc(sizeof *wk);  // the ancestor table is large for a stack frame
    if (!wk) return -1;
    for (int i = 0; i < n_inputs; i++) {
        struct stat st;
        if (!strcmp(inputs[i], "-")) {  // JSONL on standard input (prepare_pipe.c)
            if (list_push(&l, "-") != 0) break;
            continue;
        }
        if (stat(inputs[i], &st) != 0) {
            list_free(&l);
            free(wk);
            return bs_fail("input %s: %s", inputs[i], strerror(errno));
        }
        int64_t first = l.n;
        int rc;
        if (S_ISDIR(st.st_mode)) {
            // trailing slashes would double up in the paths: "dir//a.go"
            char dir[4096];
            snprintf(dir, sizeof dir, "%s", inputs[i]);
            for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--) dir[n - 1] = '\0';
            *wk = (Walk){.list = &l, .ext = ext, .input = inputs[i], .out_real = out_real};
            rc = check_out(wk, dir, NULL);
            if (rc == 0) rc = walk(wk, dir);
            if (rc == 0 && l.n - first > 1) qsort(l.paths + first, (size_t)(l.n - first), sizeof *l.paths, cmp_path);
        } else if (S_ISREG(st.st_mode)) {
            rc = list_push(&l, inputs[i]);  // named files are taken whatever their extension
        } else {
            rc = bs_fail("input %s: not a regular file or directory", inputs[i]);
        }
        if (rc != 0) {
            list_free(&l);
            free(wk);
            return -1;
        }
    }
    free(wk);
    *files = l.paths;
    *n_files = l.n;
    return 0;
}

int prepare_list_files(const char *const *inputs, int n_inputs, const char *ext, char ***files, int64_t *n_files) {
    return list_files(inputs, n_inputs, ext, NULL, files, n_files);
}

// The absolute path dir has, or will have once created, with every symbolic link in the part that
// exists resolved: the longest existing prefix through realpath(3), the rest appended by name.
static int resolve_dir(const char *dir, char *out, size_t cap) {
    char buf[2 * PATH_MAX];
    if (dir[0] == '/') {
        snprintf(buf, sizeof buf, "%s", dir);
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) return bs_fail("cannot get the current directory: %s", strerror(errno));
        snprintf(buf, sizeof buf, "%s/%s", cwd, dir);
    }
    // cut = the end of the longest prefix that exists ("/" always does)
    size_t cut = strlen(buf);
    char real[PATH_MAX];
    for (;;) {
        char saved = buf[cut];
        buf[cut] = '\0';
        int ok = realpath(cut ? buf : "/", real) != NULL;
        buf[cut] = saved;
        if (ok) break;
        while (cut > 0 && buf[cut - 1] != '/') cut--;  // back over one name...
        while (cut > 0 && buf[cut - 1] == '/') cut--;  // ...and the slashes before it
    }
    if (strlen(real) >= cap) return bs_fail("%s: path too long", dir);
    strcpy(out, real);
    // the names that do not exist yet: none is a link, so "." and ".." are plain steps
    char *save;
    for (char *name = strtok_r(buf + cut, "/", &save); name; name = strtok_r(NULL, "/", &save)) {
        size_t n = strlen(out);
        if (!strcmp(name, ".")) continue;
        if (!strcmp(name, "..")) {
            char *slash = strrchr(out, '/');
            if (slash == out) out[1] = '\0';
            else *slash = '\0';
            continue;
        }
        if (n + 1 + strlen(name) >= cap) return bs_fail("%s: path too long", dir);
        snprintf(out + n, cap - n, "%s%s", n > 1 ? "/" : "", name);
    }
    return 0;
}

// ---- the run ---------------------------------------------------------------------------------

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

// Nearest-rank percentile of sorted values: the smallest value with at least p of them at or below.
static int64_t percentile(const int64_t *sorted, int64_t n, double p) {
    int64_t k = (int64_t)(p * (double)n + 0.999999999);
    if (k < 1) k = 1;
    if (k > n) k = n;
    return sorted[k - 1];
}

static void length_stats(PrepareStats *st, int64_t *lens, int64_t n) {
    if (n == 0) return;
    qsort(lens, (size_t)n, sizeof *lens, cmp_i64);
    st->len_min = lens[0];
    st->len_median = percentile(lens, n, 0.5);
    st->len_p90 = percentile(lens, n, 0.9);
    st->len_p99 = percentile(lens, n, 0.99);
    st->len_max = lens[n - 1];
}

// The tokenizing threads: as asked, or one per core this process may run on (taskset, cgroups).
static int thread_count(int asked) {
    if (asked > 0) return asked;
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

// The inputs, the default corpus when none is given.
static int inputs_listed(const PrepareConfig *cfg, const char *out_real, char ***files, int64_t *n_files) {
    const char *default_input[] = {PREPARE_DEFAULT_CORPUS};
    const char *const *inputs = cfg->inputs;
    int n_inputs = cfg->n_inputs;
    const char *ext = cfg->ext;
    if (n_inputs == 0) {
        struct stat st;
        if (stat(PREPARE_DEFAULT_CORPUS, &st) != 0)
            return bs_fail("no input given and the default corpus %s is missing (install golang-1.19-src, or pass --input)",
                           PREPARE_DEFAULT_CORPUS);
        inputs = default_input;
        n_inputs = 1;
        if (!ext) ext = PREPARE_DEFAULT_EXT;
    }
    if (list_files(inputs, n_inputs, ext, out_real, files, n_files) != 0) return -1;
    if (*n_files > 0) return 0;
    free(*files);
    return bs_fail("no input files (%d input%s%s%s)", n_inputs, n_inputs == 1 ? "" : "s", ext ? ", extension " : "",
                   ext ? ext : "");
}

static int64_t total_size(char *const *files, int64_t n) {
    int64_t sum = 0;
    struct stat st;
    for (int64_t i = 0; i < n; i++) sum += stat(files[i], &st) == 0 ? (int64_t)st.st_size : 0;
    return sum;
}

// One tokenizer per thread (each keeps scratch state), then the pipeline into a new dataset.
static int run_pipe(const PrepareConfig *cfg, char **files, int64_t n_files, PrepareStats *stats) {
    int threads = thread_count(cfg->threads);
    Tokenizer **toks = bs_calloc((size_t)threads, sizeof *toks);
    int rc = toks ? 0 : -1;
    for (int i = 0; rc == 0 && i < threads; i++) rc = tokenizer_open(&toks[i], cfg->tokenizer, cfg->bpe_ranks);
    ShardWriter w;
    int64_t shard_bytes = cfg->shard_bytes > 0 ? cfg->shard_bytes : PREPARE_DEFAULT_SHARD_BYTES;
    if (rc == 0) rc = shard_writer_open(&w, cfg->out_dir, toks[0], shard_bytes);
    int writer_open = rc == 0;
    PipeConfig pc = {.files = files, .n_files = n_files, .in_bytes = total_size(files, n_files), .toks = toks,
                     .threads = threads, .text_field = cfg->text_field ? cfg->text_field : "text",
                     .skip_bad = cfg->skip_bad_lines, .quiet = cfg->quiet,
                     .stdin_name = cfg->stdin_name ? cfg->stdin_name : "-"};
    int64_t *lens = NULL;
    if (rc == 0) rc = prepare_pipe_run(&pc, &w, stats, &lens);
    if (rc == 0) {
        stats->n_shards = w.n_shards + (w.open ? 1 : 0);
        rc = shard_writer_finish(&w);
        writer_open = 0;
    }
    if (writer_open) shard_writer_abort(&w);
    if (rc == 0) length_stats(stats, lens, stats->n_docs);
    stats->n_files = n_files;
    stats->threads = threads;
    free(lens);
    for (int i = 0; toks && i < threads; i++) tokenizer_free(toks[i]);
    free(toks);
    return rc;
}

int prepare_run(const PrepareConfig *cfg, PrepareStats *stats) {
    memset(stats, 0, sizeof *stats);
    double t0 = now_seconds();
    if (!cfg->out_dir || !*cfg->out_dir) return bs_fail("no output directory given");
    char out_real[PATH_MAX];
    if (resolve_dir(cfg->out_dir, out_real, sizeof out_real) != 0) return -1;
    char **files;
    int64_t n_files;
    if (inputs_listed(cfg, out_real, &files, &n_files) != 0) return -1;
    int rc = run_pipe(cfg, files, n_files, stats);
    stats->seconds = now_seconds() - t0;
    for (int64_t i = 0; i < n_files; i++) free(files[i]);
    free(files);
    return rc;
}
