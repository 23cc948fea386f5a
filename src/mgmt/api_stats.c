/*
 * api_stats.c: see api_stats.h.
 */
#include "mgmt/api_stats.h"

#include <math.h>
#include <stdio.h>

#include "lib/assert.h"
#include "lib/json.h"

void api_stats_write_rate(struct json *out, const char *key, double rate)
{
    char details[64];
    int n = snprintf(details, sizeof details, "%s_details", key);
    ASSERT(n > 0 && (size_t)n < sizeof details);
    json_key(out, details);
    json_object_begin(out);
    json_key(out, "rate");
    json_decimal(out, fabs(rate) < 0.005 ? 0.0 : rate); /* no "-0.0" */
    json_object_end(out);
}

void api_stats_write(struct json *out, const char *key, uint64_t total, double rate)
{
    json_kv_uint(out, key, total);
    api_stats_write_rate(out, key, rate);
}
