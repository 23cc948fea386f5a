/*
 * api_health.c: see api_health.h. Reads the broker, the listeners and the
 * cluster map on the loop thread; changes nothing.
 */
#include "mgmt/api_health.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>

#include "broker/alarm.h"
#include "broker/broker.h"
#include "cluster/map.h"
#include "cluster/member.h"
#include "lib/json.h"
#include "mgmt/api.h"
#include "mgmt/api_list.h"
#include "net/listener.h"
#include "net/tls.h"

#define PORTS_MAX (2 * BROKER_LISTENERS_MAX + 2)

static void answer_ok(struct http_call *call, const char *key, const char *value)
{
    struct json body;
    http_body_init(&body);
    json_object_begin(&body);
    json_kv_string(&body, "status", "ok");
    if (key != NULL)
        json_kv_string(&body, key, value);
    json_object_end(&body);
    http_call_answer(call, 200, &body);
}

/* {"status": "failed", "reason": reason, (the caller's members)}: the
 * caller writes its members into body, then calls answer_failed. */
static void begin_failed(struct json *body, const char *reason)
{
    http_body_init(body);
    json_object_begin(body);
    json_kv_string(body, "status", "failed");
    json_kv_string(body, "reason", reason);
}

static void answer_failed(struct http_call *call, struct json *body)
{
    json_object_end(body);
    http_call_answer(call, 503, body);
}

static void answer_alarms(struct http_call *call, bool memory, bool disk, const char *reason)
{
    if (!memory && !disk) {
        answer_ok(call, NULL, NULL);
        return;
    }
    struct json body;
    begin_failed(&body, reason);
    json_key(&body, "alarms");
    json_array_begin(&body);
    if (memory)
        json_string(&body, "memory");
    if (disk)
        json_string(&body, "disk");
    json_array_end(&body);
    answer_failed(call, &body);
}

/* ---- listeners ---------------------------------------------------------------- */

static int bound_port(const struct listener *l)
{
    struct sockaddr_storage a;
    int size = sizeof a;
    if (uv_tcp_getsockname(&l->tcp, (struct sockaddr *)&a, &size) != 0)
        return -1;
    if (a.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&a)->sin_port);
    if (a.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    return -1;
}

/* The cluster's Raft port: this broker's cluster_address in the map. */
static int cluster_port(const struct broker *broker)
{
    const struct member *member = member_of(broker);
    if (member == NULL)
        return -1;
    const struct map_broker *self = cluster_map_broker(member_map(member), member->self_id);
    if (self == NULL)
        return -1;
    const char *colon = memrchr(self->cluster_address.ptr, ':', self->cluster_address.len);
    if (colon == NULL)
        return -1;
    int port = 0;
    for (const char *c = colon + 1;
         c < (const char *)self->cluster_address.ptr + self->cluster_address.len; c++)
        port = port * 10 + (*c - '0');
    return port;
}

/* Every port this broker listens on, RabbitMQ's order aside. */
static uint32_t listening_ports(const struct broker *broker, int ports[PORTS_MAX])
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < broker->listeners_count; i++)
        ports[n++] = bound_port(&broker->listeners[i]);
    for (uint32_t i = 0; i < broker->tls_listeners_count; i++)
        ports[n++] = bound_port(&broker->tls_listeners[i]);
    const struct listener *http = mgmt_api_listener(mgmt_api_of(broker));
    if (http != NULL)
        ports[n++] = bound_port(http);
    int raft = cluster_port(broker);
    if (raft > 0)
        ports[n++] = raft;
    return n;
}

static void check_port(struct broker *broker, struct http_call *call, struct bytes text)
{
    int port = 0;
    for (size_t i = 0; i < text.len; i++) {
        if (text.ptr[i] < '0' || text.ptr[i] > '9' || port > 65535) {
            port = -1;
            break;
        }
        port = port * 10 + (text.ptr[i] - '0');
    }
    if (text.len == 0 || port < 0 || port > 65535) {
        api_answer_bad_request(call, "Invalid port");
        return;
    }
    int ports[PORTS_MAX];
    uint32_t n = listening_ports(broker, ports);
    for (uint32_t i = 0; i < n; i++) {
        if (ports[i] == port) {
            struct json body;
            http_body_init(&body);
            json_object_begin(&body);
            json_kv_string(&body, "status", "ok");
            json_kv_uint(&body, "port", (uint64_t)port);
            json_object_end(&body);
            http_call_answer(call, 200, &body);
            return;
        }
    }
    struct json body;
    begin_failed(&body, "No active listener");
    json_kv_uint(&body, "missing", (uint64_t)port);
    json_key(&body, "ports");
    json_array_begin(&body);
    for (uint32_t i = 0; i < n; i++) {
        if (ports[i] >= 0)
            json_uint(&body, (uint64_t)ports[i]);
    }
    json_array_end(&body);
    answer_failed(call, &body);
}

/* RabbitMQ's names of a protocol, as its check normalises them. */
static const char *protocol_name(struct bytes text)
{
    static const struct {
        const char *alias, *name;
    } names[] = {{"amqp", "amqp"},         {"amqp091", "amqp"},  {"amqp0-9-1", "amqp"},
                 {"amqp0.9.1", "amqp"},    {"amqps", "amqp/ssl"}, {"amqp/ssl", "amqp/ssl"},
                 {"http", "http"},         {"https", "https"},   {"clustering", "clustering"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (bytes_equal_cstr(text, names[i].alias))
            return names[i].name;
    }
    return NULL;
}

static void check_protocol(struct broker *broker, struct http_call *call, struct bytes text)
{
    const char *active[5];
    uint32_t n = 0;
    if (broker->listeners_count > 0)
        active[n++] = "amqp";
    if (broker->tls_listeners_count > 0)
        active[n++] = "amqp/ssl";
    if (mgmt_api_of(broker) != NULL)
        active[n++] = broker->config.http_tls ? "https" : "http";
    if (member_of(broker) != NULL)
        active[n++] = "clustering";
    const char *name = protocol_name(text);
    for (uint32_t i = 0; name != NULL && i < n; i++) {
        if (strcmp(active[i], name) == 0) {
            answer_ok(call, "protocol", name);
            return;
        }
    }
    struct json body;
    begin_failed(&body, "No active listener");
    json_key(&body, "missing");
    if (name != NULL)
        json_string(&body, name);
    else
        json_string_n(&body, text.ptr, text.len);
    json_key(&body, "protocols");
    json_array_begin(&body);
    for (uint32_t i = 0; i < n; i++)
        json_string(&body, active[i]);
    json_array_end(&body);
    answer_failed(call, &body);
}

/* ---- certificates ------------------------------------------------------------- */

static void check_certificates(struct broker *broker, struct http_call *call, struct bytes count,
                               struct bytes unit)
{
    int64_t n = 0;
    for (size_t i = 0; i < count.len && n <= 100000; i++) {
        if (count.ptr[i] < '0' || count.ptr[i] > '9') {
            n = -1;
            break;
        }
        n = n * 10 + (count.ptr[i] - '0');
    }
    if (count.len == 0 || n < 0 || n > 100000) {
        api_answer_bad_request(call, "Invalid expiration value.");
        return;
    }
    static const struct {
        const char *name;
        int64_t seconds;
    } units[] = {{"days", 86400}, {"weeks", 7 * 86400}, {"months", 30 * 86400},
                 {"years", 365 * 86400}};
    int64_t within = -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (bytes_equal_cstr(unit, units[i].name))
            within = n * units[i].seconds;
    }
    if (within < 0) {
        api_answer_bad_request(call, "Time unit not recognised. Supported units: days, weeks, "
                                     "months, years.");
        return;
    }
    /* AMQPS, HTTPS and the cluster's TLS all load the one --tls-cert. */
    const struct tls_context *tls = broker->amqps_tls.ctx ? &broker->amqps_tls
                                    : broker->https_tls.ctx ? &broker->https_tls
                                                            : &broker->cluster_tls;
    int64_t left = 0;
    if (tls_context_cert_seconds_left(tls, &left) != 0 || left > within) {
        answer_ok(call, NULL, NULL);
        return;
    }
    struct json body;
    begin_failed(&body, "Certificates expiring");
    json_key(&body, "expired");
    json_array_begin(&body);
    json_object_begin(&body);
    json_kv_string(&body, "cert_file", tls->config.cert_file ? tls->config.cert_file : "");
    json_key(&body, "seconds_left");
    json_int(&body, left);
    json_object_end(&body);
    json_array_end(&body);
    answer_failed(call, &body);
}

/* ---- what stopping this broker would cost --------------------------------------- */

static void check_sync_critical(struct broker *broker, struct http_call *call)
{
    const struct member *member = member_of(broker);
    if (member == NULL) {
        answer_ok(call, "reason", "single node cluster");
        return;
    }
    const struct cluster_map *map = member_map(member);
    struct json body;
    begin_failed(&body, "There are queues whose backups are not in sync: stopping this "
                        "broker leaves them unavailable");
    json_key(&body, "queues");
    json_array_begin(&body);
    uint32_t found = 0;
    for (uint32_t i = 0; i < map->queues_count; i++) {
        const struct map_queue *q = map->queues[i];
        if (q->primary_id != member->self_id || q->replication_factor < 2 || q->in_sync_mask)
            continue;
        json_object_begin(&body);
        json_key(&body, "name");
        json_string_n(&body, q->name.ptr, q->name.len);
        json_key(&body, "virtual_host");
        json_string_n(&body, q->vhost->name.ptr, q->vhost->name.len);
        json_kv_string(&body, "type", "classic");
        json_object_end(&body);
        found++;
    }
    json_array_end(&body);
    if (found == 0) {
        json_free(&body);
        answer_ok(call, NULL, NULL);
        return;
    }
    answer_failed(call, &body);
}

static void check_quorum_critical(struct broker *broker, struct http_call *call)
{
    const struct member *member = member_of(broker);
    if (member == NULL) {
        answer_ok(call, "reason", "single node cluster");
        return;
    }
    const struct cluster_map *map = member_map(member);
    uint32_t voters = 0, up = 0;
    bool self_votes = false;
    for (uint32_t i = 0; i < map->brokers_count; i++) {
        const struct map_broker *b = map->brokers[i];
        if (!b->voter)
            continue;
        voters++;
        up += b->state == BROKER_STATE_UP || b->state == BROKER_STATE_DRAINING;
        self_votes |= b->id == member->self_id;
    }
    if (!self_votes || up - 1 >= voters / 2 + 1) {
        answer_ok(call, NULL, NULL);
        return;
    }
    struct json body;
    begin_failed(&body, "Stopping this broker would leave the cluster map's Raft group "
                        "without a majority of its voters");
    json_kv_uint(&body, "voters", voters);
    json_kv_uint(&body, "voters_up", up);
    answer_failed(call, &body);
}

/* ---- the tree ------------------------------------------------------------------ */

static void handle_checks(void *ctx, struct http_call *call, const struct http_call_request *req)
{
    struct broker *broker = ctx;
    struct api_path path;
    if (!api_path_parse(call, req, &path))
        return;
    if (path.count == 0 || (req->method != HTTP_METHOD_GET && req->method != HTTP_METHOD_HEAD)) {
        api_answer_not_found(call);
        return;
    }
    const struct alarm *a = &broker->alarm;
    if (path.count == 1 && api_path_is(&path, 0, "alarms"))
        answer_alarms(call, a->memory_on || a->cluster_memory_on, a->disk_on || a->cluster_disk_on,
                      "There are alarms in effect in the cluster");
    else if (path.count == 1 && api_path_is(&path, 0, "local-alarms"))
        answer_alarms(call, a->memory_on, a->disk_on, "There are alarms in effect on the node");
    else if (path.count == 1 && api_path_is(&path, 0, "virtual-hosts"))
        answer_ok(call, NULL, NULL); /* a quay vhost cannot be down alone */
    else if (path.count == 2 && api_path_is(&path, 0, "port-listener"))
        check_port(broker, call, path.seg[1]);
    else if (path.count == 2 && api_path_is(&path, 0, "protocol-listener"))
        check_protocol(broker, call, path.seg[1]);
    else if (path.count == 3 && api_path_is(&path, 0, "certificate-expiration"))
        check_certificates(broker, call, path.seg[1], path.seg[2]);
    else if (path.count == 1 && api_path_is(&path, 0, "node-is-mirror-sync-critical"))
        check_sync_critical(broker, call);
    else if (path.count == 1 && api_path_is(&path, 0, "node-is-quorum-critical"))
        check_quorum_critical(broker, call);
    else
        api_answer_not_found(call);
}

void api_health_register(struct http_server *http, struct broker *broker)
{
    http_server_route_prefix(http, "/api/health/checks/", handle_checks, broker,
                             MGMT_ACCESS_MONITORING);
}
