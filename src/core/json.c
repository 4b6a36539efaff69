// json.c: checked access to cJSON trees (see json.h).
#include "bytescale/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytescale/error.h"
#include "bytescale/fileio.h"

int json_read_file(const char *path, cJSON **out) {
    *out = NULL;
    char *text;
    size_t n;
    if (file_read_all(path, &text, &n) != 0) return -1;
    int rc = json_parse(text, n, path, out);
    free(text);
    return rc;
}

int json_parse(const char *text, size_t n, const char *where, cJSON **out) {
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (*out) return 0;
    // report line and column of the first byte cJSON could not parse
    size_t off = end ? (size_t)(end - text) : 0;
    int line = 1, col = 1;
    for (size_t i = 0; i < off && i < n; i++) {
        if (text[i] == '\n') line++, col = 1;
        else col++;
    }
    return bs_fail("%s:%d:%d: invalid JSON", where, line, col);
}

int json_write_file(const char *path, const cJSON *root, int formatted) {
    char *text = formatted ? cJSON_Print(root) : cJSON_PrintUnformatted(root);
    if (!text) return bs_fail("%s: out of memory printing JSON", path);
    size_t n = strlen(text);
    text[n] = '\n';  // cJSON's buffer has room: we overwrite the NUL and write n+1 bytes
    int rc = file_write_atomic(path, text, n + 1);
    free(text);
    return rc;
}

int json_add_exact(cJSON *obj, const char *key, double v) {
    char text[40];
    snprintf(text, sizeof text, "%.17g", v);
    return cJSON_AddRawToObject(obj, key, text) != NULL;
}

static const cJSON *member(const cJSON *obj, const char *key, const char *where) {
    if (!cJSON_IsObject(obj)) {
        bs_fail("%s: expected an object", where);
        return NULL;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) bs_fail("%s: missing \"%s\"", where, key);
    return v;
}

static int as_int(const cJSON *v, int64_t *out, const char *where, const char *key) {
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || d != floor(d) || fabs(d) > 9007199254740992.0)
        return bs_fail("%s: \"%s\" must be an integer", where, key);
    *out = (int64_t)d;
    return 0;
}

int json_get_int(const cJSON *obj, const char *key, int64_t *out, const char *where) {
    const cJSON *v = member(obj, key, where);
    return v ? as_int(v, out, where, key) : -1;
}

int json_get_double(const cJSON *obj, const char *key, double *out, const char *where) {
    const cJSON *v = member(obj, key, where);
    if (!v) return -1;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return bs_fail("%s: \"%s\" must be a number", where, key);
    *out = v->valuedouble;
    return 0;
}

int json_get_string(const cJSON *obj, const char *key, const char **out, const char *where) {
    const cJSON *v = member(obj, key, where);
    if (!v) return -1;
    if (!cJSON_IsString(v)) return bs_fail("%s: \"%s\" must be a string", where, key);
    *out = v->valuestring;
    return 0;
}

int json_get_array(const cJSON *obj, const char *key, const cJSON **out, const char *where) {
    const cJSON *v = member(obj, key, where);
    if (!v) return -1;
    if (!cJSON_IsArray(v)) return bs_fail("%s: \"%s\" must be an array", where, key);
    *out = v;
    return 0;
}

int json_opt_int(const cJSON *obj, const char *key, int64_t *out, const char *where) {
    if (!cJSON_IsObject(obj)) return bs_fail("%s: expected an object", where);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v ? as_int(v, out, where, key) : 0;
}

int json_opt_double(const cJSON *obj, const char *key, double *out, const char *where) {
    if (!cJSON_IsObject(obj)) return bs_fail("%s: expected an object", where);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return bs_fail("%s: \"%s\" must be a number", where, key);
    *out = v->valuedouble;
    return 0;
}

int json_item_int(const cJSON *item, int64_t *out, const char *where, int index) {
    char key[32];
    snprintf(key, sizeof key, "[%d]", index);
    if (!item) return bs_fail("%s%s: missing", where, key);
    return as_int(item, out, where, key);
}
