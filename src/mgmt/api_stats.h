/*
 * api_stats.h: RabbitMQ's message_stats fields: a counter and its rate,
 *
 *   "publish": 1200, "publish_details": {"rate": 40.0}
 *
 * (broker/rates.h computes the rates), shared by /api/overview,
 * /api/queues and /api/channels.
 */
#ifndef QUAY_MGMT_API_STATS_H
#define QUAY_MGMT_API_STATS_H

#include <stdint.h>

struct json;

/* "key": total, "key_details": {"rate": rate}. */
void api_stats_write(struct json *out, const char *key, uint64_t total, double rate);
/* "key_details": {"rate": rate} alone (the rate of change of a count). */
void api_stats_write_rate(struct json *out, const char *key, double rate);

#endif
