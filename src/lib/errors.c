/*
 * errors.c: see errors.h. The switch is built from QUAY_ERRORS, so two
 * codes with one value do not compile (a duplicate case).
 */
#include "lib/errors.h"

#define ERROR_NAME_CASE(name, value) \
    case name: return #name;

const char *error_name(int code)
{
    switch (code) {
        QUAY_ERRORS(ERROR_NAME_CASE)
    default: return "unknown error";
    }
}
