// prepare.h: text files -> token shards + document index (`bytescale prepare`).
//
// Every input file is one document, except JSONL files (named *.jsonl, *.jsonl.gz, *.jsonl.zst):
// one document per line, its text in the string member `text_field` of the line's JSON object
// (docs/datasets.md, "Preparing a corpus"). A bad line stops the run with "<file>:<line>: <reason>",
// or is skipped and counted with skip_bad_lines. Directories are walked recursively and their files taken in
// byte order of their paths, so the same inputs always give the same dataset. Symbolic links are
// followed (a link to a directory that the walk is already inside is a loop, and skipped: its files
// are being taken anyway). A file that cannot be read, a dangling link or a FIFO that the extension
// filter would take fails the whole run: a dataset silently missing files is worse than no dataset.
//
// The output directory may hold a dataset already: it stays readable, whole, until the new one
// replaces it in one step, and a run that fails or is killed leaves it as it was (shard.h,
// docs/data-format.md). An output directory inside an input directory is refused.
#ifndef BYTESCALE_PREPARE_H
#define BYTESCALE_PREPARE_H

#include <stdint.h>

#define PREPARE_DEFAULT_CORPUS "/usr/share/go-1.19/src"
#define PREPARE_DEFAULT_EXT ".go"
#define PREPARE_DEFAULT_SHARD_BYTES (256ll << 20)
#define PREPARE_SKIP_SHOWN 10   // skipped JSONL lines named in the stats (the rest are counted)
#define PREPARE_SKIP_TEXT 8192

typedef struct {
    const char *const *inputs;  // (n_inputs,) files or directories; none = the Go corpus
    int n_inputs;
    const char *ext;            // keep only directory entries ending in ext; NULL = all files
                                // (with no inputs, NULL means PREPARE_DEFAULT_EXT)
    const char *tokenizer;      // "byte" or "gpt2"
    const char *bpe_ranks;      // rank file, gpt2 only
    const char *out_dir;
    int64_t shard_bytes;        // most payload bytes per shard; 0 = PREPARE_DEFAULT_SHARD_BYTES
    int quiet;                  // no progress line
    int threads;                // tokenizing threads; 0 = one per core this process may run on
    const char *text_field;     // JSONL: the member holding a document's text; NULL = "text"
    int skip_bad_lines;         // JSONL: skip bad lines (counted in n_skipped) instead of failing
    const char *stdin_name;     // the input "-" is JSONL on standard input, named this in messages
                                // and in the index's sources ("<name>:<line>"); NULL = "-"
} PrepareConfig;

typedef struct {
    int64_t n_files;
    int64_t n_docs;    // one per plain file, one per good JSONL line
    int64_t n_skipped; // JSONL lines skipped as bad (skip_bad_lines)
    int threads;       // the tokenizing threads that ran
    int n_skip_shown;  // how many of the skipped lines skip_shown names
    char skip_shown[PREPARE_SKIP_TEXT];  // the first PREPARE_SKIP_SHOWN skipped: "<file>:<line>: <reason>\n" each
    int64_t n_bytes;   // of text read (JSONL: the lines, decompressed)
    int64_t n_tokens;
    int n_shards;
    double seconds;
    // document lengths in tokens (nearest-rank percentiles)
    int64_t len_min, len_median, len_p90, len_p99, len_max;
} PrepareStats;

// The input files in the order prepare takes them (free each and the array).
int prepare_list_files(const char *const *inputs, int n_inputs, const char *ext, char ***files, int64_t *n_files);
int prepare_run(const PrepareConfig *cfg, PrepareStats *stats);

#endif
