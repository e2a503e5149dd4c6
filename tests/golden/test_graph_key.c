/* test_graph_key.c — the thinker's graph_run contract (backend.h) on the
 * CPU, through a CPU backend whose op table gains a recording graph_run
 * (it runs the body and keeps the key), so the host side of the CUDA graph
 * path runs without a GPU:
 *   - a repeated batch layout gives the same key, another layout another one
 *     (the key is what the CUDA backend replays by);
 *   - a model freed and a new one made on the same backend never repeat the
 *     freed one's keys, even when the allocator hands the new model the old
 *     one's address (a replay would launch on the freed weights);
 *   - with graph_run present the workspace is kept between forwards
 *     (thinker.c ws_acquire / ws_release): hidden states stay bitwise those
 *     of a backend without graph_run, smaller and bigger layouts alternating. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "testutil.h"

/* the keys graph_run saw, in call order */
static struct {
    unsigned char *key[16];
    size_t bytes[16];
    size_t n;
} seen;

static int rec_graph_run(clef_backend *be, const void *key, size_t kb, int (*body)(void *ctx, clef_err *err),
                         void *ctx, clef_err *err) {
    (void)be;
    if (seen.n < 16) {
        seen.key[seen.n] = malloc(kb ? kb : 1);
        memcpy(seen.key[seen.n], key, kb);
        seen.bytes[seen.n++] = kb;
    }
    return body(ctx, err);
}

static int same_key(size_t a, size_t b) {
    return seen.bytes[a] == seen.bytes[b] && memcmp(seen.key[a], seen.key[b], seen.bytes[a]) == 0;
}

typedef struct fixture {
    clef_checkpoint ck;
    json_value **cases;
    size_t n_cases;
    clef_backend *cpu; /* the plain CPU backend (no graph_run) */
    clef_backend_ops ops;
    clef_backend rec; /* the same state with rec_graph_run */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    clef_err err;
    clef_err_clear(&err);
    if (tu_open_fixture("tiny-clef-omni", &f->ck) != 0) return -1;
    if (!(f->cpu = clef_backend_cpu_create(1, &err))) {
        fprintf(stderr, "setup: %s\n", err.message);
        return -1;
    }
    f->ops = *f->cpu->ops;
    f->ops.graph_run = rec_graph_run;
    f->rec = (clef_backend){.ops = &f->ops, .ctx = f->cpu->ctx};
    f->cases = tu_load_goldens("goldens/goldens.jsonl", &f->n_cases);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    for (size_t i = 0; i < seen.n; i++) free(seen.key[i]);
    tu_free_goldens(f->cases, f->n_cases);
    f->cpu->ops->destroy(f->cpu);
    clef_checkpoint_close(&f->ck);
    free(f);
    return 0;
}

static clef_model *model_on(fixture *f, clef_backend *be) {
    clef_err err;
    clef_err_clear(&err);
    clef_model *m = clef_model_create_on(&f->ck, be, 0, &err);
    if (!m) fail_msg("model: %s", err.message);
    return m;
}

static void test_keys_and_kept_workspace(void **state) {
    fixture *f = *state;
    const size_t H = (size_t)f->ck.config.text.hidden_size;
    const size_t pick[3] = {2, 5, 1};
    clef_record r[3];
    size_t seg[4], one[2];
    int32_t *ids = tu_pack_goldens(f->cases, pick, 3, r, seg);
    one[0] = 0, one[1] = r[0].n_ids;
    float *want = malloc(seg[3] * H * sizeof *want), *got = malloc(seg[3] * H * sizeof *got);
    const size_t n[2] = {one[1], seg[3]}, n_seg[2] = {1, 3};
    const size_t *segs[2] = {one, seg};
    clef_model *mp = model_on(f, f->cpu), *mg = model_on(f, &f->rec);
    clef_err err;
    clef_err_clear(&err);
    /* small layout first, so the kept workspace must grow once */
    const int order[4] = {0, 1, 0, 1};
    for (int i = 0; i < 4; i++) {
        const int l = order[i];
        if (clef_thinker_forward_batch(mp, ids, n[l], segs[l], n_seg[l], NULL, want, NULL, &err) != 0 ||
            clef_thinker_forward_batch(mg, ids, n[l], segs[l], n_seg[l], NULL, got, NULL, &err) != 0)
            fail_msg("forward %d: %s", i, err.message);
        assert_memory_equal(want, got, n[l] * H * sizeof(float));
    }
    assert_int_equal(seen.n, 4);
    assert_false(same_key(0, 1)); /* another layout */
    assert_true(same_key(1, 3));  /* the big layout again: its workspace is the kept one */
    /* a new model on the same backend, maybe at the freed one's address: never the old keys */
    const void *old = mg;
    clef_model_free(mg);
    mg = model_on(f, &f->rec);
    printf("  new model %s the freed one's address\n", (const void *)mg == old ? "reuses" : "does not reuse");
    for (int i = 0; i < 2; i++) {
        const int l = 1 - i;
        if (clef_thinker_forward_batch(mp, ids, n[l], segs[l], n_seg[l], NULL, want, NULL, &err) != 0 ||
            clef_thinker_forward_batch(mg, ids, n[l], segs[l], n_seg[l], NULL, got, NULL, &err) != 0)
            fail_msg("forward after the new model, layout %d: %s", l, err.message);
        assert_memory_equal(want, got, n[l] * H * sizeof(float));
    }
    assert_int_equal(seen.n, 6);
    for (size_t a = 4; a < 6; a++)
        for (size_t b = 0; b < 4; b++) assert_false(same_key(a, b));
    clef_model_free(mg), clef_model_free(mp);
    for (int i = 0; i < 3; i++) clef_record_free(&r[i]);
    free(ids), free(want), free(got);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_and_kept_workspace),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
