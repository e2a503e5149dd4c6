/* err.h — error values carried through every stage of clef.
 *
 * Every fallible function takes a `clef_err *` as its last argument and
 * returns 0 on success, -1 on failure after filling the error.  The fields map
 * one-to-one onto the wire error body of SPEC.md §2.2:
 *   {"error":{"message":<message>,"type":<type>,"param":<param or null>}}
 */
#ifndef CLEF_UTIL_ERR_H
#define CLEF_UTIL_ERR_H

#include <stddef.h>

#define CLEF_ERR_MESSAGE_MAX 2048
#define CLEF_ERR_PARAM_MAX 512

typedef struct clef_err {
    int status;                       /* HTTP-style status (400, 413, 422, 500, 503); 0 = none */
    const char *type;                 /* static string: "invalid_json", "invalid_request",
                                         "capacity_exceeded", "payload_too_large",
                                         "model_loading", "internal_error",
                                         "overloaded"; NULL = none */
    char param[CLEF_ERR_PARAM_MAX];   /* dotted path such as "questions.q.criteria"; "" = null */
    char message[CLEF_ERR_MESSAGE_MAX];
} clef_err;

/* Error type strings (SPEC.md §2.2). */
#define CLEF_E_JSON "invalid_json"
#define CLEF_E_REQUEST "invalid_request"
#define CLEF_E_CAPACITY "capacity_exceeded"
#define CLEF_E_TOO_LARGE "payload_too_large"
#define CLEF_E_LOADING "model_loading"
#define CLEF_E_INTERNAL "internal_error"
/* 503: the request queue or a memory budget is full, or the server stops; not
 * one of SPEC §2.2's six because none of them fits. */
#define CLEF_E_OVERLOADED "overloaded"

/* Fill `e` (if non-NULL) and return -1, so callers can write
 * `return clef_fail(err, 400, CLEF_E_REQUEST, "model", "model and state are required");`
 * `param` may be NULL (rendered as JSON null).  The message is printf-formatted;
 * text past CLEF_ERR_MESSAGE_MAX-1 bytes is cut with a trailing "...". */
int clef_fail(clef_err *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Fill `e` (if non-NULL) as a 500 internal_error with message
 * "<file>: <what>", `what` being the printf-formatted rest (cut at
 * CLEF_ERR_MESSAGE_MAX-1 bytes before the prefix is added), and return -1.
 * The common form of the loaders' errors (config, checkpoint, quant format,
 * safetensors writer), so a broken file is named without a debugger. */
int clef_fail_file(clef_err *e, const char *file, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Reset `e` to "no error". */
void clef_err_clear(clef_err *e);

#endif
