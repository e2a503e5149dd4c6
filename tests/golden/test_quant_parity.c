/* test_quant_parity.c — round trip parity (issue 5 acceptance): the tiny BF16
 * checkpoint quantized by clef in each format and layout answers the 38
 * golden requests like BF16 on >= 90% of questions (top-1) with mean
 * total-variation distance <= 0.05 (tiny random weights are harsher than
 * real ones); the figures are printed.  Kept apart from
 * test_quant_goldens.c so the two run in parallel under ctest.
 */
#define _GNU_SOURCE /* nftw */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_fixture.h"

#include "engine/engine.h"
#include "engine/parity.h"
#include "quant/convert.h"

/* One thread: the tiny model's ops are too small to pay for OpenMP barriers. */
static clef_engine *open_engine(const char *dir) { return tu_open_engine(dir, 1, 1); }

static void test_roundtrip_parity(void **state) {
    static const struct {
        clef_quant_format f;
        int stacked;
        int64_t group;
        const char *label;
    } cases[] = {
        {CLEF_QF_NVFP4_CT, 0, 0, "nvfp4 per-expert"},  {CLEF_QF_NVFP4_CT, 1, 0, "nvfp4 stacked"},
        {CLEF_QF_NVFP4_MODELOPT, 0, 0, "nvfp4-modelopt"}, {CLEF_QF_FP8_BLOCK, 0, 0, "fp8-block 128x128"},
        {CLEF_QF_INT4_AUTOROUND, 0, 0, "int4 group 128*"}, {CLEF_QF_INT4_AUTOROUND, 0, 16, "int4 group 16"},
    };
    char *tiny = tu_fixture("tiny-clef-omni");
    char *gp = tu_fixture("goldens/goldens.jsonl");
    size_t len;
    char *requests = tu_read_file(gp, &len);
    clef_engine *bf16 = open_engine(tiny);
    clef_parity_answers ref; /* BF16 answers, computed once */
    clef_err err0;
    assert_int_equal(clef_parity_collect(bf16, requests, len, &ref, &err0), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char tmpl[] = "/tmp/clef_qpar_XXXXXX";
        assert_non_null(mkdtemp(tmpl));
        char *out = qf_path(tmpl, "q");
        clef_quantize_options o = {.model_dir = tiny, .out_dir = out, .format = cases[i].f,
                                   .stacked = cases[i].stacked, .group = cases[i].group};
        clef_err err;
        clef_err_clear(&err);
        if (clef_quantize_checkpoint(&o, NULL, &err)) fail_msg("quantize: %s", err.message);
        clef_engine *q = open_engine(out);
        clef_parity_report rep;
        clef_parity_answers ans;
        if (clef_parity_collect(q, requests, len, &ans, &err) || clef_parity_compare(&ref, &ans, &rep, &err))
            fail_msg("parity: %s", err.message);
        clef_parity_answers_free(&ans);
        double agree = (double)rep.agree / (double)rep.questions;
        printf("round trip %-18s vs BF16: top-1 agreement %zu/%zu (%.1f%%), mean TV %.4f, max TV %.4f (%s), "
               "%zu flipped\n", cases[i].label, rep.agree, rep.questions, 100 * agree, rep.mean_tv, rep.max_tv,
               rep.max_tv_where, rep.n_flips);
        assert_int_equal(rep.requests, 38);
        assert_int_equal(rep.rejected, 11);
        assert_int_equal(rep.mismatched, 0);
        assert_int_equal(rep.questions, 66);
        assert_int_equal(rep.n_flips, rep.questions - rep.agree);
        assert_true(agree >= 0.90);
        assert_true(rep.mean_tv <= 0.05);
        assert_true(rep.mean_tv > 0); /* quantization did change the weights */
        clef_parity_report_free(&rep);
        clef_engine_close(q);
        qf_remove(tmpl);
        free(out);
    }
    /* a model against itself: total agreement, zero distance */
    clef_parity_report self;
    clef_err err;
    assert_int_equal(clef_parity_compare(&ref, &ref, &self, &err), 0);
    assert_int_equal(self.agree, self.questions);
    assert_true(self.max_tv == 0.0);
    clef_parity_report_free(&self);
    clef_parity_answers_free(&ref);
    clef_engine_close(bf16);
    free(requests);
    free(gp);
    free(tiny);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_parity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
