/*
 * broker.c: see broker.h. Start-up order: users, vhosts, listeners, tick;
 * quayd's main then joins the cluster and starts the HTTP API (cli/), and
 * plugs them in (broker->cluster_ops, broker->http), so that the broker
 * stops and frees them in its own order. Never includes a header of a
 * layer above it (docs/ARCHITECTURE.md section 1).
 * Shutdown closes listeners first (no new clients), then every connection
 * with 320 CONNECTION_FORCED, and lets the loop drain.
 */
#include "broker/broker.h"

#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/channel.h"
#include "broker/connection.h"
#include "broker/flow.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/users.h"
#include "broker/vhost.h"
#include "broker/cluster_ops.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/log.h"

#define TICK_MS 250

void broker_config_defaults(struct broker_config *config)
{
    memset(config, 0, sizeof *config);
    config->data_dir = "quay-data";
    /* RabbitMQ's defaults: 40% of physical memory, 50 MB of free disk. */
    alarm_parse_size("0.4", true, &config->memory_high_watermark);
    config->disk_free_limit = 50u * 1000 * 1000;
    config->default_backups = 1; /* in a cluster: a queue survives its primary */
    config->auto_rebalance = true;
    /* A catch-up at full speed took both cores of a small machine from
     * the queues it was meant to spare (a publisher's p99 5-6 ms at
     * 370-500 MB/s); paced at this, 3-4.6 ms (bench/RESULTS.md). */
    config->catch_up_rate = 300u * 1000 * 1000;
    config->limits = (struct broker_limits){
        .frame_max = 131072,
        .channel_max = 2047,
        .heartbeat_s = 60,
        .handshake_timeout_ms = 10000,
        .message_size_max = 128u << 20,
        .connections_max = 0,
        .handshaking_max = 1000,
        .consumers_per_channel_max = 0,
        .queues_max = 0,
        .read_batch_us = READ_BATCH_WAIT_US_DEFAULT,
        .read_share = NET_READ_SHARE_DEFAULT,
    };
}

/* The queues are sampled in BROKER_RATES_PARTS parts, one a tick: each
 * queue joins the active list of its part (queue.c, round-robin at its
 * creation), so a round's pauses are a quarter of its active queues each
 * and a queue's samples stay one second apart. They are dated by the
 * round's first tick, which shifts every one of them alike and leaves the
 * rate (a difference over a difference) as it was. Only the owners on the
 * active lists are sampled (rates.h): the others hold their newest
 * sample's values. */
#define RATES_PHASES BROKER_RATES_PARTS
_Static_assert(RATES_PHASES * TICK_MS == RATES_SAMPLE_MS, "the phases fill a sample interval");

/* Round start: the clock, the broker's counters, the active connections
 * and channels. */
static void sample_round_start(struct broker *broker, uint64_t now)
{
    rates_clock_tick(&broker->rates_clock, now);
    const struct broker_counters *c = &broker->counters;
    uint32_t values[BROKER_RATE_COUNT] = {
        [BROKER_RATE_PUBLISH] = (uint32_t)c->received,
        [BROKER_RATE_CONFIRM] = (uint32_t)c->confirmed,
        [BROKER_RATE_DELIVER] = (uint32_t)c->delivered_consume_ack,
        [BROKER_RATE_DELIVER_NO_ACK] = (uint32_t)c->delivered_consume_no_ack,
        [BROKER_RATE_GET] = (uint32_t)c->delivered_get_ack,
        [BROKER_RATE_GET_NO_ACK] = (uint32_t)c->delivered_get_no_ack,
        [BROKER_RATE_REDELIVER] = (uint32_t)c->redelivered,
        [BROKER_RATE_ACK] = (uint32_t)c->acknowledged,
        [BROKER_RATE_RETURN_UNROUTABLE] = (uint32_t)c->unroutable_returned,
        [BROKER_RATE_DROP_UNROUTABLE] = (uint32_t)c->unroutable_dropped,
    };
    rates_sample(&broker->rates, &broker->rates_clock, values, BROKER_RATE_COUNT);
    struct rates_active *active = &broker->connections_active;
    if (active->count > 0) {
        list_for_each_safe(node, &active->owners) {
            struct rates *r = CONTAINER_OF(node, struct rates, active_link);
            struct connection *connection = CONTAINER_OF(r, struct connection, rates);
            /* Sampled mod 2^32: exact while under 2^31 bytes (2 GiB) in 5 s. */
            uint32_t bytes[CONNECTION_RATE_COUNT] = {
                [CONNECTION_RATE_RECV_OCT] = (uint32_t)connection->conn.bytes_in,
                [CONNECTION_RATE_SEND_OCT] = (uint32_t)connection->conn.bytes_out};
            rates_sample(r, &broker->rates_clock, bytes, CONNECTION_RATE_COUNT);
            if (rates_still(r))
                rates_leave(active, r);
        }
    }
    channels_sample_rates(&broker->channels_active, &broker->rates_clock);
}

#if defined(__SANITIZE_ADDRESS__)
/* Tests run sanitized: every round, in O(queues), that each queue off its
 * list holds its newest sample's values (so that whatever changes a
 * queue's stats or counts called queue_rates_moved), that the totals
 * are the sums of the newest samples, and that each vhost's totals
 * (vhost.h) are its queues' sums. Production builds do not walk. */
static void check_idle_queues(struct broker *broker)
{
    uint32_t ready = 0, unacked = 0;
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
        struct hmap_entry *q;
        const struct vhost *vhost = v->value;
        uint64_t vhost_ready = 0, vhost_unacked = 0, consumers = 0, paged = 0;
        for (uint32_t j = 0; hmap_next(&vhost->queues, &j, &q);) {
            struct queue *queue = q->value;
            const struct rates *r = &queue->rates;
            consumers += queue->consumers_count;
            paged += queue->paged_count;
            ready += r->newest[QUEUE_RATE_READY];
            unacked += r->newest[QUEUE_RATE_UNACKED];
            vhost_ready += r->newest[QUEUE_RATE_READY];
            vhost_unacked += r->newest[QUEUE_RATE_UNACKED];
            if (rates_listed(r))
                continue;
            const struct queue_stats *st = &queue->stats;
            ASSERT(r->newest[QUEUE_RATE_PUBLISH] == (uint32_t)st->publish);
            ASSERT(r->newest[QUEUE_RATE_DELIVER] == (uint32_t)st->deliver);
            ASSERT(r->newest[QUEUE_RATE_DELIVER_NO_ACK] == (uint32_t)st->deliver_no_ack);
            ASSERT(r->newest[QUEUE_RATE_GET] == (uint32_t)st->get);
            ASSERT(r->newest[QUEUE_RATE_GET_NO_ACK] == (uint32_t)st->get_no_ack);
            ASSERT(r->newest[QUEUE_RATE_REDELIVER] == (uint32_t)st->redeliver);
            ASSERT(r->newest[QUEUE_RATE_ACK] == (uint32_t)st->ack);
            ASSERT(r->newest[QUEUE_RATE_READY] == queue->ready_count);
            ASSERT(r->newest[QUEUE_RATE_UNACKED] == queue->unacked_count);
        }
        ASSERT(vhost_ready == vhost->totals.ready_sampled);
        ASSERT(vhost_unacked == vhost->totals.unacked_sampled);
        ASSERT(consumers == vhost->totals.consumers);
        ASSERT(paged == vhost->totals.paged);
    }
    ASSERT(ready == broker->rates_totals[BROKER_TOTALS_RATE_READY]);
    ASSERT(unacked == broker->rates_totals[BROKER_TOTALS_RATE_UNACKED]);
    list_for_each(node, &broker->connections) {
        struct connection *connection = CONTAINER_OF(node, struct connection, broker_link);
        channels_check_idle(connection);
    }
}
#else
static void check_idle_queues(struct broker *broker)
{
    (void)broker;
}
#endif

/* The listed queues' changes since their newest samples (rates.h). */
static void add_moved(struct broker *broker, broker_vhost_filter sees, const void *ctx,
                      struct broker_queue_totals *t)
{
    int64_t ready = 0, unacked = 0;
    for (uint32_t part = 0; part < BROKER_RATES_PARTS; part++) {
        if (broker->queues_active[part].count == 0)
            continue; /* (an empty list may be all zeros: rates.h) */
        list_for_each(node, &broker->queues_active[part].owners) {
            const struct rates *r = CONTAINER_OF(node, struct rates, active_link);
            const struct queue *queue = CONTAINER_OF(r, struct queue, rates);
            if (sees != NULL && !sees(queue->vhost, ctx))
                continue;
            ready += (int64_t)queue->ready_count - r->newest[QUEUE_RATE_READY];
            unacked += (int64_t)queue->unacked_count - r->newest[QUEUE_RATE_UNACKED];
        }
    }
    ASSERT(ready >= 0 || t->ready >= (uint64_t)-ready);
    ASSERT(unacked >= 0 || t->unacked >= (uint64_t)-unacked);
    t->ready += (uint64_t)ready;
    t->unacked += (uint64_t)unacked;
}

#if defined(__SANITIZE_ADDRESS__)
/* Tests run sanitized: the totals are a walk's. */
static void check_totals(struct broker *broker, broker_vhost_filter sees, const void *ctx,
                         const struct broker_queue_totals *t)
{
    struct broker_queue_totals w = {0};
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
        const struct vhost *vhost = v->value;
        if (sees != NULL && !sees(vhost, ctx))
            continue;
        struct hmap_entry *q;
        for (uint32_t j = 0; hmap_next(&vhost->queues, &j, &q);) {
            const struct queue *queue = q->value;
            w.queues++;
            w.consumers += queue->consumers_count;
            w.ready += queue->ready_count;
            w.unacked += queue->unacked_count;
            w.paged += queue->paged_count;
        }
    }
    ASSERT(w.queues == t->queues);
    ASSERT(w.consumers == t->consumers);
    ASSERT(w.ready == t->ready);
    ASSERT(w.unacked == t->unacked);
    ASSERT(w.paged == t->paged);
}
#else
static void check_totals(struct broker *broker, broker_vhost_filter sees, const void *ctx,
                         const struct broker_queue_totals *t)
{
    (void)broker, (void)sees, (void)ctx, (void)t;
}
#endif

void broker_queue_totals(struct broker *broker, broker_vhost_filter sees, const void *ctx,
                         struct broker_queue_totals *t)
{
    memset(t, 0, sizeof *t);
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
        const struct vhost *vhost = v->value;
        if (sees != NULL && !sees(vhost, ctx))
            continue;
        t->queues += vhost->queues.count;
        t->consumers += vhost->totals.consumers;
        t->paged += vhost->totals.paged;
        t->ready += vhost->totals.ready_sampled;
        t->unacked += vhost->totals.unacked_sampled;
    }
    add_moved(broker, sees, ctx, t);
    check_totals(broker, sees, ctx, t);
}

/* Once a second in RATES_PHASES ticks (rates.h): the active owners only;
 * nothing is allocated unless an owner's values move. */
void broker_sample_rates(struct broker *broker, uint64_t now)
{
    if (broker->rates_phase == 0) {
        if (now < broker->rates_due_ms)
            return;
        broker->rates_due_ms = now + RATES_SAMPLE_MS - TICK_MS / 2; /* the tick's jitter */
        sample_round_start(broker, now);
    }
    uint32_t phase = broker->rates_phase;
    uint32_t *totals = broker->rates_totals;
    struct rates_active *active = &broker->queues_active[phase];
    if (active->count > 0) {
        list_for_each_safe(node, &active->owners) {
            struct rates *r = CONTAINER_OF(node, struct rates, active_link);
            queue_sample_rates(CONTAINER_OF(r, struct queue, rates), &broker->rates_clock,
                               totals);
            if (rates_still(r))
                rates_leave(active, r);
        }
    }
    broker->rates_phase = (uint8_t)((phase + 1) % RATES_PHASES);
    if (broker->rates_phase != 0)
        return;
    check_idle_queues(broker);
    totals[BROKER_TOTALS_RATE_MESSAGES] =
        totals[BROKER_TOTALS_RATE_READY] + totals[BROKER_TOTALS_RATE_UNACKED];
    rates_sample(&broker->totals_rates, &broker->rates_clock, totals,
                 BROKER_TOTALS_RATE_COUNT);
}

static void on_tick(uv_timer_t *timer)
{
    struct broker *broker = timer->data;
    uint64_t now = uv_now(broker->loop);
    alarm_tick(broker, now);
    flow_tick(broker, now);
    message_cache_tick(now);
    list_for_each_safe(node, &broker->connections) {
        connection_tick(CONTAINER_OF(node, struct connection, broker_link), now);
    }
    broker_sample_rates(broker, now); /* after connection_tick's rates_check */
}

void broker_queue_joined(struct broker *broker, struct queue *queue)
{
    ASSERT(broker->queues_all.next != NULL); /* list_init'ed (broker_start; a test's own) */
    if (list_linked(&queue->all_link))
        return;
    list_push_back(&broker->queues_all, &queue->all_link);
    queue->all_serial = ++broker->queues_all_serial;
}

struct vhost *broker_vhost(struct broker *broker, struct bytes name)
{
    return hmap_get(&broker->vhosts, name);
}

struct vhost *broker_add_vhost(struct broker *broker, struct bytes name)
{
    struct vhost *vhost = broker_vhost(broker, name);
    if (vhost)
        return vhost;
    vhost = vhost_new(broker, name);
    hmap_put(&broker->vhosts, vhost->name, vhost);
    durable_vhost_put(broker, vhost->name);
    return vhost;
}

void broker_retire_vhost(struct broker *broker, struct vhost *vhost)
{
    void *removed = hmap_remove(&broker->vhosts, vhost->name);
    ASSERT(removed == vhost);
    while (vhost->queues.count > 0) {
        struct hmap_entry *e;
        uint32_t i = 0;
        bool found = hmap_next(&vhost->queues, &i, &e);
        ASSERT(found);
        vhost_queue_delete(vhost, e->value);
    }
    /* One at a time, looked up again: a delete may cascade to another
     * (auto-delete), and the predeclared ones stay with the object. */
    for (bool again = true; again;) {
        again = false;
        struct hmap_entry *e;
        for (uint32_t i = 0; !again && hmap_next(&vhost->exchanges, &i, &e);) {
            struct exchange *x = e->value;
            if (x->name.len > 0 && !bytes_has_prefix(x->name, "amq.")) {
                vhost_exchange_delete(vhost, x);
                again = true;
            }
        }
    }
    durable_vhost_deleted(broker, vhost->name);
    struct vhost **grown = xrealloc(broker->retired_vhosts,
                                    sizeof *grown * (broker->retired_vhosts_count + 1));
    broker->retired_vhosts = grown;
    grown[broker->retired_vhosts_count++] = vhost;
}

/* Opens one AMQP(S) listener; the IPv6 wildcard falls back to IPv4 on a
 * host without IPv6. */
static int open_listener(struct broker *broker, struct listener *listener, const char *address,
                         struct tls_context *tls)
{
    int rc = listener_open(listener, &broker->net, address, connection_accept, broker);
    if (rc == UV_EAFNOSUPPORT && strncmp(address, "[::]:", 5) == 0) {
        char v4[32];
        snprintf(v4, sizeof v4, "0.0.0.0:%s", address + 5);
        rc = listener_open(listener, &broker->net, v4, connection_accept, broker);
    }
    if (rc != 0) {
        LOG_ERROR("cannot listen on %s: %s", address, uv_strerror(rc));
        return -1;
    }
    listener->tls = tls;
    LOG_INFO("listening for %s on %s", tls ? "AMQPS" : "AMQP", address);
    return 0;
}

/* The TLS settings (when given), then the AMQP and AMQPS listeners. */
static int open_listeners(struct broker *broker)
{
    const struct broker_config *config = &broker->config;
    char err[512];
    if (config->tls.cert_file != NULL) {
        if (tls_context_init(&broker->amqps_tls, &config->tls, err, sizeof err) != 0) {
            LOG_ERROR("%s", err);
            return -1;
        }
        struct tls_config https = config->tls;
        https.verify = TLS_VERIFY_NONE;
        if (tls_context_init(&broker->https_tls, &https, err, sizeof err) != 0) {
            LOG_ERROR("%s", err);
            return -1;
        }
    }
    if (config->cluster_tls) {
        struct tls_config links = config->tls;
        links.verify = TLS_VERIFY_PEER;
        links.client = true;
        if (tls_context_init(&broker->cluster_tls, &links, err, sizeof err) != 0) {
            LOG_ERROR("%s", err);
            return -1;
        }
        /* Raft's listener: a peer proves itself with a certificate of the
         * cluster's CAs before the transport's handshake (raft_tls.h). */
        struct tls_config raft = config->tls;
        raft.verify = TLS_VERIFY_REQUIRE;
        if (tls_context_init(&broker->raft_tls, &raft, err, sizeof err) != 0) {
            LOG_ERROR("%s", err);
            return -1;
        }
    }
    for (uint32_t i = 0; i < config->listen_count; i++) {
        if (open_listener(broker, &broker->listeners[i], config->listen[i], NULL) != 0)
            return -1;
        broker->listeners_count++;
    }
    for (uint32_t i = 0; i < config->tls_listen_count; i++) {
        ASSERT(broker->amqps_tls.ctx != NULL); /* main checks --tls-cert */
        if (open_listener(broker, &broker->tls_listeners[i], config->tls_listen[i],
                          &broker->amqps_tls) != 0)
            return -1;
        broker->tls_listeners_count++;
    }
    return 0;
}

int broker_reload_tls(struct broker *broker)
{
    struct tls_context *contexts[] = {&broker->amqps_tls, &broker->https_tls,
                                      &broker->cluster_tls, &broker->raft_tls};
    int rc = 0;
    for (size_t i = 0; i < sizeof contexts / sizeof contexts[0]; i++) {
        if (contexts[i]->ctx == NULL)
            continue;
        char err[512];
        if (tls_context_reload(contexts[i], err, sizeof err) != 0) {
            LOG_ERROR("%s (the previous certificates stay in use)", err);
            rc = -1;
        }
    }
    if (rc == 0 && broker->amqps_tls.ctx != NULL)
        LOG_INFO("TLS certificates reloaded (load %u)", broker->amqps_tls.loads_count);
    return rc;
}

int broker_start(struct broker *broker, uv_loop_t *loop, const struct broker_config *config)
{
    memset(broker, 0, sizeof *broker);
    broker->loop = loop;
    broker->config = *config;
    hmap_init(&broker->vhosts);
    list_init(&broker->connections);
    list_init(&broker->queues_all);
    policy_set_init(&broker->policies);
    limit_set_init(&broker->limits);
    usage_init(&broker->usage);
    reclaim_init(&broker->reclaim, loop);
    alarm_init(&broker->alarm, config->memory_high_watermark, config->disk_free_limit);
    struct auth boot; /* the file's users: a bootstrap (broker/users.h) */
    if (config->users_file) {
        char err[512];
        if (auth_load_file(&boot, config->users_file, err, sizeof err) != 0) {
            LOG_ERROR("%s", err);
            return -1;
        }
    } else {
        auth_init_default(&boot, &config->password_policy);
    }
    auth_set_policy(&boot, &config->password_policy);
    auth_init(&broker->auth);
    auth_set_policy(&broker->auth, &config->password_policy);
    net_init(&broker->net, loop);
    list_init(&broker->confirms_owed);
    list_init(&broker->flow_congested);
    net_flush_hook_add(&broker->net, &broker->confirms_hook, channels_flush_confirms);
    read_batch_enable(&broker->net.read_batch, config->limits.read_batch_us);
    broker->net.read_share = config->limits.read_share;
    char err[1024];
    if (durable_open(broker, err, sizeof err) != 0) {
        LOG_ERROR("%s", err);
        auth_free(&boot);
        return -1;
    }
    users_bootstrap(broker, &boot);
    if (open_listeners(broker) != 0)
        return -1;
    uv_timer_init(loop, &broker->tick);
    broker->tick.data = broker;
    uv_timer_start(&broker->tick, on_tick, TICK_MS, TICK_MS);
    return 0;
}

#define SHUTDOWN_GRACE_MS 2000

/* Clients that did not read their connection.close in time are cut. */
static void on_shutdown_deadline(uv_timer_t *timer)
{
    struct broker *broker = timer->data;
    list_for_each_safe(node, &broker->connections) {
        conn_close(&CONTAINER_OF(node, struct connection, broker_link)->conn);
    }
}

void broker__connection_gone(struct broker *broker)
{
    /* The journal's handles keep the loop alive: once the last client is
     * gone during a stop, flush and close it so the loop can end. */
    if (broker->stopping && broker->connections_count == 0)
        durable_close(broker);
}

void broker_stop(struct broker *broker)
{
    if (broker->stopping)
        return;
    broker->stopping = true;
    for (uint32_t i = 0; i < broker->listeners_count; i++)
        listener_close(&broker->listeners[i]);
    for (uint32_t i = 0; i < broker->tls_listeners_count; i++)
        listener_close(&broker->tls_listeners[i]);
    if (broker->http.stop != NULL)
        broker->http.stop(broker->http.ctx);
    if (broker->cluster_ops != NULL)
        broker->cluster_ops->stop(broker->cluster_ctx); /* freed after the queues */
    uv_timer_stop(&broker->tick);
    uv_close((uv_handle_t *)&broker->tick, NULL);
    /* Every client gets 320 CONNECTION_FORCED, written before its socket
     * closes; the loop ends once they are all gone, or at the deadline. */
    list_for_each_safe(node, &broker->connections) {
        struct connection *connection = CONTAINER_OF(node, struct connection, broker_link);
        connection_force_close(connection, "broker shutdown");
        conn_close_after_flush(&connection->conn);
    }
    uv_timer_init(broker->loop, &broker->shutdown_timer);
    broker->shutdown_timer.data = broker;
    uv_timer_start(&broker->shutdown_timer, on_shutdown_deadline, SHUTDOWN_GRACE_MS, 0);
    uv_unref((uv_handle_t *)&broker->shutdown_timer);
    broker__connection_gone(broker);
}

void broker_close_clients(struct broker *broker, const char *reason)
{
    list_for_each_safe(node, &broker->connections) {
        struct connection *connection = CONTAINER_OF(node, struct connection, broker_link);
        if (!connection->cluster_peer)
            connection_force_close(connection, reason);
    }
}

void broker_free(struct broker *broker)
{
    ASSERT(list_empty(&broker->connections));
    if (broker->stopping)
        uv_close((uv_handle_t *)&broker->shutdown_timer, NULL);
    durable_close(broker);
    usage_free(&broker->usage); /* its flush hook, before the net goes */
    reclaim_stop(&broker->reclaim); /* its handle: what comes later goes at once */
    if (broker->http.stop != NULL)
        broker->http.stop(broker->http.ctx);
    net_close(&broker->net);
    uv_run(broker->loop, UV_RUN_DEFAULT); /* the close callbacks */
    if (broker->http.free != NULL)
        broker->http.free(broker->http.ctx);
    broker->http = (struct broker_service){0};
    net_free(&broker->net);
    struct hmap_entry *e;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &e);)
        vhost_free(e->value);
    hmap_free(&broker->vhosts);
    for (uint32_t i = 0; i < broker->retired_vhosts_count; i++)
        vhost_free(broker->retired_vhosts[i]);
    free(broker->retired_vhosts);
    broker->retired_vhosts = NULL;
    if (broker->cluster_ops != NULL)
        broker->cluster_ops->free(broker->cluster_ctx); /* after the stand-ins it lists */
    broker->cluster_ops = NULL;
    broker->cluster_ctx = NULL;
    rates_free(&broker->rates);
    rates_free(&broker->totals_rates);
    auth_free(&broker->auth);
    policy_set_free(&broker->policies);
    limit_set_free(&broker->limits);
    tls_context_free(&broker->amqps_tls); /* after every session that used it */
    tls_context_free(&broker->https_tls);
    tls_context_free(&broker->cluster_tls);
    tls_context_free(&broker->raft_tls);
    reclaim_free(&broker->reclaim); /* (the cluster's copies went there) */
    ASSERT(message_live_count == 0);
    message_cache_clear();
}

void broker_generate_name(struct broker *broker, const char *prefix, char *out, size_t out_size)
{
    /* RabbitMQ: prefix + url-safe base64 of 16 random bytes (22 chars).
     * 128 random bits do not collide in practice, so declaring under a
     * generated name asserts (vhost_queue_declare) rather than retries. */
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    unsigned char raw[16];
    RAND_bytes(raw, sizeof raw);
    char encoded[23];
    uint32_t bits = 0, acc = 0, n = 0;
    for (size_t i = 0; i < sizeof raw && n < 22; i++) {
        acc = (acc << 8) | raw[i];
        bits += 8;
        while (bits >= 6 && n < 22) {
            encoded[n++] = alphabet[(acc >> (bits - 6)) & 63];
            bits -= 6;
        }
    }
    while (n < 22)
        encoded[n++] = alphabet[(acc << (6 - bits)) & 63], bits = 0;
    encoded[22] = '\0';
    snprintf(out, out_size, "%s%s", prefix, encoded);
}
