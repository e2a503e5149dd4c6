/* quant_fixture.h — assemble a quantized fixture checkpoint
 * (tests/fixtures/quant/<format>/, see tests/fixtures/README.md) into a
 * temporary directory, as shared/README.md prescribes: the format's own
 * files (config.json, index, shard 2, hf_quant_config.json, goldens) plus
 * tiny-clef-omni's byte-identical shard 1, joint head and tokenizer — as
 * symlinks, so the 20 MB shard is stored once in the repository.
 *
 * int4-autoround carries its own shard 1: tiny's without the 12 BF16
 * self_attn.{q,k,v,o}_proj.weight tensors (they are INT4 in its shard 2).
 * It is rebuilt here with clef's safetensors writer and must hash to the
 * original file's SHA-256, which proves the writer reproduces the
 * safetensors library's layout byte for byte.
 *
 * Header-only (static functions) so each test program can include it.
 */
#ifndef CLEF_TESTS_QUANT_FIXTURE_H
#define CLEF_TESTS_QUANT_FIXTURE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw; define it before any include */
#endif
#include <ftw.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "io/st_write.h"
#include "testutil.h"

/* SHA-256 of shared/fixtures/quant/int4-autoround/model-00001-of-00002.safetensors. */
#define QF_INT4_SHARD1_SHA256 "ec2fc9f32a1690ce6e146506117765668623d8a558d9a3c138ea88401043cde7"

static const char *const QF_FORMATS[] = {"nvfp4-ct", "nvfp4-ct-stacked", "nvfp4-modelopt", "fp8-block",
                                         "int4-autoround"};
#define QF_N_FORMATS 5

static inline int qf_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* Remove a temporary directory tree (symlinks themselves, not targets). */
static inline void qf_remove(const char *dir) {
    if (dir) nftw(dir, qf_rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

static inline char *qf_path(const char *a, const char *b) {
    char *p = malloc(strlen(a) + strlen(b) + 2);
    sprintf(p, "%s/%s", a, b);
    return p;
}

/* Symlink <dst_dir>/<name> -> <src_dir>/<name> (absolute), if the source exists. */
static inline void qf_link(const char *src_dir, const char *dst_dir, const char *name) {
    char *src = qf_path(src_dir, name), *dst = qf_path(dst_dir, name);
    char abs[4096];
    if (access(src, F_OK) == 0) {
        assert_non_null(realpath(src, abs));
        if (symlink(abs, dst) != 0) fail_msg("symlink %s -> %s failed", dst, abs);
    }
    free(src);
    free(dst);
}

static inline void qf_sha256_file(const char *path, char hex[65]) {
    size_t len = 0;
    char *data = tu_read_file(path, &len);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    assert_int_equal(EVP_Digest(data, len, md, &md_len, EVP_sha256(), NULL), 1);
    for (unsigned i = 0; i < md_len; i++) sprintf(hex + 2 * i, "%02x", md[i]);
    free(data);
}

static inline int qf_is_attn_weight(const char *name) {
    static const char *const p[] = {".self_attn.q_proj.weight", ".self_attn.k_proj.weight",
                                    ".self_attn.v_proj.weight", ".self_attn.o_proj.weight"};
    size_t n = strlen(name);
    if (strncmp(name, "thinker.model.layers.", 21)) return 0;
    for (int i = 0; i < 4; i++)
        if (n > strlen(p[i]) && !strcmp(name + n - strlen(p[i]), p[i])) return 1;
    return 0;
}

/* Write `dst`: the tensors of safetensors file `src` except the decoder's
 * attention projection weights. */
static inline void qf_write_int4_shard1(const char *src, const char *dst) {
    st_file f;
    clef_err err;
    clef_err_clear(&err);
    if (st_open(src, &f, &err)) fail_msg("%s", err.message);
    st_wtensor *t = calloc(f.n, sizeof *t);
    const void **d = calloc(f.n, sizeof *d);
    size_t n = 0;
    for (size_t i = 0; i < f.n; i++) {
        if (qf_is_attn_weight(f.tensors[i].name)) continue;
        t[n].name = f.tensors[i].name;
        t[n].dtype = f.tensors[i].dtype;
        t[n].ndim = f.tensors[i].ndim;
        memcpy(t[n].shape, f.tensors[i].shape, sizeof t[n].shape);
        d[n++] = f.tensors[i].data;
    }
    assert_int_equal(f.n - n, 12);
    static const char *const meta[] = {"format", "pt", NULL};
    if (st_save(dst, t, d, n, meta, &err)) fail_msg("%s", err.message);
    free(t);
    free(d);
    st_close(&f);
}

/* A fresh directory holding the assembled checkpoint of fixture `format`;
 * the caller removes it with qf_remove and frees the string. */
static inline char *qf_assemble(const char *format) {
    char tmpl[] = "/tmp/clef_quant_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char *dir = strdup(tmpl);
    char *tiny = tu_fixture("tiny-clef-omni");
    char rel[256];
    snprintf(rel, sizeof rel, "quant/%s", format);
    char *own = tu_fixture(rel);
    static const char *const own_files[] = {"config.json", "model.safetensors.index.json",
                                            "model-00002-of-00002.safetensors", "hf_quant_config.json",
                                            "goldens.jsonl"};
    for (size_t i = 0; i < sizeof own_files / sizeof own_files[0]; i++) qf_link(own, dir, own_files[i]);
    static const char *const tiny_files[] = {"joint_head.safetensors", "joint_head_config.json", "tokenizer.json"};
    for (size_t i = 0; i < sizeof tiny_files / sizeof tiny_files[0]; i++) qf_link(tiny, dir, tiny_files[i]);
    if (!strcmp(format, "int4-autoround")) {
        char *src = qf_path(tiny, "model-00001-of-00002.safetensors");
        char *dst = qf_path(dir, "model-00001-of-00002.safetensors");
        qf_write_int4_shard1(src, dst);
        char hex[65];
        qf_sha256_file(dst, hex);
        assert_string_equal(hex, QF_INT4_SHARD1_SHA256);
        free(src);
        free(dst);
    } else {
        qf_link(tiny, dir, "model-00001-of-00002.safetensors");
    }
    free(tiny);
    free(own);
    return dir;
}

#endif
