#include "util/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *clef_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "clef: out of memory allocating %zu bytes\n", n);
        abort();
    }
    return p;
}

void *clef_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "clef: out of memory allocating %zu x %zu bytes\n", n, size);
        abort();
    }
    return p;
}

void *clef_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "clef: out of memory reallocating %zu bytes\n", n);
        abort();
    }
    return q;
}

char *clef_xstrndup(const char *s, size_t n) {
    char *p = clef_xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void clef_buf_reserve(clef_buf *b, size_t extra) {
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    b->data = clef_xrealloc(b->data, cap);
    b->cap = cap;
}

void clef_buf_append(clef_buf *b, const void *p, size_t n) {
    clef_buf_reserve(b, n);
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void clef_buf_puts(clef_buf *b, const char *s) { clef_buf_append(b, s, strlen(s)); }

void clef_buf_putc(clef_buf *b, char c) { clef_buf_append(b, &c, 1); }

void clef_buf_printf(clef_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        va_end(ap2);
        return;
    }
    clef_buf_reserve(b, (size_t)n);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    b->len += (size_t)n;
}

void clef_buf_free(clef_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

void clef_ids_push(clef_ids *a, int32_t x) { clef_ids_append(a, &x, 1); }

void clef_ids_append(clef_ids *a, const int32_t *x, size_t n) {
    if (a->n + n > a->cap) {
        size_t cap = a->cap ? a->cap : 64;
        while (cap < a->n + n) cap *= 2;
        a->v = clef_xrealloc(a->v, cap * sizeof *a->v);
        a->cap = cap;
    }
    if (n) memcpy(a->v + a->n, x, n * sizeof *x);
    a->n += n;
}

void clef_ids_free(clef_ids *a) {
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}
