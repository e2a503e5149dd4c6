/* test_workq.c — the task pool (util/workq.h): one thread runs its tasks in
 * submission order; n threads run n tasks at once; stop runs what is
 * queued, then refuses (the caller keeps its argument); a pool whose stop
 * came first frees cleanly.  Every wait is bounded. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "testutil.h"
#include "util/workq.h"

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct order_log {
    pthread_mutex_t lock;
    int seen[64];
    int n;
} order_log;

typedef struct order_task {
    order_log *log;
    int id;
} order_task;

static void record_order(void *arg) {
    order_task *t = arg;
    sleep_ms(t->id == 0 ? 50 : 0); /* the first one is slow: the rest must still wait their turn */
    pthread_mutex_lock(&t->log->lock);
    t->log->seen[t->log->n++] = t->id;
    pthread_mutex_unlock(&t->log->lock);
    free(t);
}

static void test_fifo_one_thread(void **state) {
    (void)state;
    order_log log = {.n = 0};
    pthread_mutex_init(&log.lock, NULL);
    clef_workq *q = clef_workq_start("test-fifo", 1);
    assert_non_null(q);
    assert_int_equal(clef_workq_threads(q), 1);
    for (int i = 0; i < 32; i++) {
        order_task *t = malloc(sizeof *t);
        *t = (order_task){&log, i};
        assert_int_equal(clef_workq_submit(q, record_order, t), 0);
    }
    assert_true(clef_workq_pending(q) >= 30); /* the first sleeps 50 ms while the rest queue */
    clef_workq_stop(q);                       /* runs all that is queued */
    assert_int_equal(log.n, 32);
    for (int i = 0; i < 32; i++) assert_int_equal(log.seen[i], i);
    assert_int_equal(clef_workq_pending(q), 0);
    int keep = 7;
    assert_int_equal(clef_workq_submit(q, record_order, &keep), -1); /* refused: never run, never freed */
    clef_workq_free(q);
    pthread_mutex_destroy(&log.lock);
}

typedef struct gate {
    atomic_int inside, most;
    atomic_int release;
} gate;

static void wait_at_gate(void *arg) {
    gate *g = arg;
    int now = atomic_fetch_add(&g->inside, 1) + 1;
    int most = atomic_load(&g->most);
    while (now > most && !atomic_compare_exchange_weak(&g->most, &most, now)) {
    }
    for (int i = 0; i < 2000 && !atomic_load(&g->release); i++) sleep_ms(1);
    atomic_fetch_sub(&g->inside, 1);
}

static void test_threads_run_at_once(void **state) {
    (void)state;
    gate g = {0};
    clef_workq *q = clef_workq_start("test-par", 4);
    assert_non_null(q);
    assert_int_equal(clef_workq_threads(q), 4);
    for (int i = 0; i < 6; i++) assert_int_equal(clef_workq_submit(q, wait_at_gate, &g), 0);
    for (int i = 0; i < 2000 && atomic_load(&g.inside) < 4; i++) sleep_ms(1);
    sleep_ms(20);
    assert_int_equal(atomic_load(&g.inside), 4); /* four threads, four at once; two still queued */
    assert_int_equal(clef_workq_pending(q), 2);
    atomic_store(&g.release, 1);
    clef_workq_free(q); /* stops: the two queued run too */
    assert_int_equal(atomic_load(&g.inside), 0);
    assert_int_equal(atomic_load(&g.most), 4);
}

static void test_stop_twice_and_null(void **state) {
    (void)state;
    clef_workq *q = clef_workq_start(NULL, 0); /* at least one thread */
    assert_non_null(q);
    assert_int_equal(clef_workq_threads(q), 1);
    clef_workq_stop(q);
    clef_workq_stop(q);
    clef_workq_free(q);
    clef_workq_stop(NULL);
    clef_workq_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_one_thread),
        cmocka_unit_test(test_threads_run_at_once),
        cmocka_unit_test(test_stop_twice_and_null),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
