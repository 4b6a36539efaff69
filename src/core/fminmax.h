// fminmax.h: fmax and fmin, inline, for the cost model and the planners (internal to the library).
//
// Bit for bit glibc's: the larger / smaller; b when they are equal, so fmax(+0, -0) is -0; the other
// one where one is a NaN. libm's are calls the compiler may not replace by its own instruction (which
// differs on NaN), and the cost model makes them in every item time: planning 1G tokens made
// millions of such calls.
#ifndef BYTESCALE_FMINMAX_H
#define BYTESCALE_FMINMAX_H

static inline double cost_fmax(double a, double b) { return a > b || b != b ? a : b; }
static inline double cost_fmin(double a, double b) { return a < b || b != b ? a : b; }

#endif
