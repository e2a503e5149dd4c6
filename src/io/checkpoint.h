/* checkpoint.h — a Clef-Omni checkpoint directory (SPEC.md §1.1).
 *
 * Opens config.json, model.safetensors.index.json (or a single
 * model.safetensors), every shard it names, and joint_head.safetensors, and
 * builds one catalog of tensors by name.  Tensors named `talker.*` and
 * `code2wav.*` are skipped.  The index's weight_map must agree with the
 * shards (a tensor the index names must be in that shard).
 */
#ifndef CLEF_IO_CHECKPOINT_H
#define CLEF_IO_CHECKPOINT_H

#include <stddef.h>

#include "io/config.h"
#include "io/safetensors.h"
#include "util/err.h"

typedef struct clef_checkpoint {
    char *dir;                 /* owned */
    clef_config config;        /* thinker text config + head config */
    size_t n_shards;
    st_file *shards;           /* [n_shards] thinker shards, then joint_head.safetensors last */
    size_t n_tensors;          /* catalog size (skipped tensors excluded) */
    const st_tensor **catalog; /* sorted by name for bsearch; points into shards */
} clef_checkpoint;

/* Open `dir`.  Returns 0 or -1 with err (500, message naming the file). */
int clef_checkpoint_open(const char *dir, clef_checkpoint *ck, clef_err *err);
void clef_checkpoint_close(clef_checkpoint *ck);

/* Tensor by name (thinker names carry the "thinker." prefix; head names are
 * bare as in joint_head.safetensors), or NULL. */
const st_tensor *clef_checkpoint_find(const clef_checkpoint *ck, const char *name);

/* Like clef_checkpoint_find, but an absent tensor, a dtype not in
 * `allowed_dtypes_mask` (bit i = clef_dtype i; 0 = any), or a shape differing
 * from `shape[0..ndim)` is an error naming the tensor and what was expected. */
const st_tensor *clef_checkpoint_require(const clef_checkpoint *ck, const char *name, unsigned allowed_dtypes_mask,
                                         int ndim, const int64_t *shape, clef_err *err);

#endif
