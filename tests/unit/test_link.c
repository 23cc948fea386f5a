/*
 * test_link.c: the cluster link (cluster/link.h) against real brokers.
 *
 * Goal: a link logs in with the cluster secret and is refused without
 * it; it publishes in confirm mode, consumes under a prefetch limit and
 * gets, with content of every size intact; a channel error leaves the
 * rest working; it comes back by itself after its peer broker restarts;
 * link_free in any state runs no callback and leaks nothing; a peer that
 * sends garbage, says nothing, or stops sending heartbeats is dropped and
 * retried without a crash.
 *
 * Method: a broker (broker_start, listening on 127.0.0.1) and the links
 * share this process's libuv loop and talk through real sockets. The
 * links have a net of their own, so the broker can be stopped and started
 * again under them. A fake peer (a raw libuv server that speaks just the
 * handshake, then misbehaves) covers what a real broker never does.
 * Callbacks fail the test if they run after link_free.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "amqp/frame.h"
#include "amqp/method_gen.h"
#include "amqp/table.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/link.h"
#include "lib/assert.h"
#include "net/conn.h"

#define SECRET "link-test-cluster-secret"
#define QUEUE "link-test"
#define MESSAGES 1000
#define PREFETCH 10

static uv_loop_t *loop;
static uv_timer_t keepalive;
static struct net link_net;
static struct broker broker;
static struct broker_config config;
static bool broker_running;
static char listen_address[64];
static char data_dir[128];
static char users_file[160];

/* Runs the loop until cond holds or timeout_ms passed. The links' own
 * timers do not keep the loop alive (a broker's listeners would), so a
 * referenced timer stands in for them meanwhile. */
static void on_keepalive(uv_timer_t *timer)
{
    (void)timer;
}

#define RUN_UNTIL(cond, timeout_ms)                                        \
    do {                                                                   \
        uv_timer_start(&keepalive, on_keepalive, 5, 5);                    \
        uint64_t start_ = uv_now(loop);                                    \
        while (!(cond) && uv_now(loop) - start_ < (uint64_t)(timeout_ms))  \
            uv_run(loop, UV_RUN_ONCE);                                     \
        uv_timer_stop(&keepalive);                                         \
    } while (0)

/* ---- the broker ------------------------------------------------------ */

static uint16_t free_port(void)
{
    uv_tcp_t tcp;
    uv_tcp_init(loop, &tcp);
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", 0, &sa);
    assert_int_equal(uv_tcp_bind(&tcp, (const struct sockaddr *)&sa, 0), 0);
    struct sockaddr_in bound;
    int size = sizeof bound;
    assert_int_equal(uv_tcp_getsockname(&tcp, (struct sockaddr *)&bound, &size), 0);
    uv_close((uv_handle_t *)&tcp, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return ntohs(bound.sin_port);
}

static void start_broker(bool clustered)
{
    broker_config_defaults(&config);
    config.listen[0] = listen_address;
    config.listen_count = 1;
    config.data_dir = data_dir;
    config.users_file = users_file;
    config.memory_high_watermark = 0;
    config.disk_free_limit = 0;
    assert_int_equal(broker_start(&broker, loop, &config), 0);
    /* What the cluster node would set. */
    broker.cluster_secret = clustered ? BYTES_LIT(SECRET) : (struct bytes){NULL, 0};
    broker_running = true;
}

static void stop_broker(void)
{
    broker_stop(&broker);
    RUN_UNTIL(broker.connections_count == 0, 5000);
    assert_int_equal(broker.connections_count, 0);
    broker_free(&broker); /* runs the loop until its handles are closed */
    broker_running = false;
}

static int setup(void **state)
{
    (void)state;
    snprintf(listen_address, sizeof listen_address, "127.0.0.1:%u", free_port());
    start_broker(true);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (broker_running)
        stop_broker();
    RUN_UNTIL(link_net.conns_count == 0, 5000);
    assert_int_equal(link_net.conns_count, 0);
    assert_int_equal(message_live_count, 0);
    return 0;
}

/* ---- link and channel recorders ------------------------------------- */

struct probe {
    struct link *link;
    int ups;
    int downs;
    int drained;
    int closed_before_down; /* channels told closed(0) before down() */
    bool freed;             /* link_free ran: any callback now is a bug */
};

static void probe_up(void *ctx, struct link *link)
{
    struct probe *p = ctx;
    assert_false(p->freed);
    assert_ptr_equal(link, p->link);
    assert_true(link_is_up(link));
    p->ups++;
}

static void probe_down(void *ctx, struct link *link)
{
    struct probe *p = ctx;
    assert_false(p->freed);
    assert_ptr_equal(link, p->link);
    assert_false(link_is_up(link));
    p->downs++;
}

static void probe_drained(void *ctx, struct link *link)
{
    struct probe *p = ctx;
    (void)link;
    assert_false(p->freed);
    p->drained++;
}

static const struct link_ops probe_ops = {
    .up = probe_up, .down = probe_down, .drained = probe_drained};

static void new_link(struct probe *p, const char *address, const char *secret)
{
    memset(p, 0, sizeof *p);
    struct link_config cfg = {
        .address = address,
        .self_name = "test-broker",
        .secret = bytes_of_cstr(secret),
        .reconnect_min_ms = 20,
        .reconnect_max_ms = 200,
    };
    struct link_ops ops = probe_ops;
    ops.ctx = p;
    assert_int_equal(link_new(&p->link, &link_net, &cfg, &ops), 0);
}

static void free_link(struct probe *p)
{
    link_free(p->link);
    p->freed = true;
}

struct recorder {
    struct probe *probe;
    struct link_channel *ch;
    bool opened;
    bool closed;
    uint16_t close_code;
    char close_text[256];
    uint64_t confirmed;    /* every publish up to this number is confirmed */
    uint32_t nacks;
    uint32_t replies_count;
    uint32_t last_reply;   /* method id */
    uint32_t declare_ok_message_count;
    /* consuming */
    uint32_t delivered;
    uint64_t acked_tag;
    uint32_t unacked_max;
    uint32_t bad;          /* deliveries unlike what was published */
    /* getting */
    uint32_t get_replies;
    uint32_t get_oks;
    uint32_t get_message_count;
};

static void rec_opened(void *ctx)
{
    struct recorder *r = ctx;
    assert_false(r->probe->freed);
    r->opened = true;
}

static void rec_closed(void *ctx, uint16_t reply_code, struct bytes reply_text)
{
    struct recorder *r = ctx;
    assert_false(r->probe->freed);
    assert_false(r->closed);
    r->closed = true;
    r->ch = NULL;
    r->close_code = reply_code;
    snprintf(r->close_text, sizeof r->close_text, "%.*s", (int)reply_text.len,
             (const char *)reply_text.ptr);
    if (reply_code == 0 && r->probe->downs == 0)
        r->probe->closed_before_down++;
}

static void rec_confirm(void *ctx, uint64_t seq, bool multiple, bool ack)
{
    struct recorder *r = ctx;
    assert_false(r->probe->freed);
    /* Confirms come in publish order: a single one is the next, a
     * multiple one covers everything up to seq. */
    if (multiple)
        assert_true(seq > r->confirmed);
    else
        assert_int_equal(seq, r->confirmed + 1);
    r->confirmed = seq;
    if (!ack)
        r->nacks++;
}

static void rec_reply(void *ctx, const struct method *m)
{
    struct recorder *r = ctx;
    assert_false(r->probe->freed);
    r->replies_count++;
    r->last_reply = m->id;
    if (m->id == METHOD_QUEUE_DECLARE_OK)
        r->declare_ok_message_count = m->queue_declare_ok.message_count;
}

static size_t body_size_of(uint32_t i)
{
    static const size_t sizes[] = {0, 1024, 300 * 1024}; /* the last > frame_max */
    return sizes[i % 3];
}

/* Message i: properties with its number in a header, a patterned body. */
static struct message *make_message(uint32_t i)
{
    uint8_t headers[64];
    struct table_writer w;
    table_writer_init(&w, headers, sizeof headers);
    table_put_int(&w, "index", i);
    char id[32];
    snprintf(id, sizeof id, "msg-%u", i);
    struct basic_properties props = {0};
    props.flags = BASIC_FLAG_CONTENT_TYPE | BASIC_FLAG_HEADERS | BASIC_FLAG_DELIVERY_MODE |
                  BASIC_FLAG_MESSAGE_ID;
    props.content_type = BYTES_LIT("application/octet-stream");
    props.headers = table_writer_table(&w);
    props.delivery_mode = 1;
    props.message_id = bytes_of_cstr(id);
    uint8_t encoded[256];
    size_t size = basic_properties_encode(&props, encoded, sizeof encoded);
    assert_true(size > 0);
    struct basic_properties decoded;
    assert_int_equal(basic_properties_decode(&decoded, encoded, (uint32_t)size), 0);
    size_t body_size = body_size_of(i);
    struct message *m = message_new(BYTES_LIT(""), BYTES_LIT(QUEUE), encoded, (uint32_t)size,
                                    &decoded, body_size);
    assert_non_null(m);
    for (size_t j = 0; j < body_size; j++)
        m->body[j] = (uint8_t)(i * 31 + j * 7);
    m->body_received = body_size;
    return m;
}

static bool same_message(const struct message *got, uint32_t i, struct bytes routing_key)
{
    struct message *want = make_message(i);
    bool same = got->properties_size == want->properties_size &&
                memcmp(message_properties(got), message_properties(want),
                       want->properties_size) == 0 &&
                got->body_size == want->body_size && got->body_received == got->body_size &&
                memcmp(got->body, want->body, want->body_size) == 0 &&
                bytes_equal(message_routing_key(got), routing_key) &&
                bytes_equal(message_exchange(got), BYTES_LIT(""));
    message_unref(want);
    return same;
}

static void rec_deliver(void *ctx, struct bytes consumer_tag, uint64_t delivery_tag,
                        bool redelivered, struct message *message)
{
    struct recorder *r = ctx;
    assert_false(r->probe->freed);
    assert_true(bytes_equal(consumer_tag, BYTES_LIT("c1")));
    assert_int_equal(delivery_tag, r->delivered + 1);
    assert_false(redelivered);
    if (!same_message(message, r->delivered, BYTES_LIT(QUEUE)))
        r->bad++;
    message_unref(message);
    r->delivered++;
    uint32_t unacked = (uint32_t)(r->delivered - r->acked_tag);
    if (unacked > r->unacked_max)
        r->unacked_max = unacked;
}

static void rec_get_reply(void *ctx, uint64_t delivery_tag, bool redelivered,
                          uint32_t message_count, struct message *message)
{
    struct recorder *r = ctx;
    assert_false(r->probe->freed);
    r->get_replies++;
    if (!message)
        return;
    r->get_oks++;
    r->get_message_count = message_count;
    assert_true(delivery_tag > 0);
    assert_false(redelivered);
    if (!same_message(message, 1, BYTES_LIT("link-get")))
        r->bad++;
    message_unref(message);
}

static const struct link_channel_ops recorder_ops = {
    .opened = rec_opened,
    .closed = rec_closed,
    .confirm = rec_confirm,
    .deliver = rec_deliver,
    .get_reply = rec_get_reply,
    .reply = rec_reply,
};

static void open_channel(struct recorder *r, struct probe *p, const char *vhost, bool confirm)
{
    memset(r, 0, sizeof *r);
    r->probe = p;
    struct link_channel_ops ops = recorder_ops;
    ops.ctx = r;
    r->ch = link_channel_open(p->link, bytes_of_cstr(vhost), confirm, &ops);
    assert_non_null(r->ch);
}

static void declare(struct recorder *r, const char *queue, bool passive)
{
    struct method m = {.id = METHOD_QUEUE_DECLARE};
    m.queue_declare.queue = bytes_of_cstr(queue);
    m.queue_declare.passive = passive;
    link_send(r->ch, &m);
}

static void up_link(struct probe *p)
{
    char address[64];
    snprintf(address, sizeof address, "%s", listen_address);
    new_link(p, address, SECRET);
    RUN_UNTIL(p->ups == 1, 5000);
    assert_int_equal(p->ups, 1);
}

/* Publishes messages 0..count-1, holding back while the link's output
 * is over its high-water mark. */
static void publish_messages(struct recorder *r, uint32_t count)
{
    uint32_t sent = 0;
    uint64_t start = uv_now(loop);
    uv_timer_start(&keepalive, on_keepalive, 5, 5);
    while (sent < count && uv_now(loop) - start < 60000) {
        while (sent < count && link_channel_writable(r->ch)) {
            struct message *m = make_message(sent);
            uint64_t seq = link_publish(r->ch, BYTES_LIT(""), BYTES_LIT(QUEUE), false, m);
            message_unref(m); /* the link holds its own references */
            sent++;
            assert_int_equal(seq, sent);
        }
        uv_run(loop, UV_RUN_ONCE);
    }
    uv_timer_stop(&keepalive);
    assert_int_equal(sent, count);
}

/* ---- 1. login ------------------------------------------------------- */

static void comes_up_and_a_wrong_secret_is_refused(void **state)
{
    (void)state;
    struct probe good, bad, named;
    up_link(&good);
    struct link_stats stats;
    link_get_stats(good.link, &stats);
    assert_int_equal(stats.connects, 1);
    assert_int_equal(stats.auth_failures, 0);

    new_link(&bad, listen_address, "not-the-secret");
    RUN_UNTIL(bad.downs == 1, 5000);
    assert_int_equal(bad.downs, 1);
    assert_int_equal(bad.ups, 0);
    link_get_stats(bad.link, &stats);
    assert_true(stats.auth_failures >= 1); /* the broker answered 403 */
    assert_int_equal(stats.connects, 0);
    /* It keeps trying (with backoff) without telling down() again. */
    RUN_UNTIL(false, 300);
    assert_int_equal(bad.downs, 1);
    link_get_stats(bad.link, &stats);
    assert_true(stats.auth_failures >= 2);
    free_link(&bad);

    /* A host name (localhost may be ::1 first: attempts alternate). */
    char address[64];
    snprintf(address, sizeof address, "localhost:%s", strrchr(listen_address, ':') + 1);
    new_link(&named, address, SECRET);
    RUN_UNTIL(named.ups == 1, 10000);
    assert_int_equal(named.ups, 1);
    free_link(&named);

    assert_true(link_is_up(good.link));
    free_link(&good);
    RUN_UNTIL(false, 100); /* no callback after link_free (the probes check) */
}

static void unclustered_broker_refuses_links(void **state)
{
    (void)state;
    stop_broker();
    start_broker(false);
    struct probe p;
    new_link(&p, listen_address, SECRET);
    RUN_UNTIL(p.downs == 1, 5000);
    assert_int_equal(p.downs, 1);
    assert_int_equal(p.ups, 0);
    struct link_stats stats;
    link_get_stats(p.link, &stats);
    assert_true(stats.auth_failures >= 1); /* QUAY-CLUSTER not taken: not a cluster member */
    free_link(&p);
}

static void bad_arguments_are_refused(void **state)
{
    (void)state;
    struct link *link;
    struct link_ops ops = {0};
    struct link_config cfg = {.address = "127.0.0.1", .self_name = "x", .secret = BYTES_LIT("s")};
    assert_int_equal(link_new(&link, &link_net, &cfg, &ops), UV_EINVAL);
    cfg.address = "::1:5672"; /* a v6 literal needs brackets */
    assert_int_equal(link_new(&link, &link_net, &cfg, &ops), UV_EINVAL);
    cfg.address = "127.0.0.1:99999";
    assert_int_equal(link_new(&link, &link_net, &cfg, &ops), UV_EINVAL);
    cfg.address = "127.0.0.1:5672";
    cfg.secret = BYTES_LIT("");
    assert_int_equal(link_new(&link, &link_net, &cfg, &ops), UV_EINVAL);
    cfg.secret = BYTES_LIT("s");
    cfg.address = "[::1]:5672";
    assert_int_equal(link_new(&link, &link_net, &cfg, &ops), 0);
    link_free(link);
}

/* ---- 2-5. traffic --------------------------------------------------- */

static void ack_through(struct recorder *r, uint64_t tag)
{
    struct method ack = {.id = METHOD_BASIC_ACK};
    ack.basic_ack.delivery_tag = tag;
    ack.basic_ack.multiple = true;
    link_send(r->ch, &ack);
    r->acked_tag = tag;
}

/* 2. Confirmed publishes of mixed sizes. */
static void publish_confirmed(struct probe *p)
{
    struct recorder pub;
    open_channel(&pub, p, "/", true);
    declare(&pub, QUEUE, false);
    publish_messages(&pub, MESSAGES);
    RUN_UNTIL(pub.confirmed == MESSAGES, 60000);
    assert_true(pub.opened);
    assert_int_equal(pub.confirmed, MESSAGES);
    assert_int_equal(pub.nacks, 0);
    assert_int_equal(pub.replies_count, 1);
    assert_int_equal(pub.last_reply, METHOD_QUEUE_DECLARE_OK);
    struct vhost *root = broker_vhost(&broker, BYTES_LIT("/"));
    assert_int_equal(queue_ready_count(vhost_queue(root, BYTES_LIT(QUEUE))), MESSAGES);
}

/* 3. A consumer with prefetch 10, acking whenever it is full. */
static void consume_with_prefetch(struct probe *p)
{
    struct recorder sub;
    open_channel(&sub, p, "/", false);
    struct method qos = {.id = METHOD_BASIC_QOS};
    qos.basic_qos.prefetch_count = PREFETCH;
    link_send(sub.ch, &qos);
    struct method consume = {.id = METHOD_BASIC_CONSUME};
    consume.basic_consume.queue = BYTES_LIT(QUEUE);
    consume.basic_consume.consumer_tag = BYTES_LIT("c1");
    link_send(sub.ch, &consume);
    uint64_t start = uv_now(loop);
    uv_timer_start(&keepalive, on_keepalive, 5, 5);
    while (sub.acked_tag < MESSAGES && uv_now(loop) - start < 60000) {
        uv_run(loop, UV_RUN_ONCE);
        if (sub.delivered - sub.acked_tag == PREFETCH || sub.delivered == MESSAGES)
            ack_through(&sub, sub.delivered);
    }
    uv_timer_stop(&keepalive);
    assert_int_equal(sub.delivered, MESSAGES);
    assert_int_equal(sub.bad, 0);
    assert_int_equal(sub.unacked_max, PREFETCH);
    assert_int_equal(sub.replies_count, 2); /* qos-ok, consume-ok */
    struct vhost *root = broker_vhost(&broker, BYTES_LIT("/"));
    assert_int_equal(queue_ready_count(vhost_queue(root, BYTES_LIT(QUEUE))), 0);
}

/* 4. basic.get: get-ok, then get-empty; 5. a channel error closes that
 * channel only. */
static void get_and_a_channel_error(struct probe *p)
{
    struct recorder get;
    open_channel(&get, p, "", false); /* empty: the connection's vhost */
    declare(&get, "link-get", false);
    struct message *m = make_message(1);
    assert_int_equal(link_publish(get.ch, BYTES_LIT(""), BYTES_LIT("link-get"), false, m), 0);
    message_unref(m);
    struct method get_m = {.id = METHOD_BASIC_GET};
    get_m.basic_get.queue = BYTES_LIT("link-get");
    get_m.basic_get.no_ack = true;
    link_send(get.ch, &get_m);
    link_send(get.ch, &get_m);
    RUN_UNTIL(get.get_replies == 2, 5000);
    assert_int_equal(get.get_replies, 2);
    assert_int_equal(get.get_oks, 1);
    assert_int_equal(get.get_message_count, 0);
    assert_int_equal(get.bad, 0);

    struct recorder broken;
    open_channel(&broken, p, "/", false);
    declare(&broken, "no-such-queue", true);
    RUN_UNTIL(broken.closed, 5000);
    assert_true(broken.closed);
    assert_int_equal(broken.close_code, 404);
    assert_string_equal(broken.close_text, "NOT_FOUND - no queue 'no-such-queue' in vhost '/'");
    assert_true(link_is_up(p->link));
    declare(&get, "link-get", true);
    RUN_UNTIL(get.replies_count == 2, 5000);
    assert_int_equal(get.last_reply, METHOD_QUEUE_DECLARE_OK);

    /* Closing our way: the id comes back only after close-ok. */
    uint16_t id = link_channel_id(get.ch);
    link_channel_close(get.ch);
    struct recorder again;
    open_channel(&again, p, "/", false);
    assert_int_not_equal(link_channel_id(again.ch), id);
    RUN_UNTIL(again.opened, 5000);
    assert_true(again.opened);
    assert_false(get.closed); /* no callback after link_channel_close */
}

static void publishes_consumes_and_gets(void **state)
{
    (void)state;
    struct probe p;
    up_link(&p);
    publish_confirmed(&p);
    consume_with_prefetch(&p);
    get_and_a_channel_error(&p);
    free_link(&p);
}

static void channels_work_in_their_own_vhost(void **state)
{
    (void)state;
    struct probe p;
    up_link(&p);
    struct recorder other, missing;
    open_channel(&other, &p, "other", true);
    declare(&other, "in-other", false);
    struct message *m = make_message(2);
    link_publish(other.ch, BYTES_LIT(""), BYTES_LIT("in-other"), false, m);
    message_unref(m);
    open_channel(&missing, &p, "nope", false);
    RUN_UNTIL(other.confirmed == 1 && missing.closed, 5000);
    assert_int_equal(other.confirmed, 1);
    struct vhost *vhost = broker_vhost(&broker, BYTES_LIT("other"));
    assert_non_null(vhost_queue(vhost, BYTES_LIT("in-other")));
    assert_null(vhost_queue(broker_vhost(&broker, BYTES_LIT("/")), BYTES_LIT("in-other")));
    assert_true(missing.closed);
    assert_false(missing.opened);
    assert_int_equal(missing.close_code, 530);
    assert_string_equal(missing.close_text, "NOT_ALLOWED - vhost nope not found");
    assert_true(link_is_up(p.link));
    free_link(&p);
}

/* ---- 6. the peer restarts ------------------------------------------- */

static void reconnects_after_the_broker_restarts(void **state)
{
    (void)state;
    struct probe p;
    up_link(&p);
    struct recorder r;
    open_channel(&r, &p, "/", true);
    RUN_UNTIL(r.opened, 5000);
    assert_true(r.opened);

    stop_broker();
    RUN_UNTIL(p.downs == 1, 5000);
    assert_int_equal(p.downs, 1);
    assert_true(r.closed);
    assert_int_equal(r.close_code, 0);
    assert_int_equal(p.closed_before_down, 1);
    assert_null(link_channel_open(p.link, BYTES_LIT("/"), false, &recorder_ops));
    RUN_UNTIL(false, 300); /* refused attempts meanwhile: still one down() */
    assert_int_equal(p.downs, 1);

    start_broker(true);
    RUN_UNTIL(p.ups == 2, 5000);
    assert_int_equal(p.ups, 2);
    struct link_stats stats;
    link_get_stats(p.link, &stats);
    assert_int_equal(stats.connects, 2);
    assert_int_equal(stats.disconnects, 1);
    assert_true(stats.frames_in > 0 && stats.frames_out > 0);
    open_channel(&r, &p, "/", false);
    RUN_UNTIL(r.opened, 5000);
    assert_true(r.opened);
    free_link(&p);
}

/* ---- 7. link_free at any time --------------------------------------- */

static void freed_in_the_middle_of_traffic(void **state)
{
    (void)state;
    for (int round = 0; round < 2; round++) {
        struct probe p;
        up_link(&p);
        struct recorder pub, sub;
        open_channel(&pub, &p, "/", true);
        declare(&pub, QUEUE, false);
        open_channel(&sub, &p, "/", false);
        struct method consume = {.id = METHOD_BASIC_CONSUME};
        consume.basic_consume.queue = BYTES_LIT(QUEUE);
        consume.basic_consume.consumer_tag = BYTES_LIT("c1");
        consume.basic_consume.no_ack = true;
        link_send(sub.ch, &consume);
        /* Round 0 frees with megabytes queued (the socket is cut), round
         * 1 with little (connection.close is written first). */
        uint32_t count = round == 0 ? 60 : 4;
        for (uint32_t i = 0; i < count; i++) {
            struct message *m = make_message(i * 3 + 2);
            link_publish(pub.ch, BYTES_LIT(""), BYTES_LIT(QUEUE), false, m);
            message_unref(m);
        }
        RUN_UNTIL(sub.delivered > 0 || pub.confirmed > 0, 5000);
        free_link(&p);
        RUN_UNTIL(false, 200); /* the probes fail on any callback */
    }
}

static void freed_in_every_early_state(void **state)
{
    (void)state;
    /* From right after link_new through connect and handshake. */
    for (int steps = 0; steps < 12; steps++) {
        struct probe p;
        new_link(&p, listen_address, SECRET);
        for (int i = 0; i < steps; i++)
            uv_run(loop, UV_RUN_NOWAIT);
        free_link(&p);
    }
    /* While resolving a name, and while waiting to retry. */
    struct probe named, refused;
    new_link(&named, "localhost:1", SECRET);
    uv_run(loop, UV_RUN_NOWAIT);
    free_link(&named);
    new_link(&refused, "127.0.0.1:1", SECRET);
    RUN_UNTIL(refused.downs == 1, 5000);
    assert_int_equal(refused.downs, 1);
    free_link(&refused);
    RUN_UNTIL(false, 100);
}

/* connect() fails at once for a broadcast address (ENETUNREACH): the
 * transport reports it from the loop, like a refusal. */
static void unreachable_address_is_an_ordinary_failure(void **state)
{
    (void)state;
    struct probe p;
    new_link(&p, "255.255.255.255:5672", SECRET);
    RUN_UNTIL(p.downs == 1, 2000);
    assert_int_equal(p.downs, 1);
    struct link_stats stats;
    link_get_stats(p.link, &stats);
    assert_true(stats.attempts_failed >= 1);
    free_link(&p);
    /* Freed while that report waits for the loop. */
    new_link(&p, "255.255.255.255:5672", SECRET);
    uv_run(loop, UV_RUN_NOWAIT);
    free_link(&p);
    RUN_UNTIL(false, 50);
}

/* A link freed from inside its own callbacks. */
static struct probe self_free_probe;

static void free_on_closed(void *ctx, uint16_t code, struct bytes text)
{
    (void)ctx;
    (void)code;
    (void)text;
    free_link(&self_free_probe);
}

static void freed_from_its_callbacks(void **state)
{
    (void)state;
    up_link(&self_free_probe);
    struct link_channel_ops ops = {.closed = free_on_closed};
    struct link_channel *a = link_channel_open(self_free_probe.link, BYTES_LIT("/"), false, &ops);
    struct link_channel *b = link_channel_open(self_free_probe.link, BYTES_LIT("/"), false, &ops);
    assert_non_null(a);
    assert_non_null(b);
    struct method m = {.id = METHOD_QUEUE_DECLARE};
    m.queue_declare.queue = BYTES_LIT("nothing-here");
    m.queue_declare.passive = true;
    link_send(a, &m); /* closed(404) frees the link, channel b with it */
    RUN_UNTIL(self_free_probe.freed, 5000);
    assert_true(self_free_probe.freed);
    RUN_UNTIL(false, 100);
}

/* ---- a misbehaving peer --------------------------------------------- */

enum fake_mode {
    FAKE_SILENT,  /* accepts, never answers: the handshake times out */
    FAKE_GARBAGE, /* handshake, then one of garbage[] per connection */
    FAKE_QUIET,   /* handshake (heartbeat 1 s), then silence */
};

#define FAKE_CLIENTS_MAX 16

struct fake_client {
    uv_tcp_t tcp;
    struct fake_peer *peer;
    int index;
    bool used;
    bool closing;
    uint8_t in[16384];
    size_t in_size;
    int step; /* 0 header, 1 start-ok, 2 tune-ok, 3 open, 4 open-ok sent */
};

struct fake_peer {
    uv_tcp_t server;
    enum fake_mode mode;
    struct fake_client clients[FAKE_CLIENTS_MAX];
    int accepts;
    int handshakes;
    uint16_t close_codes[FAKE_CLIENTS_MAX]; /* connection.close from the link */
};

/* What a broken peer might send once the link is up. */
static const struct {
    const char *what;
    uint8_t bytes[16];
    size_t size;
    uint16_t expected_code;
} garbage[] = {
    {"bad frame end", {1, 0, 0, 0, 0, 0, 4, 0, 10, 0, 41, 0}, 12, 501},
    {"unknown frame type", {7, 0, 0, 0, 0, 0, 0, 0xCE}, 8, 501},
    {"body on an unopened channel", {3, 0, 5, 0, 0, 0, 1, 'x', 0xCE}, 9, 504},
    {"unknown method", {1, 0, 0, 0, 0, 0, 4, 0, 99, 0, 1, 0xCE}, 12, 540},
    {"truncated arguments", {1, 0, 0, 0, 0, 0, 5, 0, 10, 0, 50, 1, 0xCE}, 13, 501},
    {"heartbeat with a payload", {8, 0, 0, 0, 0, 0, 1, 0, 0xCE}, 9, 501},
    {"content header on channel 0", {2, 0, 0, 0, 0, 0, 0, 0xCE}, 8, 505},
    {"second open-ok", {1, 0, 0, 0, 0, 0, 5, 0, 10, 0, 41, 0, 0xCE}, 13, 503},
};

/* Small writes to a fresh socket: the kernel takes them whole. A link
 * that already hung up makes them fail, which the outcome shows anyway. */
static void fake_write(struct fake_client *c, const uint8_t *data, size_t size)
{
    uv_buf_t buf = uv_buf_init((char *)data, (unsigned)size);
    (void)uv_try_write((uv_stream_t *)&c->tcp, &buf, 1);
}

static void fake_send(struct fake_client *c, const struct method *m)
{
    uint8_t out[1024];
    size_t n = frame_write_method(out, sizeof out, 0, m);
    assert_true(n > 0);
    fake_write(c, out, n);
}

static void fake_close(struct fake_client *c)
{
    if (!c->closing) {
        c->closing = true;
        uv_close((uv_handle_t *)&c->tcp, NULL);
    }
}

static void fake_send_start(struct fake_client *c)
{
    uint8_t props[128];
    struct table_writer w;
    table_writer_init(&w, props, sizeof props);
    table_put_longstr(&w, "product", BYTES_LIT("fake"));
    struct method m = {.id = METHOD_CONNECTION_START};
    m.connection_start.version_minor = 9;
    m.connection_start.server_properties = table_writer_table(&w);
    m.connection_start.mechanisms = BYTES_LIT("PLAIN AMQPLAIN");
    m.connection_start.locales = BYTES_LIT("en_US");
    fake_send(c, &m);
}

/* One frame from the link, by handshake step. */
static void fake_handle(struct fake_client *c, const struct method *m)
{
    struct fake_peer *peer = c->peer;
    if (m->id == METHOD_CONNECTION_CLOSE) {
        peer->close_codes[c->index] = m->connection_close.reply_code;
        return;
    }
    if (c->step == 1 && m->id == METHOD_CONNECTION_START_OK) {
        assert_true(bytes_equal(m->connection_start_ok.mechanism, BYTES_LIT("QUAY-CLUSTER")));
        struct method secure = {.id = METHOD_CONNECTION_SECURE};
        secure.connection_secure.challenge = BYTES_LIT("0123456789abcdef0123456789abcdef");
        fake_send(c, &secure);
        c->step = 5; /* the secure-ok's proof is not checked here */
    } else if (c->step == 5 && m->id == METHOD_CONNECTION_SECURE_OK) {
        struct method tune = {.id = METHOD_CONNECTION_TUNE};
        tune.connection_tune.channel_max = 16;
        tune.connection_tune.frame_max = 131072;
        tune.connection_tune.heartbeat = 1;
        fake_send(c, &tune);
        c->step = 2;
    } else if (c->step == 2 && m->id == METHOD_CONNECTION_TUNE_OK) {
        assert_int_equal(m->connection_tune_ok.heartbeat, 1); /* the lower value wins */
        c->step = 3;
    } else if (c->step == 3 && m->id == METHOD_CONNECTION_OPEN) {
        struct method ok = {.id = METHOD_CONNECTION_OPEN_OK};
        fake_send(c, &ok);
        c->step = 4;
        peer->handshakes++;
        if (peer->mode == FAKE_GARBAGE && c->index < (int)ARRAY_SIZE(garbage))
            fake_write(c, garbage[c->index].bytes, garbage[c->index].size);
    }
}

static void fake_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    struct fake_client *c = handle->data;
    (void)suggested;
    *buf = uv_buf_init((char *)c->in + c->in_size, (unsigned)(sizeof c->in - c->in_size));
}

static void fake_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct fake_client *c = stream->data;
    (void)buf;
    if (nread < 0) {
        fake_close(c);
        return;
    }
    c->in_size += (size_t)nread;
    size_t used = 0;
    if (c->step == 0 && c->in_size >= PROTOCOL_HEADER_SIZE) {
        assert_memory_equal(c->in, PROTOCOL_HEADER, PROTOCOL_HEADER_SIZE);
        used = PROTOCOL_HEADER_SIZE;
        c->step = 1;
        if (c->peer->mode != FAKE_SILENT)
            fake_send_start(c);
    }
    struct frame_reader reader = {.frame_max = 131072};
    while (c->step > 0) {
        struct frame frame;
        int n = frame_parse(&reader, c->in + used, c->in_size - used, &frame, NULL);
        if (n <= 0)
            break;
        used += (size_t)n;
        struct method m;
        if (frame.type == FRAME_METHOD && method_decode(&m, frame.payload, frame.size) == 0)
            fake_handle(c, &m);
    }
    memmove(c->in, c->in + used, c->in_size - used);
    c->in_size -= used;
}

static void fake_on_connection(uv_stream_t *server, int status)
{
    struct fake_peer *peer = server->data;
    assert_int_equal(status, 0);
    assert_true(peer->accepts < FAKE_CLIENTS_MAX);
    struct fake_client *c = &peer->clients[peer->accepts];
    c->index = peer->accepts++;
    c->peer = peer;
    c->used = true;
    uv_tcp_init(loop, &c->tcp);
    c->tcp.data = c;
    assert_int_equal(uv_accept(server, (uv_stream_t *)&c->tcp), 0);
    uv_read_start((uv_stream_t *)&c->tcp, fake_alloc, fake_read);
}

static void fake_start(struct fake_peer *peer, enum fake_mode mode, char *address, size_t size)
{
    memset(peer, 0, sizeof *peer);
    peer->mode = mode;
    uint16_t fake_port = free_port();
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", fake_port, &sa);
    uv_tcp_init(loop, &peer->server);
    peer->server.data = peer;
    assert_int_equal(uv_tcp_bind(&peer->server, (const struct sockaddr *)&sa, 0), 0);
    assert_int_equal(uv_listen((uv_stream_t *)&peer->server, 16, fake_on_connection), 0);
    snprintf(address, size, "127.0.0.1:%u", fake_port);
}

static void fake_stop(struct fake_peer *peer)
{
    for (int i = 0; i < peer->accepts; i++)
        fake_close(&peer->clients[i]);
    uv_close((uv_handle_t *)&peer->server, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
}

static void garbage_from_the_peer_drops_the_connection(void **state)
{
    (void)state;
    struct fake_peer peer;
    char address[64];
    fake_start(&peer, FAKE_GARBAGE, address, sizeof address);
    struct probe p;
    new_link(&p, address, SECRET);
    int rounds = (int)ARRAY_SIZE(garbage);
    /* Each connection gets one piece of garbage; the last one none. */
    RUN_UNTIL(peer.handshakes == rounds + 1 && p.ups == rounds + 1, 20000);
    assert_int_equal(p.ups, rounds + 1);
    for (int i = 0; i < rounds; i++) {
        RUN_UNTIL(peer.close_codes[i] != 0, 1000);
        if (peer.close_codes[i] != garbage[i].expected_code)
            fail_msg("%s: link answered %u, not %u", garbage[i].what, peer.close_codes[i],
                     garbage[i].expected_code);
    }
    assert_true(link_is_up(p.link));
    assert_int_equal(p.downs, rounds); /* each loss of an up link is reported */
    free_link(&p);
    fake_stop(&peer);
}

static void silent_peer_times_out(void **state)
{
    (void)state;
    struct fake_peer peer;
    char address[64];
    fake_start(&peer, FAKE_SILENT, address, sizeof address);
    struct probe p;
    memset(&p, 0, sizeof p);
    struct link_config cfg = {.address = address, .self_name = "t",
                              .secret = BYTES_LIT(SECRET), .handshake_timeout_ms = 200,
                              .reconnect_min_ms = 10, .reconnect_max_ms = 20};
    struct link_ops ops = probe_ops;
    ops.ctx = &p;
    assert_int_equal(link_new(&p.link, &link_net, &cfg, &ops), 0);
    RUN_UNTIL(peer.accepts >= 3, 5000);
    assert_true(peer.accepts >= 3); /* timed out and retried, more than once */
    assert_int_equal(p.downs, 1);
    assert_int_equal(p.ups, 0);
    free_link(&p);
    fake_stop(&peer);
}

static void missed_heartbeats_drop_the_link(void **state)
{
    (void)state;
    struct fake_peer peer;
    char address[64];
    fake_start(&peer, FAKE_QUIET, address, sizeof address);
    struct probe p;
    new_link(&p, address, SECRET);
    RUN_UNTIL(p.ups == 1, 5000);
    assert_int_equal(p.ups, 1);
    uint64_t up_at = uv_now(loop);
    RUN_UNTIL(p.downs == 1, 5000);
    assert_int_equal(p.downs, 1);
    uint64_t silent_ms = uv_now(loop) - up_at;
    assert_true(silent_ms >= 1500 && silent_ms < 6000); /* two 1 s intervals (2-2.25 s) */
    RUN_UNTIL(p.ups == 2, 5000); /* and it comes back */
    assert_int_equal(p.ups, 2);
    free_link(&p);
    fake_stop(&peer);
}

/* ---- the program ----------------------------------------------------- */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* the process's job, as in quayd */
    loop = uv_default_loop();
    uv_timer_init(loop, &keepalive);
    net_init(&link_net, loop);
    snprintf(data_dir, sizeof data_dir, "/tmp/quay-test-link-XXXXXX");
    if (!mkdtemp(data_dir))
        return 1;
    /* The default guest, plus a second vhost for per-channel vhosts. */
    snprintf(users_file, sizeof users_file, "%s.users", data_dir);
    char hash[PASSWORD_TEXT_MAX + 1];
    static const struct password_policy sha256 = {.algorithm = PASSWORD_SHA256};
    auth_hash_password(&sha256, "guest", hash, sizeof hash);
    FILE *f = fopen(users_file, "w");
    if (!f)
        return 1;
    fprintf(f, "guest %s /,other loopback\n", hash);
    fclose(f);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(comes_up_and_a_wrong_secret_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(unclustered_broker_refuses_links, setup, teardown),
        cmocka_unit_test_setup_teardown(bad_arguments_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(publishes_consumes_and_gets, setup, teardown),
        cmocka_unit_test_setup_teardown(channels_work_in_their_own_vhost, setup, teardown),
        cmocka_unit_test_setup_teardown(reconnects_after_the_broker_restarts, setup, teardown),
        cmocka_unit_test_setup_teardown(freed_in_the_middle_of_traffic, setup, teardown),
        cmocka_unit_test_setup_teardown(freed_in_every_early_state, setup, teardown),
        cmocka_unit_test_setup_teardown(unreachable_address_is_an_ordinary_failure, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(freed_from_its_callbacks, setup, teardown),
        cmocka_unit_test_setup_teardown(garbage_from_the_peer_drops_the_connection, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(silent_peer_times_out, setup, teardown),
        cmocka_unit_test_setup_teardown(missed_heartbeats_drop_the_link, setup, teardown),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);

    net_close(&link_net);
    uv_close((uv_handle_t *)&keepalive, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    net_free(&link_net);
    uv_loop_close(loop);
    nftw(data_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    remove(users_file);
    return failed;
}
