// shard.h: a prepared dataset on disk - token shards plus one document index (docs/data-format.md).
//
//   <dir>/shard-g1-00000.bin ...   tokens, 1, 2 or 4 bytes each, with a checksummed header
//   <dir>/index.bin                per document: shard, offset, length (+ its source path)
//
// Documents are laid out one after another in index order, so each has a *global* token offset
// (`start`): the tokens of all earlier shards plus its offset in its own shard. A batch's
// Sequence.src is such a global offset (batch.h), and a rank reads exactly the token ranges it was
// given. Opening validates every header and checksum first and refuses a corrupt or truncated file
// with a message naming the file and what is wrong.
#ifndef BYTESCALE_SHARD_H
#define BYTESCALE_SHARD_H

#include <stdint.h>

#include "bytescale/fileio.h"
#include "bytescale/tokenizer.h"

#define SHARD_VERSION 1
#define INDEX_VERSION 1
#define INDEX_FILE "index.bin"
#define SHARD_NAME_MAX 48  // bytes for a shard's file name in the index, NUL included

typedef struct {
    char name[SHARD_NAME_MAX];  // file name relative to the index's directory
    int64_t n_tokens;
    uint32_t crc;               // crc32 of the shard's payload
    int64_t base;               // global offset of its first token (derived: sum of earlier shards)
} ShardInfo;

typedef struct {
    uint32_t shard;
    int64_t offset;  // tokens from the start of its shard's payload
    int64_t len;     // tokens (0 for an empty source file)
    int64_t start;   // global token offset of its first token (derived: shard base + offset)
} DocEntry;

// The index alone: all a scheduler needs to sample batches (lengths and offsets, no tokens).
typedef struct {
    char dir[4096];          // directory of the index file: shard names are relative to it
    TokenizerKind tokenizer;
    uint32_t vocab;
    uint32_t width;          // bytes per token in the shards: 1, 2 or 4
    int n_shards;
    int64_t n_docs;
    int64_t n_tokens;        // all documents together
    ShardInfo *shards;       // (n_shards,)
    DocEntry *docs;          // (n_docs,)
    char *path_blob;         // source paths, NUL-terminated, back to back; NULL when absent
    int64_t *path_off;       // (n_docs,) offset of each document's path in path_blob
} DocIndex;

// `path` is the index file or the directory holding index.bin. Checks magic, version, size,
// both checksums, and that every document lies inside its shard. -1 + error naming the file.
int docindex_read(DocIndex *ix, const char *path);
void docindex_free(DocIndex *ix);
// The source file a document came from, or NULL when the index has no path table.
const char *docindex_source(const DocIndex *ix, int64_t doc);
// Can a model be trained on this index? Training predicts each token from the ones before it in
// its document, so it needs a document of at least 2 tokens (one labelled token). -1 + error naming
// the dataset when there are no documents, no tokens, or only documents of 0 or 1 token.
int docindex_check_trainable(const DocIndex *ix);

// The index plus every shard, validated against it and memory-mapped.
typedef struct {
    DocIndex index;
    const uint8_t **payload;  // (n_shards,) first token byte of each shard
    void **maps;              // (n_shards,) the mappings, for munmap
    size_t *map_len;          // (n_shards,)
    uint64_t *file_id;        // (n_shards x 2,) each mapped file's device and inode
} Dataset;

int dataset_open(Dataset *ds, const char *path);
void dataset_close(Dataset *ds);
// Copy tokens [first, first + n) of document doc (first counted from the document's start).
// -1 + error when the range leaves the document, or when the dataset changed under the reader: a
// shard file truncated in place after dataset_open (its mapping would raise SIGBUS or read zeros)
// is an error naming the shard and saying the dataset changed, never a crash or silent zeros. A
// shard replaced by another file or removed is not: the mapping keeps the file that was opened.
int dataset_read(const Dataset *ds, int64_t doc, int64_t first, int64_t n, uint32_t *out);
// Copy tokens [src, src + n), src a global offset inside document doc, clipped to the document's
// end; *got says how many were copied. Asking for len + 1 tokens of a batch piece gets the label
// of its last token too, except at the document's end, where got = len tells the label is none.
int dataset_read_span(const Dataset *ds, int64_t doc, int64_t src, int64_t n, uint32_t *out, int64_t *got);

// ---- writing ---------------------------------------------------------------------------------

// Writes a dataset one document at a time, beside the one already in the directory, and replaces it
// in one step (docs/data-format.md, "Replacing a dataset"). The index is the commit point: each run
// writes its shards under names no earlier run used (shard-g<generation>-NNNNN.bin), each through a
// temporary file renamed when complete, then renames its index over index.bin, and only then
// removes the shards the old index named. Killed, failed or out of disk at any moment, the
// directory holds the old dataset or the new one, whole; a failed run removes what it wrote, and the
// next run removes what a killed one left. An exclusive lock on the directory keeps two runs apart.
typedef struct {
    char dir[4096];
    int dir_fd;            // the output directory, open and flock'ed while the writer lives
    int64_t gen;           // this run's generation: in every shard name it writes
    TokenizerKind tokenizer;
    uint32_t vocab;
    uint32_t width;
    int64_t shard_tokens;  // a shard is closed before it would exceed this many tokens
    // the shard being written
    AtomicFile file;
    int open;              // a shard is being written into file
    int64_t cur_tokens;
    uint32_t cur_crc;
    uint8_t *buf;          // a block of ids converted to file bytes, one write at a time
    // what goes into the index
    ShardInfo *shards;
    int n_shards, cap_shards;
    DocEntry *docs;
    int64_t n_docs, cap_docs;
    char *path_blob;
    int64_t *path_off;
    int64_t path_used, path_cap;
} ShardWriter;

// Bytes per token for a vocabulary: 1 up to 256, 2 up to 65536, else 4.
uint32_t token_width(uint32_t vocab);

// shard_bytes: the most payload bytes per shard (a single larger document gets a shard of its own).
// Creates dir if needed and locks it (another writer there: an error); refuses an index.bin that is
// not a bytescale index; removes what killed runs left (temporary files, shards no index names).
// The dataset already in dir stays readable until shard_writer_finish replaces it.
int shard_writer_open(ShardWriter *w, const char *dir, const Tokenizer *tok, int64_t shard_bytes);
// One document; source may be NULL. Ids must be < vocab.
int shard_writer_add(ShardWriter *w, const uint32_t *ids, int64_t n, const char *source);
// Close the last shard, switch index.bin to the new dataset, remove the shards of the old one.
// The writer is freed and the directory unlocked either way; on failure as shard_writer_abort.
int shard_writer_finish(ShardWriter *w);
// Stop: remove the open temporary file and the shards written so far; the dataset that was in the
// directory before is untouched.
void shard_writer_abort(ShardWriter *w);

#endif
