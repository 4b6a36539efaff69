// fileio.h: whole-file reads, crash-safe writes, checksums.
//
// Every file bytescale writes goes through an AtomicFile: data goes to "<path>.tmp.<pid>", is
// flushed and fsync'ed, then renamed over <path>. A crash or an error leaves the old file intact
// and no half-written one behind.
#ifndef BYTESCALE_FILEIO_H
#define BYTESCALE_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

// Read a whole file into a fresh NUL-terminated buffer (free() it). -1 + error naming the path.
// Reads to EOF whatever the file says its size is, so FIFOs, /dev/stdin and /proc files work
// (streams up to 4 GiB); a directory is refused as "<path>: is a directory".
int file_read_all(const char *path, char **data, size_t *size);

// Open a file for reading as a stream (fread in pieces): -1 + error naming the path when it cannot
// be opened or is a directory. *st tells what it is (regular file, FIFO, ...).
int file_open_read(const char *path, FILE **f, struct stat *st);

typedef struct {
    FILE *f;
    char path[4096];
    char tmp[4096 + 32];
    int failed;  // a write failed: atomic_close will refuse to rename
} AtomicFile;

int atomic_open(AtomicFile *af, const char *path);
int atomic_write(AtomicFile *af, const void *data, size_t n);  // -1 + error; remembers failure
// Flush, fsync, rename into place. On any earlier or current failure (atomic_write's, or a failed
// fprintf straight to af->f: the stream's error flag is checked) the temp file is removed.
int atomic_close(AtomicFile *af);
void atomic_abort(AtomicFile *af);  // remove the temp file, keep the old one
// One call for small files: write all of data to path atomically.
int file_write_atomic(const char *path, const void *data, size_t n);

// CRC-32 (zlib's, the same as gzip and PNG), continuing from crc (start with 0).
uint32_t checksum_crc32(uint32_t crc, const void *data, size_t n);

// Create a directory and its parents (like mkdir -p). Existing directories are fine.
int make_dirs(const char *path);

// Find a file of the source tree (tokenizer data, scripts, measured figures) given its path relative
// to the tree: in the current directory, then under $BS_SOURCE_DIR, then two levels above the running
// program (build/bytescale -> the tree). -1 + error listing where it looked.
int file_find_source(const char *rel, char *out, size_t cap);

#endif
