// procmem.c: /proc/self/status and /proc/self/clear_refs (procmem.h).
#include "bytescale/procmem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

long procmem_status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) v = atol(line + n + 1);
    fclose(f);
    return v;
}

int procmem_reset_peak(void) {
    // writing 5 to clear_refs resets the peak RSS (Documentation/filesystems/proc.rst)
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}
