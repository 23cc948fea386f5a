/*
 * metrics.c: see metrics.h. The broker's families: identity, objects,
 * global message counters, memory and disk, and the queues this broker is
 * the primary of. The cluster's are metrics_cluster.c's.
 *
 * Measured (release build, the 2-core development machine, one broker
 * with 50,000 queues): 350,028 samples, 24 MB, written in ~25-40 ms (its
 * debug log line says so; 56-63 ms when each family was a section of
 * its own and the queues were walked twice), ~34 ms of broker CPU per
 * scrape with the send (~70 ms before; the kept buffer below is a third
 * of that), ~0.06 s for curl to have it all (bench/RESULTS.md, "Issue
 * 20's management targets").
 */
#include "mgmt/metrics.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker/alarm.h"
#include "broker/broker.h"
#include "broker/channel.h"
#include "broker/connection.h"
#include "broker/flow.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/node.h"
#include "cluster/replication.h"
#include "cluster/member.h"
#include "lib/assert.h"
#include "lib/log.h"
#include "mgmt/api.h"
#include "mgmt/http.h"
#include "lib/json.h"
#include "mgmt/prom.h"

/* RabbitMQ labels its global counters with the protocol they count. */
#define METRICS_PROTOCOL "amqp091"

/* ---- objects ------------------------------------------------------------ */

/* queues: the queues this broker is the primary of (write_queues'
 * walk counted them). */
static void write_objects(struct prom *prom, struct broker *broker, uint64_t queues)
{
    uint64_t connections = 0, channels = 0, consumers = 0, in_flow = 0;
    uint64_t peer_channels = 0;
    list_for_each(node, &broker->connections) {
        const struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
        if (c->cluster_peer) { /* another broker's link, not a client */
            peer_channels += c->channels_open;
            continue;
        }
        connections++;
        in_flow += c->flow || flow_connection_waits(c);
        channels += c->channels_open;
        consumers += channels_consumers_count(c);
    }
    prom_gauge(prom, "rabbitmq_connections", "Connections currently open (clients)",
               connections);
    prom_gauge(prom, "rabbitmq_channels", "Channels currently open (clients)", channels);
    prom_gauge(prom, "rabbitmq_consumers", "Consumers currently connected (clients)",
               consumers);
    prom_gauge(prom, "rabbitmq_queues", "Queues available (this broker is their primary)",
               queues);
    if (member_node_of(broker))
        prom_gauge(prom, "quay_cluster_link_channels",
                   "Channels the other brokers' links have open here (their clients' remote "
                   "consumers and requests)", peer_channels);
    prom_gauge(prom, "quay_connections_flow",
               "Client connections not read now because of flow control", in_flow);
    prom_counter(prom, "quay_flow_stops_total",
                 "Times a client connection was stopped by a congested queue",
                 broker->counters.flow_stops);
    prom_family(prom, "rabbitmq_global_consumers", PROM_TYPE_GAUGE,
                "Current number of consumers");
    prom_sample_begin(prom);
    prom_label_str(prom, "protocol", METRICS_PROTOCOL);
    prom_sample_end(prom, consumers);
}

/* ---- global counters ---------------------------------------------------- */

static void counter_amqp(struct prom *prom, const char *name, const char *help, uint64_t value)
{
    prom_family(prom, name, PROM_TYPE_COUNTER, help);
    prom_sample_begin(prom);
    prom_label_str(prom, "protocol", METRICS_PROTOCOL);
    prom_sample_end(prom, value);
}

static void write_counters(struct prom *prom, const struct broker_counters *c)
{
    uint64_t delivered = c->delivered_consume_ack + c->delivered_consume_no_ack +
                         c->delivered_get_ack + c->delivered_get_no_ack;
    counter_amqp(prom, "rabbitmq_global_messages_received_total",
                 "Total number of messages received from publishers", c->received);
    counter_amqp(prom, "rabbitmq_global_messages_received_confirm_total",
                 "Total number of messages received from publishers expecting confirmations",
                 c->received_confirm);
    counter_amqp(prom, "rabbitmq_global_messages_routed_total",
                 "Total number of messages routed to queues", c->routed);
    counter_amqp(prom, "rabbitmq_global_messages_unroutable_dropped_total",
                 "Total number of messages published as non-mandatory into an exchange "
                 "and dropped as unroutable",
                 c->unroutable_dropped);
    counter_amqp(prom, "rabbitmq_global_messages_unroutable_returned_total",
                 "Total number of messages published as mandatory into an exchange and "
                 "returned to the publisher as unroutable",
                 c->unroutable_returned);
    counter_amqp(prom, "rabbitmq_global_messages_confirmed_total",
                 "Total number of messages confirmed to publishers", c->confirmed);
    counter_amqp(prom, "rabbitmq_global_messages_delivered_total",
                 "Total number of messages delivered to consumers", delivered);
    counter_amqp(prom, "rabbitmq_global_messages_delivered_consume_manual_ack_total",
                 "Total number of messages delivered to consumers using manual "
                 "acknowledgement mode",
                 c->delivered_consume_ack);
    counter_amqp(prom, "rabbitmq_global_messages_delivered_consume_auto_ack_total",
                 "Total number of messages delivered to consumers using automatic "
                 "acknowledgement mode",
                 c->delivered_consume_no_ack);
    counter_amqp(prom, "rabbitmq_global_messages_delivered_get_manual_ack_total",
                 "Total number of messages delivered to consumers using basic.get with "
                 "manual acknowledgement mode",
                 c->delivered_get_ack);
    counter_amqp(prom, "rabbitmq_global_messages_delivered_get_auto_ack_total",
                 "Total number of messages delivered to consumers using basic.get with "
                 "automatic acknowledgement mode",
                 c->delivered_get_no_ack);
    counter_amqp(prom, "rabbitmq_global_messages_redelivered_total",
                 "Total number of messages redelivered to consumers", c->redelivered);
    counter_amqp(prom, "rabbitmq_global_messages_acknowledged_total",
                 "Total number of messages acknowledged by consumers", c->acknowledged);
}

/* ---- memory and disk ---------------------------------------------------- */

/* The resident set from /proc (one small read per scrape), or 0. */
static uint64_t resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages_size = 0, resident_pages = 0;
    if (f == NULL)
        return 0;
    if (fscanf(f, "%llu %llu", &pages_size, &resident_pages) != 2)
        resident_pages = 0;
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? resident_pages * (uint64_t)page : 0;
}

static void write_resources(struct prom *prom, struct broker *broker)
{
    const struct alarm *alarm = &broker->alarm;
    prom_gauge(prom, "rabbitmq_alarms_memory_used_watermark",
               "is 1 if the memory high watermark alarm is in effect", alarm->memory_on);
    prom_gauge(prom, "rabbitmq_alarms_free_disk_space_watermark",
               "is 1 if the free disk space alarm is in effect", alarm->disk_on);
    prom_gauge(prom, "rabbitmq_process_resident_memory_bytes",
               "Memory used in bytes (resident set)", resident_bytes());
    prom_gauge(prom, "rabbitmq_resident_memory_limit_bytes",
               "Memory high watermark in bytes (0: none)", alarm->memory_high_watermark);
    prom_gauge(prom, "rabbitmq_disk_space_available_bytes", "Disk space available in bytes",
               alarm->disk_free_bytes);
    prom_gauge(prom, "rabbitmq_disk_space_available_limit_bytes",
               "Free disk space low watermark in bytes", alarm->disk_free_limit);
    prom_gauge(prom, "quay_memory_estimate_bytes",
               "The heap estimate the memory alarm compares with the watermark",
               alarm_memory_estimate(alarm));
    prom_gauge(prom, "quay_alarms_cluster",
               "is 1 if another broker of the cluster has an alarm on (publishers here wait "
               "too)",
               alarm->cluster_memory_on || alarm->cluster_disk_on);
}

/* ---- queues ------------------------------------------------------------- */

static uint64_t queue_ready(const struct queue *q)
{
    return queue_ready_count(q);
}

static uint64_t queue_unacked(const struct queue *q)
{
    return q->unacked_count;
}

static uint64_t queue_messages(const struct queue *q)
{
    return (uint64_t)queue_ready_count(q) + q->unacked_count;
}

static uint64_t queue_ready_bytes(const struct queue *q)
{
    return q->ready_bytes;
}

static uint64_t queue_paged(const struct queue *q)
{
    return q->paged_count;
}

static uint64_t queue_consumers(const struct queue *q)
{
    return q->consumers_count;
}

static uint64_t queue_confirms_waiting(const struct queue *q)
{
    return replication_confirms_waiting(q);
}

/* RabbitMQ's per-object queue families, each one walk over the queues
 * this broker is the primary of (a stand-in's counts are its proxy's). */
static const struct {
    const char *name;
    const char *help;
    uint64_t (*value)(const struct queue *queue);
} queue_families[] = {
    {"rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers",
     queue_ready},
    {"rabbitmq_queue_messages_unacked",
     "Messages delivered to consumers but not yet acknowledged", queue_unacked},
    {"rabbitmq_queue_messages", "Sum of ready and unacknowledged messages - total queue depth",
     queue_messages},
    {"rabbitmq_queue_messages_ready_bytes", "Size in bytes of ready messages",
     queue_ready_bytes},
    {"rabbitmq_queue_messages_paged_out", "Messages paged out to disk", queue_paged},
    {"rabbitmq_queue_consumers", "Consumers on a queue", queue_consumers},
    {"quay_queue_replication_lag_messages",
     "Publishes whose confirms wait for the queue's in-sync backups (0 without backups)",
     queue_confirms_waiting},
};

#define QUEUE_FAMILIES_COUNT (sizeof queue_families / sizeof queue_families[0])

/* A queue's part of the scrape: its labels (in struct queue_rows'
 * labels) and its value in each family. */
struct queue_row {
    size_t labels_at;
    size_t labels_size;
    uint64_t values[QUEUE_FAMILIES_COUNT];
};

/* The queues this broker is the primary of, as the scrape writes them. */
struct queue_rows {
    struct queue_row *rows; /* owned */
    size_t count;
    struct json labels;     /* each one's labels rendered: {vhost="...",queue="..."} */
};

/* One walk over the queues (each family walking them was slower: the
 * walk's cache misses were most of a scrape's time, prom.h): each local
 * queue's labels rendered once and its values kept. */
static void collect_queues(struct broker *broker, struct queue_rows *out)
{
    size_t queues = 0;
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);)
        queues += ((const struct vhost *)v->value)->queues.count;
    out->rows = malloc(sizeof *out->rows * (queues + 1));
    ASSERT(out->rows != NULL);
    out->count = 0;
    json_init(&out->labels);
    struct prom lp;
    prom_init(&lp, &out->labels);
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
        const struct vhost *vhost = v->value;
        struct hmap_entry *e;
        for (uint32_t j = 0; hmap_next(&vhost->queues, &j, &e);) {
            const struct queue *queue = e->value;
            if (queue_is_remote(queue))
                continue;
            struct queue_row *row = &out->rows[out->count++];
            row->labels_at = out->labels.size;
            prom_labels_begin(&lp);
            prom_label(&lp, "vhost", vhost->name);
            prom_label(&lp, "queue", queue->name);
            prom_labels_end(&lp);
            row->labels_size = out->labels.size - row->labels_at;
            for (size_t f = 0; f < QUEUE_FAMILIES_COUNT; f++)
                row->values[f] = queue_families[f].value(queue);
        }
    }
}

/* RabbitMQ's per-queue families, each in turn from the rows, straight
 * into the answer. 50,000 queues: bench/RESULTS.md, "Issue 20's
 * management targets". */
static void write_queues(struct prom *prom, const struct queue_rows *q)
{
    /* The whole text at once: a sample is its family's name, its labels
     * and at most 22 bytes more (" " 20 digits "\n"); 200 for each HELP. */
    size_t room = 0;
    for (size_t f = 0; f < QUEUE_FAMILIES_COUNT; f++)
        room += 200 + 2 * strlen(queue_families[f].name) + strlen(queue_families[f].help) +
                q->count * (strlen(queue_families[f].name) + 22) + q->labels.size;
    json_raw_space(prom->out, room);
    for (size_t f = 0; f < QUEUE_FAMILIES_COUNT; f++) {
        prom_family(prom, queue_families[f].name, PROM_TYPE_GAUGE, queue_families[f].help);
        for (size_t r = 0; r < q->count; r++)
            prom_sample_rendered(prom, q->labels.data + q->rows[r].labels_at,
                                 q->rows[r].labels_size, q->rows[r].values[f]);
    }
}

/* ---- the answer's buffer ------------------------------------------------- */

/* The last answer's buffer, once written, kept for the next scrape: a
 * fresh one of 24 MB (50,000 queues) is page-faulted in as it is written
 * and unmapped when freed, which was a third of the broker's CPU for a
 * scrape. One per process (the loop thread is the only user); dropped
 * when an answer needs under a quarter of it (queues deleted). */
static struct {
    char *data;
    size_t cap;
    size_t last_size; /* the last answer's */
} spare;

static void release_answer(void *data)
{
    size_t cap = malloc_usable_size(data);
    if (spare.data != NULL || cap / 4 > spare.last_size) {
        free(data);
        return;
    }
    spare.data = data;
    spare.cap = cap;
}

/* Writes into the spare buffer from here on, if there is one. */
static void take_spare(struct json *out)
{
    if (spare.data == NULL)
        return;
    if (spare.cap < out->size) {
        free(spare.data);
    } else {
        json_adopt(out, spare.data, spare.cap);
    }
    spare.data = NULL;
}

/* ---- the route ---------------------------------------------------------- */

static void handle_metrics(void *ctx, const struct auth_user *user, struct json *out)
{
    struct broker *broker = ctx;
    (void)user; /* the route needs the monitoring tag: everything is shown */
    uint64_t started_ns = uv_hrtime();
    take_spare(out);
    struct prom prom;
    prom_init(&prom, out);
    const struct cluster_node *cluster = member_node_of(broker);
    const char *node = cluster ? cluster_node_name(cluster) : "local";
    prom_family(&prom, "rabbitmq_identity_info", PROM_TYPE_GAUGE,
                "RabbitMQ node and cluster identity info");
    prom_sample_begin(&prom);
    prom_label_str(&prom, "rabbitmq_node", node);
    prom_sample_end(&prom, 1);
    prom_family(&prom, "rabbitmq_build_info", PROM_TYPE_GAUGE, "quay version info");
    prom_sample_begin(&prom);
    prom_label_str(&prom, "rabbitmq_version", QUAY_VERSION);
    prom_label_str(&prom, "product", "quay");
    prom_sample_end(&prom, 1);
    struct queue_rows queues;
    collect_queues(broker, &queues);
    write_objects(&prom, broker, queues.count);
    write_counters(&prom, &broker->counters);
    write_resources(&prom, broker);
    write_queues(&prom, &queues);
    json_free(&queues.labels);
    free(queues.rows);
    metrics__write_cluster(&prom, broker);
    spare.last_size = out->size;
    uint64_t took_us = (uv_hrtime() - started_ns) / 1000u;
    LOG_DEBUG("metrics: %llu samples, %zu bytes in %llu us",
              (unsigned long long)prom.samples_count, out->size,
              (unsigned long long)took_us);
}

void metrics_register(struct http_server *http, struct broker *broker)
{
    ASSERT(http != NULL);
    ASSERT(broker != NULL);
    http_server_route_text_release(http, "/metrics", handle_metrics, broker,
                                   MGMT_ACCESS_MONITORING, METRICS_CONTENT_TYPE, release_answer);
}
