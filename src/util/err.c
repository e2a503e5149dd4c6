#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int clef_fail(clef_err *e, int status, const char *type, const char *param, const char *fmt, ...) {
    if (!e) return -1;
    e->status = status;
    e->type = type;
    if (param) {
        snprintf(e->param, sizeof e->param, "%s", param);
    } else {
        e->param[0] = '\0';
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof e->message) memcpy(e->message + sizeof e->message - 4, "...", 4);
    return -1;
}

int clef_fail_file(clef_err *e, const char *file, const char *fmt, ...) {
    char what[CLEF_ERR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return clef_fail(e, 500, CLEF_E_INTERNAL, NULL, "%s: %s", file, what);
}

void clef_err_clear(clef_err *e) {
    if (!e) return;
    e->status = 0;
    e->type = NULL;
    e->param[0] = '\0';
    e->message[0] = '\0';
}
