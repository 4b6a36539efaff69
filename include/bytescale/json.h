// json.h: cJSON with errors that say where. Every getter names the file/object and key it was
// reading, so a bad plan or profile file reports "plan.json: items[3].ranks[1]: expected an integer".
#ifndef BYTESCALE_JSON_H
#define BYTESCALE_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

// Parse a file. -1 + error naming the path and the position of a syntax error.
int json_read_file(const char *path, cJSON **out);
// Parse n bytes already in memory; `where` (usually the path they came from) names them in the error.
int json_parse(const char *text, size_t n, const char *where, cJSON **out);
// Print and write atomically (see fileio.h). formatted=0 writes compact JSON.
int json_write_file(const char *path, const cJSON *root, int formatted);
// Add a finite number that reads back bit for bit (%.17g; cJSON's own printing keeps 15 digits
// whenever that reads back within an epsilon). 0 when out of memory.
int json_add_exact(cJSON *obj, const char *key, double v);

// Required members; `where` names the object for the message ("plan.json: items[3]").
int json_get_int(const cJSON *obj, const char *key, int64_t *out, const char *where);
int json_get_double(const cJSON *obj, const char *key, double *out, const char *where);
int json_get_string(const cJSON *obj, const char *key, const char **out, const char *where);
int json_get_array(const cJSON *obj, const char *key, const cJSON **out, const char *where);
// Optional members: leave *out unchanged and return 0 when the key is absent.
int json_opt_int(const cJSON *obj, const char *key, int64_t *out, const char *where);
int json_opt_double(const cJSON *obj, const char *key, double *out, const char *where);
// An array element that must be an integer.
int json_item_int(const cJSON *item, int64_t *out, const char *where, int index);

#endif
