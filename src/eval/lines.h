/* lines.h — one line at a time from a text file that may be gzip-compressed.
 *
 * The Decision Index kit ships its rows as JSON lines, plain or gzipped
 * (`selected-rows.jsonl.gz`).  zlib's gzread reads both: a file that does not
 * start with the gzip magic number is passed through unchanged, so the reader
 * decides from the bytes, never from the file name.  Lines may hold any byte
 * (NUL included); a line longer than the reader's limit is reported as such
 * (its bytes skipped) instead of growing memory without bound.
 */
#ifndef CLEF_EVAL_LINES_H
#define CLEF_EVAL_LINES_H

#include <stddef.h>

#include "util/buf.h"
#include "util/err.h"

typedef struct clef_lines clef_lines;

/* Open `path` for reading lines of at most `max_line` bytes (0 = no limit;
 * the newline is not counted).  Returns NULL + err (500, "<path>: <reason>")
 * when the file cannot be opened. */
clef_lines *clef_lines_open(const char *path, size_t max_line, clef_err *err);

/* Close; NULL is ok. */
void clef_lines_close(clef_lines *r);

/* Next line into `line` (reset first; without its "\n", and without a "\r"
 * before it; always NUL-terminated).  Returns
 *    1  a line (the last one may lack its newline),
 *    0  end of input,
 *    2  a line longer than the limit: `line` is empty, *too_long_bytes its
 *       length; the next call reads the line after it,
 *   -1  a read error or a damaged / truncated gzip stream: err (500) names
 *       the file, the line number and zlib's reason.
 * *line_no (may be NULL) is the 1-based number of the line returned. */
int clef_lines_next(clef_lines *r, clef_buf *line, size_t *line_no, size_t *too_long_bytes, clef_err *err);

/* 1 when the input was gzip-compressed (known after the first read). */
int clef_lines_gzipped(const clef_lines *r);

#endif
