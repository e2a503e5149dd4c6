#include "media/dataurl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

static int is_b64(unsigned char c) { return isalnum(c) || c == '+' || c == '/'; }

/* MIME token characters (RFC 2045 "token"), enough to reject garbage. */
static int is_token(unsigned char c) { return c > 32 && c < 127 && !strchr("()<>@,;:\\\"/[]?=", c); }

/* Copy the "<type>/<subtype>" at s[0..n) lower-cased into `mime`; 0 on success. */
static int parse_mime(const char *s, size_t n, char *mime, size_t cap) {
    size_t slash = 0, i;
    if (n == 0 || n >= cap) return -1;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '/') {
            if (slash || i == 0) return -1;
            slash = i;
        } else if (!is_token(c)) {
            return -1;
        }
        mime[i] = (char)tolower(c);
    }
    mime[n] = '\0';
    return slash && slash + 1 < n ? 0 : -1;
}

int clef_dataurl_parse(const char *url, size_t len, size_t max_bytes, clef_dataurl *out, char *why, size_t why_len) {
    memset(out, 0, sizeof *out);
    if (len < 5 || strncasecmp(url, "data:", 5) != 0) {
        snprintf(why, why_len, "not a data URL (expected data:<type>/<subtype>;base64,...)");
        return -1;
    }
    const char *p = url + 5, *end = url + len;
    const char *comma = memchr(p, ',', (size_t)(end - p));
    if (!comma) {
        snprintf(why, why_len, "data URL has no payload");
        return -1;
    }
    /* header = <mime>(;param)*;base64 */
    const char *semi = memchr(p, ';', (size_t)(comma - p));
    const char *mime_end = semi ? semi : comma;
    if (parse_mime(p, (size_t)(mime_end - p), out->mime, sizeof out->mime) != 0) {
        snprintf(why, why_len, "data URL has no valid <type>/<subtype>");
        return -1;
    }
    size_t hl = (size_t)(comma - mime_end);
    if (hl < 7 || strncasecmp(comma - 7, ";base64", 7) != 0) {
        snprintf(why, why_len, "data URL is not base64-encoded");
        return -1;
    }
    const unsigned char *b = (const unsigned char *)comma + 1;
    size_t n = (size_t)(end - (const char *)b);
    if (n == 0) {
        snprintf(why, why_len, "payload is empty");
        return -1;
    }
    size_t pad = 0;
    while (pad < 2 && n > pad && b[n - 1 - pad] == '=') pad++;
    if (n % 4 != 0) {
        snprintf(why, why_len, "payload is not valid base64 (length %zu is not a multiple of 4)", n);
        return -1;
    }
    for (size_t i = 0; i < n - pad; i++)
        if (!is_b64(b[i])) {
            snprintf(why, why_len, "payload is not valid base64 (byte %zu)", i);
            return -1;
        }
    size_t size = n / 4 * 3 - pad;
    if (size > max_bytes) {
        snprintf(why, why_len, "payload is %zu bytes; the context window takes at most %zu bytes per item", size,
                 max_bytes);
        return CLEF_MEDIA_OVER_LIMIT;
    }
    if (n > (size_t)0x7fffffff) { /* OpenSSL's decoder takes an int */
        snprintf(why, why_len, "payload is %zu bytes of base64; the context window takes at most %zu per item", n,
                 (size_t)0x7fffffff);
        return CLEF_MEDIA_OVER_LIMIT;
    }
    uint8_t *data = malloc(n / 4 * 3 + 1);
    if (!data) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    /* EVP_DecodeBlock writes 3 bytes per quantum including the padding zeros. */
    if (EVP_DecodeBlock(data, b, (int)n) != (int)(n / 4 * 3)) {
        free(data);
        snprintf(why, why_len, "payload is not valid base64");
        return -1;
    }
    out->data = data;
    out->size = size;
    return 0;
}

void clef_dataurl_free(clef_dataurl *d) {
    free(d->data);
    d->data = NULL;
    d->size = 0;
}
