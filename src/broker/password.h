/*
 * password.h: stored password hashes, their text forms and their checks.
 * Pure (no I/O, no broker state); OpenSSL does the hashing.
 *
 * Four forms, each named as RabbitMQ's definitions name it
 * (`hashing_algorithm`) and each recognisable from its text alone, so
 * that the cluster map, the journal and the users file carry only the
 * text:
 *
 *   rabbit_password_hashing_sha256   base64(salt[4] || sha256(salt || pw))   48 characters
 *   rabbit_password_hashing_sha512   base64(salt[4] || sha512(salt || pw))   92 characters
 *   rabbit_password_hashing_md5      base64(salt[4] || md5(salt || pw))      28 characters
 *   quay_password_hashing_pbkdf2_sha256
 *       $pbkdf2-sha256$i=ITERATIONS$SALT$HASH      (the PHC string format:
 *       SALT 16 random bytes, HASH the 32 bytes of PBKDF2-HMAC-SHA256, both
 *       base64 without padding; ITERATIONS in decimal, no leading zero)
 *
 * The first three are RabbitMQ's own (import and export compatible); new
 * passwords are stored as sha256 or pbkdf2 (the broker's
 * --password-hashing-module), md5 and sha512 only arrive in imports.
 * PBKDF2 is the slow one: one check costs `iterations` HMACs (600,000 by
 * default, OWASP's figure for PBKDF2-HMAC-SHA256), which is why the
 * broker runs it off its loop (broker/auth.h). An imported iteration
 * count is bounded (PASSWORD_PBKDF2_ITERATIONS_MAX), so a stored hash
 * cannot make one login cost minutes.
 */
#ifndef QUAY_BROKER_PASSWORD_H
#define QUAY_BROKER_PASSWORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum password_algorithm {
    PASSWORD_SHA256,
    PASSWORD_SHA512,
    PASSWORD_MD5,
    PASSWORD_PBKDF2_SHA256,
};
#define PASSWORD_ALGORITHM_COUNT 4

#define PASSWORD_SALT_MAX 16
#define PASSWORD_DIGEST_MAX 64
/* The longest text form (sha512's is 92; pbkdf2's at most 22 + 43 + 27). */
#define PASSWORD_TEXT_MAX 128
#define PASSWORD_PBKDF2_ITERATIONS_DEFAULT 600000u
#define PASSWORD_PBKDF2_ITERATIONS_MIN 1000u
#define PASSWORD_PBKDF2_ITERATIONS_MAX 10000000u

struct password_hash {
    enum password_algorithm algorithm;
    uint32_t iterations;             /* PBKDF2's; 0 for the others */
    uint8_t salt_size;
    uint8_t digest_size;
    unsigned char salt[PASSWORD_SALT_MAX];
    unsigned char digest[PASSWORD_DIGEST_MAX];
};

/* How new passwords are stored: the algorithm (sha256, sha512 or pbkdf2)
 * and PBKDF2's iterations. */
struct password_policy {
    enum password_algorithm algorithm;
    uint32_t iterations;
};

/* RabbitMQ's name of the algorithm ("rabbit_password_hashing_sha256"...). */
const char *password_algorithm_name(enum password_algorithm algorithm);
/* The algorithm of that name, also "sha256", "sha512", "md5", "pbkdf2";
 * -1 if none. */
int password_algorithm_parse(const char *name);

/* Reads a stored hash. algorithm: the name given with it
 * (hashing_algorithm), or NULL to tell it from the text. Returns 0, or -1
 * if the text is not a hash of that algorithm (or of any, or has an
 * iteration count out of bounds). */
int password_hash_parse(const char *algorithm, const char *text, size_t size,
                        struct password_hash *out);
/* Writes the text form and a NUL into out (PASSWORD_TEXT_MAX + 1 bytes);
 * returns its length. */
size_t password_hash_format(const struct password_hash *hash, char out[PASSWORD_TEXT_MAX + 1]);
/* Salts and hashes a password as the policy says (a fresh random salt). */
void password_hash_new(const struct password_policy *policy, const uint8_t *password,
                       size_t size, struct password_hash *out);
/* A hash no password has (random bytes in the policy's form). */
void password_hash_random(const struct password_policy *policy, struct password_hash *out);
/* Whether password hashes to hash (constant-time compare of the digests).
 * Costs one derivation of hash's algorithm: PBKDF2's is slow. */
bool password_hash_verify(const struct password_hash *hash, const uint8_t *password, size_t size);
/* Whether checking hash is slow (PBKDF2): such checks run off the loop. */
bool password_hash_is_slow(const struct password_hash *hash);
bool password_hash_equal(const struct password_hash *a, const struct password_hash *b);

#endif
