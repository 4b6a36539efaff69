// tok_internal.h: the Tokenizer struct, shared by tokenizer.c (the byte tokenizer) and tok_bpe.c only.
#ifndef BYTESCALE_TOK_INTERNAL_H
#define BYTESCALE_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "bytescale/tokenizer.h"

// One heap entry of the BPE merge: the pair starting at byte `pos` has rank `rank`; it is still
// current only while ver[pos] == ver (every change to the part at pos or its right neighbour
// bumps ver[pos]).
typedef struct {
    uint32_t rank;
    uint32_t pos;
    uint32_t ver;
} MergeEntry;

typedef struct PieceCache PieceCache;

struct Tokenizer {
    TokenizerKind kind;
    uint32_t vocab;  // ids are [0, vocab)
    int64_t eot;     // end-of-text id, -1 when none
    uint8_t bytes[256];  // byte tokenizer: bytes[i] == i, what token_bytes points into

    // gpt2: token bytes, by rank; the special token last
    uint8_t *blob;       // all token bytes back to back
    uint32_t blob_used;
    uint32_t *tok_off;   // (vocab,) offset of each token's bytes in blob
    uint32_t *tok_len;   // (vocab,)
    // byte string -> rank: open addressing with linear probing; slot holds rank + 1, 0 = empty
    uint32_t *slots;     // (n_slots,)
    uint32_t slot_mask;  // n_slots - 1, n_slots a power of two at least twice the token count
    uint32_t n_ranks;    // tokens from the rank file (the special token is not among them)
    // pre-tokenizer
    pcre2_code *re;
    pcre2_match_data *md;
    // merge scratch, grown to the longest piece seen: per byte position of the piece
    uint32_t *next;      // start of the next part, or n at the end
    uint32_t *prev;      // start of the previous part, UINT32_MAX at the start
    uint32_t *ver;
    MergeEntry *heap;    // at most 3 pushes per merge plus the initial pairs
    uint32_t *pid;       // hf: the token id of each part
    size_t scratch_cap;  // bytes of piece the arrays above can hold
    // hf (tok_hf.c): merges as a table (left id, right id) -> (rank, merged id), open addressing
    uint64_t *pair_key;  // left << 32 | right, UINT64_MAX = empty
    uint64_t *pair_val;  // rank << 32 | merged id
    uint32_t pair_mask;
    uint32_t byte_id[256];  // the token of each single byte
    int ignore_merges;      // a piece that is a token is taken whole (LLaMA-3's tokenizer.json says so)
    int prefix_space;       // ByteLevel's add_prefix_space: a text not starting with ' ' gets one
    int eot_rank;           // which of tok_hf.c's end-of-document names eot is (the earliest wins)
    int nfc;                // the NFC normalizer (Qwen2's): text between added tokens is composed first
    uint32_t *added;        // (n_added,) the added tokens matched in text (the non-special ones), longest first
    uint32_t n_added;
    uint8_t added_first[256];  // 1 for a byte that begins one of them: the matcher skips other bytes fast
    PieceCache *cache;      // recent pieces' ids (bpe_encode_cached); NULL until the first piece
};

void tokenizer_gpt2_free(Tokenizer *t);
// Shared with tok_hf.c: the byte-string table, the merge heap and its scratch.
int bpe_table_insert(Tokenizer *t, uint32_t id);  // -1 when the same bytes are there already
void bpe_heap_push(MergeEntry *h, size_t *n, MergeEntry e);
MergeEntry bpe_heap_pop(MergeEntry *h, size_t *n);
int bpe_ensure_scratch(Tokenizer *t, size_t n);
// merge(t, piece, n, out), through a cache of short pieces' ids (t->cache).
int bpe_encode_cached(Tokenizer *t, const uint8_t *piece, size_t n, Tokens *out,
                      int (*merge)(Tokenizer *t, const uint8_t *piece, size_t n, Tokens *out));
// Compile a pre-tokenizer pattern into t->re / t->md (UTF, Unicode classes, invalid UTF-8 allowed in
// subjects, plus extra_flags). what names the tokenizer in messages.
int bpe_compile_pattern(Tokenizer *t, const char *pattern, uint32_t extra_flags, const char *what);
int tokenizer_gpt2_encode(Tokenizer *t, const uint8_t *text, size_t n, Tokens *out);
int tokenizer_hf_encode(Tokenizer *t, const uint8_t *text, size_t n, Tokens *out);

#endif
