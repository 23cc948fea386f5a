/*
 * auth.c: see auth.h. Password checks compare hashes in constant time.
 */
#include "broker/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/table.h"
#include "lib/assert.h"

static char *str_dup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *copy = malloc(n);
    ASSERT(copy != NULL);
    memcpy(copy, s, n);
    return copy;
}

static void hash_with_salt(const unsigned char salt[4], const uint8_t *password, size_t len,
                           unsigned char out[32])
{
    unsigned char *buf = malloc(4 + len);
    ASSERT(buf != NULL);
    memcpy(buf, salt, 4);
    if (len)
        memcpy(buf + 4, password, len);
    SHA256(buf, 4 + len, out);
    OPENSSL_cleanse(buf, 4 + len);
    free(buf);
}

static void add_user(struct auth *auth, const char *name, const unsigned char salt[4],
                     const unsigned char hash[32], const char *vhosts, bool loopback_only)
{
    struct auth_user *users = realloc(auth->users, sizeof *users * (auth->users_count + 1));
    ASSERT(users != NULL);
    auth->users = users;
    struct auth_user *u = &users[auth->users_count++];
    u->name = str_dup(name);
    u->vhosts = str_dup(vhosts);
    memcpy(u->salt, salt, 4);
    memcpy(u->hash, hash, 32);
    u->loopback_only = loopback_only;
}

void auth_init_default(struct auth *auth)
{
    auth->users = NULL;
    auth->users_count = 0;
    unsigned char salt[4], hash[32];
    RAND_bytes(salt, sizeof salt);
    hash_with_salt(salt, (const uint8_t *)"guest", 5, hash);
    add_user(auth, "guest", salt, hash, "/", true);
}

void auth_hash_password(const char *password, char *out, size_t out_size)
{
    unsigned char raw[36];
    RAND_bytes(raw, 4);
    hash_with_salt(raw, (const uint8_t *)password, strlen(password), raw + 4);
    ASSERT(out_size >= 49);
    EVP_EncodeBlock((unsigned char *)out, raw, sizeof raw);
}

int auth_load_file(struct auth *auth, const char *path, char *err, size_t err_size)
{
    auth->users = NULL;
    auth->users_count = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, err_size, "cannot open users file %s", path);
        return -1;
    }
    char line[1024];
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *save = NULL;
        char *name = strtok_r(line, " \t\r\n", &save);
        if (!name || name[0] == '#')
            continue;
        char *hash64 = strtok_r(NULL, " \t\r\n", &save);
        char *vhosts = strtok_r(NULL, " \t\r\n", &save);
        char *flag = strtok_r(NULL, " \t\r\n", &save);
        unsigned char raw[48];
        int n = hash64 ? EVP_DecodeBlock(raw, (const unsigned char *)hash64, (int)strlen(hash64))
                       : -1;
        /* EVP_DecodeBlock counts base64 padding as data: 36 bytes -> 36. */
        if (!vhosts || n < 36 || (flag && strcmp(flag, "loopback") != 0)) {
            snprintf(err, err_size, "%s:%d: expected NAME HASH VHOSTS [loopback]", path, lineno);
            fclose(f);
            auth_free(auth);
            return -1;
        }
        add_user(auth, name, raw, raw + 4, vhosts, flag != NULL);
    }
    fclose(f);
    return 0;
}

void auth_free(struct auth *auth)
{
    for (size_t i = 0; i < auth->users_count; i++) {
        free(auth->users[i].name);
        free(auth->users[i].vhosts);
    }
    free(auth->users);
    auth->users = NULL;
    auth->users_count = 0;
}

const struct auth_user *auth_check(const struct auth *auth, struct bytes user,
                                   struct bytes password, bool peer_loopback)
{
    for (size_t i = 0; i < auth->users_count; i++) {
        const struct auth_user *u = &auth->users[i];
        if (!bytes_equal_cstr(user, u->name))
            continue;
        unsigned char hash[32];
        hash_with_salt(u->salt, password.ptr, password.len, hash);
        if (CRYPTO_memcmp(hash, u->hash, sizeof hash) != 0)
            return NULL;
        if (u->loopback_only && !peer_loopback)
            return NULL;
        return u;
    }
    return NULL;
}

bool auth_user_may_open(const struct auth_user *user, struct bytes vhost)
{
    const char *p = user->vhosts;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if ((len == 1 && p[0] == '*') || (len == vhost.len && memcmp(p, vhost.ptr, len) == 0))
            return true;
        if (!end)
            break;
        p = end + 1;
    }
    return false;
}

int auth_parse_plain(struct bytes response, struct bytes *user, struct bytes *password)
{
    /* authzid \0 authcid \0 password; we ignore authzid. */
    const uint8_t *p = response.ptr;
    const uint8_t *end = p + response.len;
    const uint8_t *first = memchr(p, 0, response.len);
    if (!first)
        return -1;
    const uint8_t *second = memchr(first + 1, 0, (size_t)(end - first - 1));
    if (!second)
        return -1;
    *user = (struct bytes){first + 1, (uint32_t)(second - first - 1)};
    *password = (struct bytes){second + 1, (uint32_t)(end - second - 1)};
    return 0;
}

int auth_parse_amqplain(struct bytes response, struct bytes *user, struct bytes *password)
{
    /* AMQPLAIN's response is a field table without its length prefix. */
    if (table_validate(response.ptr, response.len) != 0)
        return -1;
    struct table t = {response.ptr, response.len};
    struct field_value login, pass;
    if (!table_get(t, "LOGIN", &login) || !table_get(t, "PASSWORD", &pass))
        return -1;
    if (login.kind != 'S' || pass.kind != 'S')
        return -1;
    *user = login.str;
    *password = pass.str;
    return 0;
}

/* ---- cluster peers -------------------------------------------------- */

#define CLUSTER_PROOF_LABEL "quay-link v1"

static char cluster_user_name[] = "quay-cluster";
static char cluster_user_vhosts[] = "*";
const struct auth_user auth_cluster_user = {.name = cluster_user_name,
                                            .vhosts = cluster_user_vhosts};

static void hex_encode(const uint8_t *in, size_t size, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < size; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * size] = '\0';
}

void auth_cluster_nonce(char out[AUTH_CLUSTER_NONCE_SIZE + 1])
{
    uint8_t raw[AUTH_CLUSTER_NONCE_SIZE / 2];
    int ok = RAND_bytes(raw, sizeof raw);
    ASSERT(ok == 1);
    hex_encode(raw, sizeof raw, out);
}

void auth_cluster_proof(struct bytes secret, struct bytes nonce, struct bytes name,
                        char out[AUTH_CLUSTER_PROOF_SIZE + 1])
{
    ASSERT(secret.len > 0);
    ASSERT(nonce.len <= AUTH_CLUSTER_NONCE_SIZE);
    ASSERT(name.len <= AUTH_CLUSTER_NAME_SIZE_MAX);
    uint8_t data[sizeof CLUSTER_PROOF_LABEL - 1 + AUTH_CLUSTER_NONCE_SIZE +
                 AUTH_CLUSTER_NAME_SIZE_MAX];
    size_t size = sizeof CLUSTER_PROOF_LABEL - 1;
    memcpy(data, CLUSTER_PROOF_LABEL, size);
    if (nonce.len)
        memcpy(data + size, nonce.ptr, nonce.len);
    size += nonce.len;
    if (name.len)
        memcpy(data + size, name.ptr, name.len);
    size += name.len;
    uint8_t mac[AUTH_CLUSTER_PROOF_SIZE / 2];
    unsigned mac_size = 0;
    uint8_t *r = HMAC(EVP_sha256(), secret.ptr, (int)secret.len, data, size, mac, &mac_size);
    ASSERT(r != NULL);
    ASSERT(mac_size == sizeof mac);
    hex_encode(mac, sizeof mac, out);
}

const struct auth_user *auth_cluster_check(struct bytes secret, struct bytes nonce,
                                           struct bytes response, struct bytes *name)
{
    if (secret.len == 0 || nonce.len != AUTH_CLUSTER_NONCE_SIZE)
        return NULL;
    const uint8_t *nul = response.len ? memchr(response.ptr, 0, response.len) : NULL;
    if (!nul)
        return NULL;
    uint32_t name_size = (uint32_t)(nul - response.ptr);
    uint32_t proof_size = response.len - name_size - 1;
    if (name_size == 0 || name_size > AUTH_CLUSTER_NAME_SIZE_MAX ||
        proof_size != AUTH_CLUSTER_PROOF_SIZE)
        return NULL;
    *name = (struct bytes){response.ptr, name_size};
    char expected[AUTH_CLUSTER_PROOF_SIZE + 1];
    auth_cluster_proof(secret, nonce, *name, expected);
    if (CRYPTO_memcmp(expected, nul + 1, AUTH_CLUSTER_PROOF_SIZE) != 0)
        return NULL;
    return &auth_cluster_user;
}
