/* test_safetensors.c — st_open validation on synthetic files (SPEC.md §10.1)
 * and the real tiny fixture's shards. */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/clef_st_XXXXXX";

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }

static int setup(void **state) { return mkdtemp(tmpdir) ? 0 : -1; }

static int teardown(void **state) { return nftw(tmpdir, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

/* Write <tmpdir>/<name>: u64 LE header length `hlen` (or strlen(header) when
 * hlen is UINT64_MAX), the header text, then `data_len` bytes (0,1,2,...).
 * Returns the heap path. */
static char *write_st_raw(const char *name, const char *header, uint64_t hlen, size_t data_len) {
    char *path = malloc(strlen(tmpdir) + strlen(name) + 2);
    sprintf(path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = hlen == UINT64_MAX ? strlen(header) : hlen;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(n >> (8 * i));
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, strlen(header), f), strlen(header));
    for (size_t i = 0; i < data_len; i++)
        fputc((int)(i & 0xff), f);
    fclose(f);
    return path;
}

static char *write_st(const char *name, const char *header, size_t data_len) {
    return write_st_raw(name, header, UINT64_MAX, data_len);
}

/* st_open must fail with 500 internal_error and a message containing every
 * one of the given fragments (NULL-terminated list). */
static void expect_open_error(const char *path, ...) {
    st_file f;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(st_open(path, &f, &err), -1);
    assert_int_equal(err.status, 500);
    assert_string_equal(err.type, CLEF_E_INTERNAL);
    assert_null(f.map);
    assert_int_equal(f.n, 0);
    va_list ap;
    va_start(ap, path);
    for (const char *frag; (frag = va_arg(ap, const char *)) != NULL;)
        if (!strstr(err.message, frag)) fail_msg("message '%s' lacks '%s'", err.message, frag);
    va_end(ap);
}

static void test_valid_file(void **state) {
    /* Two BF16 tensors and a 0-d F32 scalar, header padded with spaces. */
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                      "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[12,16]},"
                      "\"e\":{\"dtype\":\"I64\",\"shape\":[0,5],\"data_offsets\":[16,16]}}      ";
    char *path = write_st("ok.safetensors", hdr, 16);
    st_file f;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(st_open(path, &f, &err), 0);
    assert_int_equal(f.n, 3);
    const st_tensor *a = st_find(&f, "a");
    assert_non_null(a);
    assert_int_equal(a->dtype, CLEF_DT_BF16);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->numel, 6);
    assert_int_equal(a->nbytes, 12);
    size_t hlen = strlen(hdr);
    assert_int_equal(f.size, 8 + hlen + 16);
    assert_ptr_equal(a->data, (const char *)f.map + 8 + hlen);
    assert_int_equal(((const unsigned char *)a->data)[1], 1);
    const st_tensor *s = st_find(&f, "s");
    assert_non_null(s);
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->numel, 1);
    assert_int_equal(s->nbytes, 4);
    assert_int_equal(((const unsigned char *)s->data)[0], 12);
    const st_tensor *e = st_find(&f, "e");
    assert_non_null(e);
    assert_int_equal(e->numel, 0);
    assert_null(st_find(&f, "__metadata__"));
    assert_null(st_find(&f, "missing"));
    st_close(&f);
    assert_null(f.map);
    st_close(&f); /* idempotent */
    free(path);
}

static void test_empty_header_object(void **state) {
    char *path = write_st("empty.safetensors", "{}", 0);
    st_file f;
    clef_err err;
    assert_int_equal(st_open(path, &f, &err), 0);
    assert_int_equal(f.n, 0);
    st_close(&f);
    free(path);
}

static void test_truncated_data(void **state) {
    char *path = write_st("trunc.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 10);
    expect_open_error(path, "trunc.safetensors", "tensor 'w'", "[0,16)", "10 bytes", NULL);
    free(path);
}

static void test_overlap(void **state) {
    char *path = write_st("overlap.safetensors",
                          "{\"x\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                          "\"y\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]}}",
                          16);
    expect_open_error(path, "overlap.safetensors", "tensor 'y'", "overlap tensor 'x'", NULL);
    free(path);
    /* Containment, listed out of offset order. */
    path = write_st("overlap2.safetensors",
                    "{\"in\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                    "\"out\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                    16);
    expect_open_error(path, "overlap2.safetensors", "tensor 'in'", "overlap tensor 'out'", NULL);
    free(path);
}

static void test_adjacent_and_gaps_ok(void **state) {
    char *path = write_st("gaps.safetensors",
                          "{\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]},"
                          "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                          "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[5,5]},"
                          "\"c\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[10,12]}}",
                          12);
    st_file f;
    clef_err err;
    assert_int_equal(st_open(path, &f, &err), 0);
    assert_int_equal(f.n, 4);
    assert_string_equal(f.tensors[0].name, "b"); /* header order kept */
    st_close(&f);
    free(path);
}

static void test_shape_size_mismatch(void **state) {
    char *path =
        write_st("mismatch.safetensors", "{\"t\":{\"dtype\":\"BF16\",\"shape\":[2,4],\"data_offsets\":[0,12]}}", 16);
    expect_open_error(path, "mismatch.safetensors", "tensor 't'", "[0,12)", "[2,4] x BF16 = 16 bytes", NULL);
    free(path);
}

static void test_header_past_end(void **state) {
    const char *hdr = "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    char *path = write_st_raw("longhdr.safetensors", hdr, strlen(hdr) + 100, 1);
    expect_open_error(path, "longhdr.safetensors", "header length", "past the end", NULL);
    free(path);
    /* Huge length (would wrap a naive 8+N addition). */
    path = write_st_raw("hugehdr.safetensors", hdr, UINT64_MAX - 3, 1);
    expect_open_error(path, "hugehdr.safetensors", "header length", NULL);
    free(path);
}

static void test_header_over_limit(void **state) {
    /* A sparse 101 MiB file whose header length claims all of it. */
    char *path = malloc(strlen(tmpdir) + 32);
    sprintf(path, "%s/big.safetensors", tmpdir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = 101ull << 20;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(n >> (8 * i));
    fwrite(len8, 1, 8, f);
    fclose(f);
    assert_int_equal(truncate(path, (off_t)(n + 8)), 0);
    expect_open_error(path, "big.safetensors", "100 MiB", NULL);
    free(path);
}

static void test_too_short(void **state) {
    char *path = malloc(strlen(tmpdir) + 32);
    sprintf(path, "%s/short.safetensors", tmpdir);
    FILE *f = fopen(path, "wb");
    fwrite("\x02\0\0", 1, 3, f);
    fclose(f);
    expect_open_error(path, "short.safetensors", "8-byte", NULL);
    free(path);
}

static void test_unknown_dtype(void **state) {
    char *path =
        write_st("dtype.safetensors", "{\"q\":{\"dtype\":\"F8_E5M2\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
    expect_open_error(path, "dtype.safetensors", "tensor 'q'", "F8_E5M2", NULL);
    free(path);
}

static void test_not_json(void **state) {
    char *path = write_st("notjson.safetensors", "{\"q\":{\"dtype\":\"U8\",", 2);
    expect_open_error(path, "notjson.safetensors", "not valid JSON", NULL);
    free(path);
    path = write_st("array.safetensors", "[1,2]", 0);
    expect_open_error(path, "array.safetensors", "not a JSON object", NULL);
    free(path);
}

static void test_bad_shapes(void **state) {
    char *path = write_st("neg.safetensors", "{\"n\":{\"dtype\":\"U8\",\"shape\":[2,-1],\"data_offsets\":[0,2]}}", 2);
    expect_open_error(path, "neg.safetensors", "tensor 'n'", "shape[1]", NULL);
    free(path);
    path = write_st("float.safetensors", "{\"n\":{\"dtype\":\"U8\",\"shape\":[2.0],\"data_offsets\":[0,2]}}", 2);
    expect_open_error(path, "float.safetensors", "tensor 'n'", "shape[0]", NULL);
    free(path);
    path = write_st("dims.safetensors",
                    "{\"n\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1);
    expect_open_error(path, "dims.safetensors", "tensor 'n'", "9 dimensions", NULL);
    free(path);
    /* 2^32 * 2^32 overflows a 64-bit element count. */
    path = write_st("ovf.safetensors",
                    "{\"n\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,1]}}", 1);
    expect_open_error(path, "ovf.safetensors", "tensor 'n'", "overflow", NULL);
    free(path);
    path = write_st("noshape.safetensors", "{\"n\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1);
    expect_open_error(path, "noshape.safetensors", "tensor 'n'", "shape", NULL);
    free(path);
}

static void test_bad_offsets(void **state) {
    char *path = write_st("rev.safetensors", "{\"r\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,2]}}", 8);
    expect_open_error(path, "rev.safetensors", "tensor 'r'", "[4,2)", NULL);
    free(path);
    path = write_st("three.safetensors", "{\"r\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 8);
    expect_open_error(path, "three.safetensors", "tensor 'r'", "data_offsets", NULL);
    free(path);
    path = write_st("negoff.safetensors", "{\"r\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 8);
    expect_open_error(path, "negoff.safetensors", "tensor 'r'", "data_offsets", NULL);
    free(path);
}

static void test_bad_metadata(void **state) {
    char *path = write_st("meta.safetensors", "{\"__metadata__\":{\"format\":1}}", 0);
    expect_open_error(path, "meta.safetensors", "__metadata__", "format", NULL);
    free(path);
}

static void test_missing_file(void **state) {
    expect_open_error("/nonexistent/dir/gone.safetensors", "gone.safetensors", "cannot open", NULL);
}

/* The tiny fixture's two thinker shards and the head (SPEC §7.2). */
static void test_fixture_shards(void **state) {
    char *p1 = tu_fixture("tiny-clef-omni/model-00001-of-00002.safetensors");
    char *p2 = tu_fixture("tiny-clef-omni/model-00002-of-00002.safetensors");
    char *ph = tu_fixture("tiny-clef-omni/joint_head.safetensors");
    st_file s1, s2, h;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(st_open(p1, &s1, &err), 0);
    assert_int_equal(st_open(p2, &s2, &err), 0);
    assert_int_equal(st_open(ph, &h, &err), 0);
    assert_int_equal(s1.n, 138);
    assert_int_equal(s2.n, 72);
    assert_int_equal(h.n, 122);

    const st_tensor *emb = st_find(&s1, "thinker.model.embed_tokens.weight");
    assert_non_null(emb);
    assert_int_equal(emb->dtype, CLEF_DT_BF16);
    assert_int_equal(emb->ndim, 2);
    assert_int_equal(emb->shape[0], 152064);
    assert_int_equal(emb->shape[1], 32);
    assert_int_equal(emb->nbytes, 152064 * 32 * 2);
    /* data_offsets [9781312, 19513408) after a 15048-byte header */
    assert_ptr_equal(emb->data, (const char *)s1.map + 8 + 15048 + 9781312);

    const st_tensor *q = st_find(&s1, "thinker.model.layers.0.self_attn.q_proj.weight");
    assert_non_null(q);
    assert_int_equal(q->shape[0], 64);
    assert_int_equal(q->shape[1], 32);

    const st_tensor *ex = st_find(&s2, "thinker.model.layers.1.mlp.experts.3.down_proj.weight");
    assert_non_null(ex);
    assert_int_equal(ex->ndim, 2);
    assert_int_equal(ex->shape[0], 32);
    assert_int_equal(ex->shape[1], 16);
    assert_null(st_find(&s1, "thinker.model.layers.1.mlp.experts.3.down_proj.weight"));

    const st_tensor *in_proj = st_find(&h, "evidence_layers.0.attention.in_proj_weight");
    assert_non_null(in_proj);
    assert_int_equal(in_proj->shape[0], 192);
    assert_int_equal(in_proj->shape[1], 64);
    const st_tensor *scale = st_find(&h, "joint_logit_scale");
    assert_non_null(scale);
    assert_int_equal(scale->ndim, 0);
    assert_int_equal(scale->nbytes, 2);
    for (size_t i = 0; i < h.n; i++)
        assert_int_equal(h.tensors[i].dtype, CLEF_DT_BF16);

    st_close(&s1);
    st_close(&s2);
    st_close(&h);
    free(p1);
    free(p2);
    free(ph);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file),
        cmocka_unit_test(test_empty_header_object),
        cmocka_unit_test(test_truncated_data),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_adjacent_and_gaps_ok),
        cmocka_unit_test(test_shape_size_mismatch),
        cmocka_unit_test(test_header_past_end),
        cmocka_unit_test(test_header_over_limit),
        cmocka_unit_test(test_too_short),
        cmocka_unit_test(test_unknown_dtype),
        cmocka_unit_test(test_not_json),
        cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_bad_offsets),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_fixture_shards),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
