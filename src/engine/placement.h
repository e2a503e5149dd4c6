/* placement.h — where a model's weights live on a GPU with a memory budget
 * (`--gpu-memory SIZE`): which layers' experts stay resident in device
 * memory and which are streamed from pinned host memory into one of two
 * device slots before each forward's use (issue 17).
 *
 * The planner is a pure function of sizes and a budget (no device, no
 * weights read), so `clef inspect --plan` answers "what fits my card" from
 * shapes alone and the engine applies the same plan at load.  Sizes are the
 * CUDA backend's own: clef_place_weight_bytes is the rule
 * cuda_backend.c's weight upload allocates by (packed arrays 256-byte
 * aligned with 256 bytes of slack each, INT4 / NVFP4 data reordered for the
 * v3 kernels), so the plan and the allocations cannot disagree.
 *
 * Plan rule (clef_place_plan_make):
 *   fixed   = dense_bytes + tower_bytes + workspace_bytes + context_bytes
 *   all resident when fixed + sum(layer expert bytes) <= budget (budget 0 =
 *     no budget: always all resident);
 *   else two slots of the largest layer's expert bytes are reserved and the
 *     largest number r of layers stays resident with
 *     fixed + 2 * slot + sum(resident layers) <= budget; the other L - r
 *     layers (always >= 3 then) are streamed, spread evenly over the depth
 *     (layer l streamed iff floor((l + 1) n / L) > floor(l n / L), n the
 *     number streamed; with dense-MLP layers, which are never streamed, l
 *     counts the MoE layers only and L is their number), so each copy
 *     overlaps the resident layers' compute;
 *   does not fit when the smallest plan, min(fixed + sum(layer expert
 *     bytes), fixed + 2 * slot) (clef_place_min_bytes), is over the budget:
 *     `message` then says how much that plan needs, what takes it, and which
 *     of the command's flags (CLEF_PLACE_ADV_*) would make it smaller.
 * Every size is saturating arithmetic: a sum past SIZE_MAX stays SIZE_MAX,
 * which never fits (a huge --max-batch-tokens cannot wrap into a plan that
 * "fits"); the CLI refuses --max-batch-tokens past CLEF_PLACE_MAX_TOKENS.
 *
 * Records: the workspace is sized for forwards of `batch_tokens` tokens, and
 * under a budget that is also the longest record the engine accepts
 * (clef_place_max_record): the engine lowers its max_length to it, so a
 * longer record is refused at admission (422 "maximum context length"), or
 * its state cut when truncation is asked, instead of running alone past the
 * planned workspace.  `decide` and `parity` answer one record a forward and
 * plan for their --max-length; `serve` and `eval` for --max-batch-tokens.
 */
#ifndef CLEF_ENGINE_PLACEMENT_H
#define CLEF_ENGINE_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/config.h"
#include "quant/qweight.h"
#include "util/err.h"

struct clef_checkpoint;

/* Fixed allowance for the CUDA context, cuBLASLt and the driver's own
 * allocations, counted against the budget: 600 MiB measured on the H200
 * (the driver's view after backend creation, before any weight) plus a
 * 256 MiB margin for what the plan cannot size exactly (the 2 MiB
 * granules of cudaMalloc, arena tails, the memory pool's cache): without
 * it an INT4 plan at 16 GiB with --towers cpu left 8.6 MB free and the
 * load was refused ~2 MiB short (2026-12-02). */
#define CLEF_PLACE_CONTEXT_BYTES ((size_t)856 << 20)

/* The largest forward a plan is made for, tokens (--max-batch-tokens,
 * --max-length under --gpu-memory): 2^24, far past any GPU's workspace, far
 * below where any size could overflow. */
#define CLEF_PLACE_MAX_TOKENS ((size_t)1 << 24)

/* The flags of a command that can make a plan smaller; the does-not-fit
 * message names only those its command accepts. */
enum {
    CLEF_PLACE_ADV_MAX_BATCH_TOKENS = 1, /* --max-batch-tokens sizes the workspace (serve, eval, inspect) */
    CLEF_PLACE_ADV_MAX_LENGTH = 2,       /* --max-length sizes it (decide, parity: one record a forward) */
    CLEF_PLACE_ADV_TEXT_ONLY = 4,        /* --text-only */
    CLEF_PLACE_ADV_TOWERS_CPU = 8,       /* --towers cpu */
};
/* Each command's set (what it passes as clef_engine_options.plan_advice). */
#define CLEF_PLACE_ADVICE_DECIDE (CLEF_PLACE_ADV_MAX_LENGTH | CLEF_PLACE_ADV_TOWERS_CPU)
#define CLEF_PLACE_ADVICE_PARITY CLEF_PLACE_ADV_MAX_LENGTH
#define CLEF_PLACE_ADVICE_BENCH (CLEF_PLACE_ADV_TEXT_ONLY | CLEF_PLACE_ADV_TOWERS_CPU)
#define CLEF_PLACE_ADVICE_SERVE (CLEF_PLACE_ADV_MAX_BATCH_TOKENS | CLEF_PLACE_ADV_TEXT_ONLY | CLEF_PLACE_ADV_TOWERS_CPU)
#define CLEF_PLACE_ADVICE_EVAL CLEF_PLACE_ADVICE_SERVE
#define CLEF_PLACE_ADVICE_INSPECT CLEF_PLACE_ADVICE_SERVE

/* What a model needs on the device, bytes. */
typedef struct clef_place_sizes {
    int64_t n_layers;                         /* decoder layers */
    size_t expert_bytes[CLEF_MAX_LAYERS];     /* layer l's routed experts (gate, up, down of all E); 0 for a
                                                 dense-MLP layer (never streamed) */
    size_t dense_bytes;                       /* every other thinker / head weight the device holds: embeddings,
                                                 lm_head, attention, routers, norms, the joint head */
    size_t tower_bytes;                       /* vision + audio towers on the device (0: text only, or on the CPU) */
    size_t tower_host_bytes;                  /* the towers' bytes when they run on the CPU (--towers cpu): host
                                                 memory, not in the budget (clef_place_towers_on_host) */
    size_t workspace_bytes;                   /* activations and scratch of one forward of `batch_tokens` */
    size_t context_bytes;                     /* CLEF_PLACE_CONTEXT_BYTES */
    size_t batch_tokens;                      /* the forward size workspace_bytes is for */
} clef_place_sizes;

typedef struct clef_place_plan {
    int fits;                          /* 0: message says why and what would */
    size_t budget;                     /* bytes; 0 = none */
    int64_t n_layers, n_resident, n_streamed; /* MoE layers only count in n_resident / n_streamed */
    uint8_t streamed[CLEF_MAX_LAYERS]; /* 1 = layer l's experts streamed */
    size_t slot_bytes;                 /* one of the two device slots (0 when nothing is streamed) */
    size_t device_bytes;               /* planned device total: fixed + resident experts + 2 slots */
    size_t streamed_bytes;             /* host -> device bytes per forward (sum of streamed layers) */
    size_t pinned_bytes;               /* pinned host memory holding the streamed layers */
    char message[512];                 /* one line: the plan, or why it does not fit */
} clef_place_plan;

/* Device bytes of one bound weight as the CUDA backend allocates it (plain:
 * bf16 stays 2 bytes an element, f16 / f32 become f32; packed: data,
 * scales and zeros each rounded up to 256 bytes after 256 bytes of slack,
 * INT4 and NVFP4 in the v3 kernels' reordered sizes). */
size_t clef_place_weight_bytes(const clef_qweight *q);

/* The plan for `s` under `budget` bytes (0 = no budget).  Pure; always
 * fills p (fits = 0 with message when it does not fit; its advice names
 * only the flags in `advice`, CLEF_PLACE_ADV_*). */
void clef_place_plan_make(const clef_place_sizes *s, size_t budget, unsigned advice, clef_place_plan *p);

/* dense + towers + workspace + context (saturating). */
size_t clef_place_fixed_bytes(const clef_place_sizes *s);

/* The smallest device total any plan of `s` needs: min(everything resident,
 * fixed + two slots of the largest layer's experts); *streaming (may be
 * NULL) = 1 when that smallest plan streams. */
size_t clef_place_min_bytes(const clef_place_sizes *s, int *streaming);

/* The longest record an engine with max_length accepts under a plan of `s`:
 * min(max_length, s->batch_tokens) (the workspace is for batch_tokens). */
size_t clef_place_max_record(size_t max_length, const clef_place_sizes *s);

/* --towers cpu: the towers' bytes move from the device to the host side. */
void clef_place_towers_on_host(clef_place_sizes *s);

/* Sizes of a checkpoint (its catalog's shapes and dtypes, headers only: no
 * weight byte is read) with quantization `qc`, towers unless text_only, and a
 * workspace for forwards of batch_tokens tokens.  -1 + err (the binding's
 * errors, 500 naming the tensor). */
int clef_place_sizes_of_checkpoint(const struct clef_checkpoint *ck, const clef_config *cfg,
                                   const clef_quant_config *qc, int text_only, size_t batch_tokens,
                                   clef_place_sizes *s, clef_err *err);

/* Sizes of synthetic preset `preset` ("tiny", "small", "full"; io/synth.h)
 * quantized to `quant` as `--synthetic P --quant F` builds it (NULL, "" or
 * "bf16": the BF16 weights; else a clef_quant_format_parse name), without
 * drawing a weight: the generator's tensor plan, headers only, with the
 * experts' companions `clef quantize` writes (INT4 group min(in, 128)
 * symmetric, FP8 blocks 128x128, per-expert layout).  Equal to
 * clef_place_sizes_of_checkpoint on the drawn checkpoint.  -1 + err (400
 * for an unknown format, 500 for an unknown preset). */
int clef_place_sizes_of_preset(const char *preset, const char *quant, int text_only, size_t batch_tokens,
                               clef_place_sizes *s, clef_err *err);

/* Device bytes of the activations and scratch of one forward of
 * batch_tokens tokens (an estimate, to be calibrated on the GPU): a sum of
 * named terms in placement.c — thinker.c's workspace (residual stream,
 * hidden output, q|k|v, attention output, routing, dense MLP, ids and
 * positions), the head's per-token rows, and the CUDA backend's scratch
 * slots (bf16 product inputs and q/k/v, precise split outputs, the MoE
 * pass's plan, SwiGLU output and permuted outputs over at most 8192 tokens),
 * each slot with cu_slot's quarter of headroom; activations counted as
 * precise numerics' two halves (the worst case).  sizes_of_checkpoint adds
 * the INT4 / NVFP4 upload stage slot, which depends on the weights. */
size_t clef_place_workspace_bytes(const clef_config *cfg, size_t batch_tokens);

/* Print the plan as `clef inspect --plan` and load (verbose) show it: one
 * line per kind of memory, then the layers streamed. */
void clef_place_plan_print(const clef_place_sizes *s, const clef_place_plan *p, FILE *f);

#endif
