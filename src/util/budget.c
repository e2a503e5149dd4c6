/* budget.c — see budget.h.  One mutex, one condition variable (on the
 * monotonic clock) and a FIFO of waiters whose nodes live on the waiting
 * threads' stacks. */
#include "util/budget.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/buf.h"

typedef struct waiter {
    size_t n;
    struct waiter *next, *prev;
} waiter;

struct clef_budget {
    pthread_mutex_t lock;
    pthread_cond_t room;
    char name[64];
    size_t capacity, used, peak, waiting;
    uint64_t admitted, waited, refused;
    waiter *head, *tail; /* waiting charges, oldest first */
};

clef_budget *clef_budget_new(const char *name, size_t capacity) {
    clef_budget *b = clef_xcalloc(1, sizeof *b);
    pthread_mutex_init(&b->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->room, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(b->name, sizeof b->name, "%s", name ? name : "memory");
    b->capacity = capacity;
    return b;
}

void clef_budget_free(clef_budget *b) {
    if (!b) return;
    pthread_cond_destroy(&b->room);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

/* Does a charge of n fit now (ignoring the queue)? */
static int fits(const clef_budget *b, size_t n) {
    if (!b->capacity) return 1;
    if (n > b->capacity) return b->used == 0;
    return b->used <= b->capacity - n;
}

static void take(clef_budget *b, size_t n) {
    b->used += n;
    if (b->used > b->peak) b->peak = b->used;
    b->admitted++;
}

static void unlink_waiter(clef_budget *b, waiter *w) {
    if (w->prev) w->prev->next = w->next;
    else b->head = w->next;
    if (w->next) w->next->prev = w->prev;
    else b->tail = w->prev;
    b->waiting--;
}

static int refuse(clef_budget *b, size_t n, long wait_ms, clef_err *err) {
    b->refused++;
    size_t used = b->used, cap = b->capacity;
    if (n > cap)
        return clef_fail(err, 503, CLEF_E_OVERLOADED, NULL,
                         "the %s budget is full: %zu bytes are needed, more than its capacity of %zu, which runs only "
                         "when nothing else holds the budget; %zu bytes were still in use after waiting %ld ms; retry "
                         "later",
                         b->name, n, cap, used, wait_ms);
    return clef_fail(err, 503, CLEF_E_OVERLOADED, NULL,
                     "the %s budget is full: %zu bytes are needed and %zu of its %zu bytes are free after waiting %ld "
                     "ms; retry later",
                     b->name, n, used < cap ? cap - used : 0, cap, wait_ms);
}

/* Wait for room until `deadline` (CLOCK_MONOTONIC); `wait_ms` is the wait
 * quoted in a refusal.  Called with the lock held; returns with it held. */
static int acquire_locked(clef_budget *b, size_t n, const struct timespec *deadline, long wait_ms, clef_err *err) {
    b->waited++;
    waiter me = {n, NULL, b->tail};
    if (b->tail) b->tail->next = &me;
    else b->head = &me;
    b->tail = &me;
    b->waiting++;
    int timed_out = 0;
    while (!(b->head == &me && fits(b, n)) && !timed_out)
        timed_out = pthread_cond_timedwait(&b->room, &b->lock, deadline) == ETIMEDOUT;
    int admitted = b->head == &me && fits(b, n); /* it may have become true as the wait timed out */
    unlink_waiter(b, &me);
    int rc = 0;
    if (admitted) take(b, n);
    else rc = refuse(b, n, wait_ms, err);
    /* The next waiter is now at the head: it may fit (or have to give up). */
    pthread_cond_broadcast(&b->room);
    return rc;
}

int clef_budget_acquire(clef_budget *b, size_t n, long wait_ms, clef_err *err) {
    if (n == 0) return 0;
    if (wait_ms < 0) wait_ms = 0;
    pthread_mutex_lock(&b->lock);
    if (!b->head && fits(b, n)) {
        take(b, n);
        pthread_mutex_unlock(&b->lock);
        return 0;
    }
    if (wait_ms == 0) {
        int rc = refuse(b, n, wait_ms, err);
        pthread_mutex_unlock(&b->lock);
        return rc;
    }
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += wait_ms / 1000;
    deadline.tv_nsec += (wait_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    int rc = acquire_locked(b, n, &deadline, wait_ms, err);
    pthread_mutex_unlock(&b->lock);
    return rc;
}

int clef_budget_try_acquire(clef_budget *b, size_t n) {
    if (n == 0) return 0;
    pthread_mutex_lock(&b->lock);
    int ok = !b->head && fits(b, n);
    if (ok) take(b, n);
    pthread_mutex_unlock(&b->lock);
    return ok ? 0 : -1;
}

int clef_budget_acquire_until(clef_budget *b, size_t n, double deadline_s, long wait_ms, clef_err *err) {
    if (n == 0) return 0;
    if (wait_ms < 0) wait_ms = 0;
    pthread_mutex_lock(&b->lock);
    if (!b->head && fits(b, n)) {
        take(b, n);
        pthread_mutex_unlock(&b->lock);
        return 0;
    }
    struct timespec deadline;
    if (deadline_s < 0) deadline_s = 0;
    deadline.tv_sec = (time_t)deadline_s;
    deadline.tv_nsec = (long)((deadline_s - (double)deadline.tv_sec) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    int rc = acquire_locked(b, n, &deadline, wait_ms, err);
    pthread_mutex_unlock(&b->lock);
    return rc;
}

void clef_budget_release(clef_budget *b, size_t n) {
    if (n == 0) return;
    pthread_mutex_lock(&b->lock);
    b->used = n < b->used ? b->used - n : 0;
    if (b->head) pthread_cond_broadcast(&b->room);
    pthread_mutex_unlock(&b->lock);
}

void clef_budget_stats_get(clef_budget *b, clef_budget_stats *out) {
    pthread_mutex_lock(&b->lock);
    *out = (clef_budget_stats){b->capacity, b->used, b->peak, b->waiting, b->admitted, b->waited, b->refused};
    pthread_mutex_unlock(&b->lock);
}
