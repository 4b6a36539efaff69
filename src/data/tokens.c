// tokens.c: the growable array of token ids that every tokenizer appends to (tokenizer.h). Its own
// file, below both tokenizers: the byte tokenizer (tokenizer.c) dispatches to the GPT-2 one
// (tok_bpe.c), so the array they share cannot live in either without the two needing each other.
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/tokenizer.h"

int tokens_reserve(Tokens *t, int64_t extra) {
    if (t->n + extra <= t->cap) return 0;
    int64_t cap = t->cap ? t->cap : 1024;
    while (cap < t->n + extra) cap *= 2;
    uint32_t *ids = bs_realloc(t->ids, (size_t)cap * sizeof *ids);
    if (!ids) return -1;
    t->ids = ids;
    t->cap = cap;
    return 0;
}

int tokens_push(Tokens *t, uint32_t id) {
    if (t->n == t->cap && tokens_reserve(t, 1) != 0) return -1;
    t->ids[t->n++] = id;
    return 0;
}

void tokens_free(Tokens *t) {
    free(t->ids);
    memset(t, 0, sizeof *t);
}
