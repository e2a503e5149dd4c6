/* seed_loader.c — seed corpora for the loader fuzz targets:
 *   seed_loader FIXTURES OUT
 * writes OUT/safetensors (mode byte 0 + small safetensors files of every
 * dtype, mode byte 1 + the tiny fixture's index and broken variants),
 * OUT/config (the tiny and quantized fixtures' configs with their mode
 * bytes), OUT/tokenizer (small tokenizer.json files of the shape SPEC §5
 * allows) and OUT/tokenize-long (texts and run-length programs). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/st_write.h"
#include "util/buf.h"

static const char *out_root;

static void put(const char *sub, const char *name, char mode, const void *data, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out_root, sub);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof path, "%s/%s/%s", out_root, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || (mode >= 0 && fputc(mode, f) == EOF) || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    clef_buf b = {0};
    char chunk[65536];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) clef_buf_append(&b, chunk, k);
    fclose(f);
    *n = b.len;
    return b.data;
}

static void put_file(const char *sub, const char *name, char mode, const char *fixtures, const char *rel) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", fixtures, rel);
    size_t n;
    char *d = slurp(path, &n);
    put(sub, name, mode, d, n);
    free(d);
}

/* A small safetensors file of the given tensors, via the project's writer. */
static void put_st(const char *name, const st_wtensor *t, size_t n) {
    char tmp[] = "/tmp/clef-seed-XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0) exit(1);
    const void *datas[16];
    static unsigned char bytes[16][4096];
    for (size_t i = 0; i < n; i++) {
        for (size_t b = 0; b < sizeof bytes[i]; b++) bytes[i][b] = (unsigned char)(b * 37 + i); /* finite and not */
        datas[i] = bytes[i];
    }
    static const char *const meta[] = {"format", "pt", NULL};
    clef_err err;
    if (st_save(tmp, t, datas, n, meta, &err) != 0) {
        fprintf(stderr, "seed_loader: %s\n", err.message);
        exit(1);
    }
    size_t len;
    char *d = slurp(tmp, &len);
    put("safetensors", name, 0, d, len);
    free(d);
    remove(tmp);
}

static const char TOKENIZER_HEAD[] = "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":300,\"content\":\"<s>\",\"single_word\":false,"
                                     "\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],";
static const char QWEN2_SPLIT[] =
    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|"
    "\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\","
    "\"invert\":false}";

/* The 256 byte-level symbols (GPT-2 mapping) as "sym":id entries. */
static void byte_vocab(clef_buf *b) {
    int n = 0;
    for (int byte = 0; byte < 256; byte++) {
        int kept = (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF);
        unsigned cp = (unsigned)byte;
        if (!kept) cp = 0x100 + (unsigned)n++;
        clef_buf_putc(b, byte ? ',' : '{');
        clef_buf_putc(b, '"');
        if (cp == '"' || cp == '\\') clef_buf_putc(b, '\\');
        if (cp < 0x80) clef_buf_putc(b, (char)cp);
        else clef_buf_putc(b, (char)(0xC0 | (cp >> 6))), clef_buf_putc(b, (char)(0x80 | (cp & 0x3F)));
        clef_buf_printf(b, "\":%d", byte);
    }
}

static void put_tokenizer(const char *name, const char *merges, const char *extra_vocab, const char *normalizer) {
    clef_buf b = {0};
    clef_buf_puts(&b, TOKENIZER_HEAD);
    clef_buf_printf(&b, "\"normalizer\":%s,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[%s,"
                        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]},"
                        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"byte_fallback\":false,\"vocab\":",
                    normalizer, QWEN2_SPLIT);
    byte_vocab(&b);
    clef_buf_printf(&b, "%s},\"merges\":%s}}", extra_vocab, merges);
    put("tokenizer", name, -1, b.data, b.len);
    clef_buf_free(&b);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: seed_loader FIXTURES OUTDIR\n");
        return 2;
    }
    const char *fx = argv[1];
    out_root = argv[2];
    /* safetensors: one tensor of each dtype, scalars, an empty tensor */
    const st_wtensor one_each[] = {
        {"a.bf16", CLEF_DT_BF16, 2, {4, 8}}, {"b.f16", CLEF_DT_F16, 1, {16}},   {"c.f32", CLEF_DT_F32, 2, {2, 3}},
        {"d.e4m3", CLEF_DT_F8_E4M3, 1, {9}}, {"e.u8", CLEF_DT_U8, 3, {2, 2, 2}}, {"f.i32", CLEF_DT_I32, 1, {3}},
        {"g.i64", CLEF_DT_I64, 0, {0}},      {"h.empty", CLEF_DT_BF16, 2, {0, 5}},
    };
    put_st("every-dtype.safetensors", one_each, sizeof one_each / sizeof *one_each);
    put_st("one.safetensors", one_each, 1);
    /* the index: the fixture's, one naming a missing shard, a path, a tensor in the wrong shard */
    put_file("safetensors", "index-fixture.json", 1, fx, "tiny-clef-omni/model.safetensors.index.json");
    static const char *const idx[] = {
        "{\"metadata\":{},\"weight_map\":{\"thinker.model.norm.weight\":\"model-00003-of-00003.safetensors\"}}",
        "{\"weight_map\":{\"thinker.model.norm.weight\":\"../model-00001-of-00002.safetensors\"}}",
        "{\"weight_map\":{\"thinker.model.norm.weight\":\"model-00002-of-00002.safetensors\"}}",
        "{\"weight_map\":{\"talker.x\":\"nowhere\",\"thinker.model.norm.weight\":\"model-00001-of-00002.safetensors\"}}",
        "{\"weight_map\":{}}",
    };
    for (size_t i = 0; i < sizeof idx / sizeof *idx; i++) {
        char name[32];
        snprintf(name, sizeof name, "index-%zu.json", i);
        put("safetensors", name, 1, idx[i], strlen(idx[i]));
    }
    /* configs */
    put_file("config", "tiny-config.json", 0, fx, "tiny-clef-omni/config.json");
    put_file("config", "tiny-head.json", 1, fx, "tiny-clef-omni/joint_head_config.json");
    static const char *const formats[] = {"nvfp4-ct", "nvfp4-ct-stacked", "nvfp4-modelopt", "fp8-block",
                                          "int4-autoround"};
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
        char rel[256], name[64];
        snprintf(rel, sizeof rel, "quant/%s/config.json", formats[i]);
        snprintf(name, sizeof name, "%s-config.json", formats[i]);
        put_file("config", name, 0, fx, rel);
    }
    put_file("config", "modelopt-hf-quant.json", 2, fx, "quant/nvfp4-modelopt/hf_quant_config.json");
    /* tokenizers */
    put_tokenizer("string-merges.json", "[\"a b\",\"ab c\",\"\\u0120 \\u0120\"]", ",\"ab\":256,\"abc\":257,\"\\u0120\\u0120\":258",
                  "{\"type\":\"NFC\"}");
    put_tokenizer("array-merges.json", "[[\"a\",\"b\"],[\"ab\",\"c\"]]", ",\"ab\":256,\"abc\":257", "null");
    put_tokenizer("sequence-nfc.json", "[]", "", "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]}");
    /* long tokenization: text, and run-length programs (count, length, unit) */
    put_file("tokenize-long", "goldens-text.jsonl", 0, fx, "goldens/tokenizer_goldens.jsonl");
    static const unsigned char prog[][24] = {
        {255, 0, ' ', 3, 3, 'w', 'o', 'r', 'd', 255, 0, '\t'},
        {200, 0, '\n', 255, 0, ' ', 0, 0, 'x', 255, 1, '\r', '\n'},
        {255, 2, 0xe3, 0x80, 0x80, 9, 0, '!', 255, 0, ' ', 0, 1, 'y', 'z'},
        {128, 3, 'a', 'b', ' ', ' ', 100, 0, '1', 60, 3, 0xf0, 0x9f, 0x98, 0x80},
    };
    for (size_t i = 0; i < sizeof prog / sizeof *prog; i++) {
        char name[32];
        snprintf(name, sizeof name, "program-%zu", i);
        size_t n = sizeof prog[i];
        while (n && !prog[i][n - 1]) n--;
        put("tokenize-long", name, 1, prog[i], n);
    }
    fprintf(stderr, "seed_loader: corpora written under %s\n", out_root);
    return 0;
}
