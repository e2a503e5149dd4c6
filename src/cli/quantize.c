/* clef quantize — write a quantized checkpoint from a BF16 one
 * (src/quant/convert.h does the work; this file is flags and the summary). */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "quant/convert.h"

static void quantize_usage(FILE *f) {
    fprintf(f,
            "usage: clef quantize (--model DIR | --synthetic tiny|small|full [--seed N] [--tokenizer F])\n"
            "                     --format nvfp4|nvfp4-modelopt|fp8-block|int4 --out DIR\n"
            "                     [--layout per-expert|stacked] [--group N] [--block N] [--force] [--quiet]\n"
            "  Quantizes the routed experts of a BF16 Clef-Omni checkpoint into a published format\n"
            "  (everything else is copied unchanged) and writes config.json, the index, the other files\n"
            "  of DIR and quant_stats.json (relative L2 error per layer).  Streams one expert matrix at a\n"
            "  time; the peak RSS (VmHWM) is printed at the end.\n"
            "  --out DIR       created if missing; a DIR that is not empty is refused (exit 2)\n"
            "  --force         write into a DIR that is not empty: files of the same names are replaced,\n"
            "                  nothing else in DIR is touched or deleted\n"
            "  --synthetic P   instead of --model: quantize the random weights of preset P (seed --seed,\n"
            "                  default 1) straight from the generator, no BF16 files: the same output as\n"
            "                  `clef synth` then `clef quantize --model`; tokenizer.json from --tokenizer F\n"
            "                  (default %s)\n"
            "  --layout L      per-expert (default); stacked = SPEC §10.3 (c), defined for nvfp4 only\n"
            "  nvfp4           compressed-tensors NVFP4 (W4A16), min-max scales per 16, one global scale\n"
            "                  shared by gate and up; --layout stacked stores each layer's experts as\n"
            "                  mlp.experts.gate_up_proj / down_proj\n"
            "  nvfp4-modelopt  NVIDIA ModelOpt NVFP4 (+ hf_quant_config.json)\n"
            "  fp8-block       FP8 E4M3 with --block N x N scales (default 128)\n"
            "  int4            AutoRound INT4 auto_gptq packing, symmetric RTN, --group N inputs per scale\n"
            "                  (default 128; a module narrower than N uses its width)\n",
            CLI_DEFAULT_TOKENIZER);
}

int cli_quantize(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *format = NULL, *layout = "per-expert", *synthetic = NULL,
               *tokenizer = NULL;
    size_t group = 0, block = 0, seed = 1;
    int quiet = 0, force = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = arg_str(argc, argv, &i, "--model", &model)) || (r = arg_str(argc, argv, &i, "--out", &out)) ||
            (r = arg_str(argc, argv, &i, "--format", &format)) || (r = arg_str(argc, argv, &i, "--layout", &layout)) ||
            (r = arg_size(argc, argv, &i, "--group", &group)) || (r = arg_size(argc, argv, &i, "--block", &block)) ||
            (r = arg_str(argc, argv, &i, "--synthetic", &synthetic)) ||
            (r = arg_str(argc, argv, &i, "--tokenizer", &tokenizer)) || (r = arg_size(argc, argv, &i, "--seed", &seed))) {
            if (r < 0) return 2;
        } else if (!strcmp(argv[i], "--quiet")) {
            quiet = 1;
        } else if (!strcmp(argv[i], "--force")) {
            force = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            quantize_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "clef quantize: unknown argument %s\n", argv[i]);
            quantize_usage(stderr);
            return 2;
        }
    }
    if (synthetic && !tokenizer && !(tokenizer = cli_default_tokenizer("clef quantize"))) return 2;
    clef_quantize_options o = {.model_dir = model, .synthetic = synthetic, .seed = seed, .tokenizer = tokenizer,
                               .out_dir = out, .group = (int64_t)group,
                               .block = {(int64_t)block, (int64_t)block}, .progress = !quiet};
    if (!model == !synthetic || !out || !format || clef_quant_format_parse(format, &o.format) != 0 ||
        (strcmp(layout, "per-expert") && strcmp(layout, "stacked"))) {
        if (format && clef_quant_format_parse(format, &o.format) != 0)
            fprintf(stderr, "clef quantize: unknown format '%s'\n", format);
        else if (strcmp(layout, "per-expert") && strcmp(layout, "stacked"))
            fprintf(stderr, "clef quantize: unknown layout '%s' (per-expert or stacked)\n", layout);
        else if (model && synthetic)
            fprintf(stderr, "clef quantize: give --model DIR or --synthetic P, not both\n");
        quantize_usage(stderr);
        return 2;
    }
    o.stacked = !strcmp(layout, "stacked");
    if (o.stacked && o.format != CLEF_QF_NVFP4_CT) { /* a usage error, said before anything is read */
        fprintf(stderr,
                "clef quantize: --layout stacked is defined for --format nvfp4 only (SPEC §10.3 (c)); %s supports "
                "--layout per-expert\n",
                format);
        return 2;
    }
    if (cli_check_out_dir("clef quantize", out, force)) return 2; /* before anything is read or written */
    clef_err err;
    clef_err_clear(&err);
    clef_quantize_report rep;
    if (clef_quantize_checkpoint(&o, &rep, &err) != 0) {
        fprintf(stderr, "clef quantize: %s\n", err.message);
        return 1;
    }
    printf("quantized %zu expert matrices to %s (%s), copied %zu tensors, %zu shard(s)\n", rep.quantized,
           clef_quant_format_name(o.format), layout, rep.copied, rep.shards);
    printf("tensor bytes %zu -> %zu (%.1f%%)\n", rep.bytes_in, rep.bytes_out,
           rep.bytes_in ? 100.0 * (double)rep.bytes_out / (double)rep.bytes_in : 0.0);
    printf("relative L2 error of the experts: mean over layers %.2f%%, mean over matrices %.2f%%\n",
           100.0 * rep.mean_rel_l2, 100.0 * rep.mean_matrix_rel_l2);
    printf("peak RSS (VmHWM) %.1f MiB, %.2f s\n", (double)rep.peak_rss_bytes / (1024.0 * 1024.0), rep.seconds);
    return 0;
}
