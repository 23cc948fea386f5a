/*
 * sim_data.h: the data path over the simulated network (issue 19): what
 * sim_link.c, sim_data.c, sim_client.c and sim_data_check.c share.
 *
 * Each broker holds a copy of each queue (struct sim_copy): the queue
 * itself while its map says it is the primary (and it serves), else the
 * replica its primary streams to it. Frames travel on links (one per pair
 * of brokers, FIFO each way, with a latency drawn from the seed); a link
 * dies with everything in flight on it when the network cuts the pair
 * either way or a broker dies, and a new one starts once both ways heal.
 * The rules are quay's (replication.c, replica.c, forward.c, member.c's
 * fences: cluster/fence.h, called here as quay calls them); each function
 * below names the one it mirrors.
 */
#ifndef QUAY_SIM_DATA_H
#define QUAY_SIM_DATA_H

#include <stddef.h>

#include "cluster/replica.h"
#include "sim.h"

#define SIM_MSGS_MAX 4096          /* publishes per seed (then the publishers stop) */
#define SIM_QUEUE_MAX 24           /* a primary refuses more (flow control) */
#define SIM_HELD_CAP 96            /* a replica may hold stale ones beside */
#define SIM_PENDING_MAX 64         /* confirms waiting at one primary copy */
#define SIM_PARKED_MAX 32          /* forwards waiting for one broker's map */
#define SIM_PROMOTION_SEQ_GAP (1ull << 32) /* mirror.c's PROMOTION_SEQ_GAP */
#define SIM_LEASE_MS 1000          /* node.h's NODE_LEASE_MS */
#define SIM_LAG_MS 2000            /* replication.h's REPLICATION_LAG_MS */
#define SIM_ASK_RETRY_MS 500       /* replication.c's REPLICATION_RETRY_MS */
#define SIM_STALL_MS 5000          /* replication.c's REPLICATION_STALL_MS */
#define SIM_WAIT_MAP_MS 2000       /* member_sync_wait, a parked forward: at most this */

enum sim_frame_kind {
    SIM_F_FORWARD,   /* proxy -> primary: a publish (forward.c) */
    SIM_F_ANSWER,    /* primary -> proxy: its confirm (ok) or nack */
    SIM_F_SYNC,      /* basic.quay-sync: the receiver holds the link until its map has seq */
    SIM_F_RESET,     /* primary -> backup: a catch-up's purge, seq: the primary's map version */
    SIM_F_REPLICATE, /* primary -> backup: basic.quay-replicate {seq} */
    SIM_F_SETTLE,    /* primary -> backup: seq left the queue (a consumer acked it) */
    SIM_F_PROBE,     /* primary -> backup: the end of a catch-up, tagged seq */
    SIM_F_ACK,       /* backup -> primary: everything up to seq is here (or refused: !ok) */
    SIM_F_VERIFY,    /* primary -> backup: a promotion's digest of what it adopted, tagged seq */
};

struct sim_frame {
    uint64_t at_ms;                /* delivered then */
    uint64_t epoch, seq;           /* SYNC, RESET: seq is a map version */
    uint32_t msg, attempt;         /* FORWARD, ANSWER, REPLICATE */
    uint32_t stream;               /* REPLICATE, PROBE, VERIFY, ACK: the stream's id */
    struct replica_digest digest;  /* VERIFY (cluster/replica.h) */
    uint8_t kind, queue;
    bool ok;
};

/* One direction of a link: frames in order. */
struct sim_link {
    struct sim_frame *frames;      /* owned ring */
    uint32_t head, count, cap;
    uint32_t latency_ms;
};

struct sim_entry {
    uint64_t seq;
    uint32_t msg;
};

/* A publish whose confirm waits (replication.c's pending_confirm). */
struct sim_pending {
    uint64_t seq, at_ms;
    uint32_t msg, attempt;
    uint32_t reply_gen;            /* the proxy's link then: its answer goes on it or nowhere */
    uint8_t reply_to;              /* the proxy's index (the primary's own: a local client) */
};

enum sim_stream_state { SIM_STREAM_IDLE, SIM_STREAM_CATCHING_UP, SIM_STREAM_LIVE,
                        SIM_STREAM_FAILED };

/* A primary's stream to one backup (replication.c's replica_stream). */
struct sim_stream {
    uint32_t id;                   /* unique in the seed: answers find their stream */
    uint32_t backup_id;
    uint32_t incarnation;          /* the backup's, as the map said when last followed */
    uint8_t state;
    bool gating, join_asked;
    uint64_t acked_seq, sent_seq, catch_up_end, progress_ms;
};

/* One broker's copy of one queue. */
struct sim_copy {
    bool primary;                  /* the real queue here (replication attached) */
    bool stood_in;                 /* it was another's here once: a promotion, not a declare */
    bool journal;                  /* real here since it became so: its definition and log */
    bool recovered;                /* what a restart's journal gave back: not in step */
    bool emptied;                  /* a replica a restart emptied, not caught up since */
    bool waking;                   /* since a restart, till the sync decides it: held, as
                                    * what the journal recovered or the map's history made
                                    * (mirror.c keep_for_now, ensure_queue) */
    bool quiescing;                /* a handover waits: publishes are refused */
    bool ask;                      /* an in-sync change to submit (ask_in_sync) */
    bool restart_wait;             /* waking, an in-sync backup may yet take it (mirror.c
                                    * wait_for_backup): decided again every tick */
    uint64_t drop_epoch;           /* waking, ours in the map, no backup takes it: a
                                    * non-durable queue to delete at that epoch (0: no) */
    uint32_t hand_off_to;          /* waking, ours in the map: the in-sync backup it goes
                                    * to instead (mirror.c hand_off_after_restart) */
    uint64_t epoch, next_seq;      /* as primary */
    uint64_t last_seq, last_epoch; /* as a replica: replica_push's (fence_replica_push) */
    uint64_t stream_version;       /* as a replica: its last reset's (fence_replica_kept) */
    uint8_t from;                  /* the checker: the last stream's sender, ... */
    uint64_t from_epoch, from_seq; /* ... its epoch and the seq it last sent here */
    struct sim_entry held[SIM_HELD_CAP]; /* in seq order */
    uint32_t held_count;
    struct sim_stream streams[CLUSTER_BACKUPS_MAX];
    uint8_t streams_count;
    struct sim_pending pending[SIM_PENDING_MAX]; /* in seq order */
    uint32_t pending_count;
    uint64_t asked_ms, checked_ms;
    uint32_t asked[CLUSTER_BACKUPS_MAX];
    uint8_t asked_count;
};

_Static_assert(SIM_SERVERS <= 32, "sim_msg.restart_pending has a bit per broker");

enum sim_msg_state { SIM_MSG_WAITING, SIM_MSG_INFLIGHT, SIM_MSG_CONFIRMED };

/* A publisher's message, until a confirm comes back; then what the
 * checkers know of it. */
struct sim_msg {
    uint8_t queue, state;
    uint8_t via, to;               /* INFLIGHT: the broker it went through, and its target */
    bool consumed;                 /* a consumer acked it at a primary: it may be gone */
    uint32_t restart_pending;      /* transient, in the memory of these primaries (bit
                                    * index) that restarted: gone if one serves the queue
                                    * again (sim_data_restart_settled), kept by a backup
                                    * that takes it instead */
    bool restarted_away;           /* ... it did: gone, as promised */
    bool copies_died;              /* transient, every copy died with its process (known loss) */
    bool deleted;                  /* its queue was deleted (a non-durable one, by its
                                    * restarted primary): gone with it, as promised */
    uint32_t attempt;
    uint64_t retry_ms, confirmed_ms;
};

struct sim_parked {
    struct sim_frame f;
    uint64_t since;
    uint32_t gen;
    uint8_t from;
};

struct sim_data {
    uint64_t rng;                  /* the data path's own: the control plane's draws stay */
    struct sim_copy copies[SIM_SERVERS][SIM_QUEUES];
    struct sim_link links[SIM_SERVERS][SIM_SERVERS];
    bool up[SIM_SERVERS][SIM_SERVERS];
    uint32_t gen[SIM_SERVERS][SIM_SERVERS]; /* a new link each time it comes up */
    uint64_t net_seen;             /* sim->net_changes when the links last followed */
    uint64_t next_at;              /* the earliest frame due */
    uint32_t stream_ids;
    struct sim_parked parked[SIM_SERVERS][SIM_PARKED_MAX];
    uint32_t parked_count[SIM_SERVERS];
    uint64_t lease_until[SIM_SERVERS];
    struct sim_msg msgs[SIM_MSGS_MAX];
    uint32_t msgs_count;
    /* The checkers' memory: per queue, the newest epoch that confirmed
     * (when, by whom), and when an operator gave its messages up. */
    uint64_t confirm_epoch[SIM_QUEUES], confirm_epoch_ms[SIM_QUEUES];
    uint32_t confirm_by[SIM_QUEUES];
    uint64_t given_up_ms[SIM_QUEUES];
    uint64_t confirms, client_confirms, consumed, frames, known_losses;
    uint64_t deleted_version[SIM_QUEUES]; /* the map version of its last queue.delete */
    uint64_t deletions, deleted_msgs;
};

/* Every fourth queue's publishers send transient messages (delivery mode
 * 1): no journal keeps them, at a backup (its log) or at a primary (a
 * restart loses them, as RabbitMQ's), so a promoted backup numbers its
 * seqs from the messages it holds only (durable.c's attach_log: else from
 * its log's last one). */
static inline bool sim_data_transient(unsigned qi)
{
    return qi % 4 == 3;
}

/* Every eighth queue (transient messages too) is not durable: nothing of
 * it survives its primary's restart but what its backups hold, and a
 * restarted primary that no backup relieves deletes it (member.c's
 * mirror.c drop_after_restart, controller_restart_drops); the
 * requests declare it again. */
static inline bool sim_data_nondurable(unsigned qi)
{
    return qi % 8 == 7;
}

/* With --watch Q: what happens to queue qi's copies, printed. */
__attribute__((format(printf, 3, 4))) void sim_data_watch(struct sim *s, unsigned qi,
                                                          const char *fmt, ...);

/* sim_link.c */
void sim_link_init(struct sim *s);
void sim_link_free(struct sim *s);
bool sim_link_up(const struct sim *s, unsigned i, unsigned j);
uint32_t sim_link_gen(const struct sim *s, unsigned i, unsigned j);
/* Queues f from i to j; false (and nothing sent) if their link is down. */
bool sim_link_send(struct sim *s, unsigned i, unsigned j, struct sim_frame f);
/* After each step of simulated time: links follow the network, due frames land. */
void sim_link_step(struct sim *s, uint64_t now);
uint64_t sim_data_random_below(struct sim *s, uint64_t n);

/* sim_data.c: the primaries and their backups. */
void sim_data_follow(struct sim *s, struct sim_broker *b);
void sim_data_receive(struct sim *s, unsigned from, unsigned to, const struct sim_frame *f);
void sim_data_link_down(struct sim *s, unsigned i, unsigned j);
void sim_data_primaries_tick(struct sim *s, uint64_t now);
void sim_data_restart(struct sim *s, unsigned i);
/* Publishes msg on broker p's copy of queue qi (a local client's, or a
 * forward from reply_to); the answer goes back when decided. */
void sim_data_publish(struct sim *s, unsigned p, unsigned qi, uint32_t msg, uint32_t attempt,
                      unsigned reply_to, uint32_t reply_gen);
void sim_data_consume(struct sim *s, unsigned p, unsigned qi);
/* handover.c's quiesce: broker p stops taking publishes for qi; true
 * once the move's target holds exactly what p does. */
bool sim_data_quiet(struct sim *s, unsigned p, unsigned qi, uint32_t target_id);
/* The in-sync backup p's restarted copy of qi is handed to (queue.set_owner
 * at epoch), or BROKER_ID_NONE. */
uint32_t sim_data_hand_off(struct sim *s, unsigned p, unsigned qi, uint64_t *epoch);
/* The epoch at which p's restarted copy of the non-durable qi asks the
 * map to delete it, or 0. */
uint64_t sim_data_drop(struct sim *s, unsigned p, unsigned qi);

/* sim_client.c: publishers, proxies, consumers. */
void sim_client_tick(struct sim *s, uint64_t now);
void sim_client_answer(struct sim *s, uint32_t msg, uint32_t attempt, bool ok);
void sim_client_forward_arrives(struct sim *s, unsigned from, unsigned p, const struct sim_frame *f);
void sim_client_parked_tick(struct sim *s, uint64_t now);
void sim_client_killed(struct sim *s, unsigned i);
void sim_client_link_down(struct sim *s, unsigned i, unsigned j);

/* sim_data_check.c */
void sim_data_confirmed(struct sim *s, unsigned p, unsigned qi, uint64_t epoch, uint32_t msg);
void sim_data_given_up(struct sim *s, unsigned qi);
/* Broker b, restarted, decided its copy of qi at its sync: it serves it
 * again (serves: what only its last process held is gone, as promised;
 * --strict fails if an in-sync backup alive of q, b's map's, holds one
 * of those messages), or the queue is another's (q NULL or not b's: a
 * backup took it, which holds them). */
void sim_data_restart_settled(struct sim *s, const struct sim_broker *b, unsigned qi,
                              const struct map_queue *q, bool serves);
/* A queue.delete of qi applied (at map version): its confirmed messages
 * went with it. */
void sim_data_deleted(struct sim *s, unsigned qi, uint64_t version);
/* b, restarted, deletes q (controller_restart_drops): --strict fails if
 * a backup alive that b's map has in sync holds a confirmed message of
 * it (that backup could have taken the queue instead). */
void sim_data_check_drop(struct sim *s, const struct sim_broker *b, unsigned qi,
                         const struct map_queue *q);
/* A known loss (docs/ARCHITECTURE.md, the simulator): broker id serves qi
 * from the replica a restart emptied, promoted by a decision the map took
 * before it knew of the restart (sim_check.c fails a promotion after it
 * knew: broker.incarnation). Unless --strict, what was confirmed before is
 * not checked. With --strict, a message no process alive holds any more
 * is not checked either (copies_died): two failures beyond the factor. */
void sim_data_known_loss(struct sim *s, uint32_t id, unsigned qi);
/* After the heal: every confirmed message not consumed is at its queue's
 * primary. False (with why) while the data path has not settled. */
bool sim_data_check_settled(struct sim *s, char *why, size_t why_size);
void sim_data_check_messages(struct sim *s);

#endif
