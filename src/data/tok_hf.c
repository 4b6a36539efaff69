// tok_hf.c: Hugging Face tokenizer.json, byte-level BPE.
#include "bytescale/error.h"
#include "data/tok_internal.h"

int tokenizer_open_hf(Tokenizer **out, const char *json_path) {
    *out = NULL;
    return bs_fail("%s: hf tokenizers are not built yet", json_path);
}

int tokenizer_hf_encode(Tokenizer *t, const uint8_t *text, size_t n, Tokens *out) { return tokenizer_gpt2_encode(t, text, n, out); }
