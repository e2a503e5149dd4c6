/* fuzz_safetensors.c — libFuzzer target for what a checkpoint's files make
 * the loader do before any weight is used (issue 15):
 *   mode 0 (first byte even): the rest is one .safetensors file, st_open'ed
 *     (header length, JSON header, dtypes, shapes, offsets, overlaps); when
 *     it opens, every tensor's bytes are read (an offset past the map would
 *     fault) and the finiteness scan runs over them;
 *   mode 1 (odd): the rest is model.safetensors.index.json of a checkpoint
 *     directory whose other files are the tiny fixture's (symlinks), opened
 *     with clef_checkpoint_open (weight_map types, shard names incl. path
 *     traversal, missing shards, tensors in the wrong shard, duplicates).
 * Every failure must be a 500 with a message; a success must be
 * self-consistent.  Seeds: make fuzz writes the fixture's index and small
 * safetensors files (seed_loader.c).  Build and run: `make fuzz`.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "fuzz_check.h"

#ifndef CLEF_FIXTURES
#define CLEF_FIXTURES "tests/fixtures"
#endif

static char dir[64], st_path[128], index_path[128];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    snprintf(dir, sizeof dir, "/tmp/clef-fuzz-st-%d", (int)getpid());
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    if (system(cmd) != 0) abort();
    static const char *const files[] = {"config.json", "joint_head_config.json", "joint_head.safetensors",
                                        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char src[4096], dst[256];
        snprintf(src, sizeof src, "%s/tiny-clef-omni/%s", CLEF_FIXTURES, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        char *abs = realpath(src, NULL);
        if (!abs || symlink(abs, dst) != 0) abort();
        free(abs);
    }
    snprintf(st_path, sizeof st_path, "%s/fuzz.safetensors", dir);
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    return 0;
}

static void write_file(const char *path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) abort();
}

static void fuzz_file(const uint8_t *data, size_t n) {
    write_file(st_path, data, n);
    st_file f;
    clef_err err;
    clef_err_clear(&err);
    if (st_open(st_path, &f, &err) != 0) {
        CHECK(err.status == 500 && err.message[0]);
        return;
    }
    const st_tensor **cat = calloc(f.n ? f.n : 1, sizeof *cat);
    volatile unsigned sum = 0;
    for (size_t i = 0; i < f.n; i++) {
        const st_tensor *t = &f.tensors[i];
        CHECK((const char *)t->data >= (const char *)f.map && t->nbytes <= f.size);
        CHECK((const char *)t->data + t->nbytes <= (const char *)f.map + f.size);
        CHECK(t->nbytes == t->numel * clef_dtype_size(t->dtype));
        for (size_t b = 0; b < t->nbytes; b++) sum += ((const unsigned char *)t->data)[b];
        CHECK(st_find(&f, t->name) != NULL);
        cat[i] = t;
    }
    clef_checkpoint ck = {.n_shards = 1, .shards = &f, .n_tensors = f.n, .catalog = cat};
    clef_err_clear(&err);
    if (clef_checkpoint_check_finite(&ck, 0, 1, NULL, &err) != 0) CHECK(err.status == 500 && strstr(err.message, "non-finite"));
    free(cat);
    st_close(&f);
}

static void fuzz_index(const uint8_t *data, size_t n) {
    write_file(index_path, data, n);
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    if (clef_checkpoint_open(dir, &ck, &err) != 0) {
        CHECK(err.status == 500 && err.message[0]);
        return;
    }
    CHECK(ck.n_shards >= 2); /* a thinker shard and the head */
    for (size_t i = 0; i < ck.n_tensors; i++) CHECK(clef_checkpoint_find(&ck, ck.catalog[i]->name) == ck.catalog[i]);
    clef_checkpoint_close(&ck);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1u << 20)) return 0;
    if (data[0] & 1)
        fuzz_index(data + 1, size - 1);
    else
        fuzz_file(data + 1, size - 1);
    return 0;
}
