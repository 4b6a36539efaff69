// checkpoint.h: files of named, checksummed sections (model, optimizer moments, step, data position,
// random state, ...). What goes in is up to the caller: any set of named byte blobs.
//
// Byte layout (all integers little-endian; docs/model.md draws it):
//   header   24 bytes: magic "BSCKPT\r\n" (8), version u32 (= 1), count u32, table_crc u32, zero u32
//   table    count entries of 80 bytes: name (64, NUL-padded), size u64, crc32 u32, zero u32
//   data     the sections' bytes in table order, back to back; the file ends with the last one
// table_crc is the CRC-32 of the table bytes; each entry's crc32 is that of its section's bytes.
//
// Saving goes through an AtomicFile (temp file, fsync, rename): a crash leaves the previous
// checkpoint intact. Loading checks magic, version, table checksum, every size against the file
// size, every section checksum, and the sections the caller requires, and refuses with a message
// naming the file and the problem ("ckpt.bin: truncated at byte 113 (expected 4096 bytes)").
#ifndef BYTESCALE_CHECKPOINT_H
#define BYTESCALE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

enum { CKPT_NAME_MAX = 64, CKPT_VERSION = 1, CKPT_HEADER_BYTES = 24, CKPT_ENTRY_BYTES = 80 };
#define CKPT_MAGIC "BSCKPT\r\n"  // 8 bytes, no NUL; \r\n catches text-mode mangling

typedef struct {
    const char *name;  // 1 .. CKPT_NAME_MAX-1 characters, unique in the file
    const void *data;
    uint64_t size;     // bytes
} CkptBlob;

// Write the blobs to path atomically. -1 + error (bad or duplicate name, I/O failure).
int ckpt_save(const char *path, const CkptBlob *blobs, int n);

typedef struct {
    char name[CKPT_NAME_MAX];
    uint64_t offset;  // of its first byte in the file
    uint64_t size;
    uint32_t crc;
} CkptEntry;

typedef struct {
    char path[1024];
    uint8_t *data;       // the whole file
    size_t size;
    CkptEntry *entries;  // (n,)
    int n;
} Checkpoint;

// Read and verify a whole checkpoint. required (n_required names, may be NULL / 0) must all be
// present. On any failure nothing is left allocated and the error names path and problem.
int ckpt_load(Checkpoint *c, const char *path, const char *const *required, int n_required);
void ckpt_free(Checkpoint *c);

int ckpt_has(const Checkpoint *c, const char *name);
// A section's bytes in the loaded file (no alignment promised: memcpy out). -1 + error when missing.
int ckpt_find(const Checkpoint *c, const char *name, const void **data, uint64_t *size);
// Copy a section into dst, whose size must equal the section's. -1 + error on missing / size mismatch.
int ckpt_read(const Checkpoint *c, const char *name, void *dst, uint64_t size);

#endif
