/*
 * mirror.h: the broker's objects follow the cluster map.
 *
 * Every broker holds every exchange and binding of the map (routing is
 * local everywhere, DESIGN §4) and every queue: a real one where it is the
 * primary, a stand-in (cluster/proxy.h) elsewhere. mirror_change applies
 * one committed change; mirror_all makes everything match (after a
 * snapshot, and once the log is caught up after a start, when the local
 * journal may have brought back objects the map no longer has).
 *
 * Runs inside the consensus apply callback: it never submits to the map
 * synchronously (member_queue_gone and vhost publication are deferred to
 * the node's next tick by the node itself).
 */
#ifndef QUAY_CLUSTER_MIRROR_H
#define QUAY_CLUSTER_MIRROR_H

#include <stdbool.h>

struct member;
struct map_change;

void mirror_change(struct member *member, const struct map_change *change);
/* drop_strays: also delete local objects the map does not have (only
 * once caught up: before that, the map may not have them *yet*). */
void mirror_all(struct member *member, bool drop_strays);
/* At the member's start: the queues our journal recovered wait, paused,
 * until we caught up with the map (mirror.c). */
void mirror_hold_recovered(struct member *member);
/* The member stops before that: what they hold is answered (nacked). */
void mirror_release_held(struct member *member);
/* Every member tick: the queues held at the sync that an in-sync backup
 * may yet take (CONTROLLER_RESTART_WAIT_MS) are decided again. */
void mirror_tick(struct member *member);
/* The broker's users table becomes the map's, once the map has users
 * (mirror_users.c); before that, mirror_users_bootstrap proposes ours. */
void mirror_users(struct member *member);
/* The broker's limits (broker/limits.h) become a copy of the map's. */
void mirror_limits(struct member *member);
void mirror_users_bootstrap(struct member *member);

#endif
