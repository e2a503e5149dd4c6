/* st_write.c — safetensors writer in the safetensors library's layout. */
#include "io/st_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json/json.h"
#include "util/buf.h"

typedef struct wt_entry {
    char *name;
    clef_dtype dtype;
    int ndim;
    int64_t shape[CLEF_MAX_DIMS];
    size_t nbytes;
    size_t begin;    /* offset in the data section */
    size_t written;  /* bytes received so far */
} wt_entry;

struct st_writer {
    char *path;
    int fd;
    size_t n;
    wt_entry *e;        /* [n] in data order */
    wt_entry **by_name; /* [n] sorted by name, for lookups */
    size_t data_start;  /* 8 + header length */
    size_t total;       /* file size */
};

static int wr_fail(clef_err *err, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int wr_fail(clef_err *err, const char *path, const char *fmt, ...) {
    char what[CLEF_ERR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *base = strrchr(path, '/');
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: %s", base ? base + 1 : path, what);
}

/* Rank of a dtype in the safetensors library's Dtype enum (declaration
 * order: BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32,
 * F64, I64, U64); data is sorted by descending rank. */
static int dtype_rank(clef_dtype t) {
    switch (t) {
    case CLEF_DT_U8: return 1;
    case CLEF_DT_I8: return 2;
    case CLEF_DT_F8_E4M3: return 4;
    case CLEF_DT_F16: return 7;
    case CLEF_DT_BF16: return 8;
    case CLEF_DT_I32: return 9;
    case CLEF_DT_F32: return 11;
    case CLEF_DT_I64: return 13;
    default: return 0;
    }
}

static int data_order(const void *a, const void *b) {
    const wt_entry *x = a, *y = b;
    int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);
    if (rx != ry) return ry - rx;
    return strcmp(x->name, y->name);
}

static int name_order(const void *a, const void *b) {
    return strcmp((*(wt_entry *const *)a)->name, (*(wt_entry *const *)b)->name);
}

static void free_writer(st_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    for (size_t i = 0; i < w->n; i++) free(w->e[i].name);
    free(w->e);
    free(w->by_name);
    free(w->path);
    free(w);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* {"__metadata__":{...},"name":{"dtype":..,"shape":[..],"data_offsets":[b,e]},...} */
static void render_header(const st_writer *w, const char *const *meta, clef_buf *h) {
    clef_buf_putc(h, '{');
    int first = 1;
    if (meta && meta[0]) {
        size_t nm = 0;
        while (meta[2 * nm]) nm++;
        const char **keys = clef_xcalloc(nm, sizeof *keys);
        for (size_t i = 0; i < nm; i++) keys[i] = meta[2 * i];
        qsort(keys, nm, sizeof *keys, cmp_str);
        clef_buf_puts(h, "\"__metadata__\":{");
        for (size_t i = 0; i < nm; i++) {
            const char *val = "";
            for (size_t j = 0; j < nm; j++)
                if (meta[2 * j] == keys[i]) val = meta[2 * j + 1];
            if (i) clef_buf_putc(h, ',');
            json_render_string(keys[i], strlen(keys[i]), h);
            clef_buf_putc(h, ':');
            json_render_string(val, strlen(val), h);
        }
        clef_buf_putc(h, '}');
        free(keys);
        first = 0;
    }
    for (size_t i = 0; i < w->n; i++) {
        const wt_entry *e = &w->e[i];
        if (!first) clef_buf_putc(h, ',');
        first = 0;
        json_render_string(e->name, strlen(e->name), h);
        clef_buf_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", clef_dtype_name(e->dtype));
        for (int d = 0; d < e->ndim; d++) clef_buf_printf(h, d ? ",%lld" : "%lld", (long long)e->shape[d]);
        clef_buf_printf(h, "],\"data_offsets\":[%zu,%zu]}", e->begin, e->begin + e->nbytes);
    }
    clef_buf_putc(h, '}');
    while ((8 + h->len) % 8) clef_buf_putc(h, ' ');
}

static int write_all(int fd, const void *p, size_t n, off_t at) {
    const char *c = p;
    while (n > 0) {
        ssize_t k = pwrite(fd, c, n, at);
        if (k < 0 && errno == EINTR) continue;
        if (k == 0) errno = ENOSPC; /* no progress: the device is full */
        if (k <= 0) return -1;
        c += k;
        n -= (size_t)k;
        at += k;
    }
    return 0;
}

/* Copy and validate the declarations, in data order. */
static int declare(st_writer *w, const st_wtensor *t, size_t n, clef_err *err) {
    w->e = clef_xcalloc(n ? n : 1, sizeof *w->e);
    w->by_name = clef_xcalloc(n ? n : 1, sizeof *w->by_name);
    for (size_t i = 0; i < n; i++) {
        wt_entry *e = &w->e[w->n++];
        if (!t[i].name || !t[i].name[0] || !strcmp(t[i].name, "__metadata__"))
            return wr_fail(err, w->path, "tensor %zu has an empty or reserved name", i);
        e->name = clef_xstrndup(t[i].name, strlen(t[i].name));
        e->dtype = t[i].dtype;
        e->ndim = t[i].ndim;
        if (t[i].ndim < 0 || t[i].ndim > CLEF_MAX_DIMS || !clef_dtype_size(t[i].dtype))
            return wr_fail(err, w->path, "tensor '%s': bad dtype or rank", e->name);
        size_t numel = 1;
        for (int d = 0; d < e->ndim; d++) {
            if (t[i].shape[d] < 0) return wr_fail(err, w->path, "tensor '%s': negative dimension", e->name);
            e->shape[d] = t[i].shape[d];
            numel *= (size_t)t[i].shape[d];
        }
        e->nbytes = numel * clef_dtype_size(e->dtype);
    }
    qsort(w->e, w->n, sizeof *w->e, data_order);
    size_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        w->e[i].begin = off;
        off += w->e[i].nbytes;
        w->by_name[i] = &w->e[i];
    }
    qsort(w->by_name, w->n, sizeof *w->by_name, name_order);
    for (size_t i = 1; i < w->n; i++)
        if (!strcmp(w->by_name[i - 1]->name, w->by_name[i]->name))
            return wr_fail(err, w->path, "tensor '%s' declared twice", w->by_name[i]->name);
    w->total = off;
    return 0;
}

st_writer *st_writer_create(const char *path, const st_wtensor *tensors, size_t n, const char *const *meta,
                            clef_err *err) {
    st_writer *w = clef_xcalloc(1, sizeof *w);
    w->fd = -1;
    w->path = clef_xstrndup(path, strlen(path));
    if (declare(w, tensors, n, err) != 0) {
        free_writer(w);
        return NULL;
    }
    clef_buf h = {0};
    render_header(w, meta, &h);
    uint64_t hl = h.len;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(hl >> (8 * i));
    w->data_start = 8 + h.len;
    w->total += w->data_start;
    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    struct stat sb;
    /* Sized up front when it is a regular file (the data then fills holes); any
     * other target (a device, e.g. /dev/full in the tests) is written as a stream. */
    int ok = w->fd >= 0 && write_all(w->fd, len8, 8, 0) == 0 && write_all(w->fd, h.data, h.len, 8) == 0 &&
             fstat(w->fd, &sb) == 0 && (!S_ISREG(sb.st_mode) || ftruncate(w->fd, (off_t)w->total) == 0);
    int e = errno;
    clef_buf_free(&h);
    if (!ok) {
        wr_fail(err, path, "cannot write: %s", strerror(e));
        st_writer_abort(w);
        return NULL;
    }
    return w;
}

static wt_entry *lookup(const st_writer *w, const char *name) {
    wt_entry key = {.name = (char *)name}, *kp = &key;
    wt_entry **hit = bsearch(&kp, w->by_name, w->n, sizeof *w->by_name, name_order);
    return hit ? *hit : NULL;
}

size_t st_writer_tensor_bytes(const st_writer *w, const char *name) {
    const wt_entry *e = lookup(w, name);
    return e ? e->nbytes : (size_t)-1;
}

size_t st_writer_file_size(const st_writer *w) { return w->total; }

int st_writer_put(st_writer *w, const char *name, size_t off, const void *data, size_t len, clef_err *err) {
    wt_entry *e = lookup(w, name);
    if (!e) return wr_fail(err, w->path, "tensor '%s' was not declared", name);
    if (off > e->nbytes || len > e->nbytes - off)
        return wr_fail(err, w->path, "tensor '%s': bytes [%zu,%zu) outside its %zu bytes", name, off, off + len,
                       e->nbytes);
    if (len && write_all(w->fd, data, len, (off_t)(w->data_start + e->begin + off)) != 0)
        return wr_fail(err, w->path, "write failed: %s", strerror(errno));
    e->written += len;
    return 0;
}

int st_writer_finish(st_writer *w, clef_err *err) {
    int rc = 0;
    for (size_t i = 0; i < w->n && rc == 0; i++)
        if (w->e[i].written != w->e[i].nbytes)
            rc = wr_fail(err, w->path, "tensor '%s': %zu of %zu bytes written", w->e[i].name, w->e[i].written,
                         w->e[i].nbytes);
    if (rc == 0 && close(w->fd) != 0) rc = wr_fail(err, w->path, "close failed: %s", strerror(errno));
    w->fd = -1;
    if (rc != 0) unlink(w->path);
    free_writer(w);
    return rc;
}

void st_writer_abort(st_writer *w) {
    if (!w) return;
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
        unlink(w->path);
    }
    free_writer(w);
}

int st_save(const char *path, const st_wtensor *tensors, const void *const *datas, size_t n, const char *const *meta,
            clef_err *err) {
    st_writer *w = st_writer_create(path, tensors, n, meta, err);
    if (!w) return -1;
    for (size_t i = 0; i < n; i++) {
        if (st_writer_put(w, tensors[i].name, 0, datas[i], st_writer_tensor_bytes(w, tensors[i].name), err) != 0) {
            st_writer_abort(w);
            return -1;
        }
    }
    return st_writer_finish(w, err);
}
