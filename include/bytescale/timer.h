// timer.h: monotonic wall clock and CPU clocks, in seconds.
#ifndef BYTESCALE_TIMER_H
#define BYTESCALE_TIMER_H

double now_seconds(void);
// CPU seconds the calling thread / the whole process has run. Beside the wall clock they tell whether
// a thread or process had its core: on a shared machine the wall clock also counts others' turns.
double thread_cpu_seconds(void);
double process_cpu_seconds(void);

#endif
