/* workq.h — a fixed pool of threads running queued tasks, first in first
 * out.  The server (server/routes.c) runs on one the work that must not
 * block libmicrohttpd's polling threads: deciding a request (parse,
 * validate, encode, media decoding and its budget waits) on a pool of one
 * thread per core, and the request-body budget's waits on a pool of one
 * thread (the budget admits its waiters in arrival order anyway, so one
 * thread serving them in that order loses nothing).
 *
 * All functions are thread-safe.
 */
#ifndef CLEF_UTIL_WORKQ_H
#define CLEF_UTIL_WORKQ_H

#include <stddef.h>

typedef struct clef_workq clef_workq;

/* A task: fn(arg) runs on one of the pool's threads.  It owns `arg` from the
 * moment clef_workq_submit accepts it. */
typedef void (*clef_workq_fn)(void *arg);

/* Start `n_threads` threads (at least 1).  `name` (at most 15 characters,
 * copied) names them for ps/top.  Returns NULL when no thread could be
 * started; when only some could, the pool runs with those. */
clef_workq *clef_workq_start(const char *name, size_t n_threads);

/* Queue fn(arg).  Returns 0 when queued (it will run, also if a stop comes
 * first: clef_workq_stop runs what is queued), or -1 when the pool is
 * stopping or stopped: nothing is queued and the caller keeps `arg`. */
int clef_workq_submit(clef_workq *q, clef_workq_fn fn, void *arg);

/* Tasks queued and not yet started. */
size_t clef_workq_pending(clef_workq *q);

/* Threads the pool runs. */
size_t clef_workq_threads(clef_workq *q);

/* Refuse new tasks, run every queued one, join the threads.  Idempotent;
 * NULL is a no-op.  Must not be called from one of the pool's tasks. */
void clef_workq_stop(clef_workq *q);

/* Stop (if not yet) and free.  NULL is a no-op. */
void clef_workq_free(clef_workq *q);

#endif
