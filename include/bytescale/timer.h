// timer.h: monotonic wall clock in seconds.
#ifndef BYTESCALE_TIMER_H
#define BYTESCALE_TIMER_H

double now_seconds(void);

#endif
