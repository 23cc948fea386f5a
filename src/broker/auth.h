/*
 * auth.h: users, their hashed passwords, and the vhosts they may open.
 *
 * The users file has one user per line (blank lines and # comments
 * ignored):
 *
 *     NAME  PASSWORD-HASH  VHOST[,VHOST...]  [loopback]  [tags=TAG[,TAG...]]
 *
 * PASSWORD-HASH is a stored hash in any form of broker/password.h
 * (RabbitMQ's rabbit_password_hashing_sha256 format, base64(salt[4] ||
 * sha256(salt || password)), or sha512, md5, or quay's PBKDF2 string);
 * `quayd [--password-hashing-module M] --hash-password PW` prints one.
 * "loopback" restricts the user to loopback peers (RabbitMQ's
 * loopback_users), over AMQP and HTTP alike. The tags are RabbitMQ's
 * management tags: what the user may do with the management API
 * (mgmt/api.h); none (the default, as in files written before tags) means
 * no API access at all. The two optional words may come in either order,
 * each at most once; "tags=" cannot be mistaken for "loopback", and an
 * unknown tag is an error rather than a user with fewer rights than meant.
 * Without a file: guest/guest on "/", loopback only, administrator (as
 * RabbitMQ's default user). The file seeds the table; it changes at run
 * time through auth_user_put & co. (broker/users.h decides when).
 *
 * RabbitMQ's permissions: a line
 *
 *     permission  USER  VHOST  CONFIGURE  WRITE  READ
 *
 * gives USER (defined on an earlier line; so no user may be named
 * "permission") three POSIX extended regular expressions for VHOST, at
 * most one line per user and vhost. They are searched for in a resource's
 * name (unanchored, as RabbitMQ's re:run: write "^mine-" to mean a
 * prefix); "" matches nothing (RabbitMQ's "^$" idiom). configure governs
 * declare and delete, write publish and the destination of a bind, read
 * consume, get, purge and the source of a bind; the default exchange is
 * named "amq.default" for the check. A user and vhost without a line have
 * full access (".*" three times), as before permissions existed. The
 * regexes are compiled once, here; a bad one refuses the file.
 */
#ifndef QUAY_BROKER_AUTH_H
#define QUAY_BROKER_AUTH_H

#include <regex.h>
#include <stdbool.h>
#include <stddef.h>

#include "broker/password.h"
#include "lib/types.h"

/* RabbitMQ's management tags, as bits. Each includes the rights of the
 * ones it names (auth_user_has_tag): administrator all of them,
 * monitoring and policymaker management. */
enum auth_tag {
    AUTH_TAG_MANAGEMENT = 1u << 0,    /* read its own vhosts' objects */
    AUTH_TAG_POLICYMAKER = 1u << 1,   /* and change policies of those vhosts */
    AUTH_TAG_MONITORING = 1u << 2,    /* and read every connection, the node, the cluster */
    AUTH_TAG_ADMINISTRATOR = 1u << 3, /* everything, every vhost, cluster actions */
};

enum auth_permission_kind {
    AUTH_PERMISSION_CONFIGURE,
    AUTH_PERMISSION_WRITE,
    AUTH_PERMISSION_READ,
};
#define AUTH_PERMISSION_KIND_COUNT 3

/* What a user may do in one vhost: a "permission" line, a vhost of the
 * file's VHOSTS list (".*" three times), or a run-time permission. Owned
 * by its user. */
struct auth_permission {
    char *vhost;                  /* owned */
    char *texts[AUTH_PERMISSION_KIND_COUNT];     /* owned: the regexes as given */
    regex_t regexes[AUTH_PERMISSION_KIND_COUNT]; /* compiled unless nothing or everything */
    bool nothing[AUTH_PERMISSION_KIND_COUNT];    /* the regex was "": nothing matches */
    bool everything[AUTH_PERMISSION_KIND_COUNT]; /* ".*": no regexec on the hot path */
};


/*
 * One user. Heap-allocated and reference-counted, because users change
 * while running (auth_user_put & co.) and connections borrow them: the
 * table holds one reference, and every logged-in connection one more
 * (auth_user_ref). A change is made in place, so a connection sees new
 * permissions at its next operation; a deleted user leaves the table
 * (deleted = true) and lives until its last connection is gone.
 */
struct auth_user {
    char *name;                   /* owned */
    struct password_hash password; /* its stored hash, any form (broker/password.h) */
    /* The last password that passed a slow check (PBKDF2): HMAC-SHA256
     * under auth.cache_key, so that a reconnecting client does not pay a
     * derivation each time. Only the right password gets here; a new hash
     * clears it. */
    bool verified_cached;
    unsigned char verified[32];
    bool loopback_only;
    /* May open every vhost, with full access where it has no permission:
     * the file's "*" and the cluster peers' user. */
    bool any_vhost;
    bool deleted;
    unsigned tags;                /* enum auth_tag bits */
    struct auth_permission *permissions; /* owned array, one per vhost it may open */
    size_t permissions_count;
    /* The broker's own login for what it does over AMQP on its own
     * behalf (quayd --definitions: mgmt/api_amqp.h): loopback only, a
     * random password nobody else knows, no management tag, never
     * exported or listed. */
    bool internal;
    /* Bumped by every permission change: a channel's cached publish check
     * (channel.c) holds only while it is unchanged. */
    uint32_t permissions_generation;
    uint32_t refs;                /* 0 for the static auth_cluster_user */
};

struct auth {
    struct auth_user **users;     /* owned array of references */
    size_t users_count;
    /* How new passwords are stored (quayd --password-hashing-module). */
    struct password_policy policy;
    /* What an unknown user's password is checked against, so that a
     * failed login costs the same whether or not the user exists: a hash
     * in the policy's form, so one derivation of it. */
    struct password_hash dummy;
    unsigned char cache_key[32];  /* random per process: auth_user.verified */
};

/* The result of a login. */
enum auth_verdict {
    AUTH_VERDICT_OK,
    AUTH_VERDICT_REFUSED,         /* no such user, or the wrong password: one answer */
    AUTH_VERDICT_LOOPBACK_ONLY,   /* the right password, but not from a loopback peer */
    AUTH_VERDICT_SLOW,            /* auth_login_begin: run the job off the loop */
};

/* A slow check of one login (auth_login_begin): auth_job_run may run on
 * any thread (it reads only the job), auth_login_end on the loop. */
struct auth_job;

/* An empty table (fresh dummy credentials), new passwords as sha256. */
void auth_init(struct auth *auth);
/* How new passwords are stored from now on (a fresh dummy of that form). */
void auth_set_policy(struct auth *auth, const struct password_policy *policy);
/* guest/guest, its password stored as policy says. */
void auth_init_default(struct auth *auth, const struct password_policy *policy);
/* Returns 0, or -1 with a message in err. */
int auth_load_file(struct auth *auth, const char *path, char *err, size_t err_size);
void auth_free(struct auth *auth);
/* Adds the internal user name (auth_user.internal) with a fresh random
 * password, written into password[password_size] (NUL-terminated). Only
 * before the loop runs: the users array may move. */
void auth_add_internal(struct auth *auth, const char *name, char *password,
                       size_t password_size);
/* Writes the policy's stored form of password into out (>=
 * PASSWORD_TEXT_MAX + 1 bytes): what `quayd --hash-password` prints. */
void auth_hash_password(const struct password_policy *policy, const char *password, char *out,
                        size_t out_size);

/* Checks a login at once, slow hashes included (tests, tools): the
 * password is hashed once whether or not the user exists. Sets *out to
 * the user on AUTH_VERDICT_OK, else to NULL. */
enum auth_verdict auth_login(struct auth *auth, struct bytes user, struct bytes password,
                             bool peer_loopback, const struct auth_user **out);
/*
 * The same in two halves, for the loop: a login whose check is cheap (a
 * salted digest, or a slow hash whose success is cached) is decided here
 * as auth_login would; one that needs a derivation of a slow hash returns
 * AUTH_VERDICT_SLOW with *job set (owned by the caller): auth_job_run it
 * off the loop, then auth_login_end it on the loop. A failed login costs
 * one derivation of the policy's form in every case: an unknown user's
 * password is checked against the dummy, a wrong password of a user
 * stored in a cheaper form than the policy's pays a dummy derivation too,
 * and one of a user stored with fewer PBKDF2 iterations pays the rest.
 */
enum auth_verdict auth_login_begin(struct auth *auth, struct bytes user, struct bytes password,
                                   bool peer_loopback, const struct auth_user **out,
                                   struct auth_job **job);
void auth_job_run(struct auth_job *job);
/* Decides the job's login with the table as it is now (a user changed or
 * deleted meanwhile is refused) and frees the job. */
enum auth_verdict auth_login_end(struct auth *auth, struct auth_job *job,
                                 const struct auth_user **out);
/* Frees a job without deciding it (its client went away). */
void auth_job_free(struct auth_job *job);
/* Whether two jobs make the same check (user, stored hash, password). */
bool auth_job_same(const struct auth_job *a, const struct auth_job *b);
/* Decides a job whose check another job with the same input made and
 * auth_login_end decided: from the cache (a success) or refused. Frees
 * the job. */
enum auth_verdict auth_login_settle(struct auth *auth, struct auth_job *job,
                                    const struct auth_user **out);
/* The user of that name, or NULL: for logins the transport vouched for
 * (EXTERNAL: a verified TLS client certificate names the user). */
const struct auth_user *auth_find_user(const struct auth *auth, struct bytes user);
/* auth_login for AMQP, where every refusal looks the same: the user or NULL. */
const struct auth_user *auth_check(struct auth *auth, struct bytes user,
                                   struct bytes password, bool peer_loopback);
bool auth_user_may_open(const struct auth_user *user, struct bytes vhost);
/* The user's permission for vhost, or NULL: none (full access for an
 * any_vhost user). */
const struct auth_permission *auth_user_permission(const struct auth_user *user,
                                                   struct bytes vhost);
/* Whether permission (NULL = full access) lets kind at the resource name.
 * No allocation: the name is copied to the stack for regexec. */
bool auth_permission_allows(const struct auth_permission *permission,
                            enum auth_permission_kind kind, struct bytes name);
/* Whether the user may do kind at the resource name in vhost, as it is
 * now: no permission for the vhost refuses (unless any_vhost). */
bool auth_user_allows(const struct auth_user *user, struct bytes vhost,
                      enum auth_permission_kind kind, struct bytes name);
/* "configure", "write", "read": RabbitMQ's words in refusals. */
const char *auth_permission_kind_name(enum auth_permission_kind kind);
/* Whether the user holds tag, directly or through a tag that includes it. */
bool auth_user_has_tag(const struct auth_user *user, enum auth_tag tag);
/* Parses a comma-separated tag list ("" = none) into enum auth_tag bits.
 * Returns 0, or -1 with the first unknown tag's name in bad (NUL-ended,
 * cut to bad_size). */
int auth_parse_tags(const char *text, unsigned *tags, char *bad, size_t bad_size);

/* Writes tags as RabbitMQ lists them ("administrator", ...) into out[], at
 * most 4; returns the count. */
uint32_t auth_tag_names(unsigned tags, const char *out[4]);

/* ---- changes while running (the management API, the cluster map, the
 * journal's replay). Names are 1..255 bytes; the caller checks that. ---- */

/* References for connections; the last unref of a deleted user frees it. */
void auth_user_ref(const struct auth_user *user);
void auth_user_unref(const struct auth_user *user);
/* Adds the user, or changes its password hash and tags in place (its
 * permissions stay; a new hash forgets the cached check). Returns it;
 * *created says which. */
struct auth_user *auth_user_put(struct auth *auth, struct bytes name,
                                const struct password_hash *hash, unsigned tags, bool *created);
/* Removes the user from the table (it is freed once unreferenced).
 * Returns false if there is none. */
bool auth_user_delete(struct auth *auth, struct bytes name);
/* Checks a regex as a permission would compile it: 0, or -1 with why. */
int auth_regex_check(const char *text, char *err, size_t err_size);
/* Sets the user's permission for vhost (three NUL-ended regexes; "" =
 * nothing). Returns 1 created, 0 replaced, -1 with why in err (bad regex:
 * nothing changed). */
int auth_permission_put(struct auth_user *user, struct bytes vhost,
                        const char *const texts[AUTH_PERMISSION_KIND_COUNT], char *err,
                        size_t err_size);
/* Removes the user's permission for vhost; false if it had none. */
bool auth_permission_delete(struct auth_user *user, struct bytes vhost);
/* A vhost went: every permission on it goes too (RabbitMQ). */
void auth_vhost_deleted(struct auth *auth, struct bytes vhost);
/* The user's password hash in its text form (broker/password.h), NUL-ended;
 * returns its length. */
size_t auth_user_hash_text(const struct auth_user *user, char out[PASSWORD_TEXT_MAX + 1]);
/* Its hashing_algorithm, as RabbitMQ's definitions name it. */
const char *auth_user_hash_algorithm(const struct auth_user *user);
/* Salts and hashes a new password as the table's policy says. */
void auth_hash_new(const struct auth *auth, struct bytes password, struct password_hash *out);

/* SASL responses: PLAIN is "\0user\0password"; AMQPLAIN is a field table
 * with LOGIN and PASSWORD. Return 0 on success. */
int auth_parse_plain(struct bytes response, struct bytes *user, struct bytes *password);
int auth_parse_amqplain(struct bytes response, struct bytes *user, struct bytes *password);

/*
 * Cluster peers: brokers of one cluster log in to each other (the cluster
 * links, cluster/link.h) with the cluster secret, never with a user, in
 * two SASL steps. The server accepts the mechanism QUAY-CLUSTER only when
 * it has a secret, and does not list it in connection.start's mechanisms
 * (clients of a cluster see exactly what one broker offers). The client's
 * start-ok names the mechanism (its response is ignored); the server's
 * connection.secure challenge is a nonce fresh for the connection (32 hex
 * digits); the client's secure-ok answers
 *
 *     response = NAME || 0x00 || hex(HMAC-SHA256(secret, "quay-link v1" || nonce || NAME))
 *
 * where NAME is its broker name and nonce the challenge exactly as
 * received; hex is lower case. One function computes the proof for both
 * sides.
 */
#define AUTH_CLUSTER_MECHANISM "QUAY-CLUSTER"
#define AUTH_CLUSTER_NONCE_SIZE 32 /* hex digits of 16 random bytes */
#define AUTH_CLUSTER_PROOF_SIZE 64 /* hex digits of an HMAC-SHA256 */
#define AUTH_CLUSTER_NAME_SIZE_MAX 255 /* a broker name, as a shortstr */

/* The user of every cluster peer: in no users table (so no password logs
 * in as it), allowed on every vhost. */
extern const struct auth_user auth_cluster_user;

/* Writes a fresh nonce: AUTH_CLUSTER_NONCE_SIZE hex digits and a NUL. */
void auth_cluster_nonce(char out[AUTH_CLUSTER_NONCE_SIZE + 1]);
/* Writes the proof: AUTH_CLUSTER_PROOF_SIZE hex digits and a NUL. */
void auth_cluster_proof(struct bytes secret, struct bytes nonce, struct bytes name,
                        char out[AUTH_CLUSTER_PROOF_SIZE + 1]);
/* Checks a QUAY-CLUSTER response against our secret and the nonce we sent
 * (constant-time compare). Returns &auth_cluster_user with *name set to
 * the peer's claimed broker name (borrowed from response), or NULL. */
const struct auth_user *auth_cluster_check(struct bytes secret, struct bytes nonce,
                                           struct bytes response, struct bytes *name);

#endif
