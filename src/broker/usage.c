/*
 * usage.c: see usage.h. Counting walks the broker's connections: it runs
 * only for a name that has a limit (a check) or once per loop iteration in
 * which such a name's count moved (a report), never on the message path.
 */
#include "broker/usage.h"

#include <stdlib.h>
#include <string.h>

#include "amqp/table.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "broker/cluster_ops.h"
#include "broker/connection.h"
#include "broker/vhost.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/bytes.h"
#include "lib/log.h"

/* A report's table, at most: a frame of the smallest frame_max a link
 * negotiates holds it with room to spare. Past it, names are left out
 * (and counted as 0 by the peers), with a warning. */
#define USAGE_REPORT_MAX (64u << 10)

struct usage_report {
    struct list_node link;          /* in usage.reports */
    uint64_t connection_id;         /* the link it came on */
    uint8_t peer[LIMIT_NAME_SIZE_MAX];
    uint8_t peer_size;
    struct limit_set counts;        /* values are counts */
};

static const struct {
    const char *key;
    enum limit_scope scope;
    enum limit_kind kind;
} report_keys[] = {
    {USAGE_VHOST_CONNECTIONS, LIMIT_SCOPE_VHOST, LIMIT_MAX_CONNECTIONS},
    {USAGE_USER_CONNECTIONS, LIMIT_SCOPE_USER, LIMIT_MAX_CONNECTIONS},
    {USAGE_USER_CHANNELS, LIMIT_SCOPE_USER, LIMIT_MAX_CHANNELS},
};
#define REPORT_KEYS_COUNT (sizeof report_keys / sizeof report_keys[0])

void usage_init(struct usage *usage)
{
    *usage = (struct usage){0};
    list_init(&usage->reports);
}

static void report_free(struct usage_report *r)
{
    list_remove(&r->link);
    limit_set_free(&r->counts);
    free(r);
}

void usage_free(struct usage *usage)
{
    list_for_each_safe(node, &usage->reports)
        report_free(CONTAINER_OF(node, struct usage_report, link));
    if (usage->hook_added)
        net_flush_hook_remove(&usage->hook);
    usage->hook_added = false;
}

/* ---- counting ---- */

/* A client's connection that passed connection.open (not a broker's link). */
static bool counted(const struct connection *c)
{
    return !c->cluster_peer && !c->conn.closing && c->vhost != NULL && c->user != NULL;
}

static bool has_limit(const struct broker *broker, enum limit_scope scope, struct bytes name,
                      enum limit_kind kind)
{
    return limit_set_value(&broker->limits, scope, name, kind) >= 0;
}

uint64_t usage_local(const struct broker *broker, enum limit_scope scope, struct bytes name,
                     enum limit_kind kind)
{
    uint64_t n = 0;
    list_for_each(node, &broker->connections) {
        const struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
        if (!counted(c))
            continue;
        if (scope == LIMIT_SCOPE_VHOST) {
            n += bytes_equal(c->vhost->name, name);
        } else if (bytes_equal_cstr(name, c->user->name)) {
            n += kind == LIMIT_MAX_CHANNELS ? c->channels_open : 1;
        }
    }
    return n;
}

uint64_t usage_count(const struct broker *broker, enum limit_scope scope, struct bytes name,
                     enum limit_kind kind)
{
    uint64_t n = usage_local(broker, scope, name, kind);
    list_for_each(node, &broker->usage.reports) {
        const struct usage_report *r = CONTAINER_OF(node, struct usage_report, link);
        int64_t theirs = limit_set_value(&r->counts, scope, name, kind);
        if (theirs > 0)
            n += (uint64_t)theirs;
    }
    return n;
}

static bool name_fits(struct bytes name)
{
    return name.len >= 1 && name.len <= LIMIT_NAME_SIZE_MAX;
}

static void add(struct limit_set *counts, enum limit_scope scope, struct bytes name,
                enum limit_kind kind, uint64_t n)
{
    if (n == 0 || !name_fits(name))
        return;
    int64_t had = limit_set_value(counts, scope, name, kind);
    limit_set_put(counts, scope, name, kind, (had > 0 ? had : 0) + (int64_t)n);
}

/* This broker's counts of the limited names, in one walk. */
static void count_limited(const struct broker *broker, struct limit_set *counts)
{
    list_for_each(node, &broker->connections) {
        const struct connection *c = CONTAINER_OF(node, struct connection, broker_link);
        if (!counted(c))
            continue;
        struct bytes user = bytes_of_cstr(c->user->name);
        if (has_limit(broker, LIMIT_SCOPE_VHOST, c->vhost->name, LIMIT_MAX_CONNECTIONS))
            add(counts, LIMIT_SCOPE_VHOST, c->vhost->name, LIMIT_MAX_CONNECTIONS, 1);
        if (has_limit(broker, LIMIT_SCOPE_USER, user, LIMIT_MAX_CONNECTIONS))
            add(counts, LIMIT_SCOPE_USER, user, LIMIT_MAX_CONNECTIONS, 1);
        if (has_limit(broker, LIMIT_SCOPE_USER, user, LIMIT_MAX_CHANNELS))
            add(counts, LIMIT_SCOPE_USER, user, LIMIT_MAX_CHANNELS, c->channels_open);
    }
}

/* ---- reports ---- */

void usage_write(const struct broker *broker, struct table_writer *w)
{
    struct limit_set counts;
    limit_set_init(&counts);
    count_limited(broker, &counts);
    bool cut = false;
    for (size_t k = 0; k < REPORT_KEYS_COUNT; k++) {
        size_t mark = table_put_table_begin(w, report_keys[k].key);
        for (uint32_t i = 0; i < counts.count; i++) {
            const struct limit *l = &counts.items[i];
            if (l->scope != report_keys[k].scope || l->kind != report_keys[k].kind)
                continue;
            /* Room for this entry (key, letter, value) and what the
             * remaining keys' empty tables take. */
            if (w->len + 1 + l->name.len + 9 + REPORT_KEYS_COUNT * 32 > w->cap) {
                cut = true;
                continue;
            }
            char key[LIMIT_NAME_SIZE_MAX + 1];
            memcpy(key, l->name.ptr, l->name.len);
            key[l->name.len] = '\0';
            if (memchr(key, '\0', l->name.len) != NULL)
                continue; /* a name a key cannot carry (no such vhost or user is made) */
            table_put_int(w, key, l->value);
        }
        table_put_table_end(w, mark);
    }
    if (cut)
        LOG_WARN("usage: too many limited names in use for one report; the rest count 0 on "
                 "other brokers");
    limit_set_free(&counts);
}

/* One nested table of a report into counts; false if malformed. */
static bool read_counts(struct table t, enum limit_scope scope, enum limit_kind kind,
                        struct limit_set *counts)
{
    struct table_iter it;
    table_iter_init(&it, t);
    struct bytes name;
    struct field_value v;
    int64_t n;
    while (table_iter_next(&it, &name, &v)) {
        if (!name_fits(name) || !field_value_as_int(&v, &n) || n < 0 ||
            counts->count >= LIMIT_COUNT_MAX)
            return false;
        limit_set_put(counts, scope, name, kind, n);
    }
    return true;
}

static struct usage_report *report_of(struct broker *broker, struct bytes peer)
{
    list_for_each(node, &broker->usage.reports) {
        struct usage_report *r = CONTAINER_OF(node, struct usage_report, link);
        if (bytes_equal(peer, (struct bytes){r->peer, r->peer_size}))
            return r;
    }
    return NULL;
}

bool usage_heard(struct broker *broker, uint64_t connection_id, struct bytes peer,
                 struct table counts)
{
    if (!name_fits(peer))
        return false;
    struct limit_set fresh;
    limit_set_init(&fresh);
    for (size_t k = 0; k < REPORT_KEYS_COUNT; k++) {
        struct field_value v;
        if (!table_get(counts, report_keys[k].key, &v))
            continue;
        if (v.kind != 'F' ||
            !read_counts(v.table, report_keys[k].scope, report_keys[k].kind, &fresh)) {
            LOG_WARN("usage: a malformed report from broker '%.*s' ignored", (int)peer.len,
                     (const char *)peer.ptr);
            limit_set_free(&fresh);
            return false;
        }
    }
    struct usage_report *r = report_of(broker, peer);
    if (r == NULL) {
        r = xcalloc(1, sizeof *r);
        memcpy(r->peer, peer.ptr, peer.len);
        r->peer_size = (uint8_t)peer.len;
        limit_set_init(&r->counts);
        list_push_back(&broker->usage.reports, &r->link);
    }
    r->connection_id = connection_id; /* a new link replaces the old one's */
    limit_set_free(&r->counts);
    r->counts = fresh;
    return true;
}

void usage_link_closed(struct broker *broker, uint64_t connection_id)
{
    list_for_each_safe(node, &broker->usage.reports) {
        struct usage_report *r = CONTAINER_OF(node, struct usage_report, link);
        if (r->connection_id == connection_id)
            report_free(r);
    }
}

/* ---- sharing ours ---- */

static void share(struct net_flush_hook *hook)
{
    struct broker *broker = CONTAINER_OF(hook, struct broker, usage.hook);
    if (broker->cluster_ops == NULL || broker->stopping)
        return;
    uint8_t *buf = xmalloc(USAGE_REPORT_MAX);
    struct table_writer w;
    table_writer_init(&w, buf, USAGE_REPORT_MAX);
    usage_write(broker, &w);
    ASSERT(!w.overflow); /* usage_write keeps within the cap */
    broker->cluster_ops->share_usage(broker->cluster_ctx, table_writer_table(&w));
    free(buf);
}

static bool touches_limit(const struct broker *broker, const struct connection *c)
{
    if (c->cluster_peer || c->user == NULL)
        return false;
    struct bytes user = bytes_of_cstr(c->user->name);
    return (c->vhost != NULL &&
            has_limit(broker, LIMIT_SCOPE_VHOST, c->vhost->name, LIMIT_MAX_CONNECTIONS)) ||
           has_limit(broker, LIMIT_SCOPE_USER, user, LIMIT_MAX_CONNECTIONS) ||
           has_limit(broker, LIMIT_SCOPE_USER, user, LIMIT_MAX_CHANNELS);
}

void usage_changed(struct broker *broker, const struct connection *connection)
{
    if (broker->cluster_ops == NULL || broker->stopping)
        return;
    if (connection != NULL && !touches_limit(broker, connection))
        return;
    struct usage *usage = &broker->usage;
    if (!usage->hook_added) {
        net_flush_hook_add(&broker->net, &usage->hook, share);
        usage->hook_added = true;
    }
    net_flush_hook_arm(&broker->net, &usage->hook);
}
