/* seed_corpus.c — write each golden request (tests/fixtures/goldens/goldens.jsonl)
 * as one file of the fuzz corpus: `seed_corpus GOLDENS.jsonl OUTDIR`.
 * Also writes a few hand-made edge cases (escaped NULs, duplicate keys, every
 * question type with odd criteria). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/json.h"
#include "util/buf.h"

static const char *const EXTRA[] = {
    "{\"model\":\"m\\u0000\",\"state\":\"a\\u0000b\",\"questions\":{\"q\":{\"type\":\"noul\",\"criteria\":{\"true\":null}}}}",
    "{\"model\":\"m\",\"state\":{\"b\":1,\"a\":[1.5,-0,1e400,NaN]},\"questions\":{\"q\":{\"type\":\"choice\",\"criteria\":{\"x\":1,\"x\":2,\"\\ud83d\\ude00\":null}}}}",
    "{\"model\":\"m\",\"state\":null,\"questions\":{\"s\":{\"type\":\"score\",\"criteria\":[\"a\",{\"b\":1},null]},\"\":{\"type\":\"noul\",\"instructions\":0}},\"truncate_state\":true}",
    "{\"model\":\"m\",\"state\":\"<|im_end|>\",\"questions\":{\"q\":{\"type\":\"noul\"}},\"images\":[]}",
};

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: seed_corpus GOLDENS.jsonl OUTDIR\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    clef_buf text = {0};
    char chunk[65536];
    size_t n, count = 0;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) clef_buf_append(&text, chunk, n);
    fclose(f);
    char path[4096];
    for (char *line = text.data; line && *line;) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        clef_err err;
        json_value *c = len ? json_parse(line, len, &err) : NULL;
        const json_value *req = c ? json_get(c, "request") : NULL;
        if (req) {
            clef_buf body = {0};
            json_render_opts(req, 0, &body);
            snprintf(path, sizeof path, "%s/golden-%02zu.json", argv[2], count++);
            FILE *o = fopen(path, "wb");
            if (!o || fwrite(body.data, 1, body.len, o) != body.len) {
                perror(path);
                return 1;
            }
            fclose(o);
            clef_buf_free(&body);
        }
        json_free(c);
        line = nl ? nl + 1 : NULL;
    }
    for (size_t i = 0; i < sizeof EXTRA / sizeof *EXTRA; i++) {
        snprintf(path, sizeof path, "%s/extra-%zu.json", argv[2], i);
        FILE *o = fopen(path, "wb");
        if (!o) {
            perror(path);
            return 1;
        }
        fputs(EXTRA[i], o);
        fclose(o);
    }
    clef_buf_free(&text);
    fprintf(stderr, "seed_corpus: %zu golden requests + %zu extra cases in %s\n", count,
            sizeof EXTRA / sizeof *EXTRA, argv[2]);
    return 0;
}
