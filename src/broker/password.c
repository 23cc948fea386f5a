/*
 * password.c: see password.h.
 */
#include "broker/password.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/assert.h"
#include "lib/base64.h"
#include "lib/errors.h"

#define PBKDF2_PREFIX "$pbkdf2-sha256$i="
#define PBKDF2_SALT_SIZE 16
#define PBKDF2_DIGEST_SIZE 32

static const struct {
    const char *name;
    const char *short_name;
    uint8_t digest_size; /* the salted digests': 4-byte salt first */
} algorithms[PASSWORD_ALGORITHM_COUNT] = {
    [PASSWORD_SHA256] = {"rabbit_password_hashing_sha256", "sha256", 32},
    [PASSWORD_SHA512] = {"rabbit_password_hashing_sha512", "sha512", 64},
    [PASSWORD_MD5] = {"rabbit_password_hashing_md5", "md5", 16},
    [PASSWORD_PBKDF2_SHA256] = {"quay_password_hashing_pbkdf2_sha256", "pbkdf2",
                                PBKDF2_DIGEST_SIZE},
};

const char *password_algorithm_name(enum password_algorithm algorithm)
{
    ASSERT((unsigned)algorithm < PASSWORD_ALGORITHM_COUNT);
    return algorithms[algorithm].name;
}

int password_algorithm_parse(const char *name)
{
    for (int i = 0; i < PASSWORD_ALGORITHM_COUNT; i++) {
        if (strcmp(name, algorithms[i].name) == 0 || strcmp(name, algorithms[i].short_name) == 0)
            return i;
    }
    return -1;
}

static const EVP_MD *salted_md(enum password_algorithm algorithm)
{
    switch (algorithm) {
    case PASSWORD_SHA512:
        return EVP_sha512();
    case PASSWORD_MD5:
        return EVP_md5();
    default:
        return EVP_sha256();
    }
}

/* ---- text forms ------------------------------------------------------------ */

/* RabbitMQ's: base64 of salt[4] || digest, padded. */
static int parse_salted(enum password_algorithm algorithm, const char *text, size_t size,
                        struct password_hash *out)
{
    uint8_t raw[4 + PASSWORD_DIGEST_MAX];
    size_t raw_size;
    if (base64_decode(text, size, raw, sizeof raw, &raw_size) != OK ||
        raw_size != 4u + algorithms[algorithm].digest_size)
        return -1;
    *out = (struct password_hash){.algorithm = algorithm, .salt_size = 4,
                                  .digest_size = algorithms[algorithm].digest_size};
    memcpy(out->salt, raw, 4);
    memcpy(out->digest, raw + 4, out->digest_size);
    return 0;
}

/* base64 without its padding (PHC), of exactly want bytes. */
static int decode_unpadded(const char *text, size_t size, uint8_t *out, size_t want)
{
    char padded[128];
    if (size == 0 || size % 4 == 1 || size + 3 > sizeof padded || memchr(text, '=', size))
        return -1;
    memcpy(padded, text, size);
    while (size % 4 != 0)
        padded[size++] = '=';
    size_t got;
    if (base64_decode(padded, size, out, want, &got) != OK || got != want)
        return -1;
    return 0;
}

static size_t encode_unpadded(const uint8_t *in, size_t size, char *out)
{
    base64_encode(in, size, out);
    size_t n = strlen(out);
    while (n > 0 && out[n - 1] == '=')
        out[--n] = '\0';
    return n;
}

/* $pbkdf2-sha256$i=N$SALT$HASH */
static int parse_pbkdf2(const char *text, size_t size, struct password_hash *out)
{
    size_t prefix = sizeof PBKDF2_PREFIX - 1;
    if (size <= prefix || memcmp(text, PBKDF2_PREFIX, prefix) != 0)
        return -1;
    const char *p = text + prefix, *end = text + size;
    uint64_t iterations = 0;
    const char *digits = p;
    while (p < end && *p >= '0' && *p <= '9' && p - digits < 9)
        iterations = iterations * 10 + (uint64_t)(*p++ - '0');
    if (p == digits || *digits == '0' || p == end || *p != '$' ||
        iterations < PASSWORD_PBKDF2_ITERATIONS_MIN || iterations > PASSWORD_PBKDF2_ITERATIONS_MAX)
        return -1;
    const char *salt = ++p;
    const char *dollar = memchr(salt, '$', (size_t)(end - salt));
    if (dollar == NULL)
        return -1;
    *out = (struct password_hash){.algorithm = PASSWORD_PBKDF2_SHA256,
                                  .iterations = (uint32_t)iterations,
                                  .salt_size = PBKDF2_SALT_SIZE,
                                  .digest_size = PBKDF2_DIGEST_SIZE};
    if (decode_unpadded(salt, (size_t)(dollar - salt), out->salt, PBKDF2_SALT_SIZE) != 0 ||
        decode_unpadded(dollar + 1, (size_t)(end - dollar - 1), out->digest,
                        PBKDF2_DIGEST_SIZE) != 0)
        return -1;
    return 0;
}

int password_hash_parse(const char *algorithm, const char *text, size_t size,
                        struct password_hash *out)
{
    int a;
    if (algorithm != NULL) {
        a = password_algorithm_parse(algorithm);
        if (a < 0 || strcmp(algorithm, algorithms[a].name) != 0)
            return -1; /* definitions name algorithms in full */
    } else if (size > 0 && text[0] == '$') {
        a = PASSWORD_PBKDF2_SHA256;
    } else {
        /* RabbitMQ's three differ in length: 48, 92, 28 characters. */
        a = size == 48 ? PASSWORD_SHA256 : size == 92 ? PASSWORD_SHA512 : PASSWORD_MD5;
    }
    if (a == PASSWORD_PBKDF2_SHA256)
        return parse_pbkdf2(text, size, out);
    return parse_salted((enum password_algorithm)a, text, size, out);
}

size_t password_hash_format(const struct password_hash *hash, char out[PASSWORD_TEXT_MAX + 1])
{
    if (hash->algorithm != PASSWORD_PBKDF2_SHA256) {
        uint8_t raw[4 + PASSWORD_DIGEST_MAX];
        memcpy(raw, hash->salt, 4);
        memcpy(raw + 4, hash->digest, hash->digest_size);
        base64_encode(raw, 4u + hash->digest_size, out);
        return strlen(out);
    }
    int n = snprintf(out, PASSWORD_TEXT_MAX + 1, PBKDF2_PREFIX "%u$", (unsigned)hash->iterations);
    ASSERT(n > 0 && n < 32);
    size_t at = (size_t)n;
    at += encode_unpadded(hash->salt, hash->salt_size, out + at);
    out[at++] = '$';
    at += encode_unpadded(hash->digest, hash->digest_size, out + at);
    ASSERT(at <= PASSWORD_TEXT_MAX);
    return at;
}

/* ---- hashing ---------------------------------------------------------------- */

static void derive(const struct password_hash *hash, const uint8_t *password, size_t size,
                   unsigned char out[PASSWORD_DIGEST_MAX])
{
    static const uint8_t empty[1];
    const uint8_t *pw = size ? password : empty;
    if (hash->algorithm == PASSWORD_PBKDF2_SHA256) {
        int ok = PKCS5_PBKDF2_HMAC((const char *)pw, (int)size, hash->salt, hash->salt_size,
                                   (int)hash->iterations, EVP_sha256(), hash->digest_size, out);
        ASSERT(ok == 1);
        return;
    }
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    ASSERT(ctx != NULL);
    unsigned n = 0;
    int ok = EVP_DigestInit_ex(ctx, salted_md(hash->algorithm), NULL) == 1 &&
             EVP_DigestUpdate(ctx, hash->salt, 4) == 1 &&
             EVP_DigestUpdate(ctx, pw, size) == 1 && EVP_DigestFinal_ex(ctx, out, &n) == 1;
    ASSERT(ok && n == hash->digest_size);
    EVP_MD_CTX_free(ctx);
}

static void new_salt(const struct password_policy *policy, struct password_hash *out)
{
    enum password_algorithm a = policy->algorithm;
    ASSERT(a != PASSWORD_MD5); /* imports only */
    *out = (struct password_hash){.algorithm = a,
                                  .digest_size = algorithms[a].digest_size,
                                  .salt_size = a == PASSWORD_PBKDF2_SHA256 ? PBKDF2_SALT_SIZE : 4};
    if (a == PASSWORD_PBKDF2_SHA256) {
        ASSERT(policy->iterations >= PASSWORD_PBKDF2_ITERATIONS_MIN &&
               policy->iterations <= PASSWORD_PBKDF2_ITERATIONS_MAX);
        out->iterations = policy->iterations;
    }
    int ok = RAND_bytes(out->salt, out->salt_size);
    ASSERT(ok == 1);
}

void password_hash_new(const struct password_policy *policy, const uint8_t *password,
                       size_t size, struct password_hash *out)
{
    new_salt(policy, out);
    derive(out, password, size, out->digest);
}

void password_hash_random(const struct password_policy *policy, struct password_hash *out)
{
    new_salt(policy, out);
    int ok = RAND_bytes(out->digest, out->digest_size);
    ASSERT(ok == 1);
}

bool password_hash_verify(const struct password_hash *hash, const uint8_t *password, size_t size)
{
    unsigned char got[PASSWORD_DIGEST_MAX];
    derive(hash, password, size, got);
    bool match = CRYPTO_memcmp(got, hash->digest, hash->digest_size) == 0;
    OPENSSL_cleanse(got, sizeof got);
    return match;
}

bool password_hash_is_slow(const struct password_hash *hash)
{
    return hash->algorithm == PASSWORD_PBKDF2_SHA256;
}

bool password_hash_equal(const struct password_hash *a, const struct password_hash *b)
{
    return a->algorithm == b->algorithm && a->iterations == b->iterations &&
           a->salt_size == b->salt_size && a->digest_size == b->digest_size &&
           memcmp(a->salt, b->salt, a->salt_size) == 0 &&
           memcmp(a->digest, b->digest, a->digest_size) == 0;
}
