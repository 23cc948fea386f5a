/*
 * api_policies.h: the replication policy endpoints of the management API
 * (RabbitMQ's /api/policies, with quay's one setting: backups).
 *
 *   GET    /api/policies[/{vhost}]         every policy of the vhosts the user sees (of
 *                                          one), by priority; sort=, columns= (not paged,
 *                                          as RabbitMQ 3.10: api_list_answer_whole)
 *   GET    /api/policies/{vhost}/{name}    one (404 if none)
 *   PUT    /api/policies/{vhost}/{name}    {"pattern": "^ha\\.", "priority": 0, "backups": 2}
 *                                          201 created, 204 replaced, without a body
 *   DELETE /api/policies/{vhost}/{name}    204 without a body, 404 if none
 * vhost and name are %-encoded ("/" is %2F). Errors: 400 bad body or
 * pattern, 404 unknown vhost or policy, 503 when the cluster map cannot
 * commit (no leader, no quorum, or this broker has not caught up).
 *
 * In a cluster a change is a map command (cluster/map.h): the answer waits
 * for it to be applied here, and the leader's controller then brings the
 * existing queues to their new replication factor. Outside a cluster the
 * broker keeps the policies itself, durably (broker/durable.h); they have
 * nothing to replicate there, so they are only kept and shown.
 */
#ifndef QUAY_MGMT_API_POLICIES_H
#define QUAY_MGMT_API_POLICIES_H

#include "broker/policy.h"
#include "lib/json_read.h"
#include "mgmt/http.h"

struct broker;
struct json;
struct json_node;
struct json_tree;

/* Adds the routes; broker is borrowed and outlives the server. */
void api_policies_register(struct http_server *http, struct broker *broker);

/* The policies in force: the map's in a cluster, else the broker's. */
const struct policy_set *api_policies_of(const struct broker *broker);

/* Writes "definition": p in RabbitMQ's classic mirroring words (N backups
 * = "ha-params": N + 1 copies), and quay-replicate only when set (RabbitMQ
 * refuses a key it does not know): GET /api/policies and the definitions
 * export write the same. */
void api_policy_definition_write(struct json *out, const struct policy *p);

/* A policy declaration that owns its strings (decl's slices point here). */
struct api_policy {
    struct policy_decl decl;
    uint8_t vhost[POLICY_NAME_SIZE_MAX], name[POLICY_NAME_SIZE_MAX];
    uint8_t pattern[JSON_READ_STRING_SIZE];
};
/* A policy in RabbitMQ's shape (PUT's body, or a definitions "policies"
 * item: its "vhost" and "name" are ignored here) as the declaration of
 * vhost/name (each 1..POLICY_NAME_SIZE_MAX bytes): OK, or E_SYNTAX with
 * the text PUT answers 400 with in err. */
int api_policy_read(const struct json_tree *t, const struct json_node *obj, struct bytes vhost,
                    struct bytes name, struct api_policy *out, char *err, size_t err_size);
/* Outside a cluster: puts d (checked; room for it) or deletes one,
 * journaled, as PUT and DELETE do (false: there was none). */
void api_policy_put_here(struct broker *broker, const struct policy_decl *d);
bool api_policy_delete_here(struct broker *broker, struct bytes vhost, struct bytes name);

#endif
