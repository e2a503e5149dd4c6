/* buf.h — growable byte buffer and int32 vector.
 *
 * Both own their heap storage; zero-initialise (`clef_buf b = {0};`) before
 * use and release with clef_buf_free / clef_ids_free.  Allocation failure
 * aborts the process (clef treats OOM of small host buffers as fatal; large
 * model/workspace allocations are checked separately by their owners).
 */
#ifndef CLEF_UTIL_BUF_H
#define CLEF_UTIL_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct clef_buf {
    char *data;  /* always NUL-terminated when len > 0 or after any append */
    size_t len;  /* bytes used, excluding the terminating NUL */
    size_t cap;
} clef_buf;

void clef_buf_reserve(clef_buf *b, size_t extra);
void clef_buf_append(clef_buf *b, const void *p, size_t n);
void clef_buf_puts(clef_buf *b, const char *s);
void clef_buf_putc(clef_buf *b, char c);
void clef_buf_printf(clef_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void clef_buf_free(clef_buf *b);

typedef struct clef_ids {
    int32_t *v;  /* token ids */
    size_t n;
    size_t cap;
} clef_ids;

void clef_ids_push(clef_ids *a, int32_t x);
void clef_ids_append(clef_ids *a, const int32_t *x, size_t n);
void clef_ids_free(clef_ids *a);

/* xmalloc family: abort with a message on allocation failure. */
void *clef_xmalloc(size_t n);
void *clef_xcalloc(size_t n, size_t size);
void *clef_xrealloc(void *p, size_t n);
char *clef_xstrndup(const char *s, size_t n);

#endif
