/*
 * api_users.h: users, vhosts and permissions in the management API, with
 * RabbitMQ 3.10's paths, bodies and statuses.
 *
 *   GET    /api/whoami                       {"name", "tags": [..]}      management
 *   GET    /api/users                        every user                  administrator
 *   GET    /api/users/{name}                 {"name", "password_hash", "hashing_algorithm",
 *                                             "tags": [..], "limits": {}}
 *   PUT    /api/users/{name}                 {"password": ".."} or {"password_hash": "..",
 *                                             "hashing_algorithm":
 *                                             "rabbit_password_hashing_sha256"},
 *                                             "tags": "a,b" or ["a", "b"] (required)
 *                                             201 created, 204 changed (permissions stay)
 *   DELETE /api/users/{name}                 204; its connections are closed (320)
 *   GET    /api/users/{name}/permissions     its permissions
 *   GET    /api/vhosts                       [{"name", ..., "messages", "messages_ready",
 *                                             "messages_unacknowledged"}] management (its own)
 *   GET    /api/vhosts/{name}                                            management (its own)
 *   GET    /api/vhosts/{name}/permissions    every user's there          administrator
 *   PUT    /api/vhosts/{name}                201 (the creator gets ".*" three times, as in
 *                                            RabbitMQ), 204 existed       administrator
 *   DELETE /api/vhosts/{name}                204; its queues, exchanges, bindings, policies,
 *                                            permissions go, its connections are closed
 *   GET    /api/permissions                  [{"user", "vhost", "configure", "write", "read"}]
 *   GET    /api/permissions/{vhost}/{user}                               administrator
 *   PUT    /api/permissions/{vhost}/{user}   {"configure", "write", "read"}: 201 / 204
 *   DELETE /api/permissions/{vhost}/{user}   204
 *
 * The lists take api_list.h's sort=, sort_reverse= and columns=;
 * /api/vhosts is paged too (page=, page_size=, name=), the others are not,
 * as in RabbitMQ 3.10 (which ignores page= on them). A vhost's counts are
 * its queues' as /api/overview counts them (in a cluster: this broker's
 * queues and stand-ins, broker_queue_totals).
 *
 * Names in paths are %-encoded ("/" is %2F). Errors are RabbitMQ's: 404
 * {"error": "Object Not Found", "reason": "Not Found"}; 400 {"error":
 * "bad_request", "reason": ..} for a body that is not a JSON object
 * ("not_json"), no "tags" ("tags_not_present"), a hash that is not one
 * ("not_base64"), an unknown hashing algorithm, a regex that does not
 * compile ("invalid_regexp: ..."), a permission for an unknown user or
 * vhost ("vhost_or_user_not_found"); 503 when the cluster map cannot
 * commit. A refused request changes nothing. quay refuses a tag it does
 * not know (RabbitMQ keeps any word): tags decide the API's rights here.
 *
 * Outside a cluster the broker applies a change at once (broker/users.h,
 * durably); in a cluster it is a map command, answered once applied here,
 * and every broker applies it (cluster/mirror_users.c).
 */
#ifndef QUAY_MGMT_API_USERS_H
#define QUAY_MGMT_API_USERS_H

#include "mgmt/http.h"

struct broker;

/* Adds the routes; broker is borrowed and outlives the server. */
void api_users_register(struct http_server *http, struct broker *broker);

#endif
