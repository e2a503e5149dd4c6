/* safetensors.c — map and validate one .safetensors file (SPEC.md §10.1).
 *
 * Everything a later stage might trust (dtype, shape, byte range) is checked
 * here once, so model code can index tensor data without further checks.
 */
#include "io/safetensors.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json/json.h"
#include "util/buf.h"
#include "util/file.h"

/* A header larger than this is refused before parsing (the safetensors
 * library uses the same limit); real headers are well under 10 MiB. */
#define ST_MAX_HEADER (100u * 1024u * 1024u)

/* Name used in messages: the basename, which is what a user recognises. */
static const char *st_basename(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* All errors of this module: 500 internal_error, message
 * "<file>: tensor '<name>': <what>" (or "<file>: <what>" for file-level
 * problems), so a broken checkpoint can be fixed without a debugger. */
static int st_fail(clef_err *err, const char *file, const char *tensor, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int st_fail(clef_err *err, const char *file, const char *tensor, const char *fmt, ...) {
    char what[CLEF_ERR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (tensor) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: tensor '%s': %s", file, tensor, what);
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: %s", file, what);
}

void st_shape_str(const int64_t *shape, int ndim, char *out, size_t cap) {
    if (cap == 0) return;
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

/* Parse the "shape" array of tensor `name` into t->shape/ndim/numel. */
static int parse_shape(const char *file, const char *name, const json_value *shape, st_tensor *t, clef_err *err) {
    if (!shape || shape->type != JSON_ARRAY) return st_fail(err, file, name, "\"shape\" is missing or not an array");
    if (shape->n > CLEF_MAX_DIMS)
        return st_fail(err, file, name, "shape has %zu dimensions (at most %d supported)", shape->n, CLEF_MAX_DIMS);
    size_t numel = 1;
    for (size_t i = 0; i < shape->n; i++) {
        int64_t d;
        if (shape->items[i]->type != JSON_INT || json_as_i64(shape->items[i], &d) != 0 || d < 0)
            return st_fail(err, file, name, "shape[%zu] is not a non-negative integer", i);
        if (d > 0 && numel > SIZE_MAX / (uint64_t)d)
            return st_fail(err, file, name, "shape overflows the element count");
        numel *= (size_t)d;
        t->shape[i] = d;
    }
    t->ndim = (int)shape->n;
    t->numel = numel;
    return 0;
}

/* Parse "data_offsets" [begin,end) of tensor `name`, relative to the data
 * section of `data_size` bytes, and check it against the tensor's size. */
static int parse_offsets(const char *file, const char *name, const json_value *off, size_t data_size, st_tensor *t,
                         size_t *begin_out, clef_err *err) {
    int64_t b, e;
    if (!off || off->type != JSON_ARRAY || off->n != 2 || off->items[0]->type != JSON_INT ||
        off->items[1]->type != JSON_INT || json_as_i64(off->items[0], &b) != 0 || json_as_i64(off->items[1], &e) != 0 ||
        b < 0 || e < 0)
        return st_fail(err, file, name, "\"data_offsets\" must be two non-negative integers");
    if (b > e)
        return st_fail(err, file, name, "data_offsets [%lld,%lld) end before they begin", (long long)b, (long long)e);
    if ((uint64_t)e > data_size)
        return st_fail(err, file, name,
                       "data_offsets [%lld,%lld) run past the end of the data (%zu bytes; file truncated?)",
                       (long long)b, (long long)e, data_size);
    size_t esize = clef_dtype_size(t->dtype);
    char shp[ST_SHAPE_STR_MAX];
    st_shape_str(t->shape, t->ndim, shp, sizeof shp);
    if (t->numel > SIZE_MAX / esize)
        return st_fail(err, file, name, "shape %s x %s overflows the byte count", shp, clef_dtype_name(t->dtype));
    if ((uint64_t)(e - b) != (uint64_t)t->numel * esize)
        return st_fail(err, file, name, "data_offsets [%lld,%lld) do not match shape %s x %s = %llu bytes",
                       (long long)b, (long long)e, shp, clef_dtype_name(t->dtype),
                       (unsigned long long)t->numel * esize);
    t->nbytes = (size_t)(e - b);
    *begin_out = (size_t)b;
    return 0;
}

/* __metadata__ must be an object of strings (it is informational only). */
static int check_metadata(const char *file, const json_value *m, clef_err *err) {
    if (m->type != JSON_OBJECT) return st_fail(err, file, NULL, "\"__metadata__\" is not an object");
    for (size_t i = 0; i < m->n; i++)
        if (m->items[i]->type != JSON_STRING)
            return st_fail(err, file, NULL, "\"__metadata__\" value for '%s' is not a string", m->keys[i]);
    return 0;
}

/* One header entry -> *t (name not yet set); *begin receives the offset. */
static int parse_entry(const char *file, const char *name, const json_value *e, size_t data_size, st_tensor *t,
                       size_t *begin, clef_err *err) {
    if (e->type != JSON_OBJECT) return st_fail(err, file, name, "entry is not an object");
    const json_value *dt = json_get(e, "dtype");
    if (!dt || dt->type != JSON_STRING) return st_fail(err, file, name, "\"dtype\" is missing or not a string");
    if (strlen(dt->str) != dt->len || clef_dtype_parse(dt->str, &t->dtype) != 0)
        return st_fail(err, file, name, "unsupported dtype '%s' (expected BF16, F16, F32, F8_E4M3, U8, I8, I32 or I64)",
                       dt->str);
    if (parse_shape(file, name, json_get(e, "shape"), t, err) != 0) return -1;
    return parse_offsets(file, name, json_get(e, "data_offsets"), data_size, t, begin, err);
}

/* Byte ranges for the overlap check. */
typedef struct st_range {
    size_t begin, end, idx;
} st_range;

static int range_cmp(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* No byte may belong to two tensors (empty tensors own no bytes).  Sorting by
 * begin makes it enough to compare each tensor with the furthest-reaching
 * earlier one. */
static int check_overlaps(const char *file, const st_file *f, st_range *r, clef_err *err) {
    qsort(r, f->n, sizeof *r, range_cmp);
    size_t reach = 0, reach_idx = 0;
    for (size_t i = 0; i < f->n; i++) {
        if (r[i].begin == r[i].end) continue;
        if (r[i].begin < reach)
            return st_fail(err, file, f->tensors[r[i].idx].name, "data_offsets [%zu,%zu) overlap tensor '%s'",
                           r[i].begin, r[i].end, f->tensors[reach_idx].name);
        if (r[i].end > reach) {
            reach = r[i].end;
            reach_idx = r[i].idx;
        }
    }
    return 0;
}

/* Parse the JSON header (already length-checked) into f->tensors. */
static int parse_header(const char *file, st_file *f, const char *hdr, size_t hdr_len, size_t data_off, clef_err *err) {
    clef_err jerr;
    clef_err_clear(&jerr);
    json_value *root = json_parse(hdr, hdr_len, &jerr);
    if (!root) return st_fail(err, file, NULL, "header is not valid JSON: %s", jerr.message);
    int rc = -1;
    st_range *ranges = NULL;
    if (root->type != JSON_OBJECT) {
        st_fail(err, file, NULL, "header is not a JSON object");
        goto done;
    }
    f->tensors = clef_xcalloc(root->n ? root->n : 1, sizeof *f->tensors);
    ranges = clef_xcalloc(root->n ? root->n : 1, sizeof *ranges);
    size_t data_size = f->size - data_off;
    for (size_t i = 0; i < root->n; i++) {
        const char *name = root->keys[i];
        if (strcmp(name, "__metadata__") == 0) {
            if (check_metadata(file, root->items[i], err) != 0) goto done;
            continue;
        }
        if (strlen(name) != root->key_lens[i]) {
            st_fail(err, file, NULL, "tensor name '%s...' contains a NUL byte", name);
            goto done;
        }
        st_tensor *t = &f->tensors[f->n];
        size_t begin = 0;
        if (parse_entry(file, name, root->items[i], data_size, t, &begin, err) != 0) goto done;
        t->name = clef_xstrndup(name, root->key_lens[i]);
        t->data = (const char *)f->map + data_off + begin;
        ranges[f->n] = (st_range){begin, begin + t->nbytes, f->n};
        f->n++;
    }
    rc = check_overlaps(file, f, ranges, err);
done:
    free(ranges);
    json_free(root);
    return rc;
}

/* Open and map `path` read-only into f->map / f->size.  The type is
 * checked before anything is read: a FIFO or a device is refused at once
 * (clef_file_open_regular opens with O_NONBLOCK, so a FIFO does not wait). */
static int map_file(const char *path, const char *file, st_file *f, clef_err *err) {
    size_t size = 0;
    int fd = clef_file_open_regular(path, file, &size, err);
    if (fd < 0) return -1;
    if (size < 8) {
        close(fd);
        return st_fail(err, file, NULL, "file is %zu bytes, shorter than the 8-byte header length", size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED) return st_fail(err, file, NULL, "mmap failed: %s", strerror(map_errno));
    f->map = map;
    f->size = size;
    return 0;
}

int st_open(const char *path, st_file *f, clef_err *err) {
    memset(f, 0, sizeof *f);
    const char *file = st_basename(path);
    if (map_file(path, file, f, err) != 0) return -1;
    f->path = clef_xstrndup(path, strlen(path));
    file = st_basename(f->path);
    uint64_t n = 0;
    const unsigned char *p = f->map;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | p[i]; /* u64 little-endian, independent of host order */
    if (n > f->size - 8) {
        st_fail(err, file, NULL, "header length %llu runs past the end of the file (%zu bytes)", (unsigned long long)n,
                f->size);
    } else if (n > ST_MAX_HEADER) {
        st_fail(err, file, NULL, "header length %llu exceeds the 100 MiB limit", (unsigned long long)n);
    } else if (parse_header(file, f, (const char *)f->map + 8, (size_t)n, 8 + (size_t)n, err) == 0) {
        return 0;
    }
    st_close(f);
    return -1;
}

void st_close(st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->size);
    if (f->tensors)
        for (size_t i = 0; i < f->n; i++)
            free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const st_tensor *st_find(const st_file *f, const char *name) {
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}
