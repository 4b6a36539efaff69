// prepare_pipe.h: prepare's pipeline (prepare_pipe.c), for prepare.c only. One thread reads the
// inputs in order and cuts them into chunks (a whole file of one document, or about a megabyte of
// JSONL lines); worker threads, one Tokenizer each, turn chunks into tokens; the calling thread
// writes the chunks' documents in order. So the dataset is the same whatever the thread count, and
// memory holds a fixed number of chunks in flight, however large the inputs.
#ifndef BYTESCALE_DATA_PREPARE_PIPE_H
#define BYTESCALE_DATA_PREPARE_PIPE_H

#include <stdint.h>

#include "bytescale/prepare.h"
#include "bytescale/shard.h"
#include "bytescale/tokenizer.h"

typedef struct {
    char *const *files;  // (n_files,) in the order their documents go into the dataset
    int64_t n_files;
    int64_t in_bytes;    // the files' sizes together (the progress line's total)
    Tokenizer **toks;    // (threads,) one per worker: a Tokenizer keeps scratch state
    int threads;
    const char *text_field;  // JSONL: the member holding a document's text
    int skip_bad;            // JSONL: skip bad lines (counted) instead of stopping
    int quiet;
    const char *stdin_name;  // what the file "-" (JSONL on standard input) is called
} PipeConfig;

// Run the pipeline into w (opened by the caller; not finished here). Fills stats' document, token
// and byte counts and n_skipped; *lens gets each document's length in tokens (free() it).
// -1 + error "<file>:<line>: <reason>" for a bad JSONL line, "<file>: ..." for a file.
int prepare_pipe_run(const PipeConfig *cfg, ShardWriter *w, PrepareStats *stats, int64_t **lens);

#endif
