// timer.c: CLOCK_MONOTONIC, immune to wall-clock adjustments.
#include "bytescale/timer.h"

#include <time.h>

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
