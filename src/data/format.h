// format.h: the byte layout of shard and index files (docs/data-format.md), for shard_read.c and
// shard_write.c only. All integers are little-endian, whatever the host.
#ifndef BYTESCALE_DATA_FORMAT_H
#define BYTESCALE_DATA_FORMAT_H

#include <stdint.h>

#define SHARD_MAGIC "BSSHARD"  // 7 characters + NUL = 8 bytes
#define INDEX_MAGIC "BSINDEX"
#define HEADER_BYTES 64        // both files: a 64-byte header whose last 4 bytes are its crc32
#define SHARD_ENTRY_BYTES 64   // index: per shard, name[48] n_tokens:u64 crc:u32 zero:u32
#define DOC_ENTRY_BYTES 24     // index: per document, shard:u32 zero:u32 offset:u64 len:u64

// shard header fields (byte offsets)
enum { SH_MAGIC = 0, SH_VERSION = 8, SH_TOKENIZER = 12, SH_VOCAB = 16, SH_WIDTH = 20, SH_NTOKENS = 24, SH_CRC = 32 };
// index header fields
enum {
    IX_MAGIC = 0, IX_VERSION = 8, IX_TOKENIZER = 12, IX_VOCAB = 16, IX_WIDTH = 20, IX_NSHARDS = 24, IX_FLAGS = 28,
    IX_NDOCS = 32, IX_NTOKENS = 40, IX_BODY_BYTES = 48, IX_BODY_CRC = 56
};
#define HEADER_CRC_AT 60
#define INDEX_HAS_PATHS 1u  // flags bit 0: a path table follows the document table

static inline void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

#endif
