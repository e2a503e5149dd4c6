/* safetensors.h — validated, memory-mapped safetensors files (SPEC.md §10.1).
 *
 * Layout: u64 LE header length N, N bytes of UTF-8 JSON header (may be space
 * padded), then the data.  Each header entry is name -> {"dtype","shape",
 * "data_offsets":[begin,end)} with offsets relative to byte 8+N; an optional
 * "__metadata__" maps strings to strings.
 *
 * st_open validates everything before any tensor is used: header length
 * within the file and below 100 MiB, header is a JSON object, known dtype
 * (BF16 F16 F32 F8_E4M3 U8 I8 I32 I64), shape of non-negative integers,
 * shape x dtype size = byte length, offsets inside the data section, no two
 * tensors overlapping.  Every violation is an error naming the file and tensor.
 */
#ifndef CLEF_IO_SAFETENSORS_H
#define CLEF_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/dtype.h"
#include "util/err.h"

#define CLEF_MAX_DIMS 8

/* A view of one tensor inside a mapped file.  `data` points into the map and
 * stays valid until the owning st_file is closed. */
typedef struct st_tensor {
    char *name;                      /* owned by the st_file */
    clef_dtype dtype;
    int ndim;                        /* 0..CLEF_MAX_DIMS (0 = scalar) */
    int64_t shape[CLEF_MAX_DIMS];
    size_t numel;
    const void *data;                /* little-endian, row-major; not necessarily aligned */
    size_t nbytes;
} st_tensor;

typedef struct st_file {
    char *path;          /* owned */
    void *map;           /* mmap of the whole file (read-only) */
    size_t size;         /* file size in bytes */
    size_t n;            /* number of tensors */
    st_tensor *tensors;  /* [n], in header order */
} st_file;

/* Map and validate `path`.  Returns 0, or -1 with err (status 500,
 * "internal_error", message like "model-00001.safetensors: tensor 'x':
 * data_offsets [0,12) do not match shape [2,4] x BF16 = 16 bytes"; file-level
 * problems read "<file>: header length ... runs past the end of the file").
 * `f` is overwritten; on failure it is left zeroed with nothing to free.
 * Tensor data is not read (pages load lazily on first touch). */
int st_open(const char *path, st_file *f, clef_err *err);
/* Unmap and free everything of `f` (pointers into it die); safe on a zeroed
 * or already closed st_file; leaves it zeroed. */
void st_close(st_file *f);

/* Tensor by exact name, or NULL.  Linear in f->n (use the checkpoint
 * catalog for repeated lookups). */
const st_tensor *st_find(const st_file *f, const char *name);

/* Buffer size that always holds st_shape_str's output for CLEF_MAX_DIMS dims. */
#define ST_SHAPE_STR_MAX (CLEF_MAX_DIMS * 21 + 3)
/* Render a shape as "[d0,d1,...]" ("[]" for 0-d) into out[0..cap) for error
 * messages; always NUL-terminated when cap > 0 (cut if too small). */
void st_shape_str(const int64_t *shape, int ndim, char *out, size_t cap);

#endif
