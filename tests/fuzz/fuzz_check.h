/* fuzz_check.h — the invariant check of the libFuzzer targets: a failed
 * CHECK prints the condition and its place and aborts, which libFuzzer
 * records as a crash (the input is kept as crash-*). */
#ifndef CLEF_TESTS_FUZZ_CHECK_H
#define CLEF_TESTS_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);                             \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

#endif
