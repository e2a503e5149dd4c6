/* record.c — ownership helpers for clef_record (SPEC.md §3.4). */
#include "decision/record.h"

#include <stdlib.h>
#include <string.h>

size_t clef_record_total_options(const clef_record *r) {
    size_t n = 0;
    for (size_t i = 0; i < r->n_questions; i++) n += r->questions[i].n_options;
    return n;
}

void clef_record_free(clef_record *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n_questions; i++) free(r->questions[i].options);
    free(r->questions);
    free(r->input_ids);
    free(r->positions);
    memset(r, 0, sizeof *r);
}
