/* workq.c — see workq.h.  One mutex, one condition variable and a singly
 * linked FIFO of heap nodes. */
#define _GNU_SOURCE /* pthread_setname_np */
#include "util/workq.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/buf.h"

typedef struct task {
    clef_workq_fn fn;
    void *arg;
    struct task *next;
} task;

struct clef_workq {
    pthread_mutex_t lock;
    pthread_cond_t work; /* a task arrived, or stop */
    task *head, *tail;
    size_t pending;
    int stopping;
    int joined;
    size_t n_threads;
    pthread_t *threads;
    char name[16];
};

static void *worker_main(void *arg) {
    clef_workq *q = arg;
    pthread_setname_np(pthread_self(), q->name);
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (!q->head && !q->stopping) pthread_cond_wait(&q->work, &q->lock);
        task *t = q->head;
        if (!t) break; /* stopping, and nothing left */
        q->head = t->next;
        if (!q->head) q->tail = NULL;
        q->pending--;
        pthread_mutex_unlock(&q->lock);
        t->fn(t->arg);
        free(t);
        pthread_mutex_lock(&q->lock);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

clef_workq *clef_workq_start(const char *name, size_t n_threads) {
    if (n_threads < 1) n_threads = 1;
    clef_workq *q = clef_xcalloc(1, sizeof *q);
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->work, NULL);
    snprintf(q->name, sizeof q->name, "%s", name ? name : "clef-work");
    q->threads = clef_xcalloc(n_threads, sizeof *q->threads);
    for (size_t i = 0; i < n_threads; i++) {
        if (pthread_create(&q->threads[q->n_threads], NULL, worker_main, q) != 0) break;
        q->n_threads++;
    }
    if (!q->n_threads) {
        q->joined = 1;
        clef_workq_free(q);
        return NULL;
    }
    return q;
}

int clef_workq_submit(clef_workq *q, clef_workq_fn fn, void *arg) {
    task *t = clef_xmalloc(sizeof *t);
    *t = (task){fn, arg, NULL};
    pthread_mutex_lock(&q->lock);
    if (q->stopping) {
        pthread_mutex_unlock(&q->lock);
        free(t);
        return -1;
    }
    if (q->tail) q->tail->next = t;
    else q->head = t;
    q->tail = t;
    q->pending++;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->lock);
    return 0;
}

size_t clef_workq_pending(clef_workq *q) {
    pthread_mutex_lock(&q->lock);
    size_t n = q->pending;
    pthread_mutex_unlock(&q->lock);
    return n;
}

size_t clef_workq_threads(clef_workq *q) { return q->n_threads; }

void clef_workq_stop(clef_workq *q) {
    if (!q) return;
    pthread_mutex_lock(&q->lock);
    int joined = q->joined;
    q->stopping = 1;
    q->joined = 1;
    pthread_cond_broadcast(&q->work);
    pthread_mutex_unlock(&q->lock);
    if (!joined)
        for (size_t i = 0; i < q->n_threads; i++) pthread_join(q->threads[i], NULL);
}

void clef_workq_free(clef_workq *q) {
    if (!q) return;
    clef_workq_stop(q);
    for (task *t = q->head, *next; t; t = next) { /* none: stop ran them all */
        next = t->next;
        free(t);
    }
    pthread_cond_destroy(&q->work);
    pthread_mutex_destroy(&q->lock);
    free(q->threads);
    free(q);
}
