/* engine/base/clock.h: the monotonic clock every timing in kvlingo reads (CLOCK_MONOTONIC:
 * unaffected by wall-clock steps, so durations and deadlines stay honest). */
#ifndef KVL_BASE_CLOCK_H
#define KVL_BASE_CLOCK_H

#include <stdint.h>

/* Seconds since an arbitrary fixed origin (double: sub-microsecond resolution for decades). */
double kvl__now_s(void);

/* Milliseconds since the same origin, as an integer (deadlines, expiries). */
int64_t kvl__now_ms(void);

#endif
