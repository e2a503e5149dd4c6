/* test_budget.c — the memory budget (util/budget.h): immediate, waiting and
 * refused charges with their exact messages, the oversize rule, first come
 * first served, many threads at once; and the decoded-media charge of a
 * decode-bomb PNG (media/media.h): its bytes from the header, the 503 when
 * the budget has no room (nothing decoded), the charge held while decoded,
 * lowered to the tensors by preprocessing and given back by clef_media_free.
 * Every wait is bounded (at most 3 s). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "media/image.h"
#include "media/media.h"
#include "media/resize.h"
#include "pngbomb.h"
#include "testutil.h"
#include "util/budget.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static clef_budget_stats stats(clef_budget *b) {
    clef_budget_stats st;
    clef_budget_stats_get(b, &st);
    return st;
}

static void test_immediate(void **state) {
    (void)state;
    clef_budget *b = clef_budget_new("test", 100);
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_budget_acquire(b, 0, 0, &err), 0);
    assert_int_equal(clef_budget_acquire(b, 60, 0, &err), 0);
    assert_int_equal(clef_budget_acquire(b, 40, 0, &err), 0);
    clef_budget_stats st = stats(b);
    assert_int_equal(st.used, 100);
    assert_int_equal(st.peak, 100);
    assert_int_equal(st.admitted, 2);
    assert_int_equal(clef_budget_acquire(b, 1, 0, &err), -1);
    assert_int_equal(err.status, 503);
    assert_string_equal(err.type, "overloaded");
    assert_string_equal(err.param, "");
    assert_string_equal(err.message,
                        "the test budget is full: 1 bytes are needed and 0 of its 100 bytes are free after waiting 0 "
                        "ms; retry later");
    st = stats(b);
    assert_int_equal(st.refused, 1);
    assert_int_equal(st.waited, 0); /* no wait was allowed */
    clef_budget_release(b, 60);
    clef_budget_release(b, 40);
    st = stats(b);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.peak, 100);
    clef_budget_free(b);
}

typedef struct release_later {
    clef_budget *b;
    size_t n;
    int after_ms;
} release_later;

static void *release_thread(void *arg) {
    release_later *r = arg;
    sleep_ms(r->after_ms);
    clef_budget_release(r->b, r->n);
    return NULL;
}

static void test_wait_then_succeed(void **state) {
    (void)state;
    clef_budget *b = clef_budget_new("test", 100);
    assert_int_equal(clef_budget_acquire(b, 80, 0, NULL), 0);
    release_later r = {b, 80, 150};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, release_thread, &r), 0);
    double t0 = now_s();
    clef_err err;
    assert_int_equal(clef_budget_acquire(b, 50, 2000, &err), 0);
    double waited = now_s() - t0;
    pthread_join(t, NULL);
    printf("admitted after %.3f s\n", waited);
    assert_true(waited >= 0.12 && waited < 1.9);
    clef_budget_stats st = stats(b);
    assert_int_equal(st.used, 50);
    assert_int_equal(st.waited, 1);
    assert_int_equal(st.refused, 0);
    clef_budget_release(b, 50);
    clef_budget_free(b);
}

static void test_wait_then_refuse(void **state) {
    (void)state;
    clef_budget *b = clef_budget_new("test", 100);
    assert_int_equal(clef_budget_acquire(b, 80, 0, NULL), 0);
    double t0 = now_s();
    clef_err err;
    assert_int_equal(clef_budget_acquire(b, 50, 200, &err), -1);
    double waited = now_s() - t0;
    assert_true(waited >= 0.19 && waited < 1.5);
    assert_int_equal(err.status, 503);
    assert_string_equal(err.type, "overloaded");
    assert_string_equal(err.message,
                        "the test budget is full: 50 bytes are needed and 20 of its 100 bytes are free after waiting "
                        "200 ms; retry later");
    clef_budget_stats st = stats(b);
    assert_int_equal(st.used, 80); /* the refused charge took nothing */
    assert_int_equal(st.waited, 1);
    assert_int_equal(st.refused, 1);
    assert_int_equal(st.waiting, 0);
    clef_budget_release(b, 80);
    clef_budget_free(b);
}

typedef struct waiter_arg {
    clef_budget *b;
    size_t n;
    long wait_ms;
    int rc;
} waiter_arg;

static void *waiter_thread(void *arg) {
    waiter_arg *w = arg;
    w->rc = clef_budget_acquire(w->b, w->n, w->wait_ms, NULL);
    return NULL;
}

/* try_acquire takes only what needs no wait and counts nothing else;
 * acquire_until waits to an absolute deadline, quoting the caller's wait. */
static void test_try_and_until(void **state) {
    (void)state;
    clef_budget *b = clef_budget_new("test", 100);
    assert_int_equal(clef_budget_try_acquire(b, 0), 0);
    assert_int_equal(clef_budget_try_acquire(b, 70), 0);
    assert_int_equal(clef_budget_try_acquire(b, 40), -1); /* does not fit: nothing counted */
    clef_budget_stats st = stats(b);
    assert_int_equal(st.used, 70);
    assert_int_equal(st.admitted, 1);
    assert_int_equal(st.waited, 0);
    assert_int_equal(st.refused, 0);
    /* a deadline 200 ms ahead, quoted as a 2000 ms wait (begun elsewhere): refused at the deadline */
    clef_err err;
    double t0 = now_s();
    assert_int_equal(clef_budget_acquire_until(b, 40, t0 + 0.2, 2000, &err), -1);
    double waited = now_s() - t0;
    assert_true(waited >= 0.19 && waited < 1.5);
    assert_string_equal(err.message,
                        "the test budget is full: 40 bytes are needed and 30 of its 100 bytes are free after waiting "
                        "2000 ms; retry later");
    st = stats(b);
    assert_int_equal(st.waited, 1);
    assert_int_equal(st.refused, 1);
    /* a deadline already past: refused at once; one that fits is still admitted */
    t0 = now_s();
    assert_int_equal(clef_budget_acquire_until(b, 40, t0 - 1, 500, &err), -1);
    assert_true(now_s() - t0 < 0.1);
    assert_int_equal(clef_budget_acquire_until(b, 30, t0 - 1, 500, &err), 0);
    /* admitted when room comes before the deadline */
    clef_budget_release(b, 30);
    release_later r = {b, 70, 100};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, release_thread, &r), 0);
    t0 = now_s();
    assert_int_equal(clef_budget_acquire_until(b, 90, t0 + 2, 2000, &err), 0);
    waited = now_s() - t0;
    pthread_join(t, NULL);
    assert_true(waited >= 0.08 && waited < 1.9);
    /* while a charge waits, try_acquire does not pass it, even if it would fit */
    st = stats(b);
    assert_int_equal(st.used, 90);
    clef_budget_release(b, 90);
    assert_int_equal(clef_budget_acquire(b, 60, 0, NULL), 0);
    release_later r2 = {b, 60, 150};
    assert_int_equal(pthread_create(&t, NULL, release_thread, &r2), 0);
    waiter_arg w = {b, 50, 2000, -2};
    pthread_t tw;
    assert_int_equal(pthread_create(&tw, NULL, waiter_thread, &w), 0);
    for (int i = 0; i < 1000 && stats(b).waiting == 0; i++) sleep_ms(1);
    assert_int_equal(stats(b).waiting, 1);
    assert_int_equal(clef_budget_try_acquire(b, 10), -1); /* 40 free, but the 50 waits first */
    pthread_join(t, NULL);
    pthread_join(tw, NULL);
    assert_int_equal(w.rc, 0);
    clef_budget_release(b, 50);
    assert_int_equal(stats(b).used, 0);
    clef_budget_free(b);
}

/* Larger than the capacity: admitted alone, refused while anything else
 * holds the budget, and nothing else is admitted while it holds it. */
static void test_oversize(void **state) {
    (void)state;
    clef_budget *b = clef_budget_new("test", 100);
    clef_err err;
    assert_int_equal(clef_budget_acquire(b, 150, 0, &err), 0);
    assert_int_equal(clef_budget_acquire(b, 1, 50, &err), -1);
    assert_string_equal(err.message,
                        "the test budget is full: 1 bytes are needed and 0 of its 100 bytes are free after waiting 50 "
                        "ms; retry later");
    assert_int_equal(stats(b).peak, 150);
    clef_budget_release(b, 150);
    assert_int_equal(clef_budget_acquire(b, 10, 0, &err), 0);
    assert_int_equal(clef_budget_acquire(b, 150, 100, &err), -1);
    assert_int_equal(err.status, 503);
    assert_string_equal(err.message,
                        "the test budget is full: 150 bytes are needed, more than its capacity of 100, which runs "
                        "only when nothing else holds the budget; 10 bytes were still in use after waiting 100 ms; "
                        "retry later");
    /* ...and it gets in once the other holder leaves within its wait */
    release_later r = {b, 10, 100};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, release_thread, &r), 0);
    assert_int_equal(clef_budget_acquire(b, 150, 2000, &err), 0);
    pthread_join(t, NULL);
    assert_int_equal(stats(b).used, 150);
    clef_budget_release(b, 150);
    clef_budget_free(b);
}

typedef struct fifo_arg {
    clef_budget *b;
    size_t n;
    int rc;
} fifo_arg;

static void *fifo_thread(void *arg) {
    fifo_arg *f = arg;
    f->rc = clef_budget_acquire(f->b, f->n, 3000, NULL);
    return NULL;
}

static void wait_waiting(clef_budget *b, size_t n) {
    double deadline = now_s() + 3;
    while (stats(b).waiting != n && now_s() < deadline) sleep_ms(2);
    assert_int_equal(stats(b).waiting, n);
}

/* A small charge that would fit queues behind a larger one already waiting.
 * The order of admission is read from the budget itself (its counters,
 * under its lock), never from the waiting threads: two threads admitted one
 * after the other may return from clef_budget_acquire in either order, so a
 * counter they bump afterwards records the scheduler's order, not the
 * budget's.  Room is given back so that only one of the two fits at a time:
 * 40 of the 90 held frees room for the 50 (first in line) or for the 5, not
 * for both; first come first served admits the 50, and the 5 stays queued
 * until the 50 is given back. */
static void test_first_come_first_served(void **state) {
    (void)state;
    clef_budget *b = clef_budget_new("test", 100);
    assert_int_equal(clef_budget_acquire(b, 90, 0, NULL), 0);
    fifo_arg big = {b, 50, -2}, small = {b, 5, -2};
    pthread_t tb, ts;
    assert_int_equal(pthread_create(&tb, NULL, fifo_thread, &big), 0);
    wait_waiting(b, 1);
    assert_int_equal(pthread_create(&ts, NULL, fifo_thread, &small), 0);
    wait_waiting(b, 2);
    sleep_ms(100);                       /* time for a budget that lets the 5 jump the queue to do so */
    assert_int_equal(stats(b).used, 90); /* 5 would fit, but waits its turn */
    assert_int_equal(stats(b).admitted, 1);
    clef_budget_release(b, 40); /* room for the 50 (or, out of turn, the 5), not both */
    pthread_join(tb, NULL);
    assert_int_equal(big.rc, 0); /* the 5 first would have left the 50 no room: refused after 3 s */
    clef_budget_stats st = stats(b);
    assert_int_equal(st.used, 100); /* 50 + 50: the 5 is not in */
    assert_int_equal(st.admitted, 2);
    assert_int_equal(st.waiting, 1); /* ...and still queued */
    clef_budget_release(b, 50); /* the 50's charge */
    pthread_join(ts, NULL);
    assert_int_equal(small.rc, 0);
    st = stats(b);
    assert_int_equal(st.used, 55);
    assert_int_equal(st.admitted, 3);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.waited, 2);
    assert_int_equal(st.refused, 0);
    clef_budget_release(b, 55);
    clef_budget_free(b);
}

#define N_THREADS 8
#define N_ITERS 3000

typedef struct churn_arg {
    clef_budget *b;
    int id;
    atomic_long *in_use, *max_seen;
    int failures;
} churn_arg;

static void *churn_thread(void *arg) {
    churn_arg *c = arg;
    for (int i = 0; i < N_ITERS; i++) {
        size_t n = (size_t)((i * 7 + c->id * 13) % 40) + 21; /* 21..60: two or three fit at once */
        if (clef_budget_acquire(c->b, n, 2000, NULL)) {
            c->failures++;
            continue;
        }
        long now = atomic_fetch_add(c->in_use, (long)n) + (long)n;
        long seen = atomic_load(c->max_seen);
        while (now > seen && !atomic_compare_exchange_weak(c->max_seen, &seen, now)) {
        }
        sched_yield(); /* hold it a moment, so that others must wait */
        atomic_fetch_sub(c->in_use, (long)n);
        clef_budget_release(c->b, n);
    }
    return NULL;
}

static void test_concurrent(void **state) {
    (void)state;
    clef_budget *b = clef_budget_new("test", 100);
    atomic_long in_use = 0, max_seen = 0;
    churn_arg args[N_THREADS];
    pthread_t t[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        args[i] = (churn_arg){b, i, &in_use, &max_seen, 0};
        assert_int_equal(pthread_create(&t[i], NULL, churn_thread, &args[i]), 0);
    }
    int failures = 0;
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(t[i], NULL);
        failures += args[i].failures;
    }
    clef_budget_stats st = stats(b);
    printf("%d x %d charges: peak %zu of 100, %llu waited, %d refused\n", N_THREADS, N_ITERS, st.peak,
           (unsigned long long)st.waited, failures);
    assert_int_equal(failures, 0);
    assert_true(atomic_load(&max_seen) <= 100);
    assert_true(st.peak <= 100);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.admitted, N_THREADS * N_ITERS);
    assert_true(st.waited > 0); /* they did contend */
    clef_budget_free(b);
}

static void test_unlimited(void **state) {
    (void)state;
    clef_budget *b = clef_budget_new("test", 0);
    assert_int_equal(clef_budget_acquire(b, (size_t)1 << 50, 0, NULL), 0);
    assert_int_equal(clef_budget_acquire(b, 7, 0, NULL), 0);
    clef_budget_stats st = stats(b);
    assert_int_equal(st.capacity, 0);
    assert_int_equal(st.used, ((size_t)1 << 50) + 7);
    clef_budget_release(b, ((size_t)1 << 50) + 7);
    assert_int_equal(stats(b).used, 0);
    clef_budget_free(b);
}

/* ---- the decoded-media charge ------------------------------------------- */

#define BOMB_SIDE 2000

static void test_media_charge(void **state) {
    (void)state;
    clef_buf png = pb_png_rgba16(BOMB_SIDE, BOMB_SIDE);
    const size_t w = BOMB_SIDE, h = BOMB_SIDE;
    /* The header's cost: 16-bit RGBA rows, row pointers, RGB, libpng's rows + zlib. */
    clef_image_header hd;
    assert_int_equal(clef_image_probe((const uint8_t *)png.data, png.len, 16000000, &hd), 0);
    assert_int_equal(hd.w, BOMB_SIDE);
    assert_int_equal(hd.h, BOMB_SIDE);
    size_t decode_bytes = w * h * 8 + 8 * h + w * h * 3 + 2 * (8 * w + 64) + ((size_t)256 << 10);
    assert_int_equal(hd.decode_bytes, decode_bytes);
    /* Over the pixel limit: no cost, the decoder refuses it from the same header. */
    assert_int_equal(clef_image_probe((const uint8_t *)png.data, png.len, w * h - 1, &hd), -1);

    char *url = pb_data_url("image/png", png.data, png.len);
    clef_media_item item = {url, strlen(url)};
    clef_media_source src = {.images = &item, .n_images = 1};
    size_t charge;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_media_charge_bytes(&src, NULL, &charge, &err), 0);
    /* decode phase: payload + RGB + the decoder's rows; preprocess phase: RGB
     * + pixel_values (1024x1024 -> 4096 rows of 1536 floats) + the two
     * tensors' one-row minimum + the 1024x1024 resize (its RGB, the
     * 1024x2000 intermediate, the tap tables). */
    int32_t rh, rw;
    assert_int_equal(clef_smart_resize(BOMB_SIDE, BOMB_SIDE, 32, CLEF_IMAGE_MIN_PIXELS, CLEF_IMAGE_MAX_PIXELS, &rh, &rw), 0);
    assert_int_equal(rh, 1024);
    assert_int_equal(rw, 1024);
    size_t tensors = 4096 * 1536 * 4;
    size_t decode = png.len + decode_bytes;
    size_t pre = w * h * 3 + tensors + 2 * 1536 * 4 + 1024 * 1024 * 3 + clef_resize_scratch_bytes(2000, 2000, 1024, 1024);
    size_t expect = decode > pre ? decode : pre;
    printf("PNG %zu bytes; charge %zu (decode phase %zu, preprocess phase %zu)\n", png.len, charge, decode, pre);
    assert_int_equal(charge, expect);

    /* No room: 503 before anything is decoded, nothing held. */
    clef_budget *b = clef_budget_new("decoded-media", charge + 1000);
    assert_int_equal(clef_budget_acquire(b, 2000, 0, NULL), 0);
    clef_media_limits lim = clef_media_limits_default();
    lim.budget = b;
    lim.budget_wait_ms = 100;
    clef_media m;
    assert_int_equal(clef_media_decode(&src, &lim, &m, &err), -1);
    assert_int_equal(err.status, 503);
    assert_string_equal(err.type, "overloaded");
    assert_string_equal(err.param, "");
    char want[512];
    snprintf(want, sizeof want,
             "the decoded-media budget is full: %zu bytes are needed and %zu of its %zu bytes are free after waiting "
             "100 ms; retry later",
             charge, charge + 1000 - 2000, charge + 1000);
    assert_string_equal(err.message, want);
    assert_null(m.images);
    assert_int_equal(stats(b).used, 2000);
    assert_int_equal(stats(b).refused, 1);

    /* Room: decoded with the charge held, lowered to the tensors by
     * preprocessing, given back by clef_media_free. */
    clef_budget_release(b, 2000);
    assert_int_equal(clef_media_decode(&src, &lim, &m, &err), 0);
    assert_int_equal(m.charged, charge);
    assert_int_equal(stats(b).used, charge);
    assert_int_equal(clef_media_preprocess(&m, &err), 0);
    assert_int_equal(m.image_rows, 4096);
    assert_int_equal(m.charged, tensors + 1536 * 4);
    assert_int_equal(stats(b).used, tensors + 1536 * 4);
    clef_media_free(&m);
    clef_budget_stats st = stats(b);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.peak, charge);

    /* A bad item later in the request: the charge covers the items before it
     * (decoding stops there), and the 422 is the decoder's. */
    clef_media_item two[2] = {item, {"data:image/png;base64,AAAA", 26}};
    clef_media_source src2 = {.images = two, .n_images = 2};
    size_t charge2;
    assert_int_equal(clef_media_charge_bytes(&src2, NULL, &charge2, &err), 0);
    assert_int_equal(charge2, charge);
    assert_int_equal(clef_media_decode(&src2, &lim, &m, &err), -1);
    assert_int_equal(err.status, 422);
    assert_string_equal(err.param, "images[1]");
    assert_int_equal(stats(b).used, 0);

    clef_budget_free(b);
    free(url);
    clef_buf_free(&png);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_immediate),
        cmocka_unit_test(test_wait_then_succeed),
        cmocka_unit_test(test_wait_then_refuse),
        cmocka_unit_test(test_try_and_until),
        cmocka_unit_test(test_oversize),
        cmocka_unit_test(test_first_come_first_served),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_unlimited),
        cmocka_unit_test(test_media_charge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
