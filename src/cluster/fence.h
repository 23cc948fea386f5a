/*
 * fence.h: the rules that keep a deposed primary from acting, as pure
 * functions of this broker's map (no I/O, no clock): the epoch fences a
 * forward and a replication stream meet (member.c calls them), and the
 * lease a primary needs to confirm (node_heartbeat.c). tests/sim's data
 * path calls the same functions, so what it checks is quay's rule.
 */
#ifndef QUAY_CLUSTER_FENCE_H
#define QUAY_CLUSTER_FENCE_H

#include <stdbool.h>
#include <stdint.h>

#include "cluster/map.h"

/* A forward at epoch for q (as this broker's map has it, or NULL) may be
 * enqueued here: this broker is its primary and the epoch is current. */
bool fence_forward_fresh(const struct map_queue *q, uint32_t self_id, uint64_t epoch);

/* A forward naming an older epoch of a queue whose primary is now another
 * broker (the sender's map lags ours): relayed rather than refused. */
bool fence_forward_relays(const struct map_queue *q, uint32_t self_id, uint64_t epoch);

/* A forward at epoch for a queue this map no longer has (q NULL), at a
 * version the map has reached: the queue was deleted since the sender
 * routed to it. As on one broker, the publish was routed to a queue that
 * then went: confirmed, and gone. */
bool fence_forward_gone(const struct cluster_map *map, const struct map_queue *q,
                        uint64_t epoch);

/* A forward (or a stream) names an epoch this map has not reached: q's
 * epoch is older, or q is unknown and the epoch is past the map's version
 * (a queue's epoch starts at the map version of its declare): we lag. */
bool fence_map_behind(const struct cluster_map *map, const struct map_queue *q, uint64_t epoch);

/* Whether this broker keeps a copy of q (its stand-in's replica, and the
 * replica's log): while its map names it one of q's backups, or while the
 * copy is fed by a stream its primary started under a newer map than ours
 * (map_version: ours; stream_version: the primary's as it started the
 * stream, which a catch-up's reset names; 0: unknown, a primary from
 * before). The primary acts on a change as soon as it applied it, and
 * ours may lag: a new backup takes its catch-up before its map names it.
 * Otherwise nobody needs the copy: the map promotes only a backup it names
 * in sync, and one it names again is caught up from a reset. So it goes,
 * memory and log (proxy_stub_update), and what its primary still streams
 * (its map lags ours) is refused. Without the stream's version, a catch-up
 * that came before our map named us was dropped by the next change we
 * applied that did not name us yet, and the primary, its probe answered,
 * had our empty copy put in sync. */
bool fence_replica_kept(const struct map_queue *q, uint32_t self_id, uint64_t map_version,
                        uint64_t stream_version);

/* A backup takes a replication stream (enqueue, settle, reset) for q at
 * epoch into its copy (or, for a reset, the copy it starts anew), whose
 * stream the primary started at stream_version: it keeps a copy of q
 * (fence_replica_kept: not q's primary) and the epoch is not older than
 * its map's (the primary may have applied a promotion ours has not). */
bool fence_replica_accepts(const struct map_queue *q, uint32_t self_id, uint64_t epoch,
                           uint64_t map_version, uint64_t stream_version);

/* What a replica does with a message its primary streams (replica_push),
 * given the newest seq it took (0 after a reset) and the epoch of the
 * stream it took it from. A newer seq is taken. An older one is a resend
 * of what it has (or had: consumed since), but only from the same epoch:
 * under another, the seqs collide (a backup promoted after a reset, or
 * with an empty queue and no log, numbers from below what this replica
 * holds; one that restarted without its log too), so acking it would
 * confirm a message that is not here. Refused: the primary's stream fails
 * and the replica is caught up again from a reset. */
enum fence_push { FENCE_PUSH_TAKE, FENCE_PUSH_HAVE, FENCE_PUSH_REFUSE };
enum fence_push fence_replica_push(uint64_t last_seq, uint64_t last_epoch, uint64_t seq,
                                   uint64_t epoch);

/* Whether a backup's stream lost step with it: the backup's incarnation
 * as the primary's map had it when the stream last followed the map
 * (known; 0: not yet known) and as it has it now. A new process holds none
 * of the replica the stream fed (a restart recreates replica logs), so the
 * stream is caught up again from a reset, whatever its acks said: the new
 * process takes the pushes of a primary that has not heard of the restart
 * (newer seqs than the nothing it holds), so the stream looked in step and
 * its primary asked the map to put it back in sync, empty (tests/sim seed
 * 281609694: then a move promoted it). A first report (0 before) is not a
 * restart, as broker.incarnation has it. */
bool fence_backup_restarted(uint32_t known, uint32_t now);

/* A primary's stream to one backup and its confirms: in_sync, as the
 * primary's map says; join_asked, the primary asked the map to put it in
 * sync (it had caught up) and the map has not shown it yet under this
 * epoch; live, it has everything sent so far, or will in order. It gates
 * confirms (fence_stream_gates) while the map may promote it: in sync, or
 * its join asked. A join asked may land whatever happened to the stream
 * since (a request goes on its way, and is sent again, until applied), so
 * a stream that fails after its join was asked still gates, and stays in
 * the set asked for (fence_stream_wanted): its join must land before it
 * can leave, as any in-sync backup leaves, by a map change the confirms
 * wait for. (Without this the primary confirmed without it the moment it
 * failed; the join landed after, and the controller, cut off from the
 * primary, promoted it without those messages: tests/sim seed 4169.) The
 * join ends with the epoch (a promotion: set_in_sync is a compare-and-set
 * on it) and with the backup's process (broker.incarnation leaves a
 * request for the old one out). */
bool fence_stream_gates(bool in_sync, bool join_asked);
/* Whether the in-sync set the primary asks for names it: gating and live,
 * or its join asked (above); an in-sync stream that failed is left out. */
bool fence_stream_wanted(bool in_sync, bool join_asked, bool live);

/* The lease: when it ends, given when each of the map's other brokers
 * was last heard (heard[n], 0: never; sorted here, newest first). It
 * lasts lease_ms past the moment the majority-th broker (counting
 * ourselves) was last heard; UINT64_MAX when we are not in the map or
 * alone in it (nobody else could confirm); 0 when a majority was never
 * heard. */
uint64_t fence_lease_until(uint64_t *heard, uint32_t n, bool member, uint64_t lease_ms);

/* Partition handling pause-minority (--partition-handling): a broker cut
 * off from the majority can confirm nothing (the lease) and reach no
 * primary on the other side, so its clients are better off on a broker of
 * the majority. One step a tick: lease_fresh as cluster_node_lease_fresh
 * says; serving: caught up with the map, in a map of more than itself (a
 * broker still catching up after a start is not cut off, only not there
 * yet). Paused once it has been serving with a stale lease for
 * pause_after_ms; back the moment the lease is fresh. */
struct fence_pause {
    uint64_t stale_since_ms;  /* 0: not counting */
    bool paused;
};
void fence_pause_step(struct fence_pause *p, bool lease_fresh, bool serving, uint64_t now_ms,
                      uint64_t pause_after_ms);

/* What a peer's heartbeats count for the lease: a heartbeat counts once
 * our map has applied the version its sender had when it sent it. A
 * primary that was cut off and deposed meanwhile hears the majority again
 * before Raft has brought its map up to date; their heartbeats name a map
 * that has moved the queue away, so they do not renew its lease, and by
 * the time its map reaches theirs it has applied its own deposition. (Without
 * this it confirmed, late, beside its successor: tests/sim seed 888.) A
 * heartbeat whose map is ahead waits (the oldest such one: under steady
 * map changes a newer one would always be ahead too); one from a sender
 * that does not say its version counts at once. Versions are compared by
 * their low 32 bits, as heartbeats carry them (serial arithmetic).
 *
 * A heartbeat from a sender still catching up after a start counts for
 * nothing: the version it names is what it has applied, not what its log
 * holds, so it can name a map from before a deposition its log already
 * took part in committing. (Without this, a deposed primary cut off for a
 * long time took its lease, when the cut healed, from brokers restarted
 * meanwhile that had not reapplied their logs yet, and confirmed beside
 * its successor: tests/sim seed 756410383.) */
struct fence_heard {
    uint64_t heard_ms;        /* the newest heartbeat that counts (0: none) */
    uint64_t waiting_ms;      /* a heartbeat that waits for our map (0: none) */
    uint32_t waiting_version; /* ... its sender's version */
};
void fence_heard_note(struct fence_heard *h, uint64_t now_ms, bool has_version, uint32_t version,
                      bool catching_up, uint64_t our_version);
/* heard_ms, once the heartbeat that waits counts if our map reached it. */
uint64_t fence_heard_ms(struct fence_heard *h, uint64_t our_version);

#endif
