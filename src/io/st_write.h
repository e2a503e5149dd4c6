/* st_write.h — writing safetensors files (SPEC.md §10.1) with bounded memory.
 *
 * The file is laid out exactly as the Python/Rust `safetensors` library lays
 * it out, so a tensor set it wrote comes back byte for byte: tensors sorted
 * by dtype (descending in the library's order: I64, F32, I32, BF16, F16,
 * F8_E4M3, I8, U8) then by name (bytewise), data contiguous in that order;
 * the header is compact JSON — "__metadata__" first (keys sorted), then each
 * tensor as {"dtype","shape","data_offsets"} in data order — padded with
 * spaces to a multiple of 8 bytes.
 *
 * Because the header comes first, every tensor's name, dtype and shape are
 * declared up front (st_writer_create); data is then written piecewise at
 * known offsets (st_writer_put, any order, e.g. one expert at a time), and
 * st_writer_finish checks that every byte was written.
 */
#ifndef CLEF_IO_ST_WRITE_H
#define CLEF_IO_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"
#include "tensor/dtype.h"
#include "util/err.h"

/* One tensor to write: `name` is copied by st_writer_create. */
typedef struct st_wtensor {
    const char *name;
    clef_dtype dtype;
    int ndim;                        /* 0..CLEF_MAX_DIMS */
    int64_t shape[CLEF_MAX_DIMS];
} st_wtensor;

typedef struct st_writer st_writer;

/* Create (truncate) `path`, write the header for `tensors[0..n)` and size
 * the file.  `meta` is a NULL-terminated list of key, value strings for
 * "__metadata__" (NULL = no metadata).  Errors (500, naming the file):
 * duplicate or empty names, negative dims, I/O failure.  Returns NULL + err. */
st_writer *st_writer_create(const char *path, const st_wtensor *tensors, size_t n, const char *const *meta,
                            clef_err *err);

/* Write `len` bytes of tensor `name`'s data starting at byte `off` of that
 * tensor (little-endian, row-major).  Each byte must be written exactly
 * once.  Errors: unknown name, a range past the tensor's end, I/O. */
int st_writer_put(st_writer *w, const char *name, size_t off, const void *data, size_t len, clef_err *err);

/* Byte size of tensor `name`'s data, or (size_t)-1 if not declared. */
size_t st_writer_tensor_bytes(const st_writer *w, const char *name);

/* Total file size (header + data). */
size_t st_writer_file_size(const st_writer *w);

/* Check that every tensor received all its bytes, close the file and free
 * `w` (always, even on error).  Returns 0 or -1 + err naming the first
 * incomplete tensor. */
int st_writer_finish(st_writer *w, clef_err *err);

/* Close, delete the partial file and free `w`.  NULL is ok. */
void st_writer_abort(st_writer *w);

/* Write a whole file in one call: tensors[i]'s data at datas[i]. */
int st_save(const char *path, const st_wtensor *tensors, const void *const *datas, size_t n, const char *const *meta,
            clef_err *err);

#endif
