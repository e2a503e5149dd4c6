/* numerics.h — the numeric modes of the device backends, named once for
 * every command (`--numerics fast|balanced|precise`), the engine
 * (clef_engine_options.numerics) and the CUDA backend (cuda.h).
 *
 * The CPU backend always computes in f32 from the bf16 weights (the
 * reference's numbers); the modes choose how a GPU feeds activations to its
 * tensor cores:
 *   fast      (the default) activations rounded to bf16.  On the `small`
 *             preset over bench/parity/requests_200.jsonl it agrees with the
 *             f32 answers on 91.0% of questions, mean total-variation distance
 *             0.0129 (H200): closer to f32 than the reference's own bf16
 *             deployment (84.7-87.1%, mean TV 0.016), which is the bar a
 *             default must clear (clef_numerics_bar).
 *   balanced  dense products and attention split into bf16 [hi | lo] halves
 *             (f32-level), bf16 activations into the expert GEMMs: 99.2%,
 *             mean TV 0.0015.
 *   precise   every product split: f32-level agreement (100%, mean TV
 *             0.00013); its bar is top-1 >= 99.5%, mean TV <= 0.001.
 * Where a setting comes from, strongest first: the command's --numerics
 * (or the engine/backend option), then the environment (CLEF_CUDA_PRECISE,
 * then CLEF_CUDA_NUMERICS: backend/cuda/cuda_env.h), then fast. */
#ifndef CLEF_BACKEND_NUMERICS_H
#define CLEF_BACKEND_NUMERICS_H

/* A mode, or CLEF_NUMERICS_ENV = "not set here: the environment, else the
 * default" (so that a zeroed options struct means the default). */
typedef enum clef_numerics {
    CLEF_NUMERICS_ENV = 0,
    CLEF_NUMERICS_FAST = 1,
    CLEF_NUMERICS_BALANCED = 2,
    CLEF_NUMERICS_PRECISE = 3,
} clef_numerics;

/* The mode a backend runs when neither an option nor the environment names one. */
#define CLEF_NUMERICS_DEFAULT CLEF_NUMERICS_FAST

/* Bits of a mode's precise parts: which products run split (hi + lo bf16 halves). */
enum { CLEF_PRECISE_DENSE = 1, CLEF_PRECISE_EXPERTS = 2, CLEF_PRECISE_ATTN = 4, CLEF_PRECISE_ALL = 7 };

/* "fast", "balanced" or "precise" -> *out (returns 0); anything else (NULL,
 * "", other case, "exact") returns -1 and leaves *out alone. */
int clef_numerics_parse(const char *name, clef_numerics *out);

/* The mode's name ("fast", "balanced", "precise"); CLEF_NUMERICS_ENV gives
 * "default". */
const char *clef_numerics_name(clef_numerics m);

/* The precise parts (CLEF_PRECISE_* bits) of a mode: fast 0, balanced
 * dense + attention, precise all.  CLEF_NUMERICS_ENV gives the default's. */
unsigned clef_numerics_parts(clef_numerics m);

/* The accuracy bar a mode must meet against the f32 answers on `small`
 * (`clef devcheck`): top-1 agreement >= *min_agree (a fraction) and mean
 * total-variation distance <= *max_tv.  precise: 0.995 / 0.001 (f32-level
 * agreement); fast and balanced: the reference's bf16 deployment measured
 * against f32 on the same 200 requests, 0.871 / 0.0159 (its best
 * configuration, eager experts; docs/BENCHMARKS.md). */
void clef_numerics_bar(clef_numerics m, double *min_agree, double *max_tv);

#endif
