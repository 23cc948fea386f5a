/*
 * queue.h: a queue: its ready messages, its consumers, and dispatch, with
 * RabbitMQ's queue arguments: TTLs, length limits and overflow modes,
 * dead-lettering, priorities, single active consumer, consumer priorities
 * and x-expires.
 *
 * Ready messages sit in a ring (a deque of 24-byte entries) so push,
 * pop and requeue-at-head are O(1) without per-message allocation. A
 * priority queue has one ring per priority level.
 * Messages handed to a consumer leave the ring; the consumer's owner (a
 * channel's delivery record) holds them until ack, reject or requeue.
 *
 * Consumers are generic: a struct consumer carries ops that say whether
 * it can take a message now and how to deliver one. A client channel
 * implements them; the cluster's proxy links will implement them too.
 * Dispatch is round-robin among the consumers that can take a message.
 *
 * De-duplication (x-quay-dedup-window, quay's own argument): a queue with
 * a window remembers the message-id of everything it enqueued in the last
 * window ms (broker/dedup.h); a publish of an id it remembers is not
 * enqueued again but is confirmed as if it had been, so a publisher that
 * resends its unconfirmed messages (after a failover) makes no duplicates.
 *
 * Memory: a queue is owned by its vhost's table until deleted; deliveries
 * that still point at it hold a reference (queue_ref), so a deleted queue
 * stays allocated, marked deleted, until the last one is settled.
 */
#ifndef QUAY_BROKER_QUEUE_H
#define QUAY_BROKER_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "lib/types.h"
#include "broker/exchange.h"
#include "broker/flow.h"
#include "broker/queue_args.h"
#include "broker/rates.h"
#include "lib/list.h"

struct journal_queue;
struct message;
struct queue;
struct consumer;
struct dedup;
struct vhost;

struct queue_entry {
    union {
        struct message *message;  /* holds one reference (not paged) */
        uint64_t paged_body_size; /* paged: the body lives only in the journal */
    };
    uint64_t seq : 62;            /* publish order in this queue */
    uint64_t redelivered : 1;     /* delivered before (and not acked) */
    uint64_t paged : 1;           /* see paged_body_size */
    uint64_t expires_at_ms;       /* loop time; 0 = never */
};
_Static_assert(sizeof(struct queue_entry) == 24, "queue entries stay three words");

struct queue_ring {
    struct queue_entry *entries;  /* owned, cap entries */
    uint32_t head;
    uint32_t count;
    uint32_t cap;                 /* a power of two, or 0 */
};

struct consumer_ops {
    /* Can this consumer take one more message right now (credit, output
     * space, flow)? */
    bool (*can_take)(struct consumer *consumer);
    /* Takes ownership of the entry's message reference. */
    void (*deliver)(struct consumer *consumer, struct queue_entry entry);
    /* The broker cancels the consumer (queue deleted): notify the client.
     * The consumer is already detached from its queue. */
    void (*cancelled)(struct consumer *consumer);
    /* A stand-in's primary accepted (200) or refused (its code and text,
     * e.g. 403 exclusive use) the consumer's upstream consumer; only for
     * consumers whose owner waits (proxy_consume_waits). */
    void (*attached)(struct consumer *consumer, uint16_t reply_code, struct bytes reply_text);
};

/* A queue whose primary is another broker (cluster/proxy.c) is a local
 * stand-in: it holds bindings (so routing is local) and local consumers,
 * but no messages of its own. These ops replace its storage. Deliveries
 * the proxy hands to local consumers carry a seq the proxy chose (it names
 * the upstream delivery), which comes back here on settle. */
struct confirm_sink;

/* One message forwarded to the primaries of stand-ins (remote_ops->forward). */
struct queue_forward {
    struct message *message;   /* borrowed: the forward takes its own references */
    struct confirm_sink *sink; /* NULL: nobody waits for the primaries' answers */
    uint64_t seq;              /* the publish's number on the sink's channel */
    bool dead_lettered;        /* a queue dead-lettered it: the target must not hold
                                * it back as a duplicate (queue_publish_dead_lettered) */
    uint32_t answers;          /* out: confirm_sink_answer calls sink will get for seq */
    uint32_t unavailable;      /* out: stand-ins whose queue has no primary now */
    bool flow;                 /* out: see publish_wait.flow */
};

/* A request a channel made at a stand-in's primary (get, query): the
 * stand-in's implementation owns it until its done callback ran, or the
 * asker cancels it (op_cancel). */
struct queue_remote_op;
struct queue_entry;

/* basic.get at the primary: reply_code 200 with the entry (NULL:
 * get-empty), the primary's refusal (code and text, as sent: with its
 * "NAME - " prefix), or 0 when it could not be asked. The entry's message
 * reference passes to done. */
typedef void (*queue_remote_get_fn)(void *ctx, struct queue *queue, uint16_t reply_code,
                                    struct bytes reply_text, struct queue_entry *entry,
                                    uint32_t message_count);
/* What a query's answer counts (all 0 unless its reply_code is 200). */
struct queue_remote_counts {
    uint32_t messages;   /* ready: declare-ok's and purge-ok's message_count */
    uint32_t consumers;
    uint32_t unacked;    /* queue.quay-counts only */
    bool primary;        /* queue.quay-counts: the broker asked is the queue's primary */
    bool down;           /* queue.quay-counts: which cannot serve it (queue->unreadable) */
};
/* queue.declare (passive), queue.purge or queue.quay-counts at the
 * primary: reply_code 200 with its counts, the primary's refusal (code and
 * text, as sent: with its "NAME - " prefix), or 0 when it could not be
 * asked. */
typedef void (*queue_remote_query_fn)(void *ctx, struct queue *queue, uint16_t reply_code,
                                      struct bytes reply_text,
                                      const struct queue_remote_counts *counts);

struct queue_remote_ops {
    /* Publishes routed to queues[0..count), stand-ins that all share these
     * ops: forwarded to their primaries, one copy of the message per
     * primary broker. Adds to fwd->answers what the sink will be told
     * (confirm_sink_answer, once per forward sent or held) and to
     * fwd->unavailable the queues it could not forward (no primary now:
     * the publisher is nacked). */
    void (*forward)(struct queue *const *queues, uint32_t count, struct queue_forward *fwd);
    /* A local consumer was added or removed: open or close its upstream
     * consumer on the primary. */
    void (*consumer_added)(struct queue *queue, struct consumer *consumer);
    void (*consumer_removed)(struct queue *queue, struct consumer *consumer);
    /* A local consumer's credit changed (basic.qos): its upstream consumer
     * gets the new one. */
    void (*consumer_credit)(struct queue *queue, struct consumer *consumer);
    /* Settling a delivery: ack it upstream, reject it there (dead-letter
     * or drop at the primary), or release it (requeue at the primary). */
    void (*ack)(struct queue *queue, uint64_t seq);
    void (*reject)(struct queue *queue, uint64_t seq);
    void (*release)(struct queue *queue, uint64_t seq);
    /* Local consumers may take messages again (output drained, acks). */
    void (*dispatch)(struct queue *queue);
    /* The stand-in is being freed. */
    void (*free)(struct queue *queue);
    /* The broker's journal closes (a shutdown): any log kept for the
     * stand-in is gone and must not be touched again. */
    void (*journal_closing)(struct queue *queue);
    /* Whether a consumer added now will have its upstream consume
     * answered (the primary is reachable): then consumer->ops->attached
     * reports the answer, and the channel waits for it before consume-ok.
     * *available false: the queue is unavailable (its primary is down). */
    bool (*consume_waits)(struct queue *queue, bool *available);
    /* Requests at the primary on behalf of a channel, answered in order.
     * The asker holds a reference on the queue until done ran (or it
     * cancels: done then never runs). NULL: the primary cannot be asked. */
    struct queue_remote_op *(*get)(struct queue *queue, queue_remote_get_fn done, void *ctx);
    /* method_id: METHOD_QUEUE_DECLARE (passive: the counts a client
     * sees), METHOD_QUEUE_PURGE, or METHOD_QUEUE_QUAY_COUNTS (the counts
     * the management API shows, unacked ones too; peers only). */
    struct queue_remote_op *(*query)(struct queue *queue, uint32_t method_id,
                                     queue_remote_query_fn done, void *ctx);
    void (*op_cancel)(struct queue_remote_op *op);
    /* The incarnation (map epoch) of the queue the stand-in stands for. */
    uint64_t (*epoch)(const struct queue *queue);
};

/* What a publisher's confirm waits for, gathered while its publish is
 * routed (channel.c): the journal's fsync and the answers of other brokers
 * (primaries of stand-ins, backups of our queues). */
struct publish_wait {
    uint64_t ticket;           /* journal sync ticket, max over the queues */
    struct confirm_sink *sink; /* where other brokers' answers go; NULL: nobody waits */
    uint64_t seq;              /* the publish's number on its channel */
    uint32_t remote;           /* answers owed to the sink */
    bool from_peer;            /* a peer's forward (queue_hold_publishes lets it in) */
    /* A peer's forward the queue records (broker/origin.h): its origin, sent
     * to the backups with the message so their marks match; stream 0: none. */
    uint64_t origin_stream, origin_seq;
    /* A peer's forward sent again (its answer was lost with a primary that
     * went): that primary may have delivered it, so the copy enqueued here
     * is flagged redelivered, as a promoted backup's replica is. */
    bool maybe_delivered;
    bool flow;                 /* out: what this broker sent other brokers and they have
                                * not answered is over its bound (forwards to primaries,
                                * replication to backups): the publisher waits
                                * (connection_flow) */
};

/* A queue whose broker is its primary and that has backups
 * (cluster/replica.c): every change is streamed to them. */
struct queue_replication_ops {
    /* Message seq entered the queue; the publisher's confirm (wait, may be
     * NULL) also waits for the backups that will answer (and wait->flow
     * says whether the publisher should wait before more). */
    void (*published)(struct queue *queue, uint64_t seq, struct message *message,
                      struct publish_wait *wait);
    /* Message seq left the queue for good (ack, reject, expiry, overflow,
     * purge); persistent: it was a persistent one. */
    void (*removed)(struct queue *queue, uint64_t seq, bool persistent);
    /* Every message of seqs first..last left the queue for good (a purge:
     * each of those seqs is a ready message, of either delivery mode). */
    void (*removed_run)(struct queue *queue, uint64_t first, uint64_t last);
    /* Message seq, still in the queue, is about to be kept on disk only
     * (its memory goes): nothing may hold on to the pointer unreferenced. */
    void (*paged)(struct queue *queue, uint64_t seq);
    /* The queue is deleted: answer what waits, stop streaming, free the
     * state (queue->replication and replication_ops become NULL). */
    void (*detach)(struct queue *queue);
    /* A held-back duplicate's confirm (wait) waits until every message up
     * to seq is on the backups, as the original's did. */
    void (*wait_for)(struct queue *queue, uint64_t seq, struct publish_wait *wait);
};

struct consumer {
    const struct consumer_ops *ops;   /* borrowed, static */
    struct queue *queue;              /* holds a queue reference while attached */
    struct list_node queue_link;      /* in queue->consumers */
    struct list_node owner_link;      /* in the owner's list (the channel) */
    void *owner;                      /* borrowed: the channel */
    struct bytes tag;                 /* owned copy */
    bool no_ack;
    bool exclusive;
    int32_t priority;
    uint32_t prefetch_count;          /* 0 = unlimited */
    uint32_t unacked_count;
};

/* A publish a paused queue holds (queue_pause): its publisher's confirm
 * owes one answer (to sink, for seq) until it is enqueued or sent on. */
struct queue_held_publish {
    struct message *message;      /* one reference */
    struct confirm_sink *sink;    /* one reference, or NULL: nobody waits */
    uint64_t seq;
    bool dead_lettered;
    /* A forward a stand-in held (proxy_stub_take_held): its origin
     * (origin.h; stream 0: none, or not known) */
    uint64_t origin_stream, origin_seq;
    /* A resend a paused queue held (publish_wait.maybe_delivered): flagged
     * redelivered wherever it goes in. */
    bool maybe_delivered;
};

/* A settle of one of a paused queue's deliveries, held (queue_pause). */
enum queue_settle_kind { QUEUE_SETTLE_ACK, QUEUE_SETTLE_REJECT, QUEUE_SETTLE_REQUEUE };
struct queue_held_settle {
    enum queue_settle_kind kind;
    struct queue_entry entry;     /* seq; message: one reference (expiry for a requeue) */
};

/* A basic.get that waits while its queue stands still (queue_pause), the
 * asking channel's: retry is called once the pause ends, the queue resumed
 * or handed over, and the channel asks again where the queue then is. */
struct queue_get_wait {
    struct list_node link; /* in queue_pause.gets, or a list being retried */
    void (*retry)(struct queue_get_wait *wait);
};

struct queue_pause {
    bool standing;                   /* queue_pause; else queue_hold_publishes */
    struct list_node gets;           /* struct queue_get_wait.link, in arrival order */
    struct queue_held_publish *held; /* owned, in arrival order */
    uint32_t count, cap;
    struct queue_held_settle *settles; /* owned, in order */
    uint32_t settles_count, settles_cap;
};

/* RabbitMQ's per-queue message_stats, kept where the queue's messages are:
 * plain counters bumped on the message path (rates.h turns them into
 * rates once a second). A stand-in counts what passes through it here
 * (its local publishers, consumers and getters); its primary counts
 * everything, the stand-ins' forwards and uplinks included. */
struct queue_stats {
    uint64_t publish;        /* publishes enqueued (a stand-in: forwarded); not
                              * dead-letterings, not refused or held-back ones */
    union {
        struct {
            uint64_t deliver;        /* basic.deliver to a consumer that acks */
            uint64_t deliver_no_ack; /* basic.deliver with no-ack */
            uint64_t get;            /* basic.get-ok, to be acked */
            uint64_t get_no_ack;     /* basic.get-ok with no-ack */
        };
        uint64_t delivered[4];       /* the same, by (a get) << 1 | (no-ack) */
    };
    uint64_t redeliver;      /* of those four, ones flagged redelivered */
    uint64_t ack;            /* deliveries acked */
};

_Static_assert(offsetof(struct queue_stats, get_no_ack) ==
                   offsetof(struct queue_stats, delivered) + 3 * sizeof(uint64_t),
               "delivered[] overlays the four delivery counters");

/* The values queue_sample_rates samples, by index (rates_per_s). */
enum queue_rate {
    QUEUE_RATE_PUBLISH,
    QUEUE_RATE_DELIVER,
    QUEUE_RATE_DELIVER_NO_ACK,
    QUEUE_RATE_GET,
    QUEUE_RATE_GET_NO_ACK,
    QUEUE_RATE_REDELIVER,
    QUEUE_RATE_ACK,
    QUEUE_RATE_MESSAGES,     /* ready + unacked: a rate of change, may be negative */
    QUEUE_RATE_READY,
    QUEUE_RATE_UNACKED,
    QUEUE_RATE_COUNT
};
_Static_assert(QUEUE_RATE_COUNT <= RATES_VALUES_MAX, "a queue's samples fit struct rates");

struct queue {
    struct bind_dest as_dest;         /* first: bindings point here */
    struct vhost *vhost;              /* borrowed: the owner */
    struct bytes name;                /* owned copy */
    bool durable;
    bool exclusive;
    bool auto_delete;
    bool deleted;
    bool had_consumers;               /* auto-delete happens only after one */
    bool dispatching;                 /* re-entrancy guard */
    /* In broker->queues_all from its first vhost table until it is freed
     * (not when deleted: a walk paused on it must find its successor,
     * broker/queue_walk.h), and the order it joined in. Beside deleted,
     * which a walk reads too: one cache line a queue. */
    struct list_node all_link;
    uint64_t all_serial;
    /* GET /metrics' join with the cluster map (mgmt/metrics_cluster.c):
     * this queue's map entry, opaque here, found by name once and valid
     * while the map's objects_stamp is still cluster_entry_stamp (0:
     * none), so that a scrape of an unchanged map looks up no names. */
    const void *cluster_entry;
    uint64_t cluster_entry_stamp;
    void *exclusive_owner;            /* borrowed: the declaring connection */
    struct bytes arguments;           /* owned copy of the declare arguments */
    struct queue_args args;           /* parsed; slices borrow from arguments */
    struct queue_ring ready;          /* priority 0 (or the only level) */
    struct queue_ring *priority_rings; /* owned: levels 1..max_priority, or NULL */
    uint32_t ready_count;             /* over all levels */
    uint64_t ready_bytes;
    uint32_t unacked_count;           /* delivered, not yet settled */
    struct list_node consumers;
    uint32_t consumers_count;
    uint32_t exclusive_consumers;     /* 0 or 1 */
    struct consumer *active_consumer; /* single active consumer, or NULL */
    uv_timer_t *timer;                /* owned, lazily: TTL expiry and x-expires */
    uint64_t last_used_ms;            /* for x-expires */
    struct journal_queue *journal;    /* borrowed from the journal: durable queues */
    const struct queue_remote_ops *remote_ops; /* non-NULL: a stand-in (see above) */
    void *remote;                     /* the proxy's state for a stand-in */
    const struct queue_replication_ops *replication_ops; /* non-NULL: it has backups */
    void *replication;                /* cluster/replica.c's state */
    uint64_t paged_count;             /* ready entries whose body is only on disk */
    struct dedup *dedup;              /* owned, lazily: x-quay-dedup-window's ids, or NULL */
    struct origin_marks *origins;     /* owned, lazily: forwards taken per stream (origin.h) */
    struct queue_pause *pause;        /* owned while paused (queue_pause), else NULL */
    bool held_until_synced;           /* cluster: recovered at a start, paused until the
                                       * member caught up with the map (cluster/mirror.c) */
    /* Its content lies in a log we could not read yet (a takeover's,
     * cluster/adoption.c, which tries again): it takes and gives nothing
     * (publishes refused as unavailable, gets, consumes, declares and
     * purges 404, no dispatch) rather than serve without its messages. */
    bool unreadable;
    bool from_replica_log;            /* recovered from a backup's log (durable.h
                                       * durable_replica_log_open) */
    bool log_left;                    /* its log left to a taker (durable_abandon_log):
                                       * its definition stays in our journal */
    struct queue_flow flow;           /* its publishers' flow control (flow.h) */
    uint32_t refs;                    /* the vhost's table + deliveries + consumers */
    uint64_t next_seq;
    struct list_node owner_link;      /* in the exclusive owner's list */
    struct queue_stats stats;
    struct rates rates;               /* of stats and counts, sampled by the broker's tick */
};

/* arguments must have been accepted by queue_args_parse. */
struct queue *queue_new(struct vhost *vhost, struct bytes name, bool durable, bool exclusive,
                        bool auto_delete, struct bytes arguments);
void queue_ref(struct queue *queue);
void queue_unref(struct queue *queue);

enum queue_publish_result {
    QUEUE_PUBLISH_OK,                 /* enqueued, or forwarded to the primary */
    QUEUE_PUBLISH_REJECTED,           /* full, with x-overflow reject-publish(-dlx) */
    QUEUE_PUBLISH_DUPLICATE,          /* its message-id is in the dedup window: not
                                       * enqueued, confirmed like an OK (it waits for
                                       * the original's fsync) */
    QUEUE_PUBLISH_UNAVAILABLE,        /* a stand-in whose queue has no primary now, or
                                       * a queue whose log cannot be read (unreadable) */
};

/* Enqueue a routed message (takes a new reference) and dispatch. A
 * persistent message on a durable queue is appended to the journal; its
 * sync ticket is max'ed into wait->ticket, and backups that will answer
 * are counted in wait->remote, so the publisher's confirm can wait for
 * both. wait may be NULL. A stand-in forwards it to its primary (whose
 * answer wait->remote counts). */
enum queue_publish_result queue_publish(struct queue *queue, struct message *message,
                                        struct publish_wait *wait);
/* A dead-lettered message: like queue_publish, but never held back as a
 * duplicate (the broker moving a message is not a publisher resending it;
 * a DLX retry loop through a de-duplicating queue must not lose it),
 * though its message-id is remembered like any enqueued one. */
enum queue_publish_result queue_publish_dead_lettered(struct queue *queue,
                                                      struct message *message,
                                                      struct publish_wait *wait);

/* A peer's forward (cluster/forward.c) into a queue: its origin (stream,
 * seq; stream 0: none, broker/origin.h), whether it was sent before (a
 * resend: the primary it went to, gone or cut off before answering, may
 * have delivered it), whether the queue may record its origin as taken
 * (only where a stream's forwards arrive in order with none refused:
 * channel.c's origin_frozen), and whether it is a dead-lettering. */
struct queue_forwarded {
    uint64_t origin_stream, origin_seq;
    bool resent;
    bool record;
    bool dead_lettered;
};

/* The one way a peer's forward enters a queue, whether it comes from a link
 * channel, waited for our map to catch up (cluster/member.c), or was held
 * by the stand-in a promotion replaced (cluster/mirror.c). Into a queue of
 * ours, a forward the queue took already (its origin at or below its
 * stream's mark) is not enqueued again (QUEUE_PUBLISH_DUPLICATE: its
 * confirm waits until what the queue holds is safe), and a resend that is
 * enqueued is flagged redelivered (as a promoted backup's replica is); the
 * origin is recorded if f->record and it is no resend. A stand-in sends it
 * on (queue_publish). */
enum queue_publish_result queue_publish_forward(struct queue *queue, struct message *message,
                                                const struct queue_forwarded *f,
                                                struct publish_wait *wait);

/* A message routed to several queues at once (a publish, a dead-lettering):
 * each local queue enqueues it (queue_publish, or queue_publish_dead_lettered),
 * and the stand-ins among them forward it together, one copy per primary
 * broker. Counts the queues that refused it (reject-publish) and those
 * with no primary now. */
struct queue_publish_summary {
    uint32_t rejected;
    uint32_t unavailable;
};
void queue_publish_routed(struct queue *const *queues, uint32_t count, struct message *message,
                          struct publish_wait *wait, bool dead_lettered,
                          struct queue_publish_summary *out);
/* A promoted backup's de-duplication table (cluster/replica.c): the queue
 * takes it over (ownership moves; table may be NULL). Before queue_adopt
 * of the replica's messages. */
void queue_adopt_dedup(struct queue *queue, struct dedup *table);

/* A peer's forward with origin (stream, seq) (broker/origin.h): was it taken
 * here already? Then its confirm (wait, may be NULL) waits as a new
 * publish's would: for the journal's fsync of what the queue wrote so far
 * and for the backups to hold what it sent them so far. */
bool queue_origin_duplicate(struct queue *queue, uint64_t stream, uint64_t seq,
                            struct publish_wait *wait);
/* Records a forward taken here (ticket: its journal sync ticket, or 0). */
void queue_origin_record(struct queue *queue, uint64_t stream, uint64_t seq, uint64_t ticket);
/* A promoted replica's marks (owned: the queue takes them; NULL is fine). */
void queue_adopt_origins(struct queue *queue, struct origin_marks *marks);
/* A promoted backup's copy of the queue (cluster/replica.c): its
 * messages under the old primary's seqs (the other backups hold them
 * under the same ones, so the stream goes on where it was), marked
 * redelivered as the old primary may have delivered them. */
struct queue_adoption {
    struct queue_ring ring;  /* owned: seq order from slot head, after every seq the
                              * queue holds, no holes; each entry holds a reference */
    uint64_t bytes;          /* their body bytes */
    uint32_t persistent;     /* how many are persistent (journaled again here) */
    uint32_t paged;          /* how many are paged: their body in the queue's log only */
};
/* Takes the adoption's ring (and leaves it empty): enqueued at the tail
 * without limits or TTL checks, persistent ones journaled. A fresh queue
 * without priorities takes the ring itself, O(1) however long it is.
 * Does not dispatch. */
void queue_adopt(struct queue *queue, struct queue_adoption *adoption);
/* The inverse, on a planned handover's old primary that stays a backup
 * (cluster/replica.c): the queue hands out its ready messages (each entry
 * keeps its reference, a paged one its place in the log), its log and its
 * de-duplication table, and is left empty and without a log, so deleting
 * it then touches nothing on disk. Its deliveries stay the channels'. */
struct journal_queue;
struct queue_surrender {
    struct queue_entry *entries; /* owned, in seq order */
    uint32_t count;
    struct journal_queue *log;   /* or NULL */
    struct dedup *dedup;         /* or NULL */
    struct origin_marks *origins; /* or NULL */
};
void queue_surrender(struct queue *queue, struct queue_surrender *out);
/* Recovery: puts a message read back from the journal at the tail. */
void queue_recover_message(struct queue *queue, struct message *message, uint64_t seq,
                           bool delivered);
/* Put a delivered, unsettled message back where it was (by its seq, as
 * RabbitMQ does), marked redelivered. Takes the message reference. Does
 * not dispatch: callers requeue a batch, then dispatch once. */
void queue_requeue(struct queue *queue, struct queue_entry entry);
/* A delivered message is acked: the queue (and its journal) forget it.
 * The caller keeps its reference. */
void queue_settle(struct queue *queue, uint64_t seq, const struct message *message);
/* A delivered message was rejected without requeue: dead-letter it if the
 * queue has a dead-letter exchange. Takes the message reference. */
void queue_reject(struct queue *queue, uint64_t seq, struct message *message);
/* Drops the in-memory copy of up to `wanted` bytes of ready persistent
 * messages, newest first (they are in the journal; queue_take reads them
 * back). Returns the bytes released. Only durable queues page. */
uint64_t queue_page_out(struct queue *queue, uint64_t wanted);

/* Whether a persistent message entering the queue now is kept on disk
 * only (x-queue-mode=lazy, or memory past the paging mark): the primary's
 * rule (with a journal), and its backups' (cluster/replica.h). */
bool queue_pages(const struct queue *queue);
/* A paged-out ready message read back from the journal, for a backup's
 * catch-up: a new reference (the entry stays paged), or NULL if the
 * journal cannot produce it (logged). */
struct message *queue_read_paged(struct queue *queue, uint64_t seq);

/* A queue handed over to another broker (cluster/handover.c) stands
 * still for the moment of the switch, so that the new primary can take it
 * as it is: publishes are held in arrival order, not enqueued (their
 * confirms wait); settles of its deliveries (ack, reject, requeue) are
 * held in order, not applied; nothing is dispatched and basic.get waits
 * (queue_hold_get). Expiry goes on. A real queue only. */
void queue_pause(struct queue *queue);
/* A basic.get on a paused queue waits (the caller holds its channel's
 * input); its retry runs when the pause ends. */
void queue_hold_get(struct queue *queue, struct queue_get_wait *wait);
/* The switch happened (cluster/mirror.c): the waiting gets move to *out
 * (an initialised list), to be retried with queue_retry_gets once the
 * queue's stand-in is in place. Before queue_take_held_settles. */
void queue_take_held_gets(struct queue *queue, struct list_node *out);
void queue_retry_gets(struct list_node *gets);
/* A queue just handed over to us (cluster/mirror.c) while our own
 * forwards to its old primary are not all answered yet: our clients'
 * publishes (and the publishes held for the old primary) wait behind
 * them, held, so that each publisher's messages stay in order; peers'
 * forwards come in (they wait for their own). queue_resume ends it. */
void queue_hold_publishes(struct queue *queue);
/* The switch did not happen: the held settles are applied and the held
 * publishes enqueued (their publishers answered), in order; dispatch
 * resumes. */
void queue_resume(struct queue *queue);
/* As queue_resume, but the held publishes are refused (their publishers
 * nacked: they send them again), not enqueued. */
void queue_resume_refusing(struct queue *queue);
/* The switch happened: the held publishes, for their new queue (the
 * caller publishes each and answers its sink: confirm_sink_routed), and
 * the held settles, for the new primary (the caller passes them on and
 * frees their messages). The queue is no longer paused. Each returns how
 * many; *out is malloc'ed. Publishes first. */
uint32_t queue_take_held(struct queue *queue, struct queue_held_publish **out);
uint32_t queue_take_held_settles(struct queue *queue, struct queue_held_settle **out);
/* Held settles nobody passes on (a failover overtook the handover): their
 * messages released, the array freed. */
void queue_held_settles_free(struct queue_held_settle *settles, uint32_t count);
static inline bool queue_paused(const struct queue *queue)
{
    return queue->pause != NULL && queue->pause->standing;
}

/* A planned handover (cluster/handover.c), on the new primary: the
 * messages the old primary had delivered and that are not settled yet
 * (seqs ascending) leave the ready rings, resident and counted unacked, as
 * out[k] for seqs[k] (found[k] false: not there, settled meanwhile); a
 * delivery of the caller's now holds each. Then the ready ones keep the
 * old primary's flags: redelivered exactly for seqs[0..n) (ascending). */
void queue_take_delivered(struct queue *queue, const uint64_t *seqs, uint32_t n,
                          struct queue_entry *out, bool *found);
void queue_set_redelivered(struct queue *queue, const uint64_t *seqs, uint32_t n);
/* On the old primary: the seqs of its ready messages marked redelivered,
 * ascending (*out malloc'ed, NULL if none); and whether seq is ready
 * (requeued, say, after the new primary was told it was delivered). */
uint32_t queue_redelivered_seqs(struct queue *queue, uint64_t **out);
bool queue_holds_ready(struct queue *queue, uint64_t seq);

/* The queue was used (declare, get, consume): postpones x-expires. */
void queue_touch(struct queue *queue);
/* Takes the head for basic.get; returns false if empty. */
bool queue_take(struct queue *queue, struct queue_entry *out);
/* Drops every ready message; returns how many. */
uint32_t queue_purge(struct queue *queue);
/* Delivers to consumers that can take messages, until none can. */
void queue_dispatch(struct queue *queue);

void queue_consumer_add(struct queue *queue, struct consumer *consumer);
void queue_consumer_remove(struct queue *queue, struct consumer *consumer);
/* The consumer may take more (or fewer) messages than before (a new
 * basic.qos on its channel): dispatches, and tells a stand-in's primary. */
void queue_consumer_credit_changed(struct queue *queue, struct consumer *consumer);
/* Marks the queue deleted: cancels consumers (ops->cancelled), drops ready
 * messages, unbinds. Returns the number of ready messages dropped. The
 * vhost removes it from its table and drops its reference. */
uint32_t queue_delete(struct queue *queue);

/* The broker's once-a-second sample of stats and counts (rates.h), while
 * the queue is on its active list; totals (enum broker_totals_rate) take
 * the change of its counts since its newest sample. */
void queue_sample_rates(struct queue *queue, const struct rates_clock *clock, uint32_t *totals);
/* Puts the queue on its broker's active list (rates.h); a deleted queue
 * stays off. */
RATES_COLD void queue_rates_join(struct queue *queue);
/* Whoever changes a queue's stats or counts calls this in the same call
 * (before or after the change: no tick comes between), so the next round
 * samples it. The message path's cost: one load and a branch. */
static inline void queue_rates_moved(struct queue *queue)
{
    if (RATES_UNLISTED(&queue->rates))
        queue_rates_join(queue);
}

static inline bool queue_is_remote(const struct queue *queue)
{
    return queue->remote_ops != NULL;
}

static inline uint32_t queue_ready_count(const struct queue *queue)
{
    return queue->ready_count;
}

#endif
