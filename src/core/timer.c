// timer.c: CLOCK_MONOTONIC (immune to wall-clock adjustments) and the CPU-time clocks.
#include "bytescale/timer.h"

#include <time.h>

static double clock_seconds(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double now_seconds(void) { return clock_seconds(CLOCK_MONOTONIC); }
double thread_cpu_seconds(void) { return clock_seconds(CLOCK_THREAD_CPUTIME_ID); }
double process_cpu_seconds(void) { return clock_seconds(CLOCK_PROCESS_CPUTIME_ID); }
