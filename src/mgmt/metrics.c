/*
 * metrics.c: see metrics.h. The broker's families: identity, objects,
 * global message counters, memory and disk, and the queues this broker is
 * the primary of. The cluster's are metrics_cluster.c's.
 *
 * Measured (release build, the 2-core development machine, one broker
 * with 50,000 queues): 350,030 samples, 24 MB, built in ~15-20 ms of CPU
 * in 15-22 slices of at most ~1 ms of CPU each (its debug log line gives
 * the slices and the longest, in wall-clock time, which is longer when
 * the process was preempted); ~0.04-0.08 s for curl to have it all.
 * Written in one loop turn it held the loop ~25-40 ms; with a scrape a
 * second, a 2,000 msg/s probe's worst latency was ~70-120 ms then and is
 * ~15 ms now, what it is without scraping on that machine
 * (bench/RESULTS.md, "A scrape in slices").
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
#include "broker/queue_walk.h"
#include "broker/vhost.h"
#include "cluster/node.h"
#include "cluster/replication.h"
#include "cluster/member.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/list.h"
#include "lib/log.h"
#include "mgmt/api.h"
#include "mgmt/http.h"
#include "lib/json.h"
#include "mgmt/prom.h"

/* RabbitMQ labels its global counters with the protocol they count. */
#define METRICS_PROTOCOL "amqp091"

/* ---- objects ------------------------------------------------------------ */

/* queues: the queues this broker is the primary of (the scrape's walk
 * counted them). */
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
    prom_counter(prom, "quay_forward_duplicates_total",
                 "Forwards sent again by another broker (their answer was lost) that a queue "
                 "here had taken already: confirmed, not enqueued twice",
                 broker->counters.forward_duplicates);
    prom_counter(prom, "quay_forward_channels_frozen_total",
                 "Peers' forwarding channels that refused a forward and so record no more "
                 "origins until their link reconnects (a resend through them is taken again)",
                 broker->counters.forward_channels_frozen);
    /* The loop thread's (net/loop_lag.h): what a client waits at worst
     * before its frame is read, and the busy share (rate of the total). */
    prom_gauge_seconds(prom, "quay_event_loop_lag_seconds",
                       "The longest the event loop went without reading new input (one "
                       "iteration's work) in the last 5 to 10 s",
                       loop_lag_max_ns(&broker->net.loop_lag));
    prom_counter_seconds(prom, "quay_event_loop_busy_seconds_total",
                         "Time the event loop spent working rather than waiting for events",
                         broker->net.loop_lag.busy_ns_total);
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

/* The per-queue families: RabbitMQ's, of the queues this broker holds
 * (a stand-in's counts are its proxy's), then the cluster's, from the
 * map. A family's samples come from the rows the walk left (below). */
enum queue_family_index {
    FAMILY_READY,
    FAMILY_UNACKED,
    FAMILY_MESSAGES,
    FAMILY_READY_BYTES,
    FAMILY_PAGED,
    FAMILY_CONSUMERS,
    FAMILY_LAG,
    FAMILY_ROLE,
    FAMILY_BACKUPS,
    FAMILY_IN_SYNC,
    QUEUE_FAMILIES_COUNT,
};

/* Which rows a family has a sample for (struct queue_row.has). */
enum {
    ROW_LOCAL = 1,                 /* this broker holds the queue (not a stand-in) */
    ROW_MAPPED = 2,                /* in the cluster's map: its role */
    ROW_PRIMARY = 4,               /* the map says this broker is its primary */
};
#define ROW_KINDS 3

static const struct {
    const char *name;
    const char *help;
    uint64_t (*value)(const struct queue *queue); /* read when walked; NULL: the map's */
    uint8_t needs;                 /* ROW_* */
} queue_families[QUEUE_FAMILIES_COUNT] = {
    [FAMILY_READY] = {"rabbitmq_queue_messages_ready",
                      "Messages ready to be delivered to consumers", queue_ready, ROW_LOCAL},
    [FAMILY_UNACKED] = {"rabbitmq_queue_messages_unacked",
                        "Messages delivered to consumers but not yet acknowledged",
                        queue_unacked, ROW_LOCAL},
    [FAMILY_MESSAGES] = {"rabbitmq_queue_messages",
                         "Sum of ready and unacknowledged messages - total queue depth",
                         queue_messages, ROW_LOCAL},
    [FAMILY_READY_BYTES] = {"rabbitmq_queue_messages_ready_bytes",
                            "Size in bytes of ready messages", queue_ready_bytes, ROW_LOCAL},
    [FAMILY_PAGED] = {"rabbitmq_queue_messages_paged_out", "Messages paged out to disk",
                      queue_paged, ROW_LOCAL},
    [FAMILY_CONSUMERS] = {"rabbitmq_queue_consumers", "Consumers on a queue", queue_consumers,
                          ROW_LOCAL},
    [FAMILY_LAG] = {"quay_queue_replication_lag_messages",
                    "Publishes whose confirms wait for the queue's in-sync backups (0 without "
                    "backups)",
                    queue_confirms_waiting, ROW_LOCAL},
    [FAMILY_ROLE] = {"quay_queue_role",
                     "is 1 with this broker's role for each queue of the map: primary (it "
                     "holds the queue), backup (a copy) or proxy (it forwards to the primary)",
                     NULL, ROW_MAPPED},
    [FAMILY_BACKUPS] = {"quay_queue_backups", "Backups of each queue this broker is the "
                        "primary of", NULL, ROW_PRIMARY},
    [FAMILY_IN_SYNC] = {"quay_queue_backups_in_sync",
                        "In-sync backups (confirms wait for them) of each queue this broker is "
                        "the primary of",
                        NULL, ROW_PRIMARY},
};

/* quay_queue_role's own label, added to the queue's. */
static const char *const role_labels[] = {
    [METRICS_ROLE_NONE] = "",
    [METRICS_ROLE_PRIMARY] = ",role=\"primary\"",
    [METRICS_ROLE_BACKUP] = ",role=\"backup\"",
    [METRICS_ROLE_PROXY] = ",role=\"proxy\"",
};

/* A queue as the walk read it: its labels, rendered once for all its
 * families (in struct scrape's labels), and its value in each. */
struct queue_row {
    size_t labels_at;
    uint32_t labels_size;
    uint8_t has;                   /* ROW_* */
    uint8_t role;                  /* enum metrics_role */
    uint64_t values[QUEUE_FAMILIES_COUNT];
};

static unsigned row_kind(uint8_t needs)
{
    return needs == ROW_LOCAL ? 0 : needs == ROW_MAPPED ? 1 : 2;
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

/* ---- a scrape, a slice at a time ------------------------------------------ */

/*
 * Why slices: written whole, a scrape of 50,000 queues held the loop for
 * ~25-40 ms (it was ~57 ms before it was made cheaper), and every
 * publisher and consumer of the broker waited that long, once a scrape.
 * Now the answer is built by an idle handle (it runs once every loop
 * turn while there is work, and makes the loop poll without blocking)
 * that stops after METRICS_SLICE_US, so the message path runs between
 * slices. Two phases:
 *
 *   WALK   queue_walk_next over the broker's queues, each read into a
 *          row: labels escaped once, every family's value;
 *   WRITE  the broker-wide families first (read in that turn), then
 *          each per-queue family's samples from the rows.
 *
 * Built then sent, not streamed: the body is one buffer (kept warm for
 * the next scrape, below) sent with its Content-Length, which the HTTP
 * server already does for every answer; chunked streaming would need
 * the server to write while the route still produces and to pause the
 * producer when the client reads slowly, to save a buffer that is kept
 * anyway. The time to the first byte is the build's (the whole is still
 * far under Prometheus's timeouts: bench/RESULTS.md).
 *
 * Scrapes run one at a time, in the order they came (each holds a walk
 * and rows of every queue: two at once would only double that); a
 * scrape whose client goes is dropped, running or waiting.
 */
enum scrape_phase {
    SCRAPE_WAITING,                /* behind another */
    SCRAPE_WALK,
    SCRAPE_WRITE,
    SCRAPE_DONE,
};

/* Owned by the scrapes list from the request until it is answered or its
 * client is gone; freed when its idle handle has closed. */
struct scrape {
    struct list_node link;         /* in scrapes: the first one runs */
    struct broker *broker;         /* borrowed */
    struct http_call *call;        /* borrowed, until answered or cancelled */
    uv_idle_t idle;
    enum scrape_phase phase;
    struct queue_walk walk;
    struct queue_row *rows;        /* owned */
    size_t rows_count, rows_cap;
    size_t kind_rows[ROW_KINDS];   /* rows per kind (row_kind) */
    size_t kind_labels[ROW_KINDS]; /* and their labels' bytes */
    struct json labels;            /* the rows' labels */
    struct prom label_writer;
    struct metrics_cluster_totals cluster;
    struct json out;               /* the answer */
    struct prom prom;
    size_t family, row;            /* WRITE: the next sample */
    uint64_t began_ns;
    uint64_t slice_max_ns;
    uint32_t slices_count;
};

static struct list_node scrapes = LIST_INIT(scrapes);

/* Rows are read and samples written in runs of this many between looks
 * at the clock (a row costs ~0.5 us, a sample ~0.05 us). */
#define SCRAPE_RUN_ROWS 32u
#define SCRAPE_RUN_SAMPLES 512u

/* queue is not const for its cluster_entry only (kept for the next scrape). */
static void read_row(struct scrape *s, struct metrics_cluster_view *view, struct queue *queue)
{
    bool local = !queue_is_remote(queue);
    uint8_t backups = 0, in_sync = 0;
    enum metrics_role role =
        view != NULL ? metrics__cluster_queue(view, queue, &backups, &in_sync, &s->cluster)
                     : METRICS_ROLE_NONE;
    if (!local && role == METRICS_ROLE_NONE)
        return; /* a stand-in outside the map: nothing to show */
    if (s->rows_count == s->rows_cap) {
        s->rows_cap = 2 * s->rows_cap + 64;
        s->rows = xrealloc(s->rows, sizeof *s->rows * s->rows_cap);
    }
    struct queue_row *row = &s->rows[s->rows_count++];
    row->labels_at = s->labels.size;
    prom_labels_begin(&s->label_writer);
    prom_label(&s->label_writer, "vhost", queue->vhost->name);
    prom_label(&s->label_writer, "queue", queue->name);
    prom_labels_end(&s->label_writer);
    row->labels_size = (uint32_t)(s->labels.size - row->labels_at);
    row->has = (uint8_t)((local ? ROW_LOCAL : 0) | (role != METRICS_ROLE_NONE ? ROW_MAPPED : 0) |
                         (role == METRICS_ROLE_PRIMARY ? ROW_PRIMARY : 0));
    row->role = (uint8_t)role;
    for (size_t f = 0; f < QUEUE_FAMILIES_COUNT; f++) {
        row->values[f] = local && queue_families[f].value ? queue_families[f].value(queue) : 0;
    }
    row->values[FAMILY_ROLE] = 1;
    row->values[FAMILY_BACKUPS] = backups;
    row->values[FAMILY_IN_SYNC] = in_sync;
    for (unsigned k = 0; k < ROW_KINDS; k++) {
        if (row->has & (1u << k)) {
            s->kind_rows[k]++;
            s->kind_labels[k] += row->labels_size;
        }
    }
}

static void write_head(struct scrape *s);

/* A run of the walk; false once it is over. */
static bool walk_run(struct scrape *s)
{
    struct metrics_cluster_view view;
    bool clustered = metrics__cluster_view(s->broker, &view);
    for (unsigned i = 0; i < SCRAPE_RUN_ROWS; i++) {
        struct queue *queue = queue_walk_next(&s->walk);
        if (queue == NULL)
            return false;
        read_row(s, clustered ? &view : NULL, queue);
    }
    return true;
}

/* The room the per-queue families take, reserved at once: the buffer
 * grown by doubling would copy up to half of 24 MB in a single turn. A
 * sample is its family's name, its labels, the role's label and at most
 * 22 bytes more (" " 20 digits "\n"); 200 for each HELP and TYPE. */
static size_t queue_families_room(const struct scrape *s)
{
    size_t room = 0;
    for (size_t f = 0; f < QUEUE_FAMILIES_COUNT; f++) {
        unsigned k = row_kind(queue_families[f].needs);
        size_t name = strlen(queue_families[f].name);
        room += 200 + 2 * name + strlen(queue_families[f].help) +
                s->kind_rows[k] * (name + 16 + 22) + s->kind_labels[k];
    }
    return room;
}

/* A run of samples; false once the last family is written. */
static bool write_run(struct scrape *s)
{
    for (unsigned n = 0; n < SCRAPE_RUN_SAMPLES; n++) {
        while (s->family < QUEUE_FAMILIES_COUNT &&
               (s->row == s->rows_count || s->kind_rows[row_kind(
                                                queue_families[s->family].needs)] == 0)) {
            s->family++;
            s->row = 0;
        }
        if (s->family == QUEUE_FAMILIES_COUNT)
            return false;
        uint8_t needs = queue_families[s->family].needs;
        if (s->row == 0)
            prom_family(&s->prom, queue_families[s->family].name, PROM_TYPE_GAUGE,
                        queue_families[s->family].help);
        const struct queue_row *row = &s->rows[s->row++];
        if (!(row->has & needs))
            continue;
        const char *labels = s->labels.data + row->labels_at;
        if (s->family == FAMILY_ROLE)
            prom_sample_rendered_with(&s->prom, labels, row->labels_size,
                                      role_labels[row->role], row->values[s->family]);
        else
            prom_sample_rendered(&s->prom, labels, row->labels_size, row->values[s->family]);
    }
    return true;
}

static void scrape_finish(struct scrape *s);

/* The idle handle's: work until the slice's time is up. */
static void on_slice(uv_idle_t *idle)
{
    struct scrape *s = idle->data;
    uint64_t began_ns = uv_hrtime();
    uint64_t deadline_ns = began_ns + METRICS_SLICE_US * 1000u;
    bool more = true;
    while (more && (s->phase == SCRAPE_WALK || s->phase == SCRAPE_WRITE)) {
        if (s->phase == SCRAPE_WALK && !walk_run(s)) {
            queue_walk_end(&s->walk);
            s->phase = SCRAPE_WRITE;
            write_head(s);
        } else if (s->phase == SCRAPE_WRITE && !write_run(s)) {
            s->phase = SCRAPE_DONE;
        }
        more = uv_hrtime() < deadline_ns;
    }
    uint64_t took_ns = uv_hrtime() - began_ns;
    s->slices_count++;
    if (took_ns > s->slice_max_ns)
        s->slice_max_ns = took_ns;
    if (s->phase != SCRAPE_DONE)
        return;
    LOG_DEBUG("metrics: %llu samples, %zu bytes in %llu us, %u slices, the longest %llu us",
              (unsigned long long)s->prom.samples_count, s->out.size,
              (unsigned long long)((uv_hrtime() - s->began_ns) / 1000u), s->slices_count,
              (unsigned long long)(s->slice_max_ns / 1000u));
    spare.last_size = s->out.size;
    http_call_answer_text(s->call, 200, &s->out, METRICS_CONTENT_TYPE, release_answer);
    s->call = NULL;
    scrape_finish(s);
}

static void scrape_start(struct scrape *s)
{
    ASSERT(s->phase == SCRAPE_WAITING);
    s->began_ns = uv_hrtime();
    s->phase = SCRAPE_WALK;
    http_body_init(&s->out);
    take_spare(&s->out);
    prom_init(&s->prom, &s->out);
    json_init(&s->labels);
    prom_init(&s->label_writer, &s->labels);
    size_t queues = 0;
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&s->broker->vhosts, &i, &v);)
        queues += ((const struct vhost *)v->value)->queues.count;
    s->rows_cap = queues + 1;
    s->rows = xmalloc(sizeof *s->rows * s->rows_cap);
    /* ~48 bytes of labels a queue, so that they seldom grow (a copy). */
    json_raw_space(&s->labels, 48 * s->rows_cap);
    queue_walk_begin(&s->walk, s->broker);
    uv_idle_start(&s->idle, on_slice);
}

static void on_scrape_closed(uv_handle_t *handle)
{
    free(handle->data);
}

/* Answered or cancelled: everything but the answer goes, and the next
 * scrape starts. */
static void scrape_finish(struct scrape *s)
{
    ASSERT(s->call == NULL);
    bool was_running = list_first(&scrapes) == &s->link;
    queue_walk_end(&s->walk);
    free(s->rows);
    s->rows = NULL;
    json_free(&s->labels);
    list_remove(&s->link);
    uv_idle_stop(&s->idle);
    uv_close((uv_handle_t *)&s->idle, on_scrape_closed);
    if (was_running && !list_empty(&scrapes))
        scrape_start(CONTAINER_OF(list_first(&scrapes), struct scrape, link));
}

/* The client went (or the server closes) before the answer. */
static void on_scrape_cancelled(void *arg)
{
    struct scrape *s = arg;
    if (s->phase != SCRAPE_WAITING && s->out.data != NULL) {
        size_t size;
        release_answer(json_release(&s->out, &size)); /* kept for the next */
    }
    s->call = NULL;
    scrape_finish(s);
}

/* ---- the route ---------------------------------------------------------- */

/* The families that are not per queue, once the walk is over (so
 * rabbitmq_queues is the walk's count), then the room for the rest. */
static void write_head(struct scrape *s)
{
    struct prom *prom = &s->prom;
    struct broker *broker = s->broker;
    const struct cluster_node *cluster = member_node_of(broker);
    const char *node = cluster ? cluster_node_name(cluster) : "local";
    prom_family(prom, "rabbitmq_identity_info", PROM_TYPE_GAUGE,
                "RabbitMQ node and cluster identity info");
    prom_sample_begin(prom);
    prom_label_str(prom, "rabbitmq_node", node);
    prom_sample_end(prom, 1);
    prom_family(prom, "rabbitmq_build_info", PROM_TYPE_GAUGE, "quay version info");
    prom_sample_begin(prom);
    prom_label_str(prom, "rabbitmq_version", QUAY_VERSION);
    prom_label_str(prom, "product", "quay");
    prom_sample_end(prom, 1);
    write_objects(prom, broker, s->kind_rows[row_kind(ROW_LOCAL)]);
    write_counters(prom, &broker->counters);
    write_resources(prom, broker);
    metrics__write_cluster(prom, broker, &s->cluster);
    json_raw_space(&s->out, queue_families_room(s));
}

/* A scrape joins the line, and starts if it is alone in it. */
static void handle_metrics(void *ctx, struct http_call *call, const struct auth_user *user)
{
    struct broker *broker = ctx;
    (void)user; /* the route needs the monitoring tag: everything is shown */
    struct scrape *s = xcalloc(1, sizeof *s);
    s->broker = broker;
    s->call = call;
    s->phase = SCRAPE_WAITING;
    uv_idle_init(broker->loop, &s->idle);
    s->idle.data = s;
    http_call_on_cancel(call, on_scrape_cancelled, s);
    bool alone = list_empty(&scrapes);
    list_push_back(&scrapes, &s->link);
    if (alone)
        scrape_start(s);
}

void metrics_register(struct http_server *http, struct broker *broker)
{
    ASSERT(http != NULL);
    ASSERT(broker != NULL);
    http_server_route_later(http, "/metrics", handle_metrics, broker, MGMT_ACCESS_MONITORING);
}
