/*
 * proxy.h: queues whose primary is another broker (DESIGN §4).
 *
 * A stand-in is a struct queue with remote ops (queue.h): it is bound like
 * any queue, so routing stays local, and local clients consume from it.
 *
 *  - Publishes routed to it are forwarded to the primary as
 *    basic.quay-forward on a confirm channel per (peer, vhost); the
 *    publisher's confirm waits for the primary's (confirm_sink), and a
 *    forward that cannot be sent or is lost with the link is nacked.
 *  - Each local consumer has its own upstream consumer on the primary, on
 *    its own link channel (an "uplink"), with the local consumer's credit
 *    as its prefetch, and its exclusive flag and priority: the primary
 *    decides exclusivity, priorities and single-active-consumer for
 *    consumers of every broker alike. Upstream deliveries go straight to
 *    the local consumer (or wait in the uplink while it cannot take one:
 *    at most its credit). The delivery's seq names the upstream delivery
 *    (uplink id << 40 | upstream tag), so the local client's ack, reject
 *    or requeue goes upstream only once it happened here; requeues and a
 *    cancelled consumer's waiting messages are released upstream at once.
 *  - basic.get goes upstream on a getter uplink; the local channel waits.
 *
 * Memory: the proxy state of a stand-in (struct proxy_stub) is owned by
 * the queue (queue->remote) and freed with it; uplinks are owned by their
 * stub until their upstream deliveries are all settled; forwarders by
 * their peer.
 */
#ifndef QUAY_CLUSTER_PROXY_H
#define QUAY_CLUSTER_PROXY_H

#include <stdbool.h>
#include <stdint.h>

#include "lib/types.h"
#include "broker/queue.h"

struct map_queue;
struct member;
struct member_peer;
struct queue;
struct queue_entry;
struct vhost;

/* Credit of an upstream consumer whose local consumer has no limit. */
#define PROXY_CREDIT_UNLIMITED 256

/* A stand-in for the map's queue (one reference; the caller inserts it). */
struct queue *proxy_stub_new(struct member *member, struct vhost *vhost,
                             const struct map_queue *mq);
/* The map changed the queue (primary, epoch, availability, backups: a
 * copy the map no longer needs here goes, fence_replica_kept). */
void proxy_stub_update(struct queue *queue, const struct map_queue *mq, bool planned);
/* A planned handover made our queue this stand-in: its consumers go on,
 * attached upstream to the new primary (no consume-ok is owed: they were
 * consuming already). */
struct consumer;
/* ... and what it had delivered: every delivery of old (the real queue it
 * replaces) now settles through the stand-in to the new primary, on the
 * relay channel by the tag the notice gave it (handover.h), and so do the
 * settles the paused queue held. Takes relay's channel and seqs and the
 * settles' messages. */
struct handover_relay;
struct queue_held_settle;
void proxy_stub_relay(struct queue *queue, struct queue *old, struct handover_relay *relay,
                      struct queue_held_settle *settles, uint32_t settles_count);
void proxy_stub_adopt_consumers(struct queue *queue, struct consumer **consumers, uint32_t count);

/* Whether a consumer added to this stand-in now will have its upstream
 * consume answered (the primary is reachable): then consumer->ops->attached
 * reports the answer, and the channel waits for it before consume-ok.
 * *available false: the queue is unavailable (its primary is down). */
bool proxy_consume_waits(struct queue *queue, bool *available);

/* Sends m (no content) to peer on its replication channel for vhost (a
 * confirm channel of its own, beside the one publishes are forwarded on:
 * forward.c), in order with what was sent there. False: the peer cannot
 * be reached now. */
struct method;
struct message;
bool proxy_peer_send(struct member_peer *peer, struct bytes vhost, const struct method *m);

/* The same with a content, whose answer goes to notify(ctx, tag, ack)
 * (ack false also when the link died first); answers come in the order
 * sent. False: not sent (notify will not run). */
typedef void (*proxy_notify_fn)(void *ctx, uint64_t tag, bool ack);
bool proxy_peer_send_notify(struct member_peer *peer, struct bytes vhost, const struct method *m,
                            struct message *message, proxy_notify_fn notify, void *ctx,
                            uint64_t tag);
/* The epoch a stand-in forwards under (the queue's, in our map). */
uint64_t proxy_stub_epoch(const struct queue *queue);

/* A backup's copy of the queue, kept by its stand-in (replica.h); made if
 * create. take: the caller owns it from now (promotion). */
struct replica;
struct replica *proxy_stub_replica(struct queue *queue, bool create);
struct replica *proxy_stub_take_replica(struct queue *queue);
/* A new stand-in's replica, made elsewhere (replica_of_queue: an old
 * primary staying a backup). The stand-in owns it. */
void proxy_stub_give_replica(struct queue *queue, struct replica *replica);

/* Promotion: the publishes a stand-in holds for its primary, now ours to
 * route. Returns how many; *out is a malloc'ed array the caller frees, and
 * each entry's references (message, sink) pass to the caller. */
struct queue_held_publish;
uint32_t proxy_stub_take_held(struct queue *queue, struct queue_held_publish **out);
/* Before that, at a promotion: the forwards the stand-in sent to the old
 * primary and that are still unanswered join the held ones (the old
 * primary is dead or deposed; the stand-in is about to go). */
void proxy_stub_recall_forwards(struct queue *queue);
/* A planned promotion, instead: nothing is recalled (the old primary
 * answers every forward it got); true if some are still out, then the
 * stand-in calls handover_forwards_drained once they are answered. */
bool proxy_stub_drain(struct queue *queue);

/* The end of a loop iteration (member->release_hook): upstream deliveries
 * local clients gave back and no settle batch sent yet go to their
 * primaries. */
struct net_flush_hook;
void proxy_send_releases(struct net_flush_hook *hook);

/* Every MEMBER_TICK_MS: requests waiting for a primary's link time out;
 * idle getters go. Up to `budget` stand-ins a call, each once a tick (as
 * replication_tick_step): true once every one was visited. */
void proxy_tick_begin(struct member *member);
bool proxy_tick_step(struct member *member, uint32_t budget);

void proxy_peer_up(struct member_peer *peer);
/* The link is down or going away: nack its forwards, drop its uplinks. */
void proxy_peer_down(struct member_peer *peer);

/* Requests to the primary on behalf of a local channel (the stand-in's
 * remote_ops get and query, queue.h; the management API asks for counts
 * directly), answered in order on the stand-in's getter uplink. */
struct queue_remote_op *proxy_get(struct queue *queue, queue_remote_get_fn done, void *ctx);
struct queue_remote_op *proxy_query(struct queue *queue, uint32_t method_id,
                                    queue_remote_query_fn done, void *ctx);

/* Whether the stand-in keeps a channel to its primary for gets and
 * queries (the getter), and letting it go once it is idle: a caller that
 * asks many stand-ins once (the management API's counts) gives back what
 * it opened, so a listing does not hold a channel per queue. */
bool proxy_stub_has_getter(const struct queue *queue);
/* Whether a request would be sent to the primary now: the queue has one
 * and its link is up (else proxy_query waits up to 5 s for it). */
bool proxy_stub_reachable(const struct queue *queue);
void proxy_stub_release_getter(struct queue *queue);

/* The asker is gone: done will not run (a message that still arrives is
 * released upstream). Returns NULL when the primary cannot be reached. */
void proxy_op_cancel(struct queue_remote_op *op);

#endif
