/* clef inspect — describe a checkpoint: config, tensors by dtype, head hash. */
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/placement.h"
#include "engine/scheduler.h"
#include "io/checkpoint.h"
#include "io/synth.h"
#include "quant/convert.h"
#include "quant/format.h"
#include "quant/summary.h"

/* SHA-256 of a mapped file as 64 lowercase hex chars (OpenSSL EVP). */
static int sha256_hex(const void *data, size_t n, char hex[65]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    if (!EVP_Digest(data, n, md, &md_len, EVP_sha256(), NULL)) return -1;
    for (unsigned i = 0; i < md_len; i++) sprintf(hex + 2 * i, "%02x", md[i]);
    return 0;
}

static void print_config(const clef_config *c) {
    const clef_text_config *t = &c->text;
    const clef_head_config *h = &c->head;
    printf("thinker text decoder:\n");
    printf("  hidden_size %lld, layers %lld, heads %lld (kv %lld) of %lld, vocab %lld\n",
           (long long)t->hidden_size, (long long)t->num_hidden_layers, (long long)t->num_attention_heads,
           (long long)t->num_key_value_heads, (long long)t->head_dim, (long long)t->vocab_size);
    printf("  experts %lld of width %lld, top-%lld%s, rms_norm_eps %g\n", (long long)t->num_experts,
           (long long)t->moe_intermediate_size, (long long)t->num_experts_per_tok,
           t->norm_topk_prob ? " (renormalised)" : "", t->rms_norm_eps);
    printf("  rope theta %g, mrope_section [%lld,%lld,%lld] interleaved, max_position_embeddings %lld\n",
           t->rope_theta, (long long)t->mrope_section[0], (long long)t->mrope_section[1],
           (long long)t->mrope_section[2], (long long)t->max_position_embeddings);
    printf("joint schema head:\n");
    printf("  width %lld, heads %lld, routing layers %lld, decoder layers %lld, feedforward %lld\n",
           (long long)h->width, (long long)h->heads, (long long)h->routing_layers, (long long)h->layers,
           (long long)h->feedforward);
}

/* "12.3 MiB" style size (static buffer per slot: at most 4 in one printf). */
static const char *human(size_t b) {
    static char buf[4][32];
    static int slot;
    char *o = buf[slot++ & 3];
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    snprintf(o, 32, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
    return o;
}

/* Detected quantization, bytes per weight type of the bound decoder Linear
 * modules, and what the model will hold in memory on each backend (weights
 * stay packed on both: the CPU maps them, a GPU gets the packed bytes). */
static int print_quantization(const clef_checkpoint *ck) {
    clef_quant_config qc;
    clef_err err;
    clef_err_clear(&err);
    clef_quant_summary s;
    if (clef_quant_detect(ck, &qc, &err) != 0 || clef_quant_summarize(ck, &qc, &s, &err) != 0) {
        clef_quant_config_free(&qc);
        fprintf(stderr, "clef inspect: %s\n", err.message);
        return 1;
    }
    printf("quantization: %s", clef_quant_format_name(qc.format));
    if (qc.format != CLEF_QF_NONE) printf(" (quant_method %s%s)", qc.method, qc.stacked ? ", experts stacked per layer" : "");
    if (qc.format == CLEF_QF_FP8_BLOCK) printf(", blocks %lldx%lld", (long long)qc.block[0], (long long)qc.block[1]);
    if (qc.format == CLEF_QF_INT4_AUTOROUND) printf(", group %lld%s", (long long)qc.group_size, qc.sym ? ", symmetric" : "");
    /* SPEC §10.3 (a) names W4A4 (input_activations + input_global_scale) but defines no activation
     * quantization, so clef runs such a checkpoint as W4A16 and says so */
    if (qc.w4a4)
        printf(", W4A4 config: activations are not quantized (run as W4A16; input_global_scale is not used)");
    printf("\n");
    size_t linear = 0;
    for (int t = 0; t < CLEF_QT_COUNT; t++) {
        linear += s.bytes[t];
        if (s.modules[t])
            printf("  %-9s %6zu decoder Linear modules %14zu bytes\n", clef_wqtype_name((clef_wqtype)t), s.modules[t],
                   s.bytes[t]);
    }
    printf("  experts: %zu modules, %s; all decoder Linear: %s (BF16 would be %s)\n", s.expert_modules,
           human(s.expert_bytes), human(linear), human(s.linear_bf16_bytes));
    size_t total = linear + s.other_bytes;
    printf("model memory (bound weights, kept packed): %s = decoder Linear %s + embeddings/norms/lm_head/head %s\n",
           human(total), human(linear), human(s.other_bytes));
    printf("  cpu:  %s mapped from the checkpoint (rows dequantized per 64-row block inside each matmul)\n",
           human(total));
    printf("  cuda: %s of device memory for weights (packed as stored), plus activations\n", human(total));
    clef_quant_config_free(&qc);
    return 0;
}

static const char USAGE[] =
    "usage: clef inspect --model DIR\n"
    "       clef inspect --plan (--model DIR | --synthetic P [--quant F]) [--gpu-memory SIZE]\n"
    "                    [--max-batch-tokens N] [--text-only] [--towers cpu|gpu]\n"
    "  --model DIR            the checkpoint to describe (config, tensors by dtype, quantization, head hash)\n"
    "  --plan                 instead: where the weights would live on a GPU (engine/placement.h), from the\n"
    "                         tensors' shapes alone (no weight is read or drawn): device memory by kind,\n"
    "                         which layers' experts stay resident and which are streamed from pinned host\n"
    "                         memory; exit 0 when it fits, 1 (the reason on stderr) when it does not\n"
    "  --synthetic P          with --plan, instead of --model: synthetic preset P (tiny, small, full)\n"
    "  --quant F              with --synthetic: its experts quantized to F (int4, fp8-block, nvfp4,\n"
    "                         nvfp4-modelopt; bf16 = none), as --synthetic P --quant F loads them\n"
    "  --gpu-memory SIZE      with --plan: the device memory budget, bytes with an optional K, M, G or T\n"
    "                         suffix (powers of 1024: 16G = 16GiB = 16 x 2^30 bytes; a trailing B or iB\n"
    "                         is optional); 0 or off, or no --gpu-memory: no budget (all resident)\n"
    "  --max-batch-tokens N   with --plan: the forward size the workspace is sized for (default %d),\n"
    "                         at most %zu; under a budget also the longest record the engine accepts\n"
    "  --text-only            with --plan: without the vision and audio towers\n"
    "  --towers cpu|gpu       with --plan: where the vision and audio towers run (default gpu); cpu keeps\n"
    "                         their weights in host memory, out of the budget\n";

/* `clef inspect --plan`: sizes (a checkpoint's headers, or a preset's
 * shapes) and the plan under the budget. */
static int inspect_plan(const char *model, const char *synthetic, const char *quant, size_t budget, size_t tokens,
                        int text_only, int towers_cpu) {
    clef_err err;
    clef_err_clear(&err);
    clef_place_sizes s;
    int rc;
    if (synthetic) {
        rc = clef_place_sizes_of_preset(synthetic, quant, text_only, tokens, &s, &err);
    } else {
        clef_checkpoint ck;
        if (clef_checkpoint_open(model, &ck, &err) != 0) {
            fprintf(stderr, "clef inspect: %s\n", err.message);
            return 1;
        }
        clef_quant_config qc;
        rc = clef_quant_detect(&ck, &qc, &err);
        if (rc == 0) rc = clef_place_sizes_of_checkpoint(&ck, &ck.config, &qc, text_only, tokens, &s, &err);
        clef_quant_config_free(&qc);
        clef_checkpoint_close(&ck);
    }
    if (rc != 0) {
        fprintf(stderr, "clef inspect: %s\n", err.message);
        return 1;
    }
    if (towers_cpu) clef_place_towers_on_host(&s);
    clef_place_plan p;
    clef_place_plan_make(&s, budget,
                         towers_cpu ? CLEF_PLACE_ADVICE_INSPECT & ~CLEF_PLACE_ADV_TOWERS_CPU : CLEF_PLACE_ADVICE_INSPECT,
                         &p);
    clef_place_plan_print(&s, &p, stdout);
    fflush(stdout);
    if (!p.fits) {
        fprintf(stderr, "clef inspect: %s\n", p.message);
        return 1;
    }
    return 0;
}

int cli_inspect(int argc, char **argv) {
    const char *model = NULL, *synthetic = NULL, *quant = NULL;
    size_t budget = 0, tokens = CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS;
    int plan = 0, text_only = 0, plan_flags = 0, towers = CLEF_TOWERS_DEFAULT;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--plan")) {
            plan = 1;
            continue;
        }
        if (!strcmp(argv[i], "--text-only")) {
            text_only = 1, plan_flags = 1;
            continue;
        }
        if ((r = arg_str(argc, argv, &i, "--model", &model)) != 0) {
            if (r < 0) return 2;
            continue;
        }
        if ((r = arg_str(argc, argv, &i, "--synthetic", &synthetic)) == 0 &&
            (r = arg_str(argc, argv, &i, "--quant", &quant)) == 0 &&
            (r = arg_bytes(argc, argv, &i, "--gpu-memory", &budget)) == 0 &&
            (r = arg_size(argc, argv, &i, "--max-batch-tokens", &tokens)) == 0 &&
            (r = arg_towers(argc, argv, &i, &towers)) == 0) {
            fprintf(stderr, USAGE, CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS, (size_t)CLEF_PLACE_MAX_TOKENS);
            if (strcmp(argv[i], "--help")) {
                fprintf(stderr, "clef inspect: unknown argument '%s'\n", argv[i]);
                return 2;
            }
            return 0;
        }
        if (r < 0) return 2;
        plan_flags = 1;
    }
    const char *why = NULL;
    static char why_buf[256];
    if (model && synthetic) why = "--model and --synthetic are exclusive";
    else if (!model && !synthetic) why = plan ? "--plan needs --model DIR or --synthetic P" : "--model DIR is required";
    else if (quant && !synthetic) why = "--quant goes with --synthetic (a checkpoint's format is its own)";
    else if (!plan && plan_flags)
        why = "--synthetic, --quant, --gpu-memory, --max-batch-tokens, --text-only and --towers go with --plan";
    else if (plan && tokens == 0) why = "--max-batch-tokens must be at least 1";
    else if (plan && tokens > CLEF_PLACE_MAX_TOKENS) {
        snprintf(why_buf, sizeof why_buf, "--max-batch-tokens is at most %zu (got %zu)", (size_t)CLEF_PLACE_MAX_TOKENS,
                 tokens);
        why = why_buf;
    }
    clef_err verr;
    clef_err_clear(&verr);
    clef_quant_format qf;
    if (!why && synthetic && !clef_synth_preset_find(synthetic, &verr)) why = verr.message;
    if (!why && quant && *quant && strcasecmp(quant, "bf16") && clef_quant_format_parse(quant, &qf) != 0) {
        snprintf(why_buf, sizeof why_buf,
                 "--quant: unknown quantized format '%s' (int4, fp8-block, nvfp4, nvfp4-modelopt; bf16 = none)", quant);
        why = why_buf;
    }
    if (why) {
        fprintf(stderr, USAGE, CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS, (size_t)CLEF_PLACE_MAX_TOKENS);
        fprintf(stderr, "clef inspect: %s\n", why);
        return 2;
    }
    if (plan) return inspect_plan(model, synthetic, quant, budget, tokens, text_only, towers == CLEF_TOWERS_CPU);
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    if (clef_checkpoint_open(model, &ck, &err) != 0) {
        fprintf(stderr, "clef inspect: %s\n", err.message);
        return 1;
    }
    printf("checkpoint %s\n", model);
    print_config(&ck.config);
    size_t count[CLEF_DT_COUNT] = {0}, bytes[CLEF_DT_COUNT] = {0}, total = 0;
    for (size_t i = 0; i < ck.n_tensors; i++) {
        count[ck.catalog[i]->dtype]++;
        bytes[ck.catalog[i]->dtype] += ck.catalog[i]->nbytes;
        total += ck.catalog[i]->nbytes;
    }
    printf("tensors: %zu in %zu files, %zu bytes (%.2f GiB)\n", ck.n_tensors, ck.n_shards, total,
           (double)total / (1024.0 * 1024 * 1024));
    for (int d = 0; d < CLEF_DT_COUNT; d++)
        if (count[d]) printf("  %-8s %6zu tensors %14zu bytes\n", clef_dtype_name((clef_dtype)d), count[d], bytes[d]);
    int rc = print_quantization(&ck);
    const st_file *head = &ck.shards[ck.n_shards - 1];
    char hex[65];
    if (sha256_hex(head->map, head->size, hex) == 0) printf("joint_head.safetensors sha256 %s\n", hex);
    clef_checkpoint_close(&ck);
    return rc;
}
