/* summary.h — what a checkpoint's weights will occupy once bound: per weight
 * type (plain / NVFP4 / FP8 block / INT4), the decoder's Linear modules and
 * their packed bytes, for `clef inspect` and memory planning.
 */
#ifndef CLEF_QUANT_SUMMARY_H
#define CLEF_QUANT_SUMMARY_H

#include <stddef.h>

#include "quant/qweight.h"

struct clef_checkpoint;

typedef struct clef_quant_summary {
    size_t modules[CLEF_QT_COUNT]; /* decoder Linear modules (attention, router, experts, dense MLP) per type */
    size_t bytes[CLEF_QT_COUNT];   /* their bytes in memory: packed data + scales (plain: as stored) */
    size_t expert_modules;         /* of which routed expert projections */
    size_t expert_bytes;
    size_t linear_bf16_bytes;      /* what the same modules take in BF16 */
    size_t other_bytes;            /* every other tensor the model binds, as stored: embeddings, lm_head,
                                      norms, the joint head */
} clef_quant_summary;

/* Bind (clef_qweight_bind) every decoder Linear module the config names and
 * add up the sizes.  Errors are the binding's (500, naming the tensor). */
int clef_quant_summarize(const struct clef_checkpoint *ck, const clef_quant_config *qc, clef_quant_summary *s,
                         clef_err *err);

#endif
