/* auth.c — constant-time bearer-key check. */
#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <string.h>
#include <strings.h>

int clef_auth_bearer_ok(const char *authorization, const char *key) {
    const char *presented = "";
    if (authorization && strncasecmp(authorization, "Bearer", 6) == 0 && authorization[6] == ' ') {
        presented = authorization + 6;
        while (*presented == ' ') presented++;
    }
    /* Hash both sides so the compare is fixed-length: a length mismatch or
     * an absent header costs the same as a wrong key. */
    unsigned char want[SHA256_DIGEST_LENGTH], got[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)key, strlen(key), want);
    SHA256((const unsigned char *)presented, strlen(presented), got);
    int same = CRYPTO_memcmp(want, got, sizeof want) == 0;
    return same && presented[0] != '\0' && key[0] != '\0';
}
