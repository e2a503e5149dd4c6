/* auth.h — bearer-key authentication of HTTP requests (the Jev convention:
 * `Authorization: Bearer <key>`, SPEC.md §2.3). */
#ifndef CLEF_SERVER_AUTH_H
#define CLEF_SERVER_AUTH_H

/* 1 if `authorization` (the header value, may be NULL) is "Bearer <key>"
 * (scheme case-insensitive, one or more spaces) with <key> equal to `key`;
 * 0 otherwise.  The comparison runs in time independent of where the keys
 * differ and of their lengths: both are hashed with SHA-256 and the digests
 * compared with CRYPTO_memcmp.  `key` must be non-empty. */
int clef_auth_bearer_ok(const char *authorization, const char *key);

#endif
