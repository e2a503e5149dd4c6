/* budget.h — a server-wide memory budget: a thread-safe count of bytes in
 * use against a capacity, with bounded waiting for room.
 *
 * The server keeps two (server/server.c): one for decoded media (charged by
 * media/media.c from each item's header before it is decoded) and one for
 * request bodies held in memory (charged by server/routes.c from
 * Content-Length, or as a chunked upload's buffer grows).
 *
 * Admission is first come, first served: a charge that has to wait queues
 * behind every charge already waiting, and one that arrives while others
 * wait queues too, even if it would fit, so a large charge is not starved by
 * a stream of small ones.  A charge is admitted when it is at the head of
 * the queue and fits (used + n <= capacity).  A charge larger than the whole
 * capacity is admitted alone: when it is at the head and nothing else holds
 * the budget (used == 0); while it holds the budget every other charge
 * waits.  So the bytes in use never exceed max(capacity, the largest single
 * charge).  Capacity 0 = unlimited: every charge is admitted at once and
 * only counted (the metrics still show the use).
 *
 * All functions are thread-safe.
 */
#ifndef CLEF_UTIL_BUDGET_H
#define CLEF_UTIL_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct clef_budget clef_budget;

/* A budget of `capacity` bytes (0 = unlimited).  `name` (copied, at most 63
 * characters) names it in refusal messages, e.g. "decoded-media".  Never
 * NULL (allocation failure aborts). */
clef_budget *clef_budget_new(const char *name, size_t capacity);

/* Free a budget nothing holds any more; NULL is a no-op. */
void clef_budget_free(clef_budget *b);

/* Take `n` bytes, waiting up to `wait_ms` milliseconds (0 = not at all) for
 * room as described above.  n == 0 succeeds at once.  Returns 0 when the
 * bytes are held (give them back with clef_budget_release), or -1 with `err`
 * (if non-NULL) set to 503 "overloaded", param null, message e.g.
 *   "the decoded-media budget is full: 184549376 bytes are needed and 83886080
 *    of its 268435456 bytes are free after waiting 2000 ms; retry later"
 * or, for a charge over the capacity,
 *   "the decoded-media budget is full: 314572800 bytes are needed, more than its
 *    capacity of 268435456, which runs only when nothing else holds the budget;
 *    1048576 bytes were still in use after waiting 2000 ms; retry later". */
int clef_budget_acquire(clef_budget *b, size_t n, long wait_ms, clef_err *err);

/* Take `n` bytes only if that needs no wait (nothing is waiting and they
 * fit now).  Returns 0 when the bytes are held, -1 when not: then nothing is
 * counted (no wait, no refusal), so the caller may still wait for them with
 * clef_budget_acquire_until.  n == 0 succeeds. */
int clef_budget_try_acquire(clef_budget *b, size_t n);

/* clef_budget_acquire with an absolute deadline: wait for room until
 * `deadline_s` (seconds on CLOCK_MONOTONIC, util/timer.h clef_now()), queued
 * first come first served like any other charge.  A deadline already past
 * still admits a charge that fits with nobody waiting, else refuses it after
 * queueing (counted as a wait and a refusal).  `wait_ms` is only the wait the
 * refusal message quotes ("after waiting N ms"): the caller's whole wait,
 * which may have begun before this call (a charge handed to another thread).
 * Returns and errors as clef_budget_acquire. */
int clef_budget_acquire_until(clef_budget *b, size_t n, double deadline_s, long wait_ms, clef_err *err);

/* Give back `n` bytes taken by clef_budget_acquire (fewer than were taken is
 * fine: a holder may give back part of its charge early).  Wakes waiters. */
void clef_budget_release(clef_budget *b, size_t n);

/* A snapshot of the counters. */
typedef struct clef_budget_stats {
    size_t capacity;    /* bytes; 0 = unlimited */
    size_t used;        /* bytes held now */
    size_t peak;        /* largest `used` so far */
    size_t waiting;     /* charges waiting now */
    uint64_t admitted;  /* charges admitted (n > 0) */
    uint64_t waited;    /* charges that queued for room (then admitted or refused) */
    uint64_t refused;   /* charges refused (no room within their wait) */
} clef_budget_stats;

void clef_budget_stats_get(clef_budget *b, clef_budget_stats *out);

#endif
