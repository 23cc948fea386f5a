/*
 * auth.h: users, their hashed passwords, and the vhosts they may open.
 *
 * The users file has one user per line (blank lines and # comments
 * ignored):
 *
 *     NAME  PASSWORD-HASH  VHOST[,VHOST...]  [loopback]  [tags=TAG[,TAG...]]
 *
 * PASSWORD-HASH is RabbitMQ's rabbit_password_hashing_sha256 format:
 * base64(salt[4] || sha256(salt || password)); `quayd --hash-password PW`
 * prints one. "loopback" restricts the user to loopback peers (RabbitMQ's
 * loopback_users), over AMQP and HTTP alike. The tags are RabbitMQ's
 * management tags: what the user may do with the management API
 * (mgmt/api.h); none (the default, as in files written before tags) means
 * no API access at all. The two optional words may come in either order,
 * each at most once; "tags=" cannot be mistaken for "loopback", and an
 * unknown tag is an error rather than a user with fewer rights than meant.
 * Without a file: guest/guest on "/", loopback only, administrator (as
 * RabbitMQ's default user).
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

#include "amqp/types.h"

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

/* One "permission" line. Owned by its user. */
struct auth_permission {
    char *vhost;                  /* owned */
    regex_t regexes[AUTH_PERMISSION_KIND_COUNT]; /* compiled unless nothing[kind] */
    bool nothing[AUTH_PERMISSION_KIND_COUNT];    /* the regex was "": nothing matches */
    char *patterns[AUTH_PERMISSION_KIND_COUNT];  /* owned: each as written ("" for "\"\""),
                                                  * for the definitions export */
};

struct auth_user {
    char *name;                   /* owned */
    char *vhosts;                 /* owned: comma-separated list, "*" = any */
    unsigned char salt[4];
    unsigned char hash[32];
    bool loopback_only;
    unsigned tags;                /* enum auth_tag bits, as the file names them */
    struct auth_permission *permissions; /* owned array; none = full access everywhere */
    size_t permissions_count;
    /* The broker's own login for what it does over AMQP on its own
     * behalf (quayd --definitions: mgmt/api_amqp.h): loopback only, a
     * random password nobody else knows, no management tag, never
     * exported or listed. */
    bool internal;
};

struct auth {
    struct auth_user *users;      /* owned array */
    size_t users_count;
    /* What an unknown user's password is checked against, so that a
     * failed login costs the same whether or not the user exists. */
    unsigned char dummy_salt[4];
    unsigned char dummy_hash[32];
};

/* The result of a login. */
enum auth_verdict {
    AUTH_VERDICT_OK,
    AUTH_VERDICT_REFUSED,         /* no such user, or the wrong password: one answer */
    AUTH_VERDICT_LOOPBACK_ONLY,   /* the right password, but not from a loopback peer */
};

void auth_init_default(struct auth *auth);
/* Returns 0, or -1 with a message in err. */
int auth_load_file(struct auth *auth, const char *path, char *err, size_t err_size);
void auth_free(struct auth *auth);
/* Adds the internal user name (auth_user.internal) with a fresh random
 * password, written into password[password_size] (NUL-terminated). Only
 * before the loop runs: the users array may move. */
void auth_add_internal(struct auth *auth, const char *name, char *password,
                       size_t password_size);
/* Writes base64(salt||sha256(salt||password)) into out (>= 48 bytes). */
void auth_hash_password(const char *password, char *out, size_t out_size);

/* Checks a login: the password is hashed once whether or not the user
 * exists. Sets *out to the user on AUTH_VERDICT_OK, else to NULL. */
enum auth_verdict auth_login(const struct auth *auth, struct bytes user, struct bytes password,
                             bool peer_loopback, const struct auth_user **out);
/* The user of that name, or NULL: for logins the transport vouched for
 * (EXTERNAL: a verified TLS client certificate names the user). */
const struct auth_user *auth_find_user(const struct auth *auth, struct bytes user);
/* auth_login for AMQP, where every refusal looks the same: the user or NULL. */
const struct auth_user *auth_check(const struct auth *auth, struct bytes user,
                                   struct bytes password, bool peer_loopback);
bool auth_user_may_open(const struct auth_user *user, struct bytes vhost);
/* The user's permission line for vhost, or NULL: full access. */
const struct auth_permission *auth_user_permission(const struct auth_user *user,
                                                   struct bytes vhost);
/* Whether permission (NULL = full access) lets kind at the resource name.
 * No allocation: the name is copied to the stack for regexec. */
bool auth_permission_allows(const struct auth_permission *permission,
                            enum auth_permission_kind kind, struct bytes name);
/* "configure", "write", "read": RabbitMQ's words in refusals. */
const char *auth_permission_kind_name(enum auth_permission_kind kind);
/* Whether the user holds tag, directly or through a tag that includes it. */
bool auth_user_has_tag(const struct auth_user *user, enum auth_tag tag);
/* Parses a comma-separated tag list ("" = none) into enum auth_tag bits.
 * Returns 0, or -1 with the first unknown tag's name in bad (NUL-ended,
 * cut to bad_size). */
int auth_parse_tags(const char *text, unsigned *tags, char *bad, size_t bad_size);

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
