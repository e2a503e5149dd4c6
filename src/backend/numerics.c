/* numerics.c — numeric mode names and bars (numerics.h). */
#include "backend/numerics.h"

#include <string.h>

static const char *const NAMES[] = {"default", "fast", "balanced", "precise"};

int clef_numerics_parse(const char *name, clef_numerics *out) {
    if (!name) return -1;
    for (int i = CLEF_NUMERICS_FAST; i <= CLEF_NUMERICS_PRECISE; i++)
        if (!strcmp(name, NAMES[i])) {
            *out = (clef_numerics)i;
            return 0;
        }
    return -1;
}

const char *clef_numerics_name(clef_numerics m) {
    return m >= CLEF_NUMERICS_ENV && m <= CLEF_NUMERICS_PRECISE ? NAMES[m] : "unknown";
}

unsigned clef_numerics_parts(clef_numerics m) {
    if (m == CLEF_NUMERICS_ENV) m = CLEF_NUMERICS_DEFAULT;
    switch (m) {
    case CLEF_NUMERICS_BALANCED: return CLEF_PRECISE_DENSE | CLEF_PRECISE_ATTN;
    case CLEF_NUMERICS_PRECISE: return CLEF_PRECISE_ALL;
    default: return 0;
    }
}

void clef_numerics_bar(clef_numerics m, double *min_agree, double *max_tv) {
    if (m == CLEF_NUMERICS_ENV) m = CLEF_NUMERICS_DEFAULT;
    if (m == CLEF_NUMERICS_PRECISE) {
        *min_agree = 0.995;
        *max_tv = 0.001;
    } else {
        *min_agree = 0.871;
        *max_tv = 0.0159;
    }
}
