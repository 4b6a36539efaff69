// tokenizer.c: the byte tokenizer, and the calls that dispatch to the byte, tiktoken (tok_bpe.c) or
// Hugging Face (tok_hf.c) tokenizer. The token array both append to is tokens.c.
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "data/tok_internal.h"

int tokenizer_open(Tokenizer **out, const char *name, const char *ranks_path) {
    *out = NULL;
    if (!strcmp(name, "byte")) return tokenizer_open_byte(out);
    if (tiktoken_encoding_name(name)) return tokenizer_open_tiktoken(out, name, ranks_path);
    if (!strncmp(name, "hf:", 3)) return tokenizer_open_hf(out, name + 3);
    return bs_fail("unknown tokenizer '%s' (expected byte, gpt2, cl100k, o200k or hf:PATH/tokenizer.json)", name);
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    if (t->kind != TOKENIZER_BYTE) tokenizer_gpt2_free(t);
    free(t);
}

TokenizerKind tokenizer_kind(const Tokenizer *t) { return t->kind; }
const char *tokenizer_kind_name(TokenizerKind kind) {
    switch (kind) {
    case TOKENIZER_BYTE: return "byte";
    case TOKENIZER_GPT2: return "gpt2";
    case TOKENIZER_CL100K: return "cl100k";
    case TOKENIZER_O200K: return "o200k";
    case TOKENIZER_HF: return "hf";
    }
    return "unknown";
}

const char *tokenizer_name(const Tokenizer *t) { return tokenizer_kind_name(t->kind); }
uint32_t tokenizer_vocab_size(const Tokenizer *t) { return t->vocab; }
int64_t tokenizer_eot(const Tokenizer *t) { return t->eot; }

int tokenizer_encode(Tokenizer *t, const void *text, size_t n, Tokens *out) {
    if (t->kind == TOKENIZER_HF) return tokenizer_hf_encode(t, text, n, out);
    if (t->kind != TOKENIZER_BYTE) return tokenizer_gpt2_encode(t, text, n, out);
    if (tokens_reserve(out, (int64_t)n) != 0) return -1;
    const uint8_t *p = text;
    for (size_t i = 0; i < n; i++) out->ids[out->n + (int64_t)i] = p[i];
    out->n += (int64_t)n;
    return 0;
}

const uint8_t *tokenizer_token_bytes(const Tokenizer *t, uint32_t id, size_t *len) {
    if (id >= t->vocab) return NULL;
    if (t->kind == TOKENIZER_BYTE) {
        *len = 1;
        return &t->bytes[id];
    }
    *len = t->tok_len[id];
    return *len ? t->blob + t->tok_off[id] : NULL;  // no token has 0 bytes: a hole
}

int tokenizer_decode(const Tokenizer *t, const uint32_t *ids, int64_t n, uint8_t **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    size_t total = 0, len;
    for (int64_t i = 0; i < n; i++) {
        if (!tokenizer_token_bytes(t, ids[i], &len))
            return bs_fail("decode: token %lld: id %u out of range [0, %u)%s", (long long)i, ids[i], t->vocab,
                           ids[i] < t->vocab ? " (no token has that id)" : "");
        total += len;
    }
    uint8_t *buf = bs_malloc(total + 1);
    if (!buf) return -1;
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *b = tokenizer_token_bytes(t, ids[i], &len);
        memcpy(buf + at, b, len);
        at += len;
    }
    buf[at] = '\0';
    *out = buf;
    *out_len = total;
    return 0;
}

int tokenizer_open_byte(Tokenizer **out) {
    *out = NULL;
    Tokenizer *t = bs_calloc(1, sizeof *t);
    if (!t) return -1;
    for (int i = 0; i < 256; i++) t->bytes[i] = (uint8_t)i;
    t->kind = TOKENIZER_BYTE;
    t->vocab = 256;
    t->eot = -1;
    *out = t;
    return 0;
}
