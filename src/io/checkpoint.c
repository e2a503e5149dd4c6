/* checkpoint.c — open a Clef-Omni checkpoint directory (SPEC.md §1.1).
 *
 * Order: config files, then the thinker shards named by the index (or the
 * single model.safetensors), then joint_head.safetensors; then one sorted
 * catalog over all kept tensors, checked for duplicates and against the
 * index's weight_map.
 */
#include "io/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json/json.h"
#include "util/buf.h"
#include "util/file.h"

#define INDEX_FILE "model.safetensors.index.json"
#define SINGLE_FILE "model.safetensors"
#define HEAD_FILE "joint_head.safetensors"

/* Speech-output parts of the original release; the thinker never uses them. */
static int is_skipped(const char *name) {
    return strncmp(name, "talker.", 7) == 0 || strncmp(name, "code2wav.", 9) == 0;
}

static const char *path_basename(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Whether `dir/name` exists (no open: a FIFO would block; the reader
 * refuses anything but a regular file). */
static int file_exists(const char *dir, const char *name) {
    char *p = clef_path_join(dir, name);
    int ok = access(p, F_OK) == 0;
    free(p);
    return ok;
}

/* Open `dir/name` as the next shard. */
static int open_shard(clef_checkpoint *ck, const char *name, clef_err *err) {
    char *p = clef_path_join(ck->dir, name);
    int rc = st_open(p, &ck->shards[ck->n_shards], err);
    free(p);
    if (rc == 0) ck->n_shards++;
    return rc;
}

/* A shard name from the index must be a plain file in the directory. */
static int check_shard_name(const json_value *v, const char *tensor, clef_err *err) {
    if (v->type != JSON_STRING)
        return clef_fail_file(err, INDEX_FILE, "weight_map entry for tensor '%s' is not a string", tensor);
    if (v->len == 0 || strlen(v->str) != v->len || strchr(v->str, '/') || strcmp(v->str, ".") == 0 ||
        strcmp(v->str, "..") == 0)
        return clef_fail_file(err, INDEX_FILE, "weight_map entry for tensor '%s' is not a plain file name: '%s'",
                              tensor, v->str);
    return 0;
}

/* The distinct shard names of the kept (non-skipped) index entries, in
 * first-occurrence order.  Returns the count, or -1 with err.  `names` point
 * into `wm`. */
static long distinct_shards(const json_value *wm, const char ***names, clef_err *err) {
    *names = clef_xcalloc(wm->n ? wm->n : 1, sizeof **names);
    long n = 0;
    for (size_t i = 0; i < wm->n; i++) {
        if (is_skipped(wm->keys[i])) continue;
        if (check_shard_name(wm->items[i], wm->keys[i], err) != 0) return -1;
        long j = 0;
        while (j < n && strcmp((*names)[j], wm->items[i]->str) != 0)
            j++;
        if (j == n) (*names)[n++] = wm->items[i]->str;
    }
    return n;
}

/* Read the index and open every shard it names (once each).  On success
 * *index_out holds the parsed index (the caller frees it). */
static int open_indexed_shards(clef_checkpoint *ck, json_value **index_out, clef_err *err) {
    size_t len = 0;
    char *text = clef_read_text_file(ck->dir, INDEX_FILE, CLEF_FILE_MAX_INDEX, &len, err);
    if (!text) return -1;
    clef_err jerr;
    clef_err_clear(&jerr);
    json_value *index = json_parse(text, len, &jerr);
    free(text);
    if (!index) return clef_fail_file(err, INDEX_FILE, "not valid JSON: %s", jerr.message);
    const json_value *wm = json_get(index, "weight_map");
    const json_value *meta = json_get(index, "metadata");
    const char **names = NULL;
    int rc = -1;
    if (index->type != JSON_OBJECT || !wm || wm->type != JSON_OBJECT) {
        clef_fail_file(err, INDEX_FILE, "\"weight_map\" is missing or not an object");
    } else if (meta && meta->type != JSON_OBJECT && meta->type != JSON_NULL) {
        clef_fail_file(err, INDEX_FILE, "\"metadata\" is not an object");
    } else {
        long n = distinct_shards(wm, &names, err);
        if (n == 0) clef_fail_file(err, INDEX_FILE, "weight_map names no thinker tensors");
        if (n > 0) {
            ck->shards = clef_xcalloc((size_t)n + 1, sizeof *ck->shards); /* +1: the head */
            rc = 0;
            for (long i = 0; i < n && rc == 0; i++)
                rc = open_shard(ck, names[i], err);
        }
    }
    free(names);
    if (rc != 0) {
        json_free(index);
        return -1;
    }
    *index_out = index;
    return 0;
}

static int catalog_cmp(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Which shard holds catalog entry `t` (by address range). */
static const st_file *shard_of(const clef_checkpoint *ck, const st_tensor *t) {
    for (size_t s = 0; s < ck->n_shards; s++)
        if (t >= ck->shards[s].tensors && t < ck->shards[s].tensors + ck->shards[s].n) return &ck->shards[s];
    return NULL;
}

/* Sorted catalog of every kept tensor of every shard; a name present twice
 * is an error (which copy the reference would load is ill-defined). */
static int build_catalog(clef_checkpoint *ck, clef_err *err) {
    size_t total = 0;
    for (size_t s = 0; s < ck->n_shards; s++)
        total += ck->shards[s].n;
    ck->catalog = clef_xcalloc(total ? total : 1, sizeof *ck->catalog);
    for (size_t s = 0; s < ck->n_shards; s++)
        for (size_t i = 0; i < ck->shards[s].n; i++)
            if (!is_skipped(ck->shards[s].tensors[i].name)) ck->catalog[ck->n_tensors++] = &ck->shards[s].tensors[i];
    qsort(ck->catalog, ck->n_tensors, sizeof *ck->catalog, catalog_cmp);
    for (size_t i = 1; i < ck->n_tensors; i++)
        if (strcmp(ck->catalog[i - 1]->name, ck->catalog[i]->name) == 0)
            return clef_fail_file(err, path_basename(shard_of(ck, ck->catalog[i])->path),
                                  "tensor '%s' is also in %s (duplicate name)", ck->catalog[i]->name,
                                  path_basename(shard_of(ck, ck->catalog[i - 1])->path));
    return 0;
}

/* Every kept tensor the index names must be in the shard it names. */
static int check_weight_map(const clef_checkpoint *ck, const json_value *index, clef_err *err) {
    const json_value *wm = json_get(index, "weight_map");
    for (size_t i = 0; i < wm->n; i++) {
        const char *name = wm->keys[i], *shard = wm->items[i]->str;
        if (is_skipped(name)) continue;
        const st_tensor *t = clef_checkpoint_find(ck, name);
        const st_file *f = t ? shard_of(ck, t) : NULL;
        if (!f || strcmp(path_basename(f->path), shard) != 0)
            return clef_fail_file(err, INDEX_FILE, "weight_map puts tensor '%s' in %s, but %s", name, shard,
                                  f ? "it is in another shard" : "that shard does not contain it");
    }
    return 0;
}

int clef_checkpoint_open(const char *dir, clef_checkpoint *ck, clef_err *err) {
    memset(ck, 0, sizeof *ck);
    /* "m/" names the same directory as "m": without the trailing slashes,
     * file names join cleanly and the directory's base name (in messages) is
     * "m", not "". */
    ck->dir = clef_xstrndup(dir, clef_path_trim_len(dir));
    dir = ck->dir;
    if (clef_config_load(dir, &ck->config, err) != 0) goto fail;
    json_value *index = NULL;
    if (file_exists(dir, INDEX_FILE)) {
        if (open_indexed_shards(ck, &index, err) != 0) goto fail;
    } else if (file_exists(dir, SINGLE_FILE)) {
        ck->shards = clef_xcalloc(2, sizeof *ck->shards);
        if (open_shard(ck, SINGLE_FILE, err) != 0) goto fail;
    } else {
        clef_fail_file(err, dir, "neither " INDEX_FILE " nor " SINGLE_FILE " found");
        goto fail;
    }
    int rc = open_shard(ck, HEAD_FILE, err);
    if (rc == 0) rc = build_catalog(ck, err);
    if (rc == 0 && index) rc = check_weight_map(ck, index, err);
    json_free(index);
    if (rc == 0) return 0;
fail:
    clef_checkpoint_close(ck);
    return -1;
}

void clef_checkpoint_close(clef_checkpoint *ck) {
    if (!ck) return;
    for (size_t s = 0; s < ck->n_shards; s++)
        st_close(&ck->shards[s]);
    free(ck->shards);
    free(ck->catalog);
    free(ck->dir);
    free(ck->config_json);
    free(ck->hf_quant_json);
    memset(ck, 0, sizeof *ck);
}

static int find_cmp(const void *key, const void *elem) {
    return strcmp((const char *)key, (*(const st_tensor *const *)elem)->name);
}

const st_tensor *clef_checkpoint_find(const clef_checkpoint *ck, const char *name) {
    if (!ck->catalog || !name) return NULL;
    const st_tensor *const *hit = bsearch(name, ck->catalog, ck->n_tensors, sizeof *ck->catalog, find_cmp);
    return hit ? *hit : NULL;
}

/* "BF16 or F16" from a dtype mask. */
static void mask_str(unsigned mask, char *out, size_t cap) {
    size_t k = 0;
    out[0] = '\0';
    for (int t = 0; t < CLEF_DT_COUNT && k < cap; t++)
        if (mask & CLEF_DT_BIT(t))
            k += (size_t)snprintf(out + k, cap - k, "%s%s", k ? " or " : "", clef_dtype_name((clef_dtype)t));
}

const st_tensor *clef_checkpoint_require(const clef_checkpoint *ck, const char *name, unsigned allowed_dtypes_mask,
                                         int ndim, const int64_t *shape, clef_err *err) {
    const st_tensor *t = clef_checkpoint_find(ck, name);
    const char *dir = ck->dir ? path_basename(ck->dir) : "checkpoint";
    if (!t) {
        clef_fail_file(err, dir, "tensor '%s' not found in the checkpoint", name);
        return NULL;
    }
    if (allowed_dtypes_mask && !(allowed_dtypes_mask & CLEF_DT_BIT(t->dtype))) {
        char want[128];
        mask_str(allowed_dtypes_mask, want, sizeof want);
        clef_fail_file(err, path_basename(shard_of(ck, t)->path), "tensor '%s': expected dtype %s, found %s", name,
                       want, clef_dtype_name(t->dtype));
        return NULL;
    }
    if (ndim < 0) return t;
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char want[ST_SHAPE_STR_MAX], have[ST_SHAPE_STR_MAX];
        st_shape_str(shape, ndim > CLEF_MAX_DIMS ? CLEF_MAX_DIMS : ndim, want, sizeof want);
        st_shape_str(t->shape, t->ndim, have, sizeof have);
        clef_fail_file(err, path_basename(shard_of(ck, t)->path), "tensor '%s': expected shape %s, found %s", name,
                       want, have);
        return NULL;
    }
    return t;
}
