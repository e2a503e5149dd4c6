#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    assert_non_null(p);
    if (fread(p, 1, (size_t)n, f) != (size_t)n) fail_msg("short read on %s", path);
    fclose(f);
    p[n] = '\0';
    if (len) *len = (size_t)n;
    return p;
}

json_value **tu_read_jsonl(const char *path, size_t *n) {
    size_t len;
    char *text = tu_read_file(path, &len);
    json_value **out = NULL;
    size_t count = 0;
    char *line = text;
    while (line < text + len) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(text + len - line);
        if (ll > 0) {
            clef_err err;
            clef_err_clear(&err);
            json_value *v = json_parse(line, ll, &err);
            if (!v) fail_msg("%s line %zu: %s", path, count + 1, err.message);
            out = realloc(out, (count + 1) * sizeof *out);
            out[count++] = v;
        }
        line += ll + 1;
    }
    free(text);
    *n = count;
    return out;
}

char *tu_fixture(const char *rel) {
    size_t n = strlen(CLEF_FIXTURES) + strlen(rel) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", CLEF_FIXTURES, rel);
    return p;
}

int64_t tu_int_at(const json_value *arr, size_t i) {
    assert_non_null(arr);
    assert_int_equal(arr->type, JSON_ARRAY);
    assert_true(i < arr->n);
    int64_t x;
    if (json_as_i64(arr->items[i], &x) != 0) fail_msg("element %zu is not an integer", i);
    return x;
}

double tu_num_at(const json_value *arr, size_t i) {
    assert_non_null(arr);
    assert_int_equal(arr->type, JSON_ARRAY);
    assert_true(i < arr->n);
    double x;
    if (json_as_double(arr->items[i], &x) != 0) fail_msg("element %zu is not a number", i);
    return x;
}
