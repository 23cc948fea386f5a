/*
 * assert.c: the one place an assertion failure is reported. It prints the
 * failed expression with its location and aborts, so a core dump (or the
 * sanitizer's report) shows the state that broke the invariant.
 */
#include "lib/assert.h"

#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>

void quay_assert_fail(const char *expr, const char *file, int line, const char *func)
{
    fprintf(stderr, "quay: assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
    /* The call chain, for the log of a broker that nobody ran under a
     * debugger (addresses resolve with addr2line on the same binary). */
    void *frames[32];
    int n = backtrace(frames, 32);
    backtrace_symbols_fd(frames, n, 2);
    fflush(stderr);
    abort();
}
