// procmem.h: this process's memory as the kernel counts it (/proc/self), for the tests and the
// benchmark that check the engine's own accounting of activation memory against it.
#ifndef BYTESCALE_PROCMEM_H
#define BYTESCALE_PROCMEM_H

// The value of a line of /proc/self/status, in kB ("VmRSS:", "VmHWM:"); -1 when it is not there.
long procmem_status_kb(const char *key);
// Reset the peak resident set (VmHWM) to the current one. 0 when the kernel does not let us (then
// peak figures cannot be taken).
int procmem_reset_peak(void);

#endif
