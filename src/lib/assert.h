/*
 * assert.h: assertions that stay on in release builds.
 *
 * ASSERT(x) guards invariants and programmer errors everywhere; it is cheap
 * and never compiled out, because a broker that goes on after its state is
 * known to be wrong can lose confirmed messages. DEBUG_ASSERT(x) is for O(n)
 * checks and exists only in debug builds. ALWAYS(x)/NEVER(x) mark defensive
 * branches that "cannot happen": they assert in debug builds and evaluate
 * to x in release builds so the branch still protects production.
 */
#ifndef QUAY_LIB_ASSERT_H
#define QUAY_LIB_ASSERT_H

#include <stdbool.h>

_Noreturn void quay_assert_fail(const char *expr, const char *file, int line, const char *func);

#define ASSERT(x) \
    ((x) ? (void)0 : quay_assert_fail(#x, __FILE__, __LINE__, __func__))

#ifndef NDEBUG
static inline bool quay_always(bool x, const char *expr, const char *file, int line,
                               const char *func)
{
    if (!x)
        quay_assert_fail(expr, file, line, func);
    return x;
}
static inline bool quay_never(bool x, const char *expr, const char *file, int line,
                              const char *func)
{
    if (x)
        quay_assert_fail(expr, file, line, func);
    return x;
}
#define DEBUG_ASSERT(x) ASSERT(x)
#define ALWAYS(x) quay_always(!!(x), #x, __FILE__, __LINE__, __func__)
#define NEVER(x) quay_never(!!(x), "!(" #x ")", __FILE__, __LINE__, __func__)
#else
#define DEBUG_ASSERT(x) ((void)0)
#define ALWAYS(x) (!!(x))
#define NEVER(x) (!!(x))
#endif

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#endif
