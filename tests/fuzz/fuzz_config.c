/* fuzz_config.c — libFuzzer target for the checkpoint's JSON configs
 * (issue 15): the first byte picks the file the rest stands for,
 *   0: config.json (thinker text config: sizes, RoPE forms, mrope_section,
 *      mlp_only_layers, token ids) with the fixture's joint_head_config.json,
 *      and its quantization_config (quant/format.c);
 *   1: joint_head_config.json with the fixture's config.json;
 *   2: hf_quant_config.json (ModelOpt) with a config.json without
 *      quantization_config.
 * A refusal must be a 500 naming the file; an accepted config must satisfy
 * what the model relies on (positive sizes, heads % kv heads, k <= experts,
 * mrope_section covering head_dim/2, head width % heads).  Seeds: the
 * fixture configs (tiny and quantized).  Build and run: `make fuzz`.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/config.h"
#include "quant/format.h"
#include "fuzz_check.h"

#ifndef CLEF_FIXTURES
#define CLEF_FIXTURES "tests/fixtures"
#endif

static char *cfg_text, *head_text;
static size_t cfg_len, head_len;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    clef_err err;
    clef_err_clear(&err);
    cfg_text = clef_read_text_file(CLEF_FIXTURES "/tiny-clef-omni", "config.json", CLEF_FILE_MAX_CONFIG, &cfg_len, &err);
    head_text = clef_read_text_file(CLEF_FIXTURES "/tiny-clef-omni", "joint_head_config.json", CLEF_FILE_MAX_CONFIG,
                                    &head_len, &err);
    if (!cfg_text || !head_text) {
        fprintf(stderr, "fuzz_config: %s\n", err.message);
        abort();
    }
    return 0;
}

static void check_config(const clef_config *c) {
    const clef_text_config *t = &c->text;
    CHECK(t->hidden_size > 0 && t->num_hidden_layers > 0 && t->num_hidden_layers <= CLEF_MAX_LAYERS);
    CHECK(t->num_attention_heads > 0 && t->num_key_value_heads > 0);
    CHECK(t->num_attention_heads % t->num_key_value_heads == 0);
    CHECK(t->num_experts_per_tok <= t->num_experts);
    CHECK(t->head_dim > 0 && t->head_dim % 2 == 0);
    CHECK(t->mrope_section[0] + t->mrope_section[1] + t->mrope_section[2] == t->head_dim / 2);
    CHECK(t->rms_norm_eps > 0 && t->rope_theta > 0);
    CHECK(c->head.hidden_size == t->hidden_size && c->head.width % c->head.heads == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1u << 20)) return 0;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    clef_config cfg;
    clef_err err;
    clef_err_clear(&err);
    int mode = data[0] % 3;
    if (mode == 0 || mode == 1) {
        int rc = mode == 0 ? clef_config_parse(text, n, head_text, head_len, &cfg, &err)
                           : clef_config_parse(cfg_text, cfg_len, text, n, &cfg, &err);
        if (rc == 0)
            check_config(&cfg);
        else
            CHECK(err.status == 500 && (strstr(err.message, "config.json") || strstr(err.message, "config")));
    }
    if (mode == 1) return 0;
    clef_quant_config qc;
    clef_err_clear(&err);
    int rc = mode == 0 ? clef_quant_config_parse(text, n, NULL, 0, &qc, &err)
                       : clef_quant_config_parse(cfg_text, cfg_len, text, n, &qc, &err);
    if (rc != 0) CHECK(err.status == 500 && err.message[0]);
    clef_quant_config_free(&qc); /* also after an error (format.h) */
    return 0;
}
