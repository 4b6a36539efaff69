// checkpoint.c: named, checksummed sections in one atomically written file (see checkpoint.h).
#include "bytescale/checkpoint.h"

#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"

// Integers are stored little-endian byte by byte, so files move between machines unchanged.
static void put_u32(uint8_t *p, uint32_t x) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(x >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t x) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(x >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) x |= (uint32_t)p[i] << (8 * i);
    return x;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)p[i] << (8 * i);
    return x;
}

static int check_names(const char *path, const CkptBlob *blobs, int n) {
    for (int i = 0; i < n; i++) {
        const char *name = blobs[i].name;
        size_t len = name ? strlen(name) : 0;
        if (len == 0 || len >= CKPT_NAME_MAX)
            return bs_fail("%s: section %d: name must have 1 to %d characters", path, i, CKPT_NAME_MAX - 1);
        if (!blobs[i].data && blobs[i].size > 0) return bs_fail("%s: section \"%s\": no data", path, name);
        for (int j = 0; j < i; j++)
            if (strcmp(blobs[j].name, name) == 0) return bs_fail("%s: section \"%s\" given twice", path, name);
    }
    return 0;
}

int ckpt_save(const char *path, const CkptBlob *blobs, int n) {
    if (n < 0) return bs_fail("%s: negative section count %d", path, n);
    if (check_names(path, blobs, n) != 0) return -1;
    size_t table_bytes = (size_t)n * CKPT_ENTRY_BYTES;
    uint8_t *head = bs_calloc(1, CKPT_HEADER_BYTES + table_bytes);
    if (!head) return bs_fail_ctx("%s", path);
    uint8_t *table = head + CKPT_HEADER_BYTES;
    for (int i = 0; i < n; i++) {
        uint8_t *e = table + (size_t)i * CKPT_ENTRY_BYTES;
        memcpy(e, blobs[i].name, strlen(blobs[i].name));  // the rest of the 64 bytes stays NUL
        put_u64(e + 64, blobs[i].size);
        put_u32(e + 72, checksum_crc32(0, blobs[i].data, blobs[i].size));
    }
    memcpy(head, CKPT_MAGIC, 8);
    put_u32(head + 8, CKPT_VERSION);
    put_u32(head + 12, (uint32_t)n);
    put_u32(head + 16, checksum_crc32(0, table, table_bytes));

    AtomicFile af;
    int rc = atomic_open(&af, path);
    if (rc == 0) rc = atomic_write(&af, head, CKPT_HEADER_BYTES + table_bytes);
    for (int i = 0; i < n && rc == 0; i++) rc = atomic_write(&af, blobs[i].data, blobs[i].size);
    free(head);
    if (rc != 0) {
        if (af.f) atomic_abort(&af);
        return -1;
    }
    return atomic_close(&af);
}

// Parse and verify c->data (c->size bytes); fills c->entries.
static int ckpt_verify(Checkpoint *c) {
    const char *path = c->path;
    const uint8_t *d = c->data;
    size_t size = c->size;
    if (size < CKPT_HEADER_BYTES)
        return bs_fail("%s: truncated at byte %zu (the header needs %d bytes)", path, size, CKPT_HEADER_BYTES);
    if (memcmp(d, CKPT_MAGIC, 8) != 0) return bs_fail("%s: not a bytescale checkpoint (bad magic number)", path);
    uint32_t version = get_u32(d + 8);
    if (version != CKPT_VERSION)
        return bs_fail("%s: unknown checkpoint version %u (this build reads version %d)", path, version, CKPT_VERSION);
    uint32_t count = get_u32(d + 12);
    if (get_u32(d + 20) != 0) return bs_fail("%s: corrupt header (reserved field is not zero)", path);
    // count is not yet trusted: compare in 64 bits so a huge count cannot overflow
    uint64_t table_end = CKPT_HEADER_BYTES + (uint64_t)count * CKPT_ENTRY_BYTES;
    if (size < table_end)
        return bs_fail("%s: truncated at byte %zu (the table of %u sections ends at byte %llu)", path, size, count,
                       (unsigned long long)table_end);
    const uint8_t *table = d + CKPT_HEADER_BYTES;
    if (checksum_crc32(0, table, (size_t)count * CKPT_ENTRY_BYTES) != get_u32(d + 16))
        return bs_fail("%s: checksum mismatch in the section table (corrupt file)", path);

    c->entries = bs_calloc(count ? count : 1, sizeof *c->entries);
    if (!c->entries) return bs_fail_ctx("%s", path);
    c->n = (int)count;
    uint64_t off = table_end;
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *e = table + (size_t)i * CKPT_ENTRY_BYTES;
        CkptEntry *ce = &c->entries[i];
        if (memchr(e, 0, CKPT_NAME_MAX) == NULL || e[0] == 0)
            return bs_fail("%s: section %u has no valid name", path, i);
        memcpy(ce->name, e, CKPT_NAME_MAX);
        ce->size = get_u64(e + 64);
        ce->crc = get_u32(e + 72);
        ce->offset = off;
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(c->entries[j].name, ce->name) == 0)
                return bs_fail("%s: section \"%s\" appears twice", path, ce->name);
        if (ce->size > UINT64_MAX - off) return bs_fail("%s: section \"%s\": size overflows", path, ce->name);
        off += ce->size;
    }
    if (size < off) return bs_fail("%s: truncated at byte %zu (expected %llu bytes)", path, size, (unsigned long long)off);
    if (size > off)
        return bs_fail("%s: %zu bytes, but the sections end at byte %llu (trailing data)", path, size,
                       (unsigned long long)off);
    for (int i = 0; i < c->n; i++) {
        const CkptEntry *ce = &c->entries[i];
        if (checksum_crc32(0, d + ce->offset, ce->size) != ce->crc)
            return bs_fail("%s: checksum mismatch in section \"%s\" (corrupt file)", path, ce->name);
    }
    return 0;
}

int ckpt_load(Checkpoint *c, const char *path, const char *const *required, int n_required) {
    memset(c, 0, sizeof *c);
    snprintf(c->path, sizeof c->path, "%s", path);
    char *buf;
    size_t size;
    if (file_read_all(path, &buf, &size) != 0) return -1;
    c->data = (uint8_t *)buf;
    c->size = size;
    int rc = ckpt_verify(c);
    for (int i = 0; i < n_required && rc == 0; i++)
        if (!ckpt_has(c, required[i])) rc = bs_fail("%s: missing required section \"%s\"", path, required[i]);
    if (rc != 0) ckpt_free(c);
    return rc;
}

void ckpt_free(Checkpoint *c) {
    free(c->data);
    free(c->entries);
    c->data = NULL;
    c->entries = NULL;
    c->n = 0;
    c->size = 0;
}

static const CkptEntry *ckpt_entry(const Checkpoint *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->entries[i].name, name) == 0) return &c->entries[i];
    return NULL;
}

int ckpt_has(const Checkpoint *c, const char *name) { return ckpt_entry(c, name) != NULL; }

int ckpt_find(const Checkpoint *c, const char *name, const void **data, uint64_t *size) {
    const CkptEntry *e = ckpt_entry(c, name);
    if (!e) return bs_fail("%s: no section \"%s\"", c->path, name);
    *data = c->data + e->offset;
    *size = e->size;
    return 0;
}

int ckpt_read(const Checkpoint *c, const char *name, void *dst, uint64_t size) {
    const CkptEntry *e = ckpt_entry(c, name);
    if (!e) return bs_fail("%s: no section \"%s\"", c->path, name);
    if (e->size != size)
        return bs_fail("%s: section \"%s\" has %llu bytes, expected %llu", c->path, name, (unsigned long long)e->size,
                       (unsigned long long)size);
    if (size) memcpy(dst, c->data + e->offset, size);
    return 0;
}
