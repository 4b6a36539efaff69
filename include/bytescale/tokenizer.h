// tokenizer.h: text bytes <-> token ids. Two tokenizers (docs/tokenizers.md):
//
//   byte  token = byte value, vocab 256. Nothing separates documents: the document index does.
//   gpt2  GPT-2's byte-level BPE (the r50k_base ranks of tiktoken), vocab 50257 with the special
//         token <|endoftext|> = 50256, which `prepare` appends to every non-empty document.
//
// Both are byte-level: every byte string, valid UTF-8 or not, encodes and decodes back to itself.
// A Tokenizer holds scratch state, so one Tokenizer must not encode on two threads at once.
#ifndef BYTESCALE_TOKENIZER_H
#define BYTESCALE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    TOKENIZER_BYTE = 1,
    TOKENIZER_GPT2 = 2,
} TokenizerKind;

typedef struct Tokenizer Tokenizer;

// A growable array of token ids; encode appends to it. Zero-initialize, then tokens_free.
typedef struct {
    uint32_t *ids;  // (n,)
    int64_t n;
    int64_t cap;
} Tokens;

int tokens_reserve(Tokens *t, int64_t extra);  // room for `extra` more ids
int tokens_push(Tokens *t, uint32_t id);
void tokens_free(Tokens *t);

int tokenizer_open_byte(Tokenizer **out);
// Read a tiktoken rank file: lines "<base64 token bytes> <rank>" with ranks 0..N-1 each once.
// -1 + error naming the file and line on anything else.
int tokenizer_open_gpt2(Tokenizer **out, const char *ranks_path);
// By name: "byte" or "gpt2" (ranks_path is used by gpt2 only).
int tokenizer_open(Tokenizer **out, const char *name, const char *ranks_path);
void tokenizer_free(Tokenizer *t);

TokenizerKind tokenizer_kind(const Tokenizer *t);
const char *tokenizer_name(const Tokenizer *t);    // "byte" or "gpt2"
uint32_t tokenizer_vocab_size(const Tokenizer *t); // 256 or 50257
int64_t tokenizer_eot(const Tokenizer *t);         // the end-of-text id, or -1 when there is none

// Append the tokens of text[0, n) to out. Never fails on content; -1 + error only when memory runs
// out (or, for gpt2, when PCRE2 itself reports an error, such as a match limit).
int tokenizer_encode(Tokenizer *t, const void *text, size_t n, Tokens *out);
// The bytes of one token (the special token decodes to "<|endoftext|>"); NULL when id is out of range.
const uint8_t *tokenizer_token_bytes(const Tokenizer *t, uint32_t id, size_t *len);
// Decode ids into a fresh buffer (free() it; NUL-terminated for convenience). -1 + error on a bad id.
int tokenizer_decode(const Tokenizer *t, const uint32_t *ids, int64_t n, uint8_t **out, size_t *out_len);

// GPT-2 internals, exposed for tests: byte-pair merging of one pre-tokenized piece, and the
// pre-tokenizer itself (calls fn for each piece in order; pieces cover text exactly, in order).
int gpt2_encode_piece(Tokenizer *t, const uint8_t *piece, size_t n, Tokens *out);
int gpt2_split(Tokenizer *t, const uint8_t *text, size_t n,
               int (*fn)(void *ctx, const uint8_t *piece, size_t len), void *ctx);
// The rank of a byte string, or -1 when it is not a token.
int64_t gpt2_rank(const Tokenizer *t, const uint8_t *bytes, size_t n);

#endif
