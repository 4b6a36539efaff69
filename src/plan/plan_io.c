// plan_io.c: plans as JSON files (docs/plan-format.md), streamed both ways.
//
// A plan of 10 million sequences is a file of about half a gigabyte; as a tree of JSON nodes it
// would take some 20 times that. So neither direction builds a tree:
//   - writing prints the header, then one sequence or item per line, straight into an AtomicFile
//     (written beside the target, fsync'ed, renamed over it: a failure leaves the old file intact);
//   - reading feeds the file in 64 KiB pieces to yajl's event parser (libyajl), whose callbacks
//     append each sequence and item to the plan's own arrays as it goes by. Memory is the plan
//     itself plus one piece of text.
// Keys may come in any order, so checks that need the header (ranks against n_ranks, segments
// against the sequences) run once the whole file is in. Errors name the place inside the file
// ("plan.json: items[3].ranks[1]: ..."), or its line and column when the JSON itself is broken.
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/plan.h"

enum { PLAN_FORMAT_VERSION = 1 };

// ---- writing ------------------------------------------------------------------------------------

// A number that reads back bit for bit; JSON has no inf or NaN, so those are refused.
static int put_number(FILE *f, double v, const char *path, const char *what) {
    if (!isfinite(v)) return bs_fail("%s: %s is %g, which JSON cannot hold", path, what, v);
    fprintf(f, "%.17g", v);
    return 0;
}

// The policy name as a JSON string: quotes, backslashes and control characters escaped.
static void put_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if (*c < 0x20) fprintf(f, "\\u%04x", *c);
        else fputc(*c, f);
    }
    fputc('"', f);
}

static int write_body(FILE *f, const Plan *p, const char *path) {
    fprintf(f, "{\n  \"format\": \"bytescale-plan\",\n  \"version\": %d,\n  \"policy\": ", PLAN_FORMAT_VERSION);
    put_string(f, p->policy);
    fprintf(f, ",\n  \"n_ranks\": %d,\n  \"pp\": %d,\n  \"capacity\": %lld,\n  \"makespan\": ", p->n_ranks, p->pp,
            (long long)p->capacity);
    if (put_number(f, p->makespan, path, "makespan") != 0) return -1;
    fputs(",\n  \"lower_bound\": ", f);
    if (put_number(f, p->lower_bound, path, "lower_bound") != 0) return -1;
    fputs(",\n  \"sequences\": [", f);
    for (int64_t i = 0; i < p->batch.n; i++) {
        const Sequence *s = &p->batch.seqs[i];
        fprintf(f, "%s\n    {\"id\": %lld, \"len\": %lld, \"src\": %lld}", i ? "," : "", (long long)s->id,
                (long long)s->len, (long long)s->src);
    }
    fputs("\n  ],\n  \"items\": [", f);
    char what[64];
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        fprintf(f, "%s\n    {\"ranks\": [", k ? "," : "");
        for (int32_t j = 0; j < it->n_ranks; j++) fprintf(f, "%s%d", j ? ", " : "", p->ranks[it->rank_begin + j]);
        fputs("], \"offload\": ", f);
        snprintf(what, sizeof what, "items[%d].offload", k);
        if (put_number(f, it->offload, path, what) != 0) return -1;
        fputs(", \"segments\": [", f);
        for (int32_t j = 0; j < it->n_segs; j++) {
            const Segment *sg = &p->segs[it->seg_begin + j];
            fprintf(f, "%s[%d, %lld, %lld]", j ? ", " : "", sg->seq, (long long)sg->start, (long long)sg->len);
        }
        fputs("], \"est_time\": ", f);
        snprintf(what, sizeof what, "items[%d].est_time", k);
        if (put_number(f, it->est_time, path, what) != 0) return -1;
        if (it->a2a) fputs(", \"a2a\": 1", f);  // only where set: other plans read as before
        if (it->ulysses > 0) fprintf(f, ", \"ulysses\": %d", it->ulysses);  // hybrid items only, likewise
        if (plan_item_kind(p, k) == ITEM_BLOCKS) {  // the block peer's owners, only in its items
            fputs(", \"owners\": [", f);
            for (int32_t j = 0; j < it->n_segs; j++) fprintf(f, "%s%d", j ? ", " : "", p->seg_owner[it->seg_begin + j]);
            fputc(']', f);
        }
        fputc('}', f);
    }
    fputs("\n  ]", f);
    // the peers' members (docs/peers.md), only where a plan has them
    if (p->n_barriers > 0) {
        fputs(",\n  \"barriers\": [", f);
        for (int32_t w = 0; w < p->n_barriers; w++) fprintf(f, "%s%d", w ? ", " : "", p->barriers[w]);
        fputc(']', f);
    }
    if (p->n_delayed > 0) {
        fputs(",\n  \"delayed\": [", f);
        for (int32_t d = 0; d < p->n_delayed; d++) fprintf(f, "%s%d", d ? ", " : "", p->delayed[d]);
        fputc(']', f);
    }
    fputs("\n}\n", f);
    return 0;
}

int plan_write_json(const Plan *p, const char *path) {
    AtomicFile af;
    if (atomic_open(&af, path) != 0) return -1;
    if (write_body(af.f, p, path) != 0) {
        atomic_abort(&af);
        return -1;
    }
    return atomic_close(&af);  // checks the stream's error flag: a full disk is an error here
}

// ---- reading: the parser's state ------------------------------------------------------------------

// Where the parser is: the container it is inside.
typedef enum {
    AT_START, IN_ROOT, IN_SEQS, IN_SEQ, IN_ITEMS, IN_ITEM, IN_RANKS, IN_SEGS, IN_SEG, IN_OWNERS, IN_BARRIERS, IN_DELAYED, AT_END
} Where;

// The member whose value comes next.
typedef enum {
    K_OTHER,  // an unknown member: its value is skipped whole
    K_VERSION, K_POLICY, K_N_RANKS, K_PP, K_CAPACITY, K_MAKESPAN, K_LOWER_BOUND, K_SEQUENCES, K_ITEMS,  // root
    K_BARRIERS, K_DELAYED,                                                                // root, optional
    K_ID, K_LEN, K_SRC,                                                                                 // sequence
    K_RANKS, K_OFFLOAD, K_SEGMENTS, K_EST_TIME, K_A2A, K_OWNERS, K_ULYSSES,                                  // item
    K_COUNT
} Key;

static const char *KEY_NAMES[K_COUNT] = {"", "version", "policy", "n_ranks", "pp", "capacity", "makespan",
                                         "lower_bound", "sequences", "items", "barriers", "delayed", "id", "len",
                                         "src", "ranks", "offload", "segments", "est_time", "a2a",
                                         "owners", "ulysses"};
static const char *KEY_TYPES[K_COUNT] = {"", "an integer", "a string", "an integer", "an integer", "an integer",
                                         "a number", "a number", "an array", "an array", "an array of integers",
                                         "an array of integers", "an integer", "an integer", "an integer",
                                         "an array", "a number", "an array", "a number", "0 or 1",
                                         "an array of integers", "an integer"};

typedef struct {
    const char *path;
    Where where;
    Key key;             // the member being read in the current object
    int64_t skip;        // > 0: inside an unknown member's value, this many containers deep
    unsigned root_seen;  // bit per Key: members the root has given so far
    unsigned seen;       // the same for the current sequence or item

    // the header
    int64_t n_ranks, pp, capacity;
    double makespan, lower_bound;
    char policy[sizeof ((Plan *)0)->policy];

    GlobalBatch b;       // the sequences, in file order
    int64_t seqs_cap;
    Sequence seq;        // the sequence being read

    Plan *p;             // items, segments and rank lists are appended here as they are read
    int32_t *ranks;      // the current item's ranks, (n_ranks_item,)
    Segment *segs;       // the current item's segments, (n_segs_item,)
    int n_ranks_item, cap_ranks, n_segs_item, cap_segs;
    double offload, est_time;
    int64_t a2a;
    int64_t ulysses;     // the current item's Ulysses group size (hybrid items; 0: none)
    int32_t *owners;     // the current item's block owners, (n_owners_item,) (block items only)
    int n_owners_item, cap_owners;
    int64_t seg[3];      // [seq, start, len] being read
    int seg_n;
    char where_buf[160];
} Reader;

static int in_object(const Reader *r) { return r->where == IN_ROOT || r->where == IN_SEQ || r->where == IN_ITEM; }
static unsigned *seen_now(Reader *r) { return r->where == IN_ROOT ? &r->root_seen : &r->seen; }

// "plan.json: items[3]" etc.: the object being read, for messages.
static const char *here(Reader *r) {
    switch (r->where) {
    case IN_SEQ: snprintf(r->where_buf, sizeof r->where_buf, "%s: sequences[%lld]", r->path, (long long)r->b.n); break;
    case IN_ITEM: case IN_RANKS: case IN_SEGS: case IN_SEG: case IN_OWNERS:
        snprintf(r->where_buf, sizeof r->where_buf, "%s: items[%d]", r->path, r->p->n_items);
        break;
    default: snprintf(r->where_buf, sizeof r->where_buf, "%s", r->path); break;
    }
    return r->where_buf;
}

// A value of the wrong kind where the parser is: the message says what belongs there. Returns 0,
// the callbacks' "stop".
static int wrong_type(Reader *r) {
    switch (r->where) {
    case AT_START: bs_fail("%s: expected a JSON object", r->path); break;
    case IN_SEQS: bs_fail("%s: sequences[%lld]: expected an object", r->path, (long long)r->b.n); break;
    case IN_ITEMS: bs_fail("%s: items[%d]: expected an object", r->path, r->p->n_items); break;
    case IN_RANKS: bs_fail("%s.ranks[%d]: expected an integer", here(r), r->n_ranks_item); break;
    case IN_SEGS: case IN_SEG:
        bs_fail("%s.segments[%d]: expected [seq, start, len] of integers", here(r), r->n_segs_item);
        break;
    default: bs_fail("%s: \"%s\" must be %s", here(r), KEY_NAMES[r->key], KEY_TYPES[r->key]); break;
    }
    return 0;
}

// yajl hands over a number's text unterminated: a NUL-terminated copy in buf, -1 when too long.
static int number_text(const char *text, size_t n, char *buf, size_t cap) {
    if (n >= cap) return -1;
    memcpy(buf, text, n);
    buf[n] = '\0';
    return 0;
}

static int number_double(const char *text, size_t n, double *out) {
    char buf[512], *end;
    if (number_text(text, n, buf, sizeof buf) != 0) return -1;
    double d = strtod(buf, &end);
    if (*end || !isfinite(d)) return -1;
    *out = d;
    return 0;
}

// A JSON number as an integer. Integers are exact to 2^53 as doubles, and files written by other
// tools may say 1e3 or 4096.0: any number with an integral value in that range is accepted.
static int number_int(const char *text, size_t n, int64_t *out) {
    char buf[64], *end;
    double d;
    if (number_text(text, n, buf, sizeof buf) != 0) return -1;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (!*end && !errno && v >= -(1ll << 53) && v <= (1ll << 53)) {
        *out = v;
        return 0;
    }
    if (number_double(text, n, &d) != 0 || d != floor(d) || fabs(d) > 9007199254740992.0) return -1;
    *out = (int64_t)d;
    return 0;
}

// ---- reading: the callbacks -----------------------------------------------------------------------
// yajl calls these as it meets each token. Each returns 1 to go on, 0 to stop with the message
// recorded (the parser then says "client canceled" and the reader reports ours).

static int grow_buf(void **buf, int *cap, int need, size_t elem, Reader *r) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap * 2 : 16;
    if (c < need || c > INT_MAX / 2) c = need;
    void *q = bs_realloc(*buf, (size_t)c * elem);
    if (!q) return bs_fail_ctx("%s", here(r));
    *buf = q;
    *cap = c;
    return 0;
}

// An integer member within [lo, hi]. 1 or 0 as the callbacks.
static int int_in(Reader *r, const char *text, size_t n, int64_t lo, int64_t hi, int64_t *out) {
    if (number_int(text, n, out) != 0) return wrong_type(r);
    if (*out >= lo && *out <= hi) return 1;
    bs_fail("%s: \"%s\" is %lld, outside [%lld, %lld]", here(r), KEY_NAMES[r->key], (long long)*out, (long long)lo,
            (long long)hi);
    return 0;
}

static int double_in(Reader *r, const char *text, size_t n, double *out) {
    return number_double(text, n, out) == 0 ? 1 : wrong_type(r);
}

static int on_number(void *ctx, const char *text, size_t n) {
    Reader *r = ctx;
    int64_t v = 0;
    if (r->skip) return 1;
    if (r->where == IN_RANKS) {
        // ranks are checked against n_ranks at the end; here against the format's bound on n_ranks
        if (number_int(text, n, &v) != 0) return wrong_type(r);
        if (v < 0 || v >= (1 << 20)) {
            bs_fail("%s.ranks[%d]: rank %lld out of range [0, 2^20)", here(r), r->n_ranks_item, (long long)v);
            return 0;
        }
        if (grow_buf((void **)&r->ranks, &r->cap_ranks, r->n_ranks_item + 1, sizeof *r->ranks, r) != 0) return 0;
        r->ranks[r->n_ranks_item++] = (int32_t)v;
        return 1;
    }
    if (r->where == IN_OWNERS) {  // members of the item: checked against its ranks by plan_validate
        if (number_int(text, n, &v) != 0 || v < 0 || v >= (1 << 20)) {
            bs_fail("%s.owners[%d]: expected a member index in [0, 2^20)", here(r), r->n_owners_item);
            return 0;
        }
        if (grow_buf((void **)&r->owners, &r->cap_owners, r->n_owners_item + 1, sizeof *r->owners, r) != 0) return 0;
        r->owners[r->n_owners_item++] = (int32_t)v;
        return 1;
    }
    if (r->where == IN_SEG) {
        if (r->seg_n == 3 || number_int(text, n, &v) != 0) return wrong_type(r);
        r->seg[r->seg_n++] = v;
        return 1;
    }
    if (r->where == IN_BARRIERS || r->where == IN_DELAYED) {
        // item and sequence indices: checked against the plan by plan_validate
        int barriers = r->where == IN_BARRIERS;
        if (number_int(text, n, &v) != 0 || v < 0 || v >= INT32_MAX) {
            bs_fail("%s: \"%s\" must be %s in [0, %d)", r->path, barriers ? "barriers" : "delayed",
                    KEY_TYPES[barriers ? K_BARRIERS : K_DELAYED], INT32_MAX);
            return 0;
        }
        int32_t **arr = barriers ? &r->p->barriers : &r->p->delayed;
        int32_t *cnt = barriers ? &r->p->n_barriers : &r->p->n_delayed;
        int32_t *cap = barriers ? &r->p->cap_barriers : &r->p->cap_delayed;
        if (grow_buf((void **)arr, cap, *cnt + 1, sizeof **arr, r) != 0) return 0;
        (*arr)[(*cnt)++] = (int32_t)v;
        return 1;
    }
    if (!in_object(r)) return wrong_type(r);
    *seen_now(r) |= 1u << r->key;
    switch (r->key) {
    case K_OTHER: return 1;
    case K_VERSION:
        if (number_int(text, n, &v) != 0) return wrong_type(r);
        if (v == PLAN_FORMAT_VERSION) return 1;
        bs_fail("%s: plan format version %lld; this build reads version %d", r->path, (long long)v,
                PLAN_FORMAT_VERSION);
        return 0;
    // n_ranks and pp size the per-rank tables: bounded as `bytescale plan`'s --ranks and --pp, so a
    // file cannot ask for gigabytes (or overflow ranks x tp x pp later)
    case K_N_RANKS: return int_in(r, text, n, 1, 1 << 20, &r->n_ranks);
    case K_PP: return int_in(r, text, n, 1, 1 << 10, &r->pp);
    case K_CAPACITY: return int_in(r, text, n, 1, INT64_MAX / 4, &r->capacity);
    case K_MAKESPAN: return double_in(r, text, n, &r->makespan);
    case K_LOWER_BOUND: return double_in(r, text, n, &r->lower_bound);
    case K_ID: return int_in(r, text, n, INT64_MIN, INT64_MAX, &r->seq.id);
    case K_LEN: return int_in(r, text, n, 1, INT64_MAX / 4, &r->seq.len);
    case K_SRC: return int_in(r, text, n, INT64_MIN, INT64_MAX, &r->seq.src);
    case K_OFFLOAD: return double_in(r, text, n, &r->offload);
    case K_EST_TIME: return double_in(r, text, n, &r->est_time);
    case K_A2A: return int_in(r, text, n, 0, 1, &r->a2a);
    case K_ULYSSES: return int_in(r, text, n, 0, 1 << 20, &r->ulysses);  // plan_validate: its rules
    default: return wrong_type(r);
    }
}

static int on_string(void *ctx, const unsigned char *s, size_t n) {
    Reader *r = ctx;
    if (r->skip || (in_object(r) && r->key == K_OTHER)) return 1;
    if (r->where != IN_ROOT || r->key != K_POLICY) return wrong_type(r);
    if (n >= sizeof r->policy || memchr(s, '\0', n)) {
        bs_fail("%s: \"policy\" must be a name of at most %zu characters", r->path, sizeof r->policy - 1);
        return 0;
    }
    memcpy(r->policy, s, n);
    r->policy[n] = '\0';
    r->root_seen |= 1u << K_POLICY;
    return 1;
}

// null, true and false: only ever the value of an unknown member.
static int on_null(void *ctx) {
    Reader *r = ctx;
    return r->skip || (in_object(r) && r->key == K_OTHER) ? 1 : wrong_type(r);
}
static int on_bool(void *ctx, int b) {
    (void)b;
    return on_null(ctx);
}

static int on_map_key(void *ctx, const unsigned char *s, size_t n) {
    Reader *r = ctx;
    if (r->skip) return 1;
    // the members this object may have: the root's, a sequence's or an item's
    Key lo = r->where == IN_ROOT ? K_VERSION : r->where == IN_SEQ ? K_ID : K_RANKS;
    Key hi = r->where == IN_ROOT ? K_DELAYED : r->where == IN_SEQ ? K_SRC : K_ULYSSES;
    r->key = K_OTHER;
    for (Key k = lo; k <= hi; k++)
        if (strlen(KEY_NAMES[k]) == n && !memcmp(KEY_NAMES[k], s, n)) r->key = k;
    if (r->key != K_OTHER && (*seen_now(r) & (1u << r->key))) {
        bs_fail("%s: \"%s\" is given twice", here(r), KEY_NAMES[r->key]);
        return 0;
    }
    return 1;
}

static int on_start_map(void *ctx) {
    Reader *r = ctx;
    if (r->skip) return ++r->skip, 1;
    switch (r->where) {
    case AT_START: r->where = IN_ROOT; return 1;
    case IN_SEQS:
        if (r->b.n >= INT32_MAX) {
            bs_fail("%s: more than %d sequences", r->path, INT32_MAX);
            return 0;
        }
        r->where = IN_SEQ;
        r->seen = 0;
        r->seq = (Sequence){0, 0, -1};
        return 1;
    case IN_ITEMS:
        r->where = IN_ITEM;
        r->seen = 0;
        r->n_ranks_item = r->n_segs_item = r->n_owners_item = 0;
        r->offload = r->est_time = 0;
        r->a2a = r->ulysses = 0;
        return 1;
    default:
        if (!in_object(r) || r->key != K_OTHER) return wrong_type(r);
        r->skip = 1;
        return 1;
    }
}

static int require(Reader *r, Key k) {
    if (r->seen & (1u << k)) return 1;
    bs_fail("%s: missing \"%s\"", here(r), KEY_NAMES[k]);
    return 0;
}

// The end of a sequence: append it to the batch.
static int end_sequence(Reader *r) {
    if (!require(r, K_ID) || !require(r, K_LEN)) return 0;
    if (r->seq.len > INT64_MAX - r->b.n_tokens) {
        bs_fail("%s: the sequences hold more than %lld tokens", here(r), (long long)INT64_MAX);
        return 0;
    }
    if (r->b.n == r->seqs_cap) {
        int64_t c = r->seqs_cap ? r->seqs_cap * 2 : 1024;
        Sequence *q = bs_realloc(r->b.seqs, (size_t)c * sizeof(Sequence));
        if (!q) return bs_fail_ctx("%s", here(r)), 0;
        r->b.seqs = q;
        r->seqs_cap = c;
    }
    r->b.seqs[r->b.n++] = r->seq;
    r->b.n_tokens += r->seq.len;
    r->where = IN_SEQS;
    return 1;
}

// The end of an item: append it to the plan. Its segments' lengths are bounded before they are
// summed (by the batch when the sequences came first, else by the format's bound on a length);
// check_after compares them with the sequences.
static int end_item(Reader *r) {
    if (!require(r, K_RANKS) || !require(r, K_OFFLOAD) || !require(r, K_SEGMENTS)) return 0;
    if (r->n_ranks_item < 1) return bs_fail("%s: \"ranks\" is empty", here(r)), 0;
    if (r->n_segs_item < 1) return bs_fail("%s: \"segments\" is empty", here(r)), 0;
    int have_seqs = (r->root_seen >> K_SEQUENCES) & 1;
    int64_t bound = have_seqs ? r->b.n_tokens : INT64_MAX / 4, tokens = 0;
    for (int j = 0; j < r->n_segs_item; j++) {
        int64_t len = r->segs[j].len;
        if (len < 1 || len > bound - tokens) {
            bs_fail("%s.segments[%d]: length %lld: the item's segments must each hold >= 1 token and together at "
                    "most %s %lld",
                    here(r), j, (long long)len, have_seqs ? "the batch's" : "", (long long)bound);
            return 0;
        }
        tokens += len;
    }
    int blocks = (r->seen >> K_OWNERS) & 1;
    if (blocks && r->n_owners_item != r->n_segs_item) {
        bs_fail("%s: \"owners\" has %d entries for %d segments", here(r), r->n_owners_item, r->n_segs_item);
        return 0;
    }
    int32_t idx = blocks ? plan_add_blocks_item(r->p, r->segs, r->n_segs_item, r->ranks, r->n_ranks_item, r->owners)
                         : plan_add_item(r->p, r->segs, r->n_segs_item, r->ranks, r->n_ranks_item, r->offload);
    if (idx >= 0 && blocks) r->p->items[idx].offload = (float)r->offload;  // plan_validate refuses one > 0
    if (idx < 0) return bs_fail_ctx("%s", here(r)), 0;
    r->p->items[idx].est_time = r->est_time;  // stands unless plan_finalize has a cost model
    r->p->items[idx].a2a = (int32_t)r->a2a;
    r->p->items[idx].ulysses = (int32_t)r->ulysses;
    r->where = IN_ITEMS;
    return 1;
}

static int on_end_map(void *ctx) {
    Reader *r = ctx;
    if (r->skip) return --r->skip, 1;
    if (r->where == IN_SEQ) return end_sequence(r);
    if (r->where == IN_ITEM) return end_item(r);
    r->where = AT_END;  // the root
    return 1;
}

static int on_start_array(void *ctx) {
    Reader *r = ctx;
    if (r->skip) return ++r->skip, 1;
    if (r->where == IN_SEGS) {
        r->where = IN_SEG;
        r->seg_n = 0;
        return 1;
    }
    if (!in_object(r)) return wrong_type(r);
    *seen_now(r) |= 1u << r->key;
    switch (r->key) {
    case K_OTHER: r->skip = 1; return 1;
    case K_SEQUENCES: r->where = IN_SEQS; return 1;
    case K_ITEMS: r->where = IN_ITEMS; return 1;
    case K_RANKS: r->where = IN_RANKS; return 1;
    case K_SEGMENTS: r->where = IN_SEGS; return 1;
    case K_OWNERS: r->where = IN_OWNERS; return 1;
    case K_BARRIERS: r->where = IN_BARRIERS; return 1;
    case K_DELAYED: r->where = IN_DELAYED; return 1;
    default: return wrong_type(r);
    }
}

static int on_end_array(void *ctx) {
    Reader *r = ctx;
    if (r->skip) return --r->skip, 1;
    switch (r->where) {
    case IN_SEQS: case IN_ITEMS: case IN_BARRIERS: case IN_DELAYED: r->where = IN_ROOT; return 1;
    case IN_RANKS: case IN_SEGS: case IN_OWNERS: r->where = IN_ITEM; return 1;
    case IN_SEG:
        if (r->seg_n != 3) return wrong_type(r);
        // the sequence index must fit the Segment; against the sequences it is checked at the end
        if (r->seg[0] < 0 || r->seg[0] >= INT32_MAX) {
            bs_fail("%s.segments[%d]: sequence %lld out of range", here(r), r->n_segs_item, (long long)r->seg[0]);
            return 0;
        }
        if (grow_buf((void **)&r->segs, &r->cap_segs, r->n_segs_item + 1, sizeof *r->segs, r) != 0) return 0;
        r->segs[r->n_segs_item++] = (Segment){(int32_t)r->seg[0], r->seg[1], r->seg[2]};
        r->where = IN_SEGS;
        return 1;
    default: return wrong_type(r);
    }
}

static const yajl_callbacks CALLBACKS = {
    .yajl_null = on_null,
    .yajl_boolean = on_bool,
    .yajl_number = on_number,  // the number's text: integers and fractions are told apart here
    .yajl_string = on_string,
    .yajl_start_map = on_start_map,
    .yajl_map_key = on_map_key,
    .yajl_end_map = on_end_map,
    .yajl_start_array = on_start_array,
    .yajl_end_array = on_end_array,
};

// ---- reading: after the last byte ------------------------------------------------------------------

// What needs the whole file: the header's members, ranks against n_ranks, segments against the
// sequences (the same checks and messages wherever the keys stood in the file).
static int check_after(Reader *r) {
    static const Key required[] = {K_VERSION, K_POLICY, K_N_RANKS, K_PP, K_CAPACITY, K_SEQUENCES, K_ITEMS};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!(r->root_seen & (1u << required[i]))) return bs_fail("%s: missing \"%s\"", r->path, KEY_NAMES[required[i]]);
    const Plan *p = r->p;
    for (int32_t k = 0; k < p->n_items; k++) {
        const Item *it = &p->items[k];
        for (int32_t j = 0; j < it->n_ranks; j++) {
            int32_t v = p->ranks[it->rank_begin + j];
            if (v >= r->n_ranks)
                return bs_fail("%s: items[%d].ranks[%d]: rank %d out of range [0, %lld)", r->path, k, j, v,
                               (long long)r->n_ranks);
        }
        int64_t tokens = 0;
        for (int32_t j = 0; j < it->n_segs; j++) {
            const Segment *sg = &p->segs[it->seg_begin + j];
            if (sg->seq >= r->b.n)
                return bs_fail("%s: items[%d].segments[%d]: sequence %d out of range [0, %lld)", r->path, k, j,
                               sg->seq, (long long)r->b.n);
            // no valid item holds more than the batch, and the bound keeps the item's token sum from
            // overflowing (plan_validate checks the segment against its sequence)
            if (sg->len < 1 || sg->len > r->b.n_tokens - tokens)
                return bs_fail("%s: items[%d].segments[%d]: length %lld: the item's segments must each hold >= 1 "
                               "token and together at most the batch's %lld",
                               r->path, k, j, (long long)sg->len, (long long)r->b.n_tokens);
            tokens += sg->len;
        }
    }
    return 0;
}

// Line and column of byte `off` of the file, for a syntax error: read again from the start.
static void position(const char *path, uint64_t off, long *line, long *col) {
    *line = 1, *col = 1;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    int c;
    for (uint64_t i = 0; i < off && (c = fgetc(f)) != EOF; i++) {
        if (c == '\n') ++*line, *col = 1;
        else ++*col;
    }
    fclose(f);
}

// Feed the file to the parser. -1 + error: a read failure, broken JSON, or a callback's complaint.
static int parse_file(Reader *r, FILE *f, int seekable) {
    yajl_handle h = yajl_alloc(&CALLBACKS, NULL, r);
    if (!h) return bs_fail("%s: out of memory starting the JSON parser", r->path);
    enum { CHUNK = 1 << 16 };
    unsigned char *buf = bs_malloc(CHUNK);
    uint64_t offset = 0;  // bytes fed before the current piece
    int rc = -1;
    yajl_status st = yajl_status_ok;
    size_t got = 0;
    if (!buf) goto out;
    while ((got = fread(buf, 1, CHUNK, f)) > 0) {
        st = yajl_parse(h, buf, got);
        if (st != yajl_status_ok) break;
        offset += got;
    }
    if (st == yajl_status_ok && ferror(f)) {
        bs_fail("%s: read failed after %llu bytes: %s", r->path, (unsigned long long)offset, strerror(errno));
        goto out;
    }
    if (st == yajl_status_ok) st = yajl_complete_parse(h), got = 0;
    if (st == yajl_status_client_canceled) goto out;  // the callback said why
    if (st == yajl_status_error) {
        unsigned char *msg = yajl_get_error(h, 0, buf, got);
        uint64_t at = offset + yajl_get_bytes_consumed(h);
        char what[128];
        snprintf(what, sizeof what, "%s", msg ? (const char *)msg : "syntax error");
        for (char *c = what; *c; c++)
            if (*c == '\n') *c = ' ';
        size_t len = strlen(what);
        while (len && what[len - 1] == ' ') what[--len] = '\0';
        if (msg) yajl_free_error(h, msg);
        if (seekable) {
            long line, col;
            position(r->path, at, &line, &col);
            bs_fail("%s:%ld:%ld: invalid JSON (%s)", r->path, line, col, what);
        } else {
            bs_fail("%s: byte %llu: invalid JSON (%s)", r->path, (unsigned long long)at, what);
        }
        goto out;
    }
    rc = 0;
out:
    free(buf);
    yajl_free(h);
    return rc;
}

int plan_read_json_cm(Plan *p, const char *path, const CostModel *cm) {
    memset(p, 0, sizeof *p);
    FILE *f;
    struct stat st;
    if (file_open_read(path, &f, &st) != 0) return -1;
    Reader r = {.path = path, .where = AT_START, .p = p};
    int rc = parse_file(&r, f, S_ISREG(st.st_mode));
    fclose(f);
    if (rc == 0) rc = check_after(&r);
    free(r.ranks);
    free(r.owners);
    free(r.segs);
    if (rc != 0) {
        free(r.b.seqs);
        plan_free(p);
        return -1;
    }
    // the header, and the batch moved in without a copy (plan_init would copy it)
    p->n_ranks = (int32_t)r.n_ranks;
    p->pp = (int32_t)r.pp;
    p->capacity = r.capacity;
    snprintf(p->policy, sizeof p->policy, "%s", r.policy);
    p->batch = r.b;
    if (plan_finalize(p, cm) != 0 || plan_validate(p, cm) != 0) {
        bs_fail_ctx("%s", path);
        plan_free(p);
        return -1;
    }
    if (!cm) p->lower_bound = r.lower_bound;  // without a cost model the file's estimates stand
    return 0;                                 // (makespan is always re-derived from the items' est_time)
}

int plan_read_json(Plan *p, const char *path) { return plan_read_json_cm(p, path, NULL); }
