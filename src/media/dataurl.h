/* dataurl.h — RFC 2397 data URLs carrying base64 media.
 *
 * Project rule (SPEC §9): media items are "data:<type>/<subtype>;base64,<payload>"
 * strings; the server never fetches URLs (file paths are the CLI's business).
 */
#ifndef CLEF_MEDIA_DATAURL_H
#define CLEF_MEDIA_DATAURL_H

#include <stddef.h>
#include <stdint.h>

#include "media/media.h"

/* Result of clef_dataurl_parse: the MIME type (lower-cased, parameters
 * removed, e.g. "image/png") and the decoded payload. */
typedef struct clef_dataurl {
    char mime[128];
    uint8_t *data; /* owned, malloc'd; NULL when size is 0 */
    size_t size;
} clef_dataurl;

/* Parse `url` (`len` bytes).  Accepted: case-insensitive "data:", a
 * "<type>/<subtype>" MIME type, optional ";name=value" parameters, then
 * ";base64," and a standard-alphabet base64 payload (length a multiple of 4,
 * at most two '=' at the end, no whitespace).  The payload is decoded only if
 * its decoded size is at most `max_bytes`.
 * Returns 0; -1 with a short reason in `why` (`why_len` bytes) for a
 * malformed URL, e.g. "not a data URL (...)"; CLEF_MEDIA_OVER_LIMIT when the
 * payload is too large, e.g. "payload is 5242880 bytes; the context window
 * takes at most 4194304 bytes per item". */
int clef_dataurl_parse(const char *url, size_t len, size_t max_bytes, clef_dataurl *out, char *why, size_t why_len);

void clef_dataurl_free(clef_dataurl *d);

#endif
