// tokenizer.h: text bytes <-> token ids. The tokenizers (docs/tokenizers.md):
//
//   byte    token = byte value, vocab 256. Nothing separates documents: the document index does.
//   gpt2    GPT-2's byte-level BPE (the r50k_base ranks of tiktoken), vocab 50257 with the special
//           token <|endoftext|> = 50256, which `prepare` appends to every non-empty document.
//   cl100k  tiktoken's cl100k_base, vocab 100277, <|endoftext|> = 100257.
//   o200k   tiktoken's o200k_base, vocab 200019, <|endoftext|> = 199999.
//   hf:PATH a Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2, LLaMA-3, Qwen2 families).
//
// All are byte-level: every byte string, valid UTF-8 or not, encodes and decodes back to itself.
// Special tokens are never produced from text: "<|endoftext|>" in a document is ordinary text.
// A Tokenizer holds scratch state, so one Tokenizer must not encode on two threads at once.
#ifndef BYTESCALE_TOKENIZER_H
#define BYTESCALE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    TOKENIZER_BYTE = 1,
    TOKENIZER_GPT2 = 2,
    TOKENIZER_CL100K = 3,
    TOKENIZER_O200K = 4,
    TOKENIZER_HF = 5,
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
// A tiktoken encoding by bytescale's name: "gpt2", "cl100k" or "o200k", its rank file at ranks_path
// (which must hold that encoding's number of ranks).
int tokenizer_open_tiktoken(Tokenizer **out, const char *name, const char *ranks_path);
// tiktoken's name for one of those ("r50k_base", "cl100k_base", "o200k_base"; its rank file is
// <that>.tiktoken), NULL for another name.
const char *tiktoken_encoding_name(const char *name);
// A Hugging Face tokenizer.json (tok_hf.c): a BPE model over GPT-2's byte-to-character map, its
// pre-tokenizer ByteLevel or a Split by regex then ByteLevel. Other kinds are refused by name.
int tokenizer_open_hf(Tokenizer **out, const char *json_path);
// By name: "byte", "gpt2", "cl100k", "o200k" (ranks_path: their rank file) or "hf:PATH".
int tokenizer_open(Tokenizer **out, const char *name, const char *ranks_path);
void tokenizer_free(Tokenizer *t);

TokenizerKind tokenizer_kind(const Tokenizer *t);
const char *tokenizer_name(const Tokenizer *t);    // "byte", "gpt2", "cl100k", "o200k" or "hf"
const char *tokenizer_kind_name(TokenizerKind kind);  // the same by kind; "unknown" for another
uint32_t tokenizer_vocab_size(const Tokenizer *t); // the highest id + 1 (256, 50257, 100277, ...)
int64_t tokenizer_eot(const Tokenizer *t);         // the end-of-text id, or -1 when there is none

// Append the tokens of text[0, n) to out. Never fails on content; -1 + error only when memory runs
// out (or, for gpt2, when PCRE2 itself reports an error, such as a match limit).
int tokenizer_encode(Tokenizer *t, const void *text, size_t n, Tokens *out);
// The bytes of one token (a special token decodes to its text, "<|endoftext|>"); NULL when id is out
// of range or a hole (an id below vocab that is no token, such as cl100k's 100256).
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
