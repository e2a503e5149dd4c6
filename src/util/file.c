/* file.c — regular-file checks and capped reads (see file.h). */
#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/buf.h"

static const char *file_kind(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "of an unknown type";
}

int clef_file_open_regular(const char *path, const char *label, size_t *size, clef_err *err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return clef_fail_file(err, label, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return clef_fail_file(err, label, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return clef_fail_file(err, label, "not a regular file (%s)", file_kind(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (size) *size = (size_t)st.st_size;
    return fd;
}

char *clef_file_read(const char *path, const char *label, size_t max_bytes, size_t *len, clef_err *err) {
    size_t size = 0;
    int fd = clef_file_open_regular(path, label, &size, err);
    if (fd < 0) return NULL;
    if (size > max_bytes) {
        close(fd);
        clef_fail_file(err, label, "file is %zu bytes, more than the limit of %zu bytes", size, max_bytes);
        return NULL;
    }
    clef_buf b = {0};
    clef_buf_reserve(&b, size + 1);
    for (;;) {
        if (b.len > max_bytes) { /* grew while being read */
            close(fd);
            clef_buf_free(&b);
            clef_fail_file(err, label, "file grew past the limit of %zu bytes while being read", max_bytes);
            return NULL;
        }
        if (b.cap - b.len - 1 == 0) clef_buf_reserve(&b, 65536); /* only if it grew since fstat */
        size_t room = b.cap - b.len - 1;
        if (room > max_bytes + 1 - b.len) room = max_bytes + 1 - b.len;
        ssize_t k = read(fd, b.data + b.len, room);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            close(fd);
            clef_buf_free(&b);
            clef_fail_file(err, label, "read error: %s", strerror(e));
            return NULL;
        }
        if (k == 0) break;
        b.len += (size_t)k;
    }
    close(fd);
    b.data[b.len] = '\0';
    *len = b.len;
    return b.data;
}

size_t clef_path_trim_len(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    return n;
}

char *clef_path_join(const char *dir, const char *name) {
    size_t n = clef_path_trim_len(dir);
    clef_buf p = {0};
    clef_buf_append(&p, dir, n);
    if (!(n == 1 && dir[0] == '/')) clef_buf_putc(&p, '/');
    clef_buf_puts(&p, name);
    return p.data;
}
