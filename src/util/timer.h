/* timer.h — monotonic wall-clock time. */
#ifndef CLEF_UTIL_TIMER_H
#define CLEF_UTIL_TIMER_H

#include <time.h>

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC). */
static inline double clef_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
