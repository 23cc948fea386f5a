/*
 * api_queues.c: see api_queues.h. Reads go to broker state on the loop
 * (and, for a stand-in's counts, to the primary through proxy_query);
 * changes go over AMQP as the user (api_amqp.h).
 *
 * A read gathers the queues it shows first, each with a reference, so a
 * queue deleted while its primary is asked stays valid (it is then left
 * out); the answer is written once every count came back.
 */
#include "mgmt/api_queues.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/method_gen.h"
#include "amqp/reply_code_gen.h"
#include "broker/broker.h"
#include "broker/dedup.h"
#include "broker/policy.h"
#include "broker/queue.h"
#include "broker/vhost.h"
#include "cluster/link.h"
#include "cluster/map.h"
#include "cluster/node.h"
#include "cluster/proxy.h"
#include "cluster/replica.h"
#include "cluster/replication.h"
#include "cluster/member.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/errors.h"
#include "mgmt/api.h"
#include "mgmt/api_amqp.h"
#include "mgmt/api_bindings.h"
#include "mgmt/api_list.h"
#include "mgmt/api_message.h"
#include "mgmt/api_policies.h"
#include "mgmt/api_stats.h"
#include "mgmt/api_table.h"
#include "lib/json.h"
#include "mgmt/json_tree.h"

#define API_ARGUMENTS_SIZE_MAX 65536
/* Counts asked of primaries at once (ask_more), and how long a listing
 * waits for them (on_deadline). */
#define GATHER_WINDOW 64
#define GATHER_DEADLINE_MS 3000

const char *api_node_name(const struct broker *broker)
{
    const struct cluster_node *node = member_node_of(broker);
    return node != NULL ? cluster_node_name(node) : "local";
}

struct vhost *api_vhost_or_404(struct broker *broker, struct http_call *call, struct bytes name)
{
    struct vhost *vhost = broker_vhost(broker, name);
    if (vhost == NULL)
        api_answer_not_found(call);
    return vhost;
}

/* ---- one queue's JSON --------------------------------------------------- */

/* What is known of one queue's counts. */
struct counts {
    uint32_t ready;
    uint32_t consumers;
    uint32_t unacked;
    bool from_primary;
    bool down; /* the primary cannot serve it (its queue->unreadable) */
};

static void write_broker_name(struct json *out, const struct cluster_map *map, uint32_t id)
{
    const struct map_broker *b = cluster_map_broker(map, id);
    if (b)
        json_string_n(out, (const char *)b->name.ptr, b->name.len);
    else
        json_null(out);
}

static void write_id_list(struct json *out, const char *key, const struct cluster_map *map,
                          const struct map_queue *mq, bool in_sync_only)
{
    json_key(out, key);
    json_array_begin(out);
    for (uint8_t i = 0; mq != NULL && i < mq->backups_count; i++) {
        if (!in_sync_only || (mq->in_sync_mask & (1u << i)))
            write_broker_name(out, map, mq->backup_ids[i]);
    }
    json_array_end(out);
}

/* quay's placement fields, from the cluster map (every broker answers the
 * same); a single broker is the primary of everything. */
static void write_placement(struct json *out, struct broker *broker, const struct queue *queue)
{
    const struct cluster_node *node = member_node_of(broker);
    const struct cluster_map *map = node ? cluster_node_map(node) : NULL;
    const struct map_queue *mq = map ? cluster_map_queue(map, queue->vhost->name, queue->name)
                                     : NULL;
    if (mq == NULL) {
        json_kv_string(out, "primary", api_node_name(broker));
        json_kv_string(out, "role", "primary");
        write_id_list(out, "backups", NULL, NULL, false);
        write_id_list(out, "in_sync", NULL, NULL, false);
        json_kv_uint(out, "epoch", 0);
        return;
    }
    json_key(out, "primary");
    write_broker_name(out, map, mq->primary_id);
    bool backup = map_queue_has_backup(mq, cluster_node_id(member_node_of(broker)));
    json_kv_string(out, "role",
                   !queue_is_remote(queue) ? "primary" : backup ? "backup" : "proxy");
    if (queue_is_remote(queue)) { /* a backup's copy of the primary's messages */
        const struct replica *r = proxy_stub_replica((struct queue *)queue, false);
        json_kv_uint(out, "replica_messages", replica_count(r));
        if (queue->args.quay_dedup_window_ms > 0)
            json_kv_uint(out, "dedup_ids", replica_dedup_count(r));
    } else {
        replication_write_json(queue, out); /* serving, confirms (with backups) */
    }
    json_kv_bool(out, "available", mq->available);
    write_id_list(out, "backups", map, mq, false);
    write_id_list(out, "in_sync", map, mq, true);
    json_kv_uint(out, "epoch", mq->epoch);
    json_kv_uint(out, "replication_factor", mq->replication_factor);
}

/* RabbitMQ's "node": where the queue lives, i.e. its primary. */
static void write_node(struct json *out, struct broker *broker, const struct queue *queue)
{
    json_key(out, "node");
    const struct cluster_node *node = member_node_of(broker);
    const struct cluster_map *map = node ? cluster_node_map(node) : NULL;
    const struct map_queue *mq = map ? cluster_map_queue(map, queue->vhost->name, queue->name)
                                     : NULL;
    if (mq != NULL)
        write_broker_name(out, map, mq->primary_id);
    else
        json_string(out, api_node_name(broker));
}

/* The replication policy that sets the queue's backups: null when none
 * matches, or when its own x-quay-backups (or being exclusive) decides. */
static void write_policy_name(struct json *out, struct broker *broker, const struct queue *queue)
{
    json_key(out, "policy");
    const struct policy *p = NULL;
    if (!queue->exclusive &&
        policy_queue_own_backups(queue->arguments.ptr, queue->arguments.len) < 0)
        p = policy_set_match(api_policies_of(broker), queue->vhost->name, queue->name);
    if (p != NULL)
        json_string_n(out, p->name.ptr, p->name.len);
    else
        json_null(out);
}

static bool queue_available(struct broker *broker, const struct queue *queue)
{
    if (member_node_of(broker) == NULL)
        return true;
    const struct map_queue *mq =
        cluster_map_queue(cluster_node_map(member_node_of(broker)), queue->vhost->name,
                          queue->name);
    return mq == NULL || mq->available;
}

/* RabbitMQ's message_stats of a queue, totals and rates (broker/rates.h):
 * this broker's own (a stand-in's: what passed through it here). */
static void write_message_stats(struct json *out, struct broker *broker,
                                const struct queue *queue)
{
    const struct rates_clock *clock = &broker->rates_clock;
    const struct rates *r = &queue->rates;
    const struct queue_stats *s = &queue->stats;
    json_key(out, "message_stats");
    json_object_begin(out);
    api_stats_write(out, "publish", s->publish, rates_per_s(r, clock, QUEUE_RATE_PUBLISH));
    api_stats_write(out, "deliver", s->deliver, rates_per_s(r, clock, QUEUE_RATE_DELIVER));
    api_stats_write(out, "deliver_no_ack", s->deliver_no_ack,
                    rates_per_s(r, clock, QUEUE_RATE_DELIVER_NO_ACK));
    api_stats_write(out, "get", s->get, rates_per_s(r, clock, QUEUE_RATE_GET));
    api_stats_write(out, "get_no_ack", s->get_no_ack,
                    rates_per_s(r, clock, QUEUE_RATE_GET_NO_ACK));
    double deliver_get = 0.0;
    for (int i = QUEUE_RATE_DELIVER; i <= QUEUE_RATE_GET_NO_ACK; i++)
        deliver_get += rates_per_s(r, clock, (uint32_t)i);
    api_stats_write(out, "deliver_get", s->deliver + s->deliver_no_ack + s->get + s->get_no_ack,
                    deliver_get);
    api_stats_write(out, "redeliver", s->redeliver, rates_per_s(r, clock, QUEUE_RATE_REDELIVER));
    api_stats_write(out, "ack", s->ack, rates_per_s(r, clock, QUEUE_RATE_ACK));
    json_object_end(out);
    /* The rates of change of this broker's counts. */
    api_stats_write_rate(out, "messages", rates_per_s(r, clock, QUEUE_RATE_MESSAGES));
    api_stats_write_rate(out, "messages_ready", rates_per_s(r, clock, QUEUE_RATE_READY));
    api_stats_write_rate(out, "messages_unacknowledged",
                         rates_per_s(r, clock, QUEUE_RATE_UNACKED));
}

static void write_queue(struct json *out, struct broker *broker, const struct queue *queue,
                        const struct counts *c)
{
    json_object_begin(out);
    json_key(out, "name");
    json_string_n(out, queue->name.ptr, queue->name.len);
    json_key(out, "vhost");
    json_string_n(out, queue->vhost->name.ptr, queue->vhost->name.len);
    json_kv_bool(out, "durable", queue->durable);
    json_kv_bool(out, "auto_delete", queue->auto_delete);
    json_kv_bool(out, "exclusive", queue->exclusive);
    json_key(out, "arguments");
    api_table_write(out, (struct table){queue->arguments.ptr, queue->arguments.len});
    json_kv_uint(out, "messages", (uint64_t)c->ready + c->unacked);
    json_kv_uint(out, "messages_ready", c->ready);
    json_kv_uint(out, "messages_unacknowledged", c->unacked);
    json_kv_uint(out, "consumers", c->consumers);
    json_kv_uint(out, "message_bytes_ready", queue->ready_bytes);
    /* What the queue holds here: its record and its ready bodies. */
    json_kv_uint(out, "memory", sizeof *queue + queue->ready_bytes);
    bool down = !queue_available(broker, queue) || queue->unreadable || c->down;
    json_kv_string(out, "state", down ? "down" : "running");
    json_kv_string(out, "type", "classic");
    write_node(out, broker, queue);
    write_policy_name(out, broker, queue);
    json_key(out, "exclusive_consumer_tag");
    json_null(out);
    json_key(out, "effective_policy_definition");
    json_object_begin(out);
    json_object_end(out);
    write_message_stats(out, broker, queue);
    /* quay's own. */
    json_kv_string(out, "counts_from", c->from_primary ? "primary" : "local");
    json_kv_string(out, "message_stats_from", queue_is_remote(queue) ? "local" : "primary");
    json_kv_uint(out, "paged", queue->paged_count);
    if (!queue_is_remote(queue) && queue->args.quay_dedup_window_ms > 0)
        json_kv_uint(out, "dedup_ids", queue->dedup ? dedup_count(queue->dedup) : 0);
    write_placement(out, broker, queue);
    json_object_end(out);
}

/* ---- gathering (reads) ----------------------------------------------------- */

struct gather_item {
    struct gather *gather;
    struct queue *queue;         /* one reference */
    uint32_t vhost_index;        /* its vhost's name: gather.vhost_names */
    struct queue_remote_op *op;         /* asking the primary, or NULL */
    bool opened_getter;          /* the query opened the stand-in's getter: release it */
    struct counts counts;
    bool gone;                   /* the primary says it is no more */
};

struct gather {
    struct broker *broker;
    struct http_call *call;
    struct http_call_request req; /* slices valid until the call is answered */
    bool single;                  /* one object, not a list */
    uint32_t pending;             /* queries in flight, plus one while starting */
    uint32_t next;                /* the next item to ask about */
    uint32_t count, cap;
    struct gather_item *items;    /* owned */
    struct bytes *vhost_names;    /* owned copies: a vhost may go while we wait */
    uint32_t vhosts_count;
    uv_timer_t deadline;          /* started when a primary is asked */
    bool deadline_started;
    struct api_list_cut *cut;     /* owned: the page was cut before gathering, or NULL */
};

static void on_deadline_closed(uv_handle_t *handle)
{
    free(handle->data);
}

static void gather_free(struct gather *g)
{
    for (uint32_t i = 0; i < g->count; i++) {
        if (g->items[i].op != NULL)
            proxy_op_cancel(g->items[i].op);
        queue_unref(g->items[i].queue);
    }
    free(g->items);
    g->items = NULL;
    g->count = 0;
    for (uint32_t i = 0; i < g->vhosts_count; i++)
        bytes_free(&g->vhost_names[i]);
    free(g->vhost_names);
    g->vhost_names = NULL;
    g->vhosts_count = 0;
    if (g->cut != NULL)
        api_list_cut_free(g->cut);
    free(g->cut);
    g->cut = NULL;
    if (!g->deadline_started) {
        free(g);
        return;
    }
    uv_timer_stop(&g->deadline);
    uv_close((uv_handle_t *)&g->deadline, on_deadline_closed); /* frees g */
}

static void gather_cancel(void *arg)
{
    gather_free(arg);
}

/* The queue an item stands for now. While the primaries were asked the
 * item's queue may have been replaced under its name: a stand-in by the
 * real queue (it moved here), the real queue by a stand-in (it moved
 * away). The listing shows the queue as it is when answered, never a gap
 * (*counts: the replacement's own when it is real here). NULL: no queue
 * of that name any more, or the primary says it is gone. */
static struct queue *gather_current(const struct gather *g, const struct gather_item *it,
                                    struct counts *counts)
{
    *counts = it->counts;
    if (!it->queue->deleted && !it->gone)
        return it->queue;
    struct vhost *vhost = broker_vhost(g->broker, g->vhost_names[it->vhost_index]);
    struct queue *now = vhost ? vhost_queue(vhost, it->queue->name) : NULL;
    if (now == NULL || now == it->queue)
        return NULL;
    if (!queue_is_remote(now))
        *counts = (struct counts){queue_ready_count(now), now->consumers_count,
                                  now->unacked_count, true, now->unreadable};
    return now;
}

/* ---- a whole list, a slice at a time (api_list_answer_slices) ---- */

static bool write_item(void *ctx, size_t i, struct json *out)
{
    struct gather *g = ctx;
    struct counts counts;
    struct queue *queue = gather_current(g, &g->items[i], &counts);
    if (queue == NULL)
        return false;
    write_queue(out, g->broker, queue, &counts);
    return true;
}

static void list_done(void *ctx)
{
    gather_free(ctx);
}

static int compare_bytes(struct bytes a, struct bytes b)
{
    size_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    return c ? c : (a.len > b.len) - (a.len < b.len);
}

/* By vhost, then name: the list's default order (api_list.c's "vhost,name"). */
static int compare_items(void *ctx, size_t x, size_t y)
{
    const struct gather *g = ctx;
    const struct gather_item *a = &g->items[x], *b = &g->items[y];
    int c = compare_bytes(g->vhost_names[a->vhost_index], g->vhost_names[b->vhost_index]);
    return c ? c : compare_bytes(a->queue->name, b->queue->name);
}

/* Every count is in: the items go out in slices (the deadline is over). */
static void list_answer(struct gather *g)
{
    if (g->deadline_started)
        uv_timer_stop(&g->deadline);
    struct api_list_source source = {.count = g->count, .write = write_item,
                                     .compare = compare_items, .done = list_done, .ctx = g};
    api_list_answer_slices(g->broker->loop, g->call, &g->req, "vhost,name", &source);
}

static void gather_answer(struct gather *g)
{
    if (!g->single && g->cut == NULL) {
        list_answer(g);
        return;
    }
    struct json body;
    http_body_init(&body);
    if (!g->single)
        json_array_begin(&body);
    uint32_t written = 0;
    for (uint32_t i = 0; i < g->count; i++) {
        struct counts counts;
        struct queue *queue = gather_current(g, &g->items[i], &counts);
        if (queue == NULL)
            continue;
        write_queue(&body, g->broker, queue, &counts);
        written++;
    }
    if (g->single && written == 0) {
        json_free(&body);
        api_answer_not_found(g->call);
    } else if (g->single) {
        api_object_answer(g->call, &g->req, &body);
    } else {
        json_array_end(&body);
        api_list_answer_cut(g->call, &g->req, &body, g->cut);
    }
    gather_free(g);
}

static void ask_more(struct gather *g);

static void on_counts(void *ctx, struct queue *queue, uint16_t reply_code,
                      struct bytes reply_text, const struct queue_remote_counts *counts)
{
    (void)reply_text;
    struct gather_item *it = ctx;
    struct gather *g = it->gather;
    it->op = NULL;
    /* Counts that are not the primary's (the broker asked could not reach
     * it: channel_declare.c's queue_quay_counts) are not better than ours. */
    if (reply_code == REPLY_SUCCESS && counts->primary)
        it->counts = (struct counts){counts->messages, counts->consumers, counts->unacked, true,
                                     counts->down};
    else if (reply_code == REPLY_NOT_FOUND)
        it->gone = true;
    if (it->opened_getter)
        proxy_stub_release_getter(queue);
    ASSERT(g->pending > 0);
    g->pending--;
    ask_more(g);
    if (g->pending == 0)
        gather_answer(g);
}

static void gather_add(struct gather *g, struct queue *queue)
{
    ASSERT(!queue->deleted);
    ASSERT(g->vhosts_count > 0);
    if (g->count == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 16;
        g->items = xrealloc(g->items, g->cap * sizeof *g->items);
    }
    queue_ref(queue);
    g->items[g->count++] = (struct gather_item){
        .queue = queue,
        .vhost_index = g->vhosts_count - 1,
        .counts = {queue_ready_count(queue), queue->consumers_count, queue->unacked_count,
                   !queue_is_remote(queue)}};
}

/* Asks the next stand-ins' primaries for their counts, at most
 * GATHER_WINDOW at once: each query holds a channel to the primary for
 * its while (the stand-in's getter, released after unless it was open
 * already), and a link has a bounded number of channels. */
static void ask_more(struct gather *g)
{
    while (g->next < g->count && g->pending < GATHER_WINDOW) {
        struct gather_item *it = &g->items[g->next++];
        it->gather = g;
        /* A primary that cannot be asked now (down, its link not up) is
         * not waited for: a listing during a failover answers at once,
         * with the local counts ("counts_from": "local"). */
        if (!queue_is_remote(it->queue) || it->queue->deleted ||
            !proxy_stub_reachable(it->queue))
            continue;
        it->opened_getter = !proxy_stub_has_getter(it->queue);
        g->pending++;
        it->op = proxy_query(it->queue, METHOD_QUEUE_QUAY_COUNTS, on_counts, it);
        if (it->op == NULL) {
            g->pending--; /* unreachable: the local counts stand */
            if (it->opened_getter)
                proxy_stub_release_getter(it->queue);
        }
    }
}

/* A primary that is reachable but slow (stopped, overloaded) does not
 * hold the answer past GATHER_DEADLINE_MS: the counts not back by then
 * are the local ones. */
static void on_deadline(uv_timer_t *timer)
{
    struct gather *g = timer->data;
    for (uint32_t i = 0; i < g->count; i++) {
        if (g->items[i].op != NULL)
            proxy_op_cancel(g->items[i].op);
        g->items[i].op = NULL;
    }
    g->next = g->count;
    g->pending = 0;
    http_call_on_cancel(g->call, NULL, NULL);
    gather_answer(g);
}

/* Answers once every count came back (at once when no queue is remote).
 * The items array is complete: the callbacks hold pointers into it. */
static void gather_start(struct gather *g)
{
    g->pending = 1; /* held while asking, so no answer comes before the loop ends */
    ask_more(g);
    if (--g->pending == 0 && g->next == g->count) {
        gather_answer(g);
        return;
    }
    uv_timer_init(g->broker->loop, &g->deadline);
    g->deadline.data = g;
    g->deadline_started = true;
    uv_timer_start(&g->deadline, on_deadline, GATHER_DEADLINE_MS, 0);
    http_call_on_cancel(g->call, gather_cancel, g);
}

static struct gather *gather_new(struct broker *broker, struct http_call *call,
                                 const struct http_call_request *req, bool single)
{
    struct gather *g = xcalloc(1, sizeof *g);
    *g = (struct gather){.broker = broker, .call = call, .req = *req, .single = single};
    return g;
}

/* The vhost of the items added next. */
static void gather_vhost(struct gather *g, const struct vhost *vhost)
{
    g->vhost_names = xrealloc(g->vhost_names, (g->vhosts_count + 1) * sizeof *g->vhost_names);
    g->vhost_names[g->vhosts_count++] = bytes_dup(vhost->name);
}

static void add_vhost_queues(struct gather *g, struct vhost *vhost)
{
    gather_vhost(g, vhost);
    struct hmap_entry *q;
    for (uint32_t j = 0; hmap_next(&vhost->queues, &j, &q);)
        gather_add(g, q->value);
}

/* ---- a page of the list ---------------------------------------------------- */

struct listed {
    const struct vhost *vhost;
    struct queue *queue;
};

static _Thread_local const struct api_list_cut *cut_now; /* qsort has no context */

static int compare_listed(const void *x, const void *y)
{
    const struct listed *a = x, *b = y;
    return api_list_cut_compare(cut_now, a->vhost->name, a->queue->name, b->vhost->name,
                                b->queue->name);
}

/* The matching queues of vhost appended to list[*count] (room for all). */
static void cut_vhost(const struct vhost *vhost, struct api_list_cut *cut, struct listed *list,
                      size_t *count)
{
    struct hmap_entry *q;
    for (uint32_t j = 0; hmap_next(&vhost->queues, &j, &q);) {
        struct queue *queue = q->value;
        cut->total++;
        if (api_list_cut_matches(cut, queue->name))
            list[(*count)++] = (struct listed){vhost, queue};
    }
}

/* A page by vhost and name (api_list_cut): the queues are sorted by their
 * names first and only the page's are gathered, so in a cluster only
 * their primaries are asked for counts (the console's queue list and
 * search: 10,000 queues on 5 brokers, bench/RESULTS.md). vhost NULL:
 * every vhost the user sees. */
static void list_page(struct broker *broker, struct http_call *call,
                      const struct http_call_request *req, struct vhost *only,
                      struct api_list_cut *cut)
{
    size_t room = 0;
    struct hmap_entry *v;
    for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);)
        room += ((const struct vhost *)v->value)->queues.count;
    struct listed *list = xmalloc((room + 1) * sizeof *list);
    size_t count = 0;
    if (only != NULL)
        cut_vhost(only, cut, list, &count);
    for (uint32_t i = 0; only == NULL && hmap_next(&broker->vhosts, &i, &v);) {
        if (mgmt_user_sees_vhost(req->user, ((struct vhost *)v->value)->name))
            cut_vhost(v->value, cut, list, &count);
    }
    cut->filtered = count;
    cut_now = cut;
    qsort(list, count, sizeof *list, compare_listed);
    cut_now = NULL;
    size_t from, to;
    api_list_cut_range(cut, &from, &to);
    struct gather *g = gather_new(broker, call, req, false);
    g->cut = cut;
    for (size_t i = from; i < to; i++) {
        if (g->vhosts_count == 0 || list[i].vhost != list[i - 1].vhost)
            gather_vhost(g, list[i].vhost);
        gather_add(g, list[i].queue);
    }
    free(list);
    gather_start(g);
}

static void list_queues(struct broker *broker, struct http_call *call,
                        const struct http_call_request *req, const struct bytes *vhost_name)
{
    struct api_list_cut *cut = xmalloc(sizeof *cut);
    if (api_list_cut_parse(req, cut)) {
        struct vhost *vhost = vhost_name ? broker_vhost(broker, *vhost_name) : NULL;
        if (vhost_name != NULL && vhost == NULL) {
            api_list_cut_free(cut);
            free(cut);
            api_answer_not_found(call);
            return;
        }
        list_page(broker, call, req, vhost, cut);
        return;
    }
    free(cut);
    struct gather *g = gather_new(broker, call, req, false);
    if (vhost_name != NULL) {
        struct vhost *vhost = broker_vhost(broker, *vhost_name);
        if (vhost == NULL) {
            gather_free(g);
            api_answer_not_found(call);
            return;
        }
        add_vhost_queues(g, vhost);
    } else {
        struct hmap_entry *v;
        for (uint32_t i = 0; hmap_next(&broker->vhosts, &i, &v);) {
            struct vhost *vhost = v->value;
            if (mgmt_user_sees_vhost(req->user, vhost->name))
                add_vhost_queues(g, vhost);
        }
    }
    gather_start(g);
}

static void show_queue(struct broker *broker, struct http_call *call,
                       const struct http_call_request *req, struct queue *queue)
{
    struct gather *g = gather_new(broker, call, req, true);
    gather_vhost(g, queue->vhost);
    gather_add(g, queue);
    gather_start(g);
}

/* ---- changes, over AMQP ------------------------------------------------------ */

/* One change: the method to send, and how success is answered. */
struct change {
    struct api_change head;        /* first: api_change_type's */
    uint8_t name[API_SEGMENT_SIZE_MAX];
    uint8_t arguments[API_ARGUMENTS_SIZE_MAX];
};

static struct change *change_new(struct bytes name, uint32_t method_id, uint32_t ok_id)
{
    struct change *c = xcalloc(1, sizeof *c);
    ASSERT(name.len <= sizeof c->name);
    memcpy(c->name, name.ptr, name.len);
    c->head.method.id = method_id;
    c->head.ok_id = ok_id;
    c->head.status = 204;
    return c;
}

/* A request body: parsed, or answered 400 (with where it went wrong). */
bool api_body_parse(struct http_call *call, const struct http_call_request *req,
                    struct json_tree *tree)
{
    char err[200];
    if (json_tree_parse(tree, req->body, req->body_size, err, sizeof err) != OK) {
        api_answer_bad_request(call, err);
        return false;
    }
    if (json_tree_root(tree)->kind != JSON_KIND_OBJECT) {
        json_tree_free(tree);
        api_answer_bad_request(call, "not_json: the body must be a JSON object");
        return false;
    }
    return true;
}

static void declare_queue(struct broker *broker, struct http_call *call,
                          const struct http_call_request *req, struct vhost *vhost,
                          struct bytes name)
{
    struct json_tree tree;
    if (!api_body_parse(call, req, &tree))
        return;
    const struct json_node *root = json_tree_root(&tree);
    struct change *c = change_new(name, METHOD_QUEUE_DECLARE, METHOD_QUEUE_DECLARE_OK);
    struct method_queue_declare *d = &c->head.method.queue_declare;
    char err[200];
    bool durable, auto_delete;
    if (!json_tree_get_bool(&tree, root, "durable", false, &durable) ||
        !json_tree_get_bool(&tree, root, "auto_delete", false, &auto_delete)) {
        snprintf(err, sizeof err, "durable and auto_delete must be true or false");
    } else if (api_table_from_json(&tree, json_tree_get(&tree, root, "arguments"), c->arguments,
                                   sizeof c->arguments, &d->arguments, err,
                                   sizeof err) == OK) {
        err[0] = '\0';
    }
    json_tree_free(&tree);
    if (err[0] != '\0') {
        free(c);
        api_answer_bad_request(call, err);
        return;
    }
    d->queue = (struct bytes){c->name, name.len};
    d->durable = durable;
    d->auto_delete = auto_delete;
    c->head.status = vhost_queue(vhost, name) != NULL ? 204 : 201;
    api_op_start(broker, call, req, vhost->name, false, &api_change_type, c);
}

static bool query_true(const struct http_call_request *req, const char *key)
{
    char v[8];
    return api_query_get(req, key, v, sizeof v) && strcmp(v, "true") == 0;
}

static void delete_queue(struct broker *broker, struct http_call *call,
                         const struct http_call_request *req, struct vhost *vhost,
                         struct bytes name)
{
    struct change *c = change_new(name, METHOD_QUEUE_DELETE, METHOD_QUEUE_DELETE_OK);
    c->head.method.queue_delete.queue = (struct bytes){c->name, name.len};
    c->head.method.queue_delete.if_empty = query_true(req, "if-empty");
    c->head.method.queue_delete.if_unused = query_true(req, "if-unused");
    api_op_start(broker, call, req, vhost->name, false, &api_change_type, c);
}

static void purge_queue(struct broker *broker, struct http_call *call,
                        const struct http_call_request *req, struct vhost *vhost,
                        struct bytes name)
{
    struct change *c = change_new(name, METHOD_QUEUE_PURGE, METHOD_QUEUE_PURGE_OK);
    c->head.method.queue_purge.queue = (struct bytes){c->name, name.len};
    api_op_start(broker, call, req, vhost->name, false, &api_change_type, c);
}

/* ---- the tree ------------------------------------------------------------------ */

/* /api/queues/{vhost}/{name}[/...]: the vhost and the queue exist. */
static void handle_one(struct broker *broker, struct http_call *call,
                       const struct http_call_request *req, const struct api_path *path)
{
    struct vhost *vhost = api_vhost_or_404(broker, call, path->seg[0]);
    if (vhost == NULL)
        return;
    struct bytes name = path->seg[1];
    struct queue *queue = vhost_queue(vhost, name);
    enum http_method m = req->method;
    bool read = m == HTTP_METHOD_GET || m == HTTP_METHOD_HEAD;
    if (path->count == 2 && m == HTTP_METHOD_PUT) {
        declare_queue(broker, call, req, vhost, name);
    } else if (queue == NULL) {
        api_answer_not_found(call);
    } else if (path->count == 2 && read) {
        show_queue(broker, call, req, queue);
    } else if (path->count == 2 && m == HTTP_METHOD_DELETE) {
        delete_queue(broker, call, req, vhost, name);
    } else if (path->count == 3 && api_path_is(path, 2, "contents") &&
               m == HTTP_METHOD_DELETE) {
        purge_queue(broker, call, req, vhost, name);
    } else if (path->count == 3 && api_path_is(path, 2, "get") && m == HTTP_METHOD_POST) {
        api_message_get(broker, call, req, vhost, name);
    } else if (path->count == 3 && api_path_is(path, 2, "bindings") && read) {
        api_bindings_of_queue(broker, call, req, queue);
    } else if (path->count <= 3) {
        http_call_answer_error(call, 405, "Method Not Allowed");
    } else {
        api_answer_not_found(call);
    }
}

static void handle_queues(void *ctx, struct http_call *call, const struct http_call_request *req)
{
    struct broker *broker = ctx;
    struct api_path path;
    if (!api_path_parse(call, req, &path))
        return;
    bool read = req->method == HTTP_METHOD_GET || req->method == HTTP_METHOD_HEAD;
    if (path.count >= 1 && !mgmt_user_sees_vhost_or_401(call, req->user, path.seg[0]))
        return;
    if (path.count == 0 && read) {
        list_queues(broker, call, req, NULL);
    } else if (path.count == 1 && read) {
        list_queues(broker, call, req, &path.seg[0]);
    } else if (path.count >= 2) {
        handle_one(broker, call, req, &path);
    } else {
        http_call_answer_error(call, 405, "Method Not Allowed");
    }
}

void api_queues_register(struct http_server *http, struct broker *broker)
{
    http_server_route_tree(http, "/api/queues/", handle_queues, broker, MGMT_ACCESS_MANAGEMENT);
}
