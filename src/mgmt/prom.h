/*
 * prom.h: a writer of Prometheus's text exposition format (version 0.0.4),
 * for GET /metrics.
 *
 *   # HELP rabbitmq_queue_messages_ready Messages ready to be delivered to consumers
 *   # TYPE rabbitmq_queue_messages_ready gauge
 *   rabbitmq_queue_messages_ready{vhost="/",queue="orders"} 12
 *
 * The format wants every sample of a metric family right after its HELP
 * and TYPE lines, so a caller writes one family at a time:
 * prom_family, then prom_sample_begin / prom_label... / prom_sample_end
 * for each sample. Label values are escaped as the format requires
 * (backslash, double quote, line feed) and made valid UTF-8 (each byte of
 * an invalid sequence becomes U+FFFD), so arbitrary AMQP names are safe.
 * Metric and label names are the caller's static strings and are asserted
 * to be valid names: the caller decides them, not its input.
 *
 * The text goes into a struct json used as a plain buffer (json_raw: the
 * HTTP server's body, with its headroom), written front to back once:
 * nothing else is allocated.
 */
#ifndef QUAY_MGMT_PROM_H
#define QUAY_MGMT_PROM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/types.h"

struct json;

enum prom_type {
    PROM_TYPE_GAUGE,
    PROM_TYPE_COUNTER,
};

/* Owned by its caller, for one response; out is borrowed. */
struct prom {
    struct json *out;
    const char *family;            /* borrowed, static: the family being written */
    size_t family_size;            /* strlen(family) */
    bool in_sample;                /* a sample's name is written, its value is due */
    bool has_labels;               /* the sample's '{' is written */
    uint64_t samples_count;        /* written, for the log */
};

void prom_init(struct prom *prom, struct json *out);
/* Starts a family: its HELP and TYPE lines. A counter's name must end in
 * "_total" (the format's convention, which promtool checks). */
void prom_family(struct prom *prom, const char *name, enum prom_type type, const char *help);
/* Starts a sample of the current family: name is the family's. */
void prom_sample_begin(struct prom *prom);
/* Adds a label; value is any bytes (escaped). */
void prom_label(struct prom *prom, const char *name, struct bytes value);
void prom_label_str(struct prom *prom, const char *name, const char *value);
/* Ends the sample with its value. */
void prom_sample_end(struct prom *prom, uint64_t value);

/* Labels rendered once and used in many samples (an object's labels in
 * each of its families): prom_labels_begin, prom_label..., then
 * prom_labels_end write "{a="x",b="y"}" (nothing without labels) to
 * prom's buffer, no family name and no value. prom_sample_rendered writes
 * a whole sample of the current family with such text as its labels. */
void prom_labels_begin(struct prom *prom);
void prom_labels_end(struct prom *prom);
void prom_sample_rendered(struct prom *prom, const char *labels, size_t size, uint64_t value);
/* The same with more labels of the sample's own (static text such as
 * ",role=\"primary\"", already escaped; "" for none) added to labels,
 * which must not be empty. */
void prom_sample_rendered_with(struct prom *prom, const char *labels, size_t size,
                               const char *more, uint64_t value);

/* A sample without labels: a whole family of one sample. */
void prom_gauge(struct prom *prom, const char *name, const char *help, uint64_t value);
void prom_counter(struct prom *prom, const char *name, const char *help, uint64_t value);
/* The same for a duration in ns, written in seconds (exact: 9 decimals),
 * as Prometheus names want (_seconds); and a sample's end with one. */
void prom_gauge_seconds(struct prom *prom, const char *name, const char *help, uint64_t ns);
void prom_counter_seconds(struct prom *prom, const char *name, const char *help, uint64_t ns);
void prom_sample_end_ns_as_seconds(struct prom *prom, uint64_t ns);

#endif
