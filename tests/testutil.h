/* testutil.h — helpers shared by the cmocka test programs. */
#ifndef CLEF_TESTS_TESTUTIL_H
#define CLEF_TESTS_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "json/json.h"

/* Read a whole file into a NUL-terminated heap buffer (caller frees); fails
 * the test if it cannot. `len` may be NULL. */
char *tu_read_file(const char *path, size_t *len);

/* Read a JSON-lines file: returns an array of parsed documents (caller frees
 * each with json_free and the array with free); fails the test on error. */
json_value **tu_read_jsonl(const char *path, size_t *n);

/* Path under the fixtures directory (static buffer per call site is not
 * needed: returns a heap string the caller frees). */
char *tu_fixture(const char *rel);

/* Element `i` of a JSON array of integers as int64 (fails the test otherwise). */
int64_t tu_int_at(const json_value *arr, size_t i);
/* Element `i` of a JSON array of numbers as double. */
double tu_num_at(const json_value *arr, size_t i);

#endif
