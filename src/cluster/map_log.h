/*
 * map_log.h: one log line per change of a queue's placement in the
 * cluster map, with its reason, as every broker applies the command (so
 * any broker's log tells the history):
 *
 *   map_epoch=812 event=primary_moved vhost=/ queue=orders from=a to=b
 *   reason=failover queue_epoch=4 primary=b backups=c in_sync=c cluster map change
 *
 * events: primary_moved (from, to), move_started (to), move_ended (to:
 * the move's target, when it ends without a new primary: cancelled, or a
 * backup move done), backup_added, backup_removed, backup_in_sync,
 * backup_out_of_sync (broker), available, unavailable. reason (enum
 * map_reason): a primary moved by a planned handover says why its move
 * started (move, rebalance, drain); any other new primary is a failover
 * (or forget); backups say the command's reason (failover, return,
 * repair, move, rebalance, drain, policy, forget, sync), none for a
 * command that carries none (one written before reasons were). Every
 * line ends with the queue's placement after the change. Names are
 * single words: ' ', '%' and control bytes are %XX. With --log-format
 * json the key=value words are the object's members.
 *
 * A queue's declaration and deletion stay debug lines (node.c): a broker
 * with short-lived queues would log little else.
 */
#ifndef QUAY_CLUSTER_MAP_LOG_H
#define QUAY_CLUSTER_MAP_LOG_H

#include <stddef.h>

#include "lib/types.h"

struct cluster_map;
struct map_change;
struct map_events;

/* A name as one word of a key=value field: '%', ' ' and control bytes
 * become %XX. out holds size bytes (3 * the name's + 1 is enough). */
void map_log_word(struct bytes name, char *out, size_t size);

/* After change was applied to map (OK): its lines, if it moved anything;
 * and into events (if not NULL) those of map_events.h (primary_moved,
 * move_started, move_ended, available, unavailable), with the same reasons. */
void map_log_change(const struct cluster_map *map, const struct map_change *change,
                    struct map_events *events);

#endif
