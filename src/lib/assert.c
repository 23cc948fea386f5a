/*
 * assert.c: the one place an assertion failure is reported. It prints the
 * failed expression with its location and aborts, so a core dump (or the
 * sanitizer's report) shows the state that broke the invariant.
 */
#include "lib/assert.h"

#include <stdio.h>
#include <stdlib.h>

void quay_assert_fail(const char *expr, const char *file, int line, const char *func)
{
    fprintf(stderr, "quay: assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
    fflush(stderr);
    abort();
}
