/* lines.c — lines of a plain or gzipped file through zlib.  See lines.h. */
#include "eval/lines.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define CHUNK (256 * 1024)

struct clef_lines {
    gzFile gz;
    char *path;
    size_t max_line;
    size_t line_no;
    char *chunk; /* [CHUNK]: bytes read, chunk[pos..len) not yet returned */
    size_t pos, len;
    int eof;
};

clef_lines *clef_lines_open(const char *path, size_t max_line, clef_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        close(fd);
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: is a directory, not a JSON-lines file", path);
        return NULL;
    }
    gzFile gz = gzdopen(fd, "rb");
    if (!gz) {
        close(fd);
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: cannot start zlib: out of memory", path);
        return NULL;
    }
    gzbuffer(gz, CHUNK);
    clef_lines *r = clef_xcalloc(1, sizeof *r);
    r->gz = gz;
    r->path = clef_xstrndup(path, strlen(path));
    r->max_line = max_line ? max_line : (size_t)-1;
    r->chunk = clef_xmalloc(CHUNK);
    return r;
}

void clef_lines_close(clef_lines *r) {
    if (!r) return;
    gzclose(r->gz);
    free(r->chunk);
    free(r->path);
    free(r);
}

int clef_lines_gzipped(const clef_lines *r) { return r && !gzdirect(r->gz); }

/* Refill the chunk; 1 bytes, 0 end of input, -1 error (err set). */
static int refill(clef_lines *r, clef_err *err) {
    if (r->eof) return 0;
    int n = gzread(r->gz, r->chunk, CHUNK);
    int zerr = Z_OK;
    const char *why = n < 0 || n == 0 ? gzerror(r->gz, &zerr) : NULL;
    if (n < 0 || (n == 0 && zerr != Z_OK && zerr != Z_STREAM_END)) {
        if (zerr == Z_ERRNO)
            why = strerror(errno);
        else if (why && !strncmp(why, "<fd:", 4) && strstr(why, ": ")) /* gzdopen names the file "<fd:N>" */
            why = strstr(why, ": ") + 2;
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: cannot read past line %zu: %s%s", r->path, r->line_no,
                  why && *why ? why : "read error",
                  zerr == Z_BUF_ERROR ? " (the gzip stream is truncated)" : zerr == Z_DATA_ERROR ? " (the gzip stream is damaged)" : "");
        return -1;
    }
    if (n == 0) {
        r->eof = 1;
        return 0;
    }
    r->pos = 0;
    r->len = (size_t)n;
    return 1;
}

int clef_lines_next(clef_lines *r, clef_buf *line, size_t *line_no, size_t *too_long_bytes, clef_err *err) {
    line->len = 0;
    clef_buf_reserve(line, 0);
    line->data[0] = '\0';
    size_t total = 0; /* the line's length so far, kept or not */
    int any = 0;
    for (;;) {
        if (r->pos == r->len) {
            int rc = refill(r, err);
            if (rc < 0) return -1;
            if (rc == 0) {
                if (!any) return 0;
                break; /* a last line without its newline */
            }
        }
        any = 1;
        const char *p = r->chunk + r->pos, *nl = memchr(p, '\n', r->len - r->pos);
        size_t n = nl ? (size_t)(nl - p) : r->len - r->pos;
        if (total + n <= r->max_line) clef_buf_append(line, p, n);
        total += n;
        r->pos += n + (nl != NULL);
        if (nl) break;
    }
    r->line_no++;
    if (line_no) *line_no = r->line_no;
    if (total > r->max_line) {
        line->len = 0;
        line->data[0] = '\0';
        if (too_long_bytes) *too_long_bytes = total;
        return 2;
    }
    if (line->len && line->data[line->len - 1] == '\r') line->data[--line->len] = '\0';
    return 1;
}
