/*
 * auth.h: users, their hashed passwords, and the vhosts they may open.
 *
 * The users file has one user per line (blank lines and # comments
 * ignored):
 *
 *     NAME  PASSWORD-HASH  VHOST[,VHOST...]  [loopback]
 *
 * PASSWORD-HASH is RabbitMQ's rabbit_password_hashing_sha256 format:
 * base64(salt[4] || sha256(salt || password)); `quayd --hash-password PW`
 * prints one. "loopback" restricts the user to loopback peers (RabbitMQ's
 * loopback_users). Without a file: guest/guest on "/", loopback only.
 */
#ifndef QUAY_BROKER_AUTH_H
#define QUAY_BROKER_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "amqp/types.h"

struct auth_user {
    char *name;                   /* owned */
    char *vhosts;                 /* owned: comma-separated list, "*" = any */
    unsigned char salt[4];
    unsigned char hash[32];
    bool loopback_only;
};

struct auth {
    struct auth_user *users;      /* owned array */
    size_t users_count;
};

void auth_init_default(struct auth *auth);
/* Returns 0, or -1 with a message in err. */
int auth_load_file(struct auth *auth, const char *path, char *err, size_t err_size);
void auth_free(struct auth *auth);
/* Writes base64(salt||sha256(salt||password)) into out (>= 48 bytes). */
void auth_hash_password(const char *password, char *out, size_t out_size);

/* Checks a login; returns the user or NULL. */
const struct auth_user *auth_check(const struct auth *auth, struct bytes user,
                                   struct bytes password, bool peer_loopback);
bool auth_user_may_open(const struct auth_user *user, struct bytes vhost);

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
