// jsonl.c: one JSONL line -> the text of one field (jsonl.h).
//
// A scanner of our own rather than cJSON or yajl, which the project links: cJSON keeps strings
// NUL-terminated, so a text holding \u0000 would be cut short without a word, and it takes invalid
// UTF-8 as it comes; yajl turns a lone surrogate escape into '?'. A corpus line must either give
// exactly the text its writer meant or be refused, so the whole line is checked against RFC 8259
// (strict UTF-8 included: no overlong forms, no surrogates, nothing past U+10FFFF) and the field
// is decoded here, escapes and all.
#include "data/jsonl.h"

#include <stdio.h>
#include <string.h>

#include "bytescale/error.h"

enum { DEPTH_MAX = 512 };

typedef struct {
    const uint8_t *p, *end, *start;
    JsonlText *out;   // where the wanted field's string goes
    char *why;        // the reason a line is refused
    size_t why_cap;
} Scan;

static int refuse(Scan *s, const char *fmt, const char *arg) {
    char what[160];
    snprintf(what, sizeof what, fmt, arg);
    snprintf(s->why, s->why_cap, "%s at byte %zu", what, (size_t)(s->p - s->start) + 1);
    return -1;
}

static void skip_ws(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static int text_put(JsonlText *t, const uint8_t *b, size_t n) {
    if (!t) return 0;
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < t->n + n) cap *= 2;
        char *p = bs_realloc(t->s, cap);
        if (!p) return -1;
        t->s = p;
        t->cap = cap;
    }
    memcpy(t->s + t->n, b, n);
    t->n += n;
    return 0;
}

// Length of the valid UTF-8 sequence at p (1..4), or 0 when it is not one (RFC 3629, table 3-7 of
// the Unicode standard: second-byte ranges exclude overlongs, surrogates and > U+10FFFF).
static size_t utf8_len(const uint8_t *p, const uint8_t *end) {
    uint8_t c = p[0];
    if (c < 0x80) return 1;
    size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    if (c < 0xc2 || c > 0xf4 || (size_t)(end - p) < n) return 0;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
    if (p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xbf) return 0;
    return n;
}

static int hex4(Scan *s, uint32_t *v) {
    if (s->end - s->p < 4) return refuse(s, "%s", "a \\u escape needs 4 hex digits");
    *v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = s->p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return refuse(s, "%s", "a \\u escape needs 4 hex digits");
        *v = *v << 4 | (uint32_t)d;
    }
    s->p += 4;
    return 0;
}

// \uXXXX (s->p just past the 'u'), a surrogate pair taken whole, appended as UTF-8.
static int unicode_escape(Scan *s, JsonlText *t) {
    uint32_t cp, lo;
    if (hex4(s, &cp) != 0) return -1;
    if (cp >= 0xdc00 && cp <= 0xdfff) return refuse(s, "%s", "invalid UTF-8: a lone low surrogate escape");
    if (cp >= 0xd800 && cp <= 0xdbff) {
        if (s->end - s->p < 2 || s->p[0] != '\\' || s->p[1] != 'u')
            return refuse(s, "%s", "invalid UTF-8: a high surrogate escape without its low half");
        s->p += 2;
        if (hex4(s, &lo) != 0) return -1;
        if (lo < 0xdc00 || lo > 0xdfff) return refuse(s, "%s", "invalid UTF-8: a high surrogate escape without its low half");
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    uint8_t b[4];
    size_t n;
    if (cp < 0x80) b[0] = (uint8_t)cp, n = 1;
    else if (cp < 0x800) b[0] = (uint8_t)(0xc0 | cp >> 6), b[1] = (uint8_t)(0x80 | (cp & 0x3f)), n = 2;
    else if (cp < 0x10000)
        b[0] = (uint8_t)(0xe0 | cp >> 12), b[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f)), b[2] = (uint8_t)(0x80 | (cp & 0x3f)), n = 3;
    else
        b[0] = (uint8_t)(0xf0 | cp >> 18), b[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f)),
        b[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f)), b[3] = (uint8_t)(0x80 | (cp & 0x3f)), n = 4;
    return text_put(t, b, n);
}

// A string, s->p on its opening quote; its decoded bytes go to t when t is not NULL.
static int scan_string(Scan *s, JsonlText *t) {
    s->p++;
    for (;;) {
        // a run of plain bytes first: the common case, copied in one go
        const uint8_t *run = s->p;
        while (s->p < s->end && *s->p >= 0x20 && *s->p < 0x80 && *s->p != '"' && *s->p != '\\') s->p++;
        if (text_put(t, run, (size_t)(s->p - run)) != 0) return -1;
        if (s->p == s->end) return refuse(s, "%s", "not JSON: the line ends inside a string");
        uint8_t c = *s->p;
        if (c == '"') {
            s->p++;
            return 0;
        }
        if (c < 0x20) return refuse(s, "%s", "not JSON: a control character inside a string (escape it)");
        if (c >= 0x80) {
            size_t n = utf8_len(s->p, s->end);
            if (n == 0) return refuse(s, "%s", "invalid UTF-8");
            if (text_put(t, s->p, n) != 0) return -1;
            s->p += n;
            continue;
        }
        // a backslash
        if (s->end - s->p < 2) return refuse(s, "%s", "not JSON: the line ends inside a string");
        uint8_t e = s->p[1], b;
        s->p += 2;
        if (e == 'u') {
            if (unicode_escape(s, t) != 0) return -1;
            continue;
        }
        switch (e) {
        case '"': b = '"'; break;
        case '\\': b = '\\'; break;
        case '/': b = '/'; break;
        case 'b': b = '\b'; break;
        case 'f': b = '\f'; break;
        case 'n': b = '\n'; break;
        case 'r': b = '\r'; break;
        case 't': b = '\t'; break;
        default: s->p--; return refuse(s, "%s", "not JSON: an unknown escape in a string");
        }
        if (text_put(t, &b, 1) != 0) return -1;
    }
}

static int scan_number(Scan *s) {
    const uint8_t *p = s->p;
    if (p < s->end && *p == '-') p++;
    if (p < s->end && *p == '0') p++;
    else if (p < s->end && *p >= '1' && *p <= '9') while (p < s->end && *p >= '0' && *p <= '9') p++;
    else return refuse(s, "%s", "not JSON: expected a value");
    if (p < s->end && *p == '.') {
        if (++p == s->end || *p < '0' || *p > '9') return refuse(s, "%s", "not JSON: a malformed number");
        while (p < s->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < s->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < s->end && (*p == '+' || *p == '-')) p++;
        if (p == s->end || *p < '0' || *p > '9') return refuse(s, "%s", "not JSON: a malformed number");
        while (p < s->end && *p >= '0' && *p <= '9') p++;
    }
    s->p = p;
    return 0;
}

static int scan_word(Scan *s, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n) != 0) return refuse(s, "%s", "not JSON: expected a value");
    s->p += n;
    return 0;
}

// Any value (nested ones are checked but not kept). Containers are walked without recursion
// limits of the C stack: a stack of open brackets, at most DEPTH_MAX deep.
static int scan_value(Scan *s) {
    uint8_t open[DEPTH_MAX];
    int depth = 0;
    for (;;) {
        skip_ws(s);
        if (s->p == s->end) return refuse(s, "%s", "not JSON: the line ends where a value should be");
        uint8_t c = *s->p;
        int rc = 0;
        if (c == '{' || c == '[') {
            if (depth == DEPTH_MAX) return refuse(s, "not JSON: nested more than %s deep", "512");
            open[depth++] = c;
            s->p++;
            skip_ws(s);
            if (s->p < s->end && *s->p == (c == '{' ? '}' : ']')) {
                s->p++;
                depth--;
            } else if (c == '{') {
                if (s->p == s->end || *s->p != '"') return refuse(s, "%s", "not JSON: expected a key");
                if (scan_string(s, NULL) != 0) return -1;
                skip_ws(s);
                if (s->p == s->end || *s->p != ':') return refuse(s, "%s", "not JSON: expected ':'");
                s->p++;
                continue;
            } else {
                continue;
            }
        } else if (c == '"') rc = scan_string(s, NULL);
        else if (c == 't') rc = scan_word(s, "true");
        else if (c == 'f') rc = scan_word(s, "false");
        else if (c == 'n') rc = scan_word(s, "null");
        else rc = scan_number(s);
        if (rc != 0) return -1;
        // after a value: close what ends here, or go on with the next element
        for (;;) {
            if (depth == 0) return 0;
            skip_ws(s);
            if (s->p == s->end) return refuse(s, "%s", "not JSON: the line ends inside an object or array");
            uint8_t close = open[depth - 1] == '{' ? '}' : ']';
            if (*s->p == close) {
                s->p++;
                depth--;
                continue;
            }
            if (*s->p != ',') return refuse(s, "not JSON: expected ',' or '%s'", close == '}' ? "}" : "]");
            s->p++;
            if (open[depth - 1] == '{') {
                skip_ws(s);
                if (s->p == s->end || *s->p != '"') return refuse(s, "%s", "not JSON: expected a key");
                if (scan_string(s, NULL) != 0) return -1;
                skip_ws(s);
                if (s->p == s->end || *s->p != ':') return refuse(s, "%s", "not JSON: expected ':'");
                s->p++;
            }
            break;
        }
    }
}

static const char *kind_of(uint8_t c) {
    if (c == '{') return "an object";
    if (c == '[') return "an array";
    if (c == 't' || c == 'f') return "a boolean";
    if (c == 'n') return "null";
    return "a number";
}

// The top-level object: each member's key compared with the field; the field's string decoded
// into out (a later duplicate key wins, as in Python's json module). *found: '"' when the field is a
// string, the first byte of its value when it is something else, 0 when there is no such field.
static int scan_object(Scan *s, const char *field, int *found) {
    size_t flen = strlen(field);
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    for (;;) {
        skip_ws(s);
        if (s->p == s->end || *s->p != '"') return refuse(s, "%s", "not JSON: expected a key");
        // keys are decoded too (an escaped key is the same key), into a scratch piece of out
        size_t mark = s->out->n;
        if (scan_string(s, s->out) != 0) return -1;
        int is_field = s->out->n - mark == flen && memcmp(s->out->s + mark, field, flen) == 0;
        s->out->n = mark;
        skip_ws(s);
        if (s->p == s->end || *s->p != ':') return refuse(s, "%s", "not JSON: expected ':'");
        s->p++;
        skip_ws(s);
        if (is_field && s->p < s->end && *s->p == '"') {
            s->out->n = 0;
            if (scan_string(s, s->out) != 0) return -1;
            *found = '"';
        } else {
            if (is_field && s->p < s->end) *found = *s->p;  // the wrong kind: said once the line checks out
            if (scan_value(s) != 0) return -1;
        }
        skip_ws(s);
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            return 0;
        }
        if (s->p == s->end || *s->p != ',') return refuse(s, "%s", "not JSON: expected ',' or '}'");
        s->p++;
    }
}

int jsonl_field(const char *line, size_t n, const char *field, JsonlText *out, char *why, size_t why_cap) {
    Scan s = {(const uint8_t *)line, (const uint8_t *)line + n, (const uint8_t *)line, out, why, why_cap};
    out->n = 0;
    skip_ws(&s);
    if (s.p == s.end) {
        snprintf(why, why_cap, "an empty line, not a JSON object");
        return -1;
    }
    if (*s.p != '{') {
        // name what the line is only when it is JSON: "not" is no null
        uint8_t first = *s.p;
        if (scan_value(&s) != 0) return -1;
        skip_ws(&s);
        if (s.p != s.end) return refuse(&s, "%s", "not JSON: more after the value");
        snprintf(why, why_cap, "not a JSON object (the line is %s)", first == '"' ? "a string" : kind_of(first));
        return -1;
    }
    int found = 0;
    if (scan_object(&s, field, &found) != 0) return -1;
    skip_ws(&s);
    if (s.p != s.end) return refuse(&s, "%s", "not JSON: more after the object");
    if (!found) {
        snprintf(why, why_cap, "no field \"%s\"", field);
        return -1;
    }
    if (found != '"') {
        snprintf(why, why_cap, "field \"%s\" is %s, not a string", field, kind_of((uint8_t)found));
        return -1;
    }
    return 0;
}
