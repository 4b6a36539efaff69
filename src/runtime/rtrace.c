// rtrace.c: per-rank event log, written as part files and merged into one Chrome trace (rtrace.h).
//
// Part file "<path>.rank<R>.part", binary, native byte order (every rank of a run is the same kind
// of machine, and a part lives only between the end of the run and rank 0's merge):
//
//   header   char magic[8] = "BSRTPRT1"; int32 rank, n_ranks; int64 n_events, dropped;
//            int32 n_strings; uint32 zero
//   strings  n_strings x { uint32 len; len bytes, no NUL }
//   events   n_events x { uint32 name, cat (indices into the string table);
//                         double ts_us, dur_us (relative to the origin); int64 arg }
//   trailer  uint32 CRC-32 of everything before it
//
// Names are interned: a run records millions of events but a few dozen distinct names, so a part
// is 32 bytes per event and the merge escapes each name once, not once per event. The exact
// size and the CRC together catch a truncated or damaged part (a rank killed mid-write can't
// leave one, thanks to the atomic rename, but a copied or hand-edited one can).
#include "bytescale/rtrace.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"

#define PART_MAGIC "BSRTPRT1"
#define HEADER_BYTES 40
#define EVENT_BYTES 32
#define MAX_STRING_BYTES 4096  // names are short labels; anything longer means a damaged part

int rtrace_init(RtTrace *t, const char *path, int rank, int n_ranks, double origin) {
    memset(t, 0, sizeof *t);
    t->max_events = RTRACE_DEFAULT_MAX_EVENTS;
    if (!path || !path[0]) return 0;  // off: path stays "" and every call is a no-op
    // leave room for ".rank<R>.part" so the part path can never be cut short later
    if (strlen(path) + 32 >= sizeof t->path) return bs_fail("trace %s: path too long", path);
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
        return bs_fail("trace %s: rank %d out of range [0, %d)", path, rank, n_ranks);
    strcpy(t->path, path);
    t->rank = rank;
    t->n_ranks = n_ranks;
    t->origin = origin;
    return 0;
}

void rtrace_free(RtTrace *t) {
    if (!t) return;
    free(t->ev);
    t->ev = NULL;
    t->n = t->cap = 0;
}

void rtrace_add(RtTrace *t, const char *name, const char *cat, double t0, double t1, int64_t arg) {
    if (!rtrace_on(t)) return;
    if (t->n >= t->max_events) {
        t->dropped++;
        return;
    }
    if (t->n == t->cap) {
        int64_t cap = t->cap ? 2 * t->cap : 4096;
        if (cap > t->max_events) cap = t->max_events;
        // plain realloc, not bs_realloc: a failed trace allocation must not overwrite the error
        // message of whatever the trainer is doing; the event is just dropped and counted
        RtEvent *ev = realloc(t->ev, (size_t)cap * sizeof *ev);
        if (!ev) {
            t->dropped++;
            return;
        }
        t->ev = ev;
        t->cap = cap;
    }
    t->ev[t->n++] = (RtEvent){name ? name : "", cat ? cat : "", t0, t1, arg};
}

static void part_path(char *buf, size_t cap, const char *path, int rank) {
    snprintf(buf, cap, "%s.rank%d.part", path, rank);
}

// ---- writing a part ------------------------------------------------------------------------------

typedef struct {
    AtomicFile af;
    uint32_t crc;
} PartWriter;

static int put(PartWriter *w, const void *data, size_t n) {
    w->crc = checksum_crc32(w->crc, data, n);
    return atomic_write(&w->af, data, n);
}

typedef struct {
    const char **s;
    uint32_t n, cap;
} Strings;

// Index of s in the table, adding it if new. Pointer equality first: names are static strings,
// so the same literal almost always has the same address and strcmp is the rare path.
static int intern(Strings *tab, const char *s, uint32_t *id) {
    for (uint32_t i = 0; i < tab->n; i++)
        if (tab->s[i] == s) return *id = i, 0;
    for (uint32_t i = 0; i < tab->n; i++)
        if (strcmp(tab->s[i], s) == 0) return *id = i, 0;
    if (strlen(s) > MAX_STRING_BYTES) return bs_fail("event name \"%.40s...\" longer than %d bytes", s, MAX_STRING_BYTES);
    if (tab->n == tab->cap) {
        uint32_t cap = tab->cap ? 2 * tab->cap : 64;
        const char **p = bs_realloc(tab->s, cap * sizeof *p);
        if (!p) return -1;
        tab->s = p;
        tab->cap = cap;
    }
    tab->s[tab->n] = s;
    *id = tab->n++;
    return 0;
}

int rtrace_write_part(const RtTrace *t) {
    if (!rtrace_on(t)) return 0;
    char path[1100];
    part_path(path, sizeof path, t->path, t->rank);
    // first pass: the string table, so the header and the table can precede the events and the
    // file is written (and checksummed) front to back in one stream
    Strings tab = {0};
    uint32_t id;
    for (int64_t i = 0; i < t->n; i++)
        if (intern(&tab, t->ev[i].name, &id) != 0 || intern(&tab, t->ev[i].cat, &id) != 0) {
            free(tab.s);
            return bs_fail_ctx("%s", path);
        }

    PartWriter w = {.crc = 0};
    if (atomic_open(&w.af, path) != 0) {
        free(tab.s);
        return -1;
    }
    unsigned char header[HEADER_BYTES] = {0};
    int32_t rank = t->rank, n_ranks = t->n_ranks, n_strings = (int32_t)tab.n;
    int64_t n = t->n, dropped = t->dropped;
    memcpy(header, PART_MAGIC, 8);
    memcpy(header + 8, &rank, 4);
    memcpy(header + 12, &n_ranks, 4);
    memcpy(header + 16, &n, 8);
    memcpy(header + 24, &dropped, 8);
    memcpy(header + 32, &n_strings, 4);
    if (put(&w, header, sizeof header) != 0) goto fail;
    for (uint32_t i = 0; i < tab.n; i++) {
        uint32_t len = (uint32_t)strlen(tab.s[i]);
        if (put(&w, &len, 4) != 0 || put(&w, tab.s[i], len) != 0) goto fail;
    }
    for (int64_t i = 0; i < t->n; i++) {
        const RtEvent *e = &t->ev[i];
        unsigned char rec[EVENT_BYTES];
        uint32_t name, cat;
        intern(&tab, e->name, &name);  // already in the table: can't fail
        intern(&tab, e->cat, &cat);
        double ts = (e->t0 - t->origin) * 1e6;
        double dur = e->t1 > e->t0 ? (e->t1 - e->t0) * 1e6 : 0.0;  // a clock hiccup is a zero-width slice
        if (!isfinite(ts) || !isfinite(dur)) ts = dur = 0.0;       // "nan" would make the JSON unreadable
        memcpy(rec, &name, 4);
        memcpy(rec + 4, &cat, 4);
        memcpy(rec + 8, &ts, 8);
        memcpy(rec + 16, &dur, 8);
        memcpy(rec + 24, &e->arg, 8);
        if (put(&w, rec, sizeof rec) != 0) goto fail;
    }
    uint32_t crc = w.crc;
    if (atomic_write(&w.af, &crc, 4) != 0) goto fail;
    free(tab.s);
    return atomic_close(&w.af);
fail:
    free(tab.s);
    atomic_abort(&w.af);
    return -1;
}

// ---- reading a part --------------------------------------------------------------------------------

typedef struct {
    char *data;       // the whole file (file_read_all)
    int64_t n, dropped;
    uint32_t n_strings;
    char **json;      // each string already JSON-escaped with its quotes: "\"ring wait\""
    const unsigned char *events;
} Part;

static void part_free(Part *p) {
    if (p->json)
        for (uint32_t i = 0; i < p->n_strings; i++) free(p->json[i]);
    free(p->json);
    free(p->data);
    memset(p, 0, sizeof *p);
}

// s[0..len) as a quoted JSON string. Names are plain labels, but a quote or a control character
// must not be able to break the file.
static char *json_quote(const char *s, uint32_t len) {
    char *out = bs_malloc((size_t)len * 6 + 3), *o = out;
    if (!out) return NULL;
    *o++ = '"';
    for (uint32_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c < 0x20) {
            o += sprintf(o, "\\u%04x", c);
        } else {
            *o++ = (char)c;
        }
    }
    *o++ = '"';
    *o = '\0';
    return out;
}

// Read and check rank r's part: magic, rank, exact size, CRC, string indices.
static int part_read(Part *p, const char *path, int r, int n_ranks) {
    memset(p, 0, sizeof *p);
    size_t size;
    if (file_read_all(path, &p->data, &size) != 0) return -1;
    const unsigned char *d = (const unsigned char *)p->data;
    if (size < HEADER_BYTES + 4 || memcmp(d, PART_MAGIC, 8) != 0)
        return bs_fail("%s: not a trace part (bad header, %zu bytes)", path, size);
    uint32_t want, got = checksum_crc32(0, d, size - 4);
    memcpy(&want, d + size - 4, 4);
    if (want != got) return bs_fail("%s: damaged or truncated (checksum mismatch)", path);
    int32_t rank, nr, n_strings;
    memcpy(&rank, d + 8, 4);
    memcpy(&nr, d + 12, 4);
    memcpy(&p->n, d + 16, 8);
    memcpy(&p->dropped, d + 24, 8);
    memcpy(&n_strings, d + 32, 4);
    if (rank != r || nr != n_ranks)
        return bs_fail("%s: written by rank %d of %d, expected rank %d of %d (a stale part from another run?)", path,
                       rank, nr, r, n_ranks);
    size_t at = HEADER_BYTES, end = size - 4;
    if (n_strings < 0 || p->n < 0 || p->dropped < 0) return bs_fail("%s: damaged (negative counts)", path);
    p->json = bs_calloc((size_t)n_strings + 1, sizeof *p->json);
    if (!p->json) return bs_fail_ctx("%s", path);
    for (int32_t i = 0; i < n_strings; i++) {
        uint32_t len;
        if (end - at < 4) return bs_fail("%s: damaged (string table cut short)", path);
        memcpy(&len, d + at, 4);
        at += 4;
        if (len > MAX_STRING_BYTES || end - at < len) return bs_fail("%s: damaged (string %d)", path, i);
        if (!(p->json[i] = json_quote((const char *)d + at, len))) return bs_fail_ctx("%s", path);
        p->n_strings = (uint32_t)i + 1;
        at += len;
    }
    if ((uint64_t)p->n > (end - at) / EVENT_BYTES || (end - at) != (size_t)p->n * EVENT_BYTES)
        return bs_fail("%s: damaged (%zu bytes of events for %lld events)", path, end - at, (long long)p->n);
    p->events = d + at;
    for (int64_t i = 0; i < p->n; i++) {
        uint32_t ids[2];
        memcpy(ids, p->events + i * EVENT_BYTES, 8);
        if (ids[0] >= p->n_strings || ids[1] >= p->n_strings)
            return bs_fail("%s: damaged (event %lld names string %u of %u)", path, (long long)i,
                           ids[0] > ids[1] ? ids[0] : ids[1], p->n_strings);
    }
    return 0;
}

// ---- the merge ------------------------------------------------------------------------------------

int rtrace_merge(const char *path, int n_ranks) {
    if (!path || !path[0]) return 0;
    if (n_ranks < 1) return bs_fail("trace %s: n_ranks %d < 1", path, n_ranks);
    char part[1100];
    // every part must be there before any work starts: a rank that died is the likely cause, and
    // the first missing one is the useful thing to report
    for (int r = 0; r < n_ranks; r++) {
        part_path(part, sizeof part, path, r);
        struct stat st;
        if (stat(part, &st) != 0) return bs_fail("trace %s: part %s missing: %s", path, part, strerror(errno));
    }

    AtomicFile af;
    if (atomic_open(&af, path) != 0) return -1;
    FILE *f = af.f;
    // ts/dur with 3 decimals: nanoseconds, the viewer's resolution
    fprintf(f, "{\"traceEvents\":[\n");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"bytescale training\"}}");
    for (int r = 0; r < n_ranks; r++) {
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":\"rank %d\"}}", r, r);
        fprintf(f, ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"sort_index\":%d}}", r,
                r);
    }
    // parts are streamed one at a time, so the merge holds one rank's events, not the whole run's
    int64_t total = 0, dropped = 0;
    for (int r = 0; r < n_ranks; r++) {
        part_path(part, sizeof part, path, r);
        Part p;
        if (part_read(&p, part, r, n_ranks) != 0) {
            part_free(&p);
            atomic_abort(&af);
            return bs_fail_ctx("trace %s", path);
        }
        for (int64_t i = 0; i < p.n; i++) {
            const unsigned char *rec = p.events + i * EVENT_BYTES;
            uint32_t name, cat;
            double ts, dur;
            int64_t arg;
            memcpy(&name, rec, 4);
            memcpy(&cat, rec + 4, 4);
            memcpy(&ts, rec + 8, 8);
            memcpy(&dur, rec + 16, 8);
            memcpy(&arg, rec + 24, 8);
            fprintf(f, ",\n{\"name\":%s,\"cat\":%s,\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":0,\"tid\":%d", p.json[name],
                    p.json[cat], ts, dur, r);
            if (arg != -1) fprintf(f, ",\"args\":{\"arg\":%lld}", (long long)arg);
            fputs("}", f);
        }
        total += p.n;
        dropped += p.dropped;
        part_free(&p);
    }
    fprintf(f, "\n],\n\"displayTimeUnit\":\"ms\",\n");
    fprintf(f, "\"otherData\":{\"generator\":\"bytescale rtrace\",\"n_ranks\":%d,\"events\":%lld,\"dropped\":%lld}}\n",
            n_ranks, (long long)total, (long long)dropped);
    if (atomic_close(&af) != 0) return bs_fail_ctx("trace %s", path);
    // the merged file is in place; a part that won't go away is litter, not a failed trace
    for (int r = 0; r < n_ranks; r++) {
        part_path(part, sizeof part, path, r);
        unlink(part);
    }
    return 0;
}
