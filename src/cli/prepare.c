// prepare.c: `bytescale prepare` - text files -> token shards + document index.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"
#include "bytescale/prepare.h"
#include "bytescale/progress.h"
#include "bytescale/tokenizer.h"
#include "cli/cli.h"

#define RANKS_DIR "data/tiktoken/"
enum { MAX_INPUTS = 256 };

static void usage(FILE *f) {
    fprintf(f,
            "usage: bytescale prepare [flags]\n"
            "\n"
            "Turn text files into token shards plus a document index (docs/data-format.md). Every file is\n"
            "one document, except JSONL files (*.jsonl, *.jsonl.gz, *.jsonl.zst): one document per line,\n"
            "its text in the line's --text-field. Directories are walked recursively, symbolic links\n"
            "followed, files taken in sorted path order.\n"
            "\n"
            "  --input PATH       a file or directory; repeatable (default: %s, *.go);\n"
            "                     - is JSONL on standard input\n"
            "  --ext EXT          keep only files in directories whose name ends in EXT\n"
            "                     (default: .go for the default corpus, every file otherwise)\n"
            "  --tokenizer NAME   byte (default); gpt2, cl100k or o200k (tiktoken's r50k_base,\n"
            "                     cl100k_base, o200k_base); hf:PATH (a Hugging Face tokenizer.json,\n"
            "                     byte-level BPE) - docs/tokenizers.md\n"
            "  --bpe-ranks PATH   the tiktoken rank file for gpt2, cl100k, o200k (default: %s<name>.tiktoken,\n"
            "                     looked up in the current directory, then $BS_SOURCE_DIR, then next to\n"
            "                     the bytescale binary's parent directory; `make tokenizer` fetches them)\n"
            "  --out DIR          output directory (default: data/go-<tokenizer> for the default corpus;\n"
            "                     required with --input)\n"
            "  --shard-size N     most bytes of tokens per shard, suffixes K M G (default 256M)\n"
            "  --text-field NAME  JSONL: the member of each line's object that holds the text (default text)\n"
            "  --skip-bad-lines   JSONL: skip a bad line (not JSON, no such field, not a string, invalid\n"
            "                     UTF-8) and count it, instead of stopping at it\n"
            "  --threads N        tokenizing threads (default: one per core)\n"
            "  --stdin-name NAME  what --input - is called in messages and in the index (default -)\n"
            "  --help             this text\n"
            "\n"
            "A file that cannot be read, or a bad JSONL line (<file>:<line>: <reason>), stops the run with\n"
            "an error; nothing half-written is left behind. A truncated .gz or .zst always stops it.\n"
            "A dataset already in --out stays usable until the new one replaces it in one step: a run that\n"
            "fails or is killed leaves it as it was, and the next run removes what a killed one left.\n"
            "--out may not lie inside an --input directory.\n"
            "Set BS_QUIET=1 to hide the progress line.\n",
            PREPARE_DEFAULT_CORPUS, RANKS_DIR);
}

static int bad_usage(const char *fmt, const char *arg) { return cli_usage_error("prepare", fmt, arg); }

// The default rank file of a tiktoken encoding, looked up in the source tree (file_find_source).
static int find_ranks(const char *tokenizer, char *out, size_t cap) {
    char rel[128];
    snprintf(rel, sizeof rel, RANKS_DIR "%s.tiktoken", tiktoken_encoding_name(tokenizer));
    if (file_find_source(rel, out, cap) == 0) return 0;
    return bs_fail("%s: no rank file %s in the current directory, $BS_SOURCE_DIR or the source tree: run "
                   "`make tokenizer` or pass --bpe-ranks PATH",
                   tokenizer, rel);
}

int cmd_prepare(int argc, char **argv) {
    const char *inputs[MAX_INPUTS];
    PrepareConfig cfg = {.inputs = inputs, .tokenizer = "byte", .quiet = progress_env_quiet()};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
            usage(stdout);
            return 0;
        }
        // every other flag takes a value: "--flag value" or "--flag=value"
        if (strncmp(flag, "--", 2) != 0) return bad_usage("unexpected argument '%s'", flag);
        if (!strcmp(flag, "--skip-bad-lines")) {
            cfg.skip_bad_lines = 1;
            continue;
        }
        char name[64];
        const char *eq = strchr(flag, '='), *value;
        size_t len = eq ? (size_t)(eq - flag) : strlen(flag);
        if (len >= sizeof name) return bad_usage("unknown flag '%s'", flag);
        memcpy(name, flag, len);
        name[len] = '\0';
        int known = !strcmp(name, "--input") || !strcmp(name, "--ext") || !strcmp(name, "--tokenizer") ||
                    !strcmp(name, "--bpe-ranks") || !strcmp(name, "--out") || !strcmp(name, "--shard-size") ||
                    !strcmp(name, "--text-field") || !strcmp(name, "--threads") || !strcmp(name, "--stdin-name");
        if (!known) return bad_usage("unknown flag '%s'", name);
        if (eq) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc) return bad_usage("%s needs a value", name);
            value = argv[++i];
        }
        if (!strcmp(name, "--input")) {
            if (cfg.n_inputs == MAX_INPUTS) return bad_usage("more than 256 --input flags (pass a directory)%s", "");
            inputs[cfg.n_inputs++] = value;
        } else if (!strcmp(name, "--ext")) {
            cfg.ext = value;
        } else if (!strcmp(name, "--tokenizer")) {
            if (strcmp(value, "byte") != 0 && !tiktoken_encoding_name(value) && strncmp(value, "hf:", 3) != 0)
                return bad_usage("--tokenizer: '%s' is not a tokenizer (byte, gpt2, cl100k, o200k or hf:PATH)", value);
            if (!strcmp(value, "hf:")) return bad_usage("--tokenizer hf: needs the path of a tokenizer.json%s", "");
            cfg.tokenizer = value;
        } else if (!strcmp(name, "--bpe-ranks")) {
            cfg.bpe_ranks = value;
        } else if (!strcmp(name, "--out")) {
            cfg.out_dir = value;
        } else if (!strcmp(name, "--stdin-name")) {
            cfg.stdin_name = value;
        } else if (!strcmp(name, "--text-field")) {
            if (!*value) return bad_usage("--text-field needs a name%s", "");
            cfg.text_field = value;
        } else if (!strcmp(name, "--threads")) {
            int64_t n;
            if (arg_int64("--threads", value, &n) != 0) return bad_usage("%s", bs_errmsg());
            if (n < 1 || n > 1024) return bad_usage("--threads: '%s' must be 1..1024", value);
            cfg.threads = (int)n;
        } else {
            if (arg_int64("--shard-size", value, &cfg.shard_bytes) != 0) return bad_usage("%s", bs_errmsg());
            if (cfg.shard_bytes < 1) return bad_usage("--shard-size: '%s' must be at least 1 byte", value);
        }
    }
    char out_default[64];
    if (!cfg.out_dir) {
        if (cfg.n_inputs > 0) return bad_usage("--out is required with --input%s", "");
        if (!strncmp(cfg.tokenizer, "hf:", 3)) return bad_usage("--out is required with --tokenizer hf:PATH%s", "");
        snprintf(out_default, sizeof out_default, "data/go-%s", cfg.tokenizer);
        cfg.out_dir = out_default;
    }
    char ranks[4200];
    if (tiktoken_encoding_name(cfg.tokenizer) && !cfg.bpe_ranks) {
        if (find_ranks(cfg.tokenizer, ranks, sizeof ranks) != 0) cli_die("prepare", "%s", bs_errmsg());
        cfg.bpe_ranks = ranks;
    }

    PrepareStats st;
    if (prepare_run(&cfg, &st) != 0) cli_die("prepare", "%s", bs_errmsg());
    printf("prepared %lld files (%.1f MB) into %lld documents, %lld tokens (%s), %d shard%s in %s\n",
           (long long)st.n_files, (double)st.n_bytes / 1e6, (long long)st.n_docs, (long long)st.n_tokens, cfg.tokenizer,
           st.n_shards, st.n_shards == 1 ? "" : "s", cfg.out_dir);
    if (st.n_skipped > 0) {
        fprintf(stderr, "%s", st.skip_shown);
        printf("skipped %lld bad line%s (--skip-bad-lines)%s\n", (long long)st.n_skipped, st.n_skipped == 1 ? "" : "s",
               st.n_skipped > st.n_skip_shown ? "; the first ones are on stderr" : ", each named on stderr");
    }
    printf("document length in tokens: min %lld  median %lld  p90 %lld  p99 %lld  max %lld\n", (long long)st.len_min,
           (long long)st.len_median, (long long)st.len_p90, (long long)st.len_p99, (long long)st.len_max);
    printf("time %.2f s (%.1f MB/s of text, %d thread%s)\n", st.seconds,
           st.seconds > 0 ? (double)st.n_bytes / 1e6 / st.seconds : 0.0, st.threads, st.threads == 1 ? "" : "s");
    return 0;
}
