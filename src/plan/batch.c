// batch.c: global batches: a growable list of sequences, cutting to a maximum context, lengths
// files, and batches generated from a length distribution (the distributions are in lengths.c).
#include "bytescale/batch.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/json.h"

// ---- the list ---------------------------------------------------------------------------------

// Most sequences a batch may hold: 16M, over 400 MB of Sequence entries and several times that in
// a plan of them. Far beyond any real global batch (the paper's 32M tokens hold a few thousand
// sequences); a bound, so that a context of 1 token or a huge token budget is refused at once rather
// than allocating and planning for minutes.
#define MAX_SEQS ((int64_t)1 << 24)
// Most tokens a batch may hold: 1T (the largest --tokens), 30,000 x the paper's 32M. Planning work
// grows with tokens / capacity (the ranks every ring names), so a lengths file of a few huge
// numbers must not set planners to work for hours; the bound also keeps every sum of lengths far
// from overflowing an int64.
#define MAX_TOKENS ((int64_t)1 << 40)

int batch_init(GlobalBatch *b, int64_t cap_hint) {
    memset(b, 0, sizeof *b);
    if (cap_hint > MAX_SEQS)
        return bs_fail("batch_init: %lld sequences; a batch holds at most %lld", (long long)cap_hint,
                       (long long)MAX_SEQS);
    int64_t cap = cap_hint > 16 ? cap_hint : 16;
    b->seqs = bs_malloc((size_t)cap * sizeof *b->seqs);
    if (!b->seqs) return bs_fail_ctx("batch_init: %lld sequences", (long long)cap);
    b->cap = cap;
    return 0;
}

// Make room for at least `need` entries. cap == 0 with n > 0 (a batch assembled by hand) counts
// as exactly n allocated.
static int batch_reserve(GlobalBatch *b, int64_t need) {
    int64_t have = b->cap > b->n ? b->cap : b->n;
    if (need <= have && b->seqs) return 0;
    if (need > MAX_SEQS)
        return bs_fail("batch: %lld sequences; a batch holds at most %lld (a larger --context or a smaller token "
                       "budget makes fewer)",
                       (long long)need, (long long)MAX_SEQS);
    int64_t cap = have > 16 ? have : 16;
    while (cap < need) cap *= 2;
    if (cap > MAX_SEQS) cap = MAX_SEQS;
    Sequence *s = bs_realloc(b->seqs, (size_t)cap * sizeof *s);
    if (!s) return bs_fail_ctx("batch: growing to %lld sequences", (long long)cap);
    b->seqs = s;
    b->cap = cap;
    return 0;
}

int batch_push(GlobalBatch *b, int64_t id, int64_t len, int64_t src) {
    if (len <= 0) return bs_fail("batch_push: sequence %lld: length must be positive, got %lld", (long long)id, (long long)len);
    if (len > MAX_TOKENS - b->n_tokens)
        return bs_fail("batch_push: sequence %lld: %lld tokens; a batch holds at most %lld in all", (long long)id,
                       (long long)len, (long long)MAX_TOKENS);
    if (b->n >= b->cap && batch_reserve(b, b->n + 1) != 0) return -1;
    b->seqs[b->n++] = (Sequence){.id = id, .len = len, .src = src};
    b->n_tokens += len;
    return 0;
}

void batch_free(GlobalBatch *b) {
    free(b->seqs);
    memset(b, 0, sizeof *b);
}

// ---- cutting to a context ---------------------------------------------------------------------

static int64_t pieces_of(int64_t len, int64_t max_ctx) { return len / max_ctx + (len % max_ctx != 0); }

int batch_cut(GlobalBatch *b, int64_t max_ctx) {
    if (max_ctx <= 0) return 0;
    int64_t total = 0;  // pieces <= tokens, and the tokens fit an int64 (batch_push): no overflow
    for (int64_t i = 0; i < b->n; i++) total += pieces_of(b->seqs[i].len, max_ctx);
    if (total == b->n) return 0;
    if (batch_reserve(b, total) != 0) return -1;
    // Fill from the back: the write position w never falls below the read position i, so every
    // sequence is read before its slot is overwritten and nothing needs a second buffer.
    int64_t w = total;
    for (int64_t i = b->n - 1; i >= 0; i--) {
        Sequence s = b->seqs[i];
        int64_t k = pieces_of(s.len, max_ctx);
        for (int64_t j = k - 1; j >= 0; j--) {
            int64_t off = j * max_ctx;
            int64_t len = j == k - 1 ? s.len - off : max_ctx;
            b->seqs[--w] = (Sequence){.id = s.id, .len = len, .src = s.src >= 0 ? s.src + off : -1};
        }
    }
    b->n = total;
    return 0;
}

// ---- lengths files ----------------------------------------------------------------------------

static int read_json_lengths(GlobalBatch *b, const char *path, const char *text, size_t size) {
    cJSON *root;
    if (json_parse(text, size, path, &root) != 0) return -1;
    const cJSON *arr = root;
    const char *name = "";  // how the message names the array: "" for a bare array
    if (cJSON_IsObject(root)) {
        arr = cJSON_GetObjectItemCaseSensitive(root, "lengths");
        name = "lengths";
    }
    int rc = 0;
    if (!cJSON_IsArray(arr)) {
        rc = bs_fail("%s: expected a JSON array of lengths or an object {\"lengths\": [...]}", path);
        goto done;
    }
    if (cJSON_GetArraySize(arr) == 0) {
        rc = bs_fail("%s: no lengths (the array is empty)", path);
        goto done;
    }
    int i = 0;
    for (const cJSON *it = arr->child; it; it = it->next, i++) {
        double v = it->valuedouble;
        if (!cJSON_IsNumber(it) || v != floor(v) || fabs(v) > 9007199254740992.0) {
            char *txt = cJSON_PrintUnformatted(it);
            rc = bs_fail("%s: %s[%d]: expected an integer length, got %.40s", path, name, i, txt ? txt : "?");
            free(txt);
            goto done;
        }
        if (v <= 0) {
            rc = bs_fail("%s: %s[%d]: length must be positive, got %lld", path, name, i, (long long)v);
            goto done;
        }
        if (batch_push(b, i, (int64_t)v, -1) != 0) {
            rc = bs_fail_ctx("%s: %s[%d]", path, name, i);
            goto done;
        }
    }
done:
    cJSON_Delete(root);
    return rc;
}

// One integer per line; '#' starts a comment that runs to the end of the line.
static int read_line_lengths(GlobalBatch *b, const char *path, const char *text, size_t size) {
    const char *p = text, *end = text + size;
    for (int64_t line = 1; p < end; line++) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        const char *hash = memchr(p, '#', (size_t)(eol - p));
        const char *stop = hash ? hash : eol;
        while (p < stop && isspace((unsigned char)*p)) p++;
        while (stop > p && isspace((unsigned char)stop[-1])) stop--;
        if (p < stop) {
            char tok[64];
            size_t n = (size_t)(stop - p);
            snprintf(tok, sizeof tok, "%.*s", (int)(n < sizeof tok ? n : sizeof tok - 1), p);
            char *after;
            errno = 0;
            long long v = strtoll(p, &after, 10);
            if (after != stop || after == p)
                return bs_fail("%s:%lld: \"%s\" is not an integer length (one per line)", path, (long long)line, tok);
            if (errno == ERANGE) return bs_fail("%s:%lld: length %s is out of range", path, (long long)line, tok);
            if (v <= 0) return bs_fail("%s:%lld: length must be positive, got %lld", path, (long long)line, v);
            if (batch_push(b, b->n, v, -1) != 0) return bs_fail_ctx("%s:%lld", path, (long long)line);
        }
        p = eol + 1;
    }
    if (b->n == 0) return bs_fail("%s: no lengths (the file is empty or holds only comments)", path);
    return 0;
}

int batch_read_file(GlobalBatch *b, const char *path) {
    if (batch_init(b, 0) != 0) return -1;
    char *text;
    size_t size;
    if (file_read_all(path, &text, &size) != 0) {
        batch_free(b);
        return -1;
    }
    const char *p = text;
    while (*p && isspace((unsigned char)*p)) p++;
    int json = *p == '[' || *p == '{';
    int rc = json ? read_json_lengths(b, path, text, size) : read_line_lengths(b, path, text, size);
    free(text);
    if (rc != 0) batch_free(b);
    return rc;
}

// ---- generated batches ------------------------------------------------------------------------

int batch_generate(GlobalBatch *b, const char *spec, uint64_t seed, int64_t token_budget, int64_t max_ctx) {
    memset(b, 0, sizeof *b);
    if (token_budget <= 0) return bs_fail("batch_generate: token budget must be positive, got %lld", (long long)token_budget);
    LengthDist *d;
    if (dist_parse(&d, spec) != 0) return -1;
    if (batch_init(b, 0) != 0) {
        dist_free(d);
        return -1;
    }
    Rng rng;
    rng_seed(&rng, seed);
    while (b->n_tokens < token_budget) {
        int64_t len = dist_sample(d, &rng);
        int64_t left = token_budget - b->n_tokens;
        if (len > left) len = left;  // the last sequence is cut so the batch holds exactly the budget
        if (batch_push(b, b->n, len, -1) != 0) break;
    }
    dist_free(d);
    if (b->n_tokens != token_budget || batch_cut(b, max_ctx) != 0) {
        batch_free(b);
        return bs_fail_ctx("batch_generate \"%s\"", spec);
    }
    return 0;
}
