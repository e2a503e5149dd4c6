/* fuzz_tokenizer.c — libFuzzer target for loading tokenizer.json (issue 15):
 * the input is the file (written to a temporary path, since that is what
 * clef_tokenizer_load reads).  A refusal must be a 500 naming the file; a
 * tokenizer that loads must tokenize (a few fixed texts, and the input
 * itself when it is UTF-8) to ids below its size, without a 500 for valid
 * text.  Seeds: small tokenizer.json files in the shape SPEC §5 allows
 * (seed_loader.c), with json_loader.dict.  Build and run: `make fuzz`.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "text/tokenizer.h"
#include "fuzz_check.h"

static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    snprintf(path, sizeof path, "/tmp/clef-fuzz-tok-%d.json", (int)getpid());
    return 0;
}

static void tokenize_ok(const clef_tokenizer *t, const char *s, size_t n) {
    clef_ids ids = {0};
    clef_err err;
    clef_err_clear(&err);
    int rc = clef_tokenize(t, s, n, &ids, &err);
    if (rc == 0) {
        for (size_t i = 0; i < ids.n; i++) CHECK(ids.v[i] >= 0 && (size_t)ids.v[i] < clef_tokenizer_size(t));
    } else {
        CHECK(err.status == 400); /* only invalid UTF-8 (or an absurd length) is refused */
    }
    clef_ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    clef_err err;
    clef_err_clear(&err);
    clef_tokenizer *t = clef_tokenizer_load(path, &err);
    if (!t) {
        CHECK(err.status == 500 && strstr(err.message, path));
        return 0;
    }
    static const char *const texts[] = {"hello world", "  \t\n\r\n x", "<s>a</s>", "e\xcc\x81 caf\xc3\xa9 1234",
                                        "don't WE'LL", "\xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x98\x80", ""};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) tokenize_ok(t, texts[i], strlen(texts[i]));
    tokenize_ok(t, (const char *)data, size < 4096 ? size : 4096);
    clef_tokenizer_free(t);
    return 0;
}
