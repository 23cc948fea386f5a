/*
 * consensus.h: quay's interface to Raft. The cluster map (cluster/map.c)
 * is replicated through it as opaque byte commands; nothing outside
 * consensus.c and raft_transport.c includes libraft, so the engine can be
 * swapped.
 *
 * Runs on the broker's own libuv loop (one thread, no locks): every call
 * here and every callback happens on that loop. Backed by libraft 0.15 with
 * its libuv disk backend (a data directory of its own) and our
 * authenticated transport (raft_transport.h) on the cluster port.
 *
 * Membership: the first broker bootstraps a one-member cluster; the others
 * call consensus_join() with any member's cluster address. The request goes
 * over the cluster port (the join RPC, authenticated with the secret); a
 * non-leader answers with the leader's address and the joiner retries
 * there. The leader adds the joiner as a voter while there are fewer than
 * CONSENSUS_VOTERS_MAX voters, else as a standby (replicates the log, does
 * not vote). When a voter is removed, the leader promotes a standby.
 * Membership changes are queued on the leader and run one at a time.
 *
 * Snapshots: every snapshot_threshold applied entries the snapshot callback
 * serializes the state machine and libraft truncates its log, keeping
 * snapshot_trailing entries; a follower that is too far behind (or a new
 * member) receives the snapshot and the restore callback loads it.
 *
 * Return values follow lib/errors.h: 0 (OK) or a negative code; the
 * consensus-specific codes (CONSENSUS_E_*) are registered there too.
 */
#ifndef QUAY_CLUSTER_CONSENSUS_H
#define QUAY_CLUSTER_CONSENSUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "lib/errors.h"

#define CONSENSUS_VOTERS_MAX 5
/* A snapshot not acknowledged within this is sent again (libraft: 30 s).
 * Far above a LAN transfer of the map (15,000 queues: ~5 MB). */
#define CONSENSUS_INSTALL_SNAPSHOT_TIMEOUT_MS 3000
/* Entries kept behind a snapshot: a broker cut off for a while (a
 * partition, a restart) catches up from these instead of being sent the
 * whole map (~5 MB with 15,000 queues). Map commands are a few hundred
 * bytes: ~2 MB of log in memory and on disk. */
#define CONSENSUS_SNAPSHOT_TRAILING 8192
/* A snapshot store (taken or installed) still running after this is
 * logged: it blocks installing the leader's snapshot. */
#define CONSENSUS_SNAPSHOT_SLOW_MS 2000
#define CONSENSUS_ADDRESS_SIZE_MAX 255

/* Its errors (CONSENSUS_E_*, -20..-31) are in lib/errors.h. */

/* Owned by the caller of consensus_start(); read during that call only
 * (strings and the secret are copied). */
struct raft_tls; /* raft_tls.h */

struct consensus_config {
    uint64_t id;              /* this broker's id, > 0, unique and stable across restarts */
    const char *address;      /* cluster address "a.b.c.d:port" (IPv4); listened on */
    const char *dir;          /* Raft data directory; must exist */
    const uint8_t *secret;    /* cluster secret, 16..1024 bytes */
    size_t secret_size;
    bool bootstrap;           /* with an empty dir: form a new one-member cluster */
    unsigned election_timeout_ms;   /* 0 = 1000; randomized in [t, 2t) by libraft */
    unsigned heartbeat_ms;          /* 0 = 100 */
    unsigned snapshot_threshold;    /* entries between snapshots; 0 = 1024 */
    unsigned snapshot_trailing;     /* entries kept after a snapshot; 0 = the default below */
    unsigned handshake_timeout_ms;  /* per transport handshake step; 0 = 2000 */
    unsigned join_timeout_ms;       /* one join attempt end to end; 0 = 30000 */
    const struct raft_tls *tls;     /* the transport's TLS (raft_tls.h), or NULL */
};

/* The state machine. Every callback runs on the loop. ctx is borrowed. */
/* libraft's settings as quay runs it (timeouts, pre-vote, snapshots),
 * for a consensus and for the simulator's servers (tests/sim). */
struct raft;
void consensus_tune(struct raft *r, const struct consensus_config *cfg);

struct consensus_callbacks {
    void *ctx;
    /* Apply a committed command, in log order, on every member. Must be
     * deterministic. *result (may stay NULL) reaches the proposer's done
     * callback when this member is the leader that proposed the entry; on
     * every other member it is dropped, so it must not own memory (point
     * into the state, or encode a small value). A non-zero return reaches
     * the proposer as CONSENSUS_E_APPLY; the entry counts as applied either
     * way (Raft cannot skip or retry an entry). */
    int (*apply)(void *ctx, uint64_t index, const uint8_t *cmd, size_t size, void **result);
    /* Serialize the whole state into *data (malloc'd; consensus frees it). */
    int (*snapshot)(void *ctx, uint8_t **data, size_t *size);
    /* Replace the whole state with a snapshot (data is borrowed). */
    int (*restore)(void *ctx, const uint8_t *data, size_t size);
    /* The known leader changed (leader_id 0: none known). Optional. */
    void (*leader_changed)(void *ctx, uint64_t leader_id, const char *leader_address,
                           bool is_self);
};

/* Completion of a proposal or a membership change: status 0 means committed
 * (and, for proposals, applied locally with *result from apply). */
typedef void (*consensus_done_fn)(void *req_ctx, int status, void *result);

/* Owned by the caller that started it until consensus_stop()'s closed
 * callback (or a failed start); its memory then waits for
 * consensus_release_remains. */
struct consensus;

/* Frees every consensus closed so far. Only once the loop has run dry:
 * libraft 0.15 may still use a closed one's I/O until then (consensus.c,
 * remains). */
void consensus_release_remains(void);

/* Open the data dir, start listening on the cluster port and start Raft.
 * With cfg->bootstrap and an empty dir, this broker becomes a one-member
 * cluster (it elects itself). On error, *out is NULL and err says why;
 * resources may be released asynchronously, so keep running the loop. */
int consensus_start(struct consensus **out, uv_loop_t *loop, const struct consensus_config *cfg,
                    const struct consensus_callbacks *cb, char *err, size_t err_size);

/* Ask the cluster to add this broker: tries peers in order, follows
 * redirects to the leader, retries with capped backoff until it succeeds or
 * consensus_stop() is called. done(req_ctx, 0, NULL) once the leader has
 * committed the change (at once, asynchronously, if this broker is already
 * a member, e.g. after a restart). peers are copied. */
int consensus_join(struct consensus *c, const char *const *peers, size_t peers_count,
                   consensus_done_fn done, void *req_ctx);

/* Propose a command (copied). Only on the leader, else CONSENSUS_E_NOT_LEADER
 * synchronously and done is not called. Otherwise done is called exactly
 * once: 0 when committed and applied here, else an error. */
int consensus_propose(struct consensus *c, const uint8_t *cmd, size_t size, consensus_done_fn done,
                      void *req_ctx);
/* The same for n commands in one go: n log entries, appended and sent to
 * the followers together (a failover's thousands of changes); done once,
 * when the last is applied here (its result), or with the error. */
struct consensus_cmd {
    const uint8_t *bytes;
    size_t size;
};
int consensus_propose_many(struct consensus *c, const struct consensus_cmd *cmds, uint32_t n,
                           consensus_done_fn done, void *req_ctx);

/* Leader only: add a member (voter if fewer than CONSENSUS_VOTERS_MAX voters,
 * else standby) or remove one. Queued behind other membership changes. done
 * may be NULL. */
int consensus_add_member(struct consensus *c, uint64_t id, const char *address,
                         consensus_done_fn done, void *req_ctx);
int consensus_remove_member(struct consensus *c, uint64_t id, consensus_done_fn done,
                            void *req_ctx);

enum consensus_role {
    CONSENSUS_ROLE_VOTER,   /* votes and replicates */
    CONSENSUS_ROLE_STANDBY, /* replicates, does not vote */
    CONSENSUS_ROLE_SPARE,   /* neither (transient: just added) */
};

struct consensus_member {
    uint64_t id;
    char address[CONSENSUS_ADDRESS_SIZE_MAX + 1];
    enum consensus_role role;
};

/* Copy up to max members of the latest (possibly uncommitted) configuration
 * known here; returns the total count. */
size_t consensus_members(const struct consensus *c, struct consensus_member *out, size_t max);

bool consensus_is_leader(const struct consensus *c);
/* The known leader's id (0: none); *address (may be NULL) is valid until
 * the next return to the loop. */
uint64_t consensus_leader(const struct consensus *c, const char **address);
uint64_t consensus_last_applied(const struct consensus *c);
uint64_t consensus_term(const struct consensus *c);
/* The leader seems dead (its connections dropped) or none is known: a
 * follower stands for election, or a candidate tries again, within
 * [timeout_ms, 2 timeout_ms) instead of its full election timeout (unless
 * a leader is heard meanwhile). Pre-vote keeps a false alarm from
 * disturbing a leader that is alive. True: the timer was moved. */
bool consensus_hurry_election(struct consensus *c, unsigned timeout_ms);

struct consensus_stats {
    uint64_t proposed_count;
    uint64_t applied_count;
    uint64_t snapshot_count;        /* snapshots taken here */
    uint64_t restore_count;         /* snapshots installed here */
    uint64_t leader_change_count;
    uint64_t join_attempt_count;    /* outgoing join RPCs */
    uint64_t auth_failure_count;    /* transport: bad proofs, either direction */
    uint64_t handshake_timeout_count;
    uint64_t malformed_count;
    uint64_t refused_count;
    uint64_t probe_hurry_count;     /* probes let go before the heartbeat (probe_tune) */
    uint64_t probe_rewind_count;    /* unheard followers probed from the log's end */
};
void consensus_stats(const struct consensus *c, struct consensus_stats *out);

/* Where this server's log is. */
struct consensus_log {
    uint64_t term;
    uint64_t last_index;   /* the last entry, committed or not */
    uint64_t commit_index; /* the highest entry known committed */
    uint64_t applied_index;
    /* A snapshot is being taken or installed here: 0, or for how long (ms).
     * libraft ignores a leader's snapshot meanwhile. */
    uint64_t snapshot_busy_ms;
};
void consensus_log_state(const struct consensus *c, struct consensus_log *out);

/* How a leader replicates to one follower (libraft's progress). */
enum consensus_replication {
    CONSENSUS_REPLICATION_PROBE,    /* finding where the logs agree */
    CONSENSUS_REPLICATION_PIPELINE, /* streaming new entries */
    CONSENSUS_REPLICATION_SNAPSHOT, /* a snapshot is on its way */
};
struct consensus_follower {
    uint64_t id;
    enum consensus_replication state;
    uint64_t next_index;  /* the next entry to send it */
    uint64_t match_index; /* the highest entry it confirmed holding */
    bool heard;           /* it answered within the election timeout */
};
/* On the leader: copy up to max followers' progress, return the total
 * count. 0 elsewhere. */
size_t consensus_followers(const struct consensus *c, struct consensus_follower *out, size_t max);
const char *consensus_replication_name(enum consensus_replication state);

/* Stop: fail what is pending (CONSENSUS_E_SHUTDOWN), close Raft, the
 * transport and the disk, then call closed(ctx) and free c. Callbacks may
 * still fire until closed runs; no call on c is allowed after this one. */
void consensus_stop(struct consensus *c, void (*closed)(void *ctx), void *ctx);

const char *consensus_strerror(int error);

#endif
