/* Packed forwards and the scheduler (engine/scheduler.h, clef_engine_run):
 * every record's logits are bitwise those of running it alone, whatever it
 * is packed with and in whatever order; a bad record in a batch fails alone;
 * the scheduler batches concurrent submissions, refuses past its queue limit
 * with 503, and drains its queue on stop; asynchronous submissions are called
 * back once each, on the engine thread, with the same logits, packed, and a
 * refused one never. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clef.h"
#include "engine/scheduler.h"
#include "testutil.h"

typedef struct ref_case {
    char *body;
    size_t len;
    size_t max_length;
    const json_value *golden; /* the golden case */
    float *logits;            /* alone, reference */
    size_t n_logits;
} ref_case;

static clef_engine *engine;
static json_value **cases;
static size_t n_cases;
static ref_case refs[64];
static size_t n_refs;
/* Records of at most SMALL_TOKENS tokens: the scheduler tests and the
 * regrouped pass use these so the suite stays fast (the tiny model's
 * attention is quadratic, the 3737-token case alone takes seconds). */
#define SMALL_TOKENS 320
static ref_case *small[64];
static size_t n_small;

static void prepare(const ref_case *r, clef_job *job) {
    clef_request req;
    clef_err err;
    clef_err_clear(&err);
    if (clef_engine_parse(engine, r->body, r->len, &req, &err) != 0) fail_msg("parse: %s", err.message);
    clef_decide_params p = {.max_length = r->max_length, .truncate_state = 1};
    if (clef_engine_encode(engine, &req, &p, job, &err) != 0) fail_msg("encode: %s", err.message);
}

static int setup(void **state) {
    char *dir = tu_fixture("tiny-clef-omni");
    engine = tu_open_engine(dir, 1, 2);
    free(dir);
    cases = tu_load_goldens("goldens/goldens.jsonl", &n_cases);
    clef_err err;
    clef_err_clear(&err);
    for (size_t i = 0; i < n_cases; i++) {
        const json_value *c = cases[i];
        if (json_get(c, "error") || !strcmp(json_get(c, "name")->str, "question_id_empty")) continue;
        ref_case *r = &refs[n_refs++];
        clef_buf body = {0};
        json_render_opts(json_get(c, "request"), 0, &body);
        int64_t ml = 64000;
        json_as_i64(json_get(c, "max_length"), &ml);
        *r = (ref_case){body.data, body.len, (size_t)ml, c, NULL, 0};
        clef_job job, *one = &job;
        prepare(r, &job);
        if (clef_engine_run(engine, &one, 1, &err) != 0) fail_msg("run: %s", err.message);
        if (job.rec.n_ids <= SMALL_TOKENS) small[n_small++] = r;
        r->n_logits = clef_record_total_options(&job.rec);
        r->logits = clef_xmalloc(r->n_logits * sizeof *r->logits);
        memcpy(r->logits, job.logits, r->n_logits * sizeof *r->logits);
        clef_job_free(&job);
    }
    assert_int_equal(n_refs, 38);
    assert_true(n_small >= 30);
    return 0;
}

static int teardown(void **state) {
    for (size_t i = 0; i < n_refs; i++) {
        free(refs[i].body);
        free(refs[i].logits);
    }
    tu_free_goldens(cases, n_cases);
    clef_engine_close(engine);
    return 0;
}

/* The alone logits are the golden ones (so the bitwise checks below compare
 * real answers, not two copies of garbage). */
static void test_alone_matches_golden(void **state) {
    double worst = 0;
    for (size_t i = 0; i < n_refs; i++) {
        const json_value *qs = json_get(refs[i].golden, "questions");
        size_t k = 0;
        for (size_t q = 0; q < qs->n; q++) {
            const json_value *lg = json_get(qs->items[q], "logits");
            for (size_t j = 0; j < lg->n; j++, k++) worst = fmax(worst, fabs(refs[i].logits[k] - tu_num_at(lg, j)));
        }
        assert_int_equal(k, refs[i].n_logits);
    }
    printf("alone vs golden logits: max |diff| %.3g\n", worst);
    assert_true(worst <= 1e-4);
}

static int logits_equal(const clef_job *job, const ref_case *r) {
    return clef_record_total_options(&job->rec) == r->n_logits &&
           !memcmp(job->logits, r->logits, r->n_logits * sizeof *r->logits);
}

/* All 38 records in one packed forward, then in reversed groups of 3. */
static void test_packed_bitwise(void **state) {
    clef_job *jobs = clef_xcalloc(n_refs, sizeof *jobs);
    clef_job **ptrs = clef_xcalloc(n_refs, sizeof *ptrs);
    clef_err *errs = clef_xcalloc(n_refs, sizeof *errs);
    size_t tokens = 0;
    for (size_t i = 0; i < n_refs; i++) {
        prepare(&refs[i], &jobs[i]);
        ptrs[i] = &jobs[i];
        tokens += jobs[i].rec.n_ids;
    }
    assert_int_equal(clef_engine_run(engine, ptrs, n_refs, errs), 0);
    for (size_t i = 0; i < n_refs; i++)
        if (!logits_equal(&jobs[i], &refs[i]))
            fail_msg("%s: packed with %zu records (%zu tokens) differs from alone", json_get(refs[i].golden, "name")->str,
                     n_refs, tokens);
    for (size_t i = 0; i < n_refs; i++) clef_job_free(&jobs[i]);
    /* the small records again, regrouped in threes in reverse order */
    for (size_t i = 0; i < n_small; i++) prepare(small[i], &jobs[i]);
    for (size_t start = 0; start < n_small; start += 3) {
        size_t n = n_small - start < 3 ? n_small - start : 3;
        clef_job *group[3];
        for (size_t k = 0; k < n; k++) group[k] = &jobs[start + n - 1 - k];
        assert_int_equal(clef_engine_run(engine, group, n, errs), 0);
        for (size_t k = 0; k < n; k++) assert_true(logits_equal(&jobs[start + k], small[start + k]));
    }
    printf("%zu records (%zu tokens) packed, then %zu regrouped: logits bitwise equal to alone\n", n_refs, tokens,
           n_small);
    for (size_t i = 0; i < n_small; i++) clef_job_free(&jobs[i]);
    free(jobs);
    free(ptrs);
    free(errs);
}

/* A record the thinker refuses (token id outside the vocabulary) fails
 * alone; its batch mates still get their exact answers. */
static void test_bad_record_fails_alone(void **state) {
    clef_job jobs[3], *ptrs[3];
    clef_err errs[3];
    for (int i = 0; i < 3; i++) {
        prepare(&refs[i], &jobs[i]);
        ptrs[i] = &jobs[i];
    }
    jobs[1].rec.input_ids[3] = 1 << 30;
    assert_int_equal(clef_engine_run(engine, ptrs, 3, errs), -1);
    assert_int_equal(errs[0].status, 0);
    assert_int_equal(errs[2].status, 0);
    assert_true(errs[1].status >= 400);
    assert_true(logits_equal(&jobs[0], &refs[0]));
    assert_true(logits_equal(&jobs[2], &refs[2]));
    for (int i = 0; i < 3; i++) clef_job_free(&jobs[i]);
}

/* ---- the scheduler -------------------------------------------------- */

typedef struct sched_stats {
    atomic_int batches, records, multi;
    int delay_ms;
    /* when set: every on_batch waits (up to 60 s) until *gate != 0, so the engine thread takes no second
     * batch before the test opens it (what reaches the queue meanwhile does not depend on timing) */
    atomic_int *gate;
} sched_stats;

static void count_batch(void *ctx, size_t n_records, size_t n_tokens, double seconds) {
    sched_stats *st = ctx;
    atomic_fetch_add(&st->batches, 1);
    atomic_fetch_add(&st->records, (int)n_records);
    if (n_records > 1) atomic_fetch_add(&st->multi, 1);
    if (st->delay_ms) {
        struct timespec ts = {0, st->delay_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    for (int ms = 0; st->gate && !atomic_load(st->gate) && ms < 60000; ms++) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
}

typedef struct submitter {
    clef_scheduler *s;
    int id, n;
    atomic_int *wrong, *refused, *started;
} submitter;

static void *submit_main(void *arg) {
    submitter *sb = arg;
    atomic_fetch_add(sb->started, 1);
    for (int i = 0; i < sb->n; i++) {
        const ref_case *r = small[(size_t)(sb->id * 5 + i * 11) % n_small];
        clef_job job;
        prepare(r, &job);
        clef_err err;
        clef_err_clear(&err);
        if (clef_scheduler_submit(sb->s, &job, &err) == 0) {
            if (!logits_equal(&job, r)) atomic_fetch_add(sb->wrong, 1);
        } else if (err.status == 503 && !strcmp(err.type, CLEF_E_OVERLOADED)) {
            atomic_fetch_add(sb->refused, 1);
        } else {
            atomic_fetch_add(sb->wrong, 1);
        }
        clef_job_free(&job);
    }
    return NULL;
}

static void run_submitters(clef_scheduler *s, int n_threads, int per_thread, atomic_int *wrong, atomic_int *refused) {
    pthread_t th[16];
    submitter sb[16];
    atomic_int started = 0;
    for (int i = 0; i < n_threads; i++) {
        sb[i] = (submitter){s, i, per_thread, wrong, refused, &started};
        assert_int_equal(pthread_create(&th[i], NULL, submit_main, &sb[i]), 0);
    }
    for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
}

static void test_scheduler_batches(void **state) {
    sched_stats st = {0};
    clef_scheduler_options o = {.max_batch_tokens = 2048, .on_batch = count_batch, .ctx = &st};
    clef_err err;
    clef_scheduler *s = clef_scheduler_start(engine, &o, &err);
    assert_non_null(s);
    atomic_int wrong = 0, refused = 0;
    run_submitters(s, 8, 12, &wrong, &refused);
    assert_int_equal(clef_scheduler_queue_depth(s), 0);
    clef_scheduler_free(s);
    printf("scheduler: %d records in %d forwards (%d packed several), %d wrong\n", atomic_load(&st.records),
           atomic_load(&st.batches), atomic_load(&st.multi), atomic_load(&wrong));
    assert_int_equal(atomic_load(&wrong), 0);
    assert_int_equal(atomic_load(&refused), 0);
    assert_int_equal(atomic_load(&st.records), 96);
    assert_true(atomic_load(&st.multi) > 0);
}

static void test_scheduler_queue_limit(void **state) {
    sched_stats st = {.delay_ms = 20};
    clef_scheduler_options o = {.max_queue = 1, .max_batch_tokens = 1, .on_batch = count_batch, .ctx = &st};
    clef_err err;
    clef_scheduler *s = clef_scheduler_start(engine, &o, &err);
    assert_non_null(s);
    atomic_int wrong = 0, refused = 0;
    run_submitters(s, 8, 4, &wrong, &refused);
    clef_scheduler_free(s);
    printf("queue of 1: %d of 32 refused, %d answered\n", atomic_load(&refused), atomic_load(&st.records));
    assert_int_equal(atomic_load(&wrong), 0);
    assert_true(atomic_load(&refused) > 0);
    assert_int_equal(atomic_load(&refused) + atomic_load(&st.records), 32);
}

/* stop() with records queued answers them all, then refuses. */
static void test_scheduler_stop_drains(void **state) {
    sched_stats st = {.delay_ms = 30};
    clef_scheduler_options o = {.max_batch_tokens = 1, .on_batch = count_batch, .ctx = &st};
    clef_err err;
    clef_scheduler *s = clef_scheduler_start(engine, &o, &err);
    assert_non_null(s);
    pthread_t th[6];
    submitter sb[6];
    atomic_int wrong = 0, refused = 0, started = 0;
    for (int i = 0; i < 6; i++) {
        sb[i] = (submitter){s, i, 1, &wrong, &refused, &started};
        assert_int_equal(pthread_create(&th[i], NULL, submit_main, &sb[i]), 0);
    }
    while (atomic_load(&started) < 6 || clef_scheduler_queue_depth(s) < 3) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    /* records are waiting: stop must still answer every one of them; a
     * submitter that comes later is refused */
    clef_scheduler_stop(s);
    for (int i = 0; i < 6; i++) pthread_join(th[i], NULL);
    clef_err late;
    clef_job job;
    prepare(small[0], &job);
    assert_int_equal(clef_scheduler_submit(s, &job, &late), -1);
    assert_int_equal(late.status, 503);
    assert_string_equal(late.message, "the server is shutting down");
    clef_job_free(&job);
    clef_scheduler_free(s);
    assert_int_equal(atomic_load(&wrong), 0);
    assert_int_equal(atomic_load(&refused) + atomic_load(&st.records), 6);
    assert_true(atomic_load(&st.records) >= 3); /* at least the 3 that were queued */
}

/* ---- clef_scheduler_submit_async ----------------------------------------- */

/* More than the engine can hold before the gate opens: its first batch (at most the 16 queued) plus a
 * full queue of 16, so at least 8 are refused whatever the timing */
#define N_ASYNC 40

typedef struct async_slot {
    clef_job job;
    const ref_case *ref;
    atomic_int calls;
    int status;
    pthread_t thread; /* the thread the callback ran on */
} async_slot;

typedef struct async_run {
    async_slot slot[N_ASYNC];
    atomic_int done;
    pthread_mutex_t lock;
    pthread_cond_t all_done;
} async_run;

static async_run *the_run;

static void on_async_done(void *ctx, clef_job *job, const clef_err *err) {
    async_slot *a = ctx;
    assert_ptr_equal(job, &a->job);
    a->status = err->status;
    a->thread = pthread_self();
    atomic_fetch_add(&a->calls, 1);
    pthread_mutex_lock(&the_run->lock);
    atomic_fetch_add(&the_run->done, 1);
    pthread_cond_signal(&the_run->all_done);
    pthread_mutex_unlock(&the_run->lock);
}

static void test_scheduler_async(void **state) {
    atomic_int gate = 0;
    sched_stats st = {.delay_ms = 5, .gate = &gate};
    clef_scheduler_options o = {.max_queue = 16, .max_batch_tokens = 2048, .on_batch = count_batch, .ctx = &st};
    clef_err err;
    clef_scheduler *s = clef_scheduler_start(engine, &o, &err);
    assert_non_null(s);
    async_run *run = calloc(1, sizeof *run);
    assert_non_null(run);
    the_run = run;
    pthread_mutex_init(&run->lock, NULL);
    pthread_cond_init(&run->all_done, NULL);
    /* encoded first, then submitted from this one thread without waiting while the engine thread is held
     * after its first batch (the gate): the queue of 16 fills, and the rest are refused at once */
    for (int i = 0; i < N_ASYNC; i++) {
        run->slot[i].ref = small[(size_t)(i * 7) % n_small];
        prepare(run->slot[i].ref, &run->slot[i].job);
    }
    int queued = 0, refused = 0;
    for (int i = 0; i < N_ASYNC; i++) {
        async_slot *a = &run->slot[i];
        clef_err e;
        clef_err_clear(&e);
        if (clef_scheduler_submit_async(s, &a->job, on_async_done, a, &e) == 0) {
            queued++;
        } else {
            assert_int_equal(e.status, 503);
            assert_string_equal(e.type, CLEF_E_OVERLOADED);
            assert_non_null(strstr(e.message, "the request queue is full"));
            a->status = -1; /* refused: never called back */
            refused++;
        }
    }
    atomic_store(&gate, 1);
    pthread_mutex_lock(&run->lock);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    while (atomic_load(&run->done) < queued)
        if (pthread_cond_timedwait(&run->all_done, &run->lock, &until) != 0) break;
    pthread_mutex_unlock(&run->lock);
    printf("async: %d queued, %d refused, %d called back in %d forwards (%d packed several)\n", queued, refused,
           atomic_load(&run->done), atomic_load(&st.batches), atomic_load(&st.multi));
    assert_int_equal(atomic_load(&run->done), queued);
    assert_true(queued >= 16 && queued <= 32); /* a full queue, plus the first batch (0 .. 16 records) */
    assert_int_equal(queued + refused, N_ASYNC);
    assert_true(refused >= 8);
    assert_true(atomic_load(&st.multi) > 0); /* records submitted without waiting were packed */
    for (int i = 0; i < N_ASYNC; i++) {
        async_slot *a = &run->slot[i];
        if (a->status == -1) {
            assert_int_equal(atomic_load(&a->calls), 0);
        } else {
            assert_int_equal(atomic_load(&a->calls), 1);
            assert_int_equal(a->status, 0);
            assert_false(pthread_equal(a->thread, pthread_self())); /* the engine thread's */
            assert_true(logits_equal(&a->job, a->ref));
        }
        clef_job_free(&a->job);
    }
    /* queued, then stopped: stop calls every one back before it returns */
    atomic_store(&run->done, 0);
    queued = 0;
    for (int i = 0; i < 8; i++) {
        async_slot *a = &run->slot[i];
        atomic_store(&a->calls, 0);
        prepare(small[i % n_small], &a->job);
        if (clef_scheduler_submit_async(s, &a->job, on_async_done, a, &err) == 0) queued++;
    }
    clef_scheduler_stop(s);
    assert_int_equal(atomic_load(&run->done), queued);
    clef_err late;
    assert_int_equal(clef_scheduler_submit_async(s, &run->slot[9].job, on_async_done, &run->slot[9], &late), -1);
    assert_string_equal(late.message, "the server is shutting down");
    for (int i = 0; i < 8; i++) clef_job_free(&run->slot[i].job);
    clef_scheduler_free(s);
    pthread_cond_destroy(&run->all_done);
    pthread_mutex_destroy(&run->lock);
    free(run);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone_matches_golden),
        cmocka_unit_test(test_packed_bitwise),
        cmocka_unit_test(test_bad_record_fails_alone),
        cmocka_unit_test(test_scheduler_batches),
        cmocka_unit_test(test_scheduler_queue_limit),
        cmocka_unit_test(test_scheduler_stop_drains),
        cmocka_unit_test(test_scheduler_async),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
