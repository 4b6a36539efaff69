// jsonl.h: the data layer's JSONL pieces (prepare's JSONL inputs, docs/datasets.md "JSONL"): one
// line -> the text of one field (jsonl.c), and reading a plain, gzip or zstd file as a stream of
// bytes (instream.c). Internal to src/data.
#ifndef BYTESCALE_DATA_JSONL_H
#define BYTESCALE_DATA_JSONL_H

#include <stddef.h>
#include <stdint.h>

// A growable byte buffer: the decoded text of a field (not NUL-terminated: a text may hold NULs).
typedef struct {
    char *s;
    size_t n, cap;
} JsonlText;

// Check that line[0, n) (without its newline) is one JSON object, and decode the string value of
// its member `field` into out. 0, or -1 with the reason in why ("not JSON: expected ':' at byte 17",
// "no field \"text\"", "field \"text\" is a number, not a string", "invalid UTF-8 at byte 9"); an
// out of memory is -1 with why empty and the error set (error.h).
int jsonl_field(const char *line, size_t n, const char *field, JsonlText *out, char *why, size_t why_cap);

// ---- compressed or plain input ---------------------------------------------------------------

typedef enum { INSTREAM_PLAIN = 0, INSTREAM_GZIP = 1, INSTREAM_ZSTD = 2 } InstreamKind;

typedef struct InStream InStream;

// The kind a file name says: ".gz" gzip, ".zst" zstd, anything else plain.
InstreamKind instream_kind_of(const char *path);
// -1 + error naming the path when it cannot be opened, or its first bytes are not the format the
// name says (a ".gz" that is not gzip).
int instream_open(InStream **out, const char *path);
// Up to cap decompressed bytes into buf; *got = 0 at the end. -1 + error "truncated gzip stream" /
// "corrupt zstd stream: ..." (without the path: the caller knows the file and line).
int instream_read(InStream *s, void *buf, size_t cap, size_t *got);
// Compressed bytes read from the file so far (for the progress line).
int64_t instream_offset(const InStream *s);
void instream_close(InStream *s);

// Whether a file holds JSONL by its name: ends in .jsonl, .jsonl.gz or .jsonl.zst.
int jsonl_is_jsonl(const char *path);

#endif
