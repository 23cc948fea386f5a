/*
 * auth.c: see auth.h. Password checks compare hashes in constant time, and
 * hash once per login whether or not the user exists.
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

/* Fresh random dummy credentials: no password hashes to them in practice,
 * and nobody can log in with them (they belong to no user). */
static void init_dummy(struct auth *auth)
{
    int ok = RAND_bytes(auth->dummy_salt, sizeof auth->dummy_salt);
    ASSERT(ok == 1);
    ok = RAND_bytes(auth->dummy_hash, sizeof auth->dummy_hash);
    ASSERT(ok == 1);
}

static void add_user(struct auth *auth, const char *name, const unsigned char salt[4],
                     const unsigned char hash[32], const char *vhosts, bool loopback_only,
                     unsigned tags)
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
    u->tags = tags;
    u->permissions = NULL;
    u->permissions_count = 0;
    u->internal = false;
}

void auth_add_internal(struct auth *auth, const char *name, char *password,
                       size_t password_size)
{
    unsigned char raw[24], salt[4], hash[32];
    ASSERT(password_size > 2 * sizeof raw);
    int ok = RAND_bytes(raw, sizeof raw) == 1 && RAND_bytes(salt, sizeof salt) == 1;
    ASSERT(ok); /* no randomness: nothing here is safe */
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(password + 2 * i, 3, "%02x", raw[i]);
    hash_with_salt(salt, (const uint8_t *)password, 2 * sizeof raw, hash);
    OPENSSL_cleanse(raw, sizeof raw);
    add_user(auth, name, salt, hash, "*", true, 0);
    auth->users[auth->users_count - 1].internal = true;
}

static struct auth_user *find_user_cstr(struct auth *auth, const char *name)
{
    for (size_t i = 0; i < auth->users_count; i++) {
        if (strcmp(auth->users[i].name, name) == 0)
            return &auth->users[i];
    }
    return NULL;
}

static void permission_free(struct auth_permission *p)
{
    for (int kind = 0; kind < AUTH_PERMISSION_KIND_COUNT; kind++) {
        if (!p->nothing[kind])
            regfree(&p->regexes[kind]);
    }
    for (int kind = 0; kind < AUTH_PERMISSION_KIND_COUNT; kind++) {
        free(p->patterns[kind]);
        p->patterns[kind] = NULL;
    }
    free(p->vhost);
    p->vhost = NULL;
}

/* "permission USER VHOST CONFIGURE WRITE READ" after the word "permission"
 * (save: the rest of the line). Returns 0, or -1 with why in err. */
static int parse_permission(struct auth *auth, char *save, char *err, size_t err_size)
{
    char *words[6];
    int count = 0;
    for (char *word; count < 6 && (word = strtok_r(NULL, " \t\r\n", &save)) != NULL;)
        words[count++] = word;
    if (count != 5) {
        snprintf(err, err_size, "expected permission USER VHOST CONFIGURE WRITE READ");
        return -1;
    }
    struct auth_user *user = find_user_cstr(auth, words[0]);
    if (!user) {
        snprintf(err, err_size, "permission for unknown user '%.64s' (users come first)",
                 words[0]);
        return -1;
    }
    if (auth_user_permission(user, bytes_of_cstr(words[1])) != NULL) {
        snprintf(err, err_size, "a second permission for user '%.64s' in vhost '%.64s'",
                 words[0], words[1]);
        return -1;
    }
    struct auth_permission p = {.vhost = str_dup(words[1])};
    for (int kind = 0; kind < AUTH_PERMISSION_KIND_COUNT; kind++) {
        const char *text = words[2 + kind];
        p.nothing[kind] = strcmp(text, "\"\"") == 0;
        p.patterns[kind] = str_dup(p.nothing[kind] ? "" : text);
        int rc = p.nothing[kind] ? 0 : regcomp(&p.regexes[kind], text, REG_EXTENDED | REG_NOSUB);
        if (rc != 0) {
            char why[128];
            regerror(rc, &p.regexes[kind], why, sizeof why);
            snprintf(err, err_size, "bad %s regex '%.64s': %s",
                     auth_permission_kind_name((enum auth_permission_kind)kind), text, why);
            p.nothing[kind] = true; /* nothing compiled to free */
            for (int k = kind + 1; k < AUTH_PERMISSION_KIND_COUNT; k++)
                p.nothing[k] = true;
            permission_free(&p);
            return -1;
        }
    }
    struct auth_permission *grown =
        realloc(user->permissions, sizeof *grown * (user->permissions_count + 1));
    ASSERT(grown != NULL);
    user->permissions = grown;
    grown[user->permissions_count++] = p;
    return 0;
}

void auth_init_default(struct auth *auth)
{
    auth->users = NULL;
    auth->users_count = 0;
    init_dummy(auth);
    unsigned char salt[4], hash[32];
    RAND_bytes(salt, sizeof salt);
    hash_with_salt(salt, (const uint8_t *)"guest", 5, hash);
    add_user(auth, "guest", salt, hash, "/", true, AUTH_TAG_ADMINISTRATOR);
}

void auth_hash_password(const char *password, char *out, size_t out_size)
{
    unsigned char raw[36];
    RAND_bytes(raw, 4);
    hash_with_salt(raw, (const uint8_t *)password, strlen(password), raw + 4);
    ASSERT(out_size >= 49);
    EVP_EncodeBlock((unsigned char *)out, raw, sizeof raw);
}

int auth_parse_tags(const char *text, unsigned *tags, char *bad, size_t bad_size)
{
    static const struct {
        const char *name;
        enum auth_tag tag;
    } known[] = {{"management", AUTH_TAG_MANAGEMENT},
                 {"policymaker", AUTH_TAG_POLICYMAKER},
                 {"monitoring", AUTH_TAG_MONITORING},
                 {"administrator", AUTH_TAG_ADMINISTRATOR}};
    *tags = 0;
    for (const char *p = text; *p != '\0';) {
        size_t n = strcspn(p, ",");
        size_t i = 0;
        while (i < sizeof known / sizeof known[0] &&
               !(strlen(known[i].name) == n && memcmp(known[i].name, p, n) == 0))
            i++;
        if (i == sizeof known / sizeof known[0]) {
            snprintf(bad, bad_size, "%.*s", (int)n, p);
            return -1;
        }
        *tags |= (unsigned)known[i].tag;
        p += n;
        if (*p == ',' && *++p == '\0') { /* "a," names an empty tag */
            snprintf(bad, bad_size, "%s", "");
            return -1;
        }
    }
    return 0;
}

/* The optional words after VHOSTS: "loopback" and "tags=...", each at most
 * once. Returns 0, or -1 with why in err. */
static int parse_options(char *save, bool *loopback, unsigned *tags, char *err, size_t err_size)
{
    bool seen_tags = false;
    *loopback = false;
    *tags = 0;
    for (char *word; (word = strtok_r(NULL, " \t\r\n", &save)) != NULL;) {
        if (strcmp(word, "loopback") == 0 && !*loopback) {
            *loopback = true;
        } else if (strncmp(word, "tags=", 5) == 0 && !seen_tags) {
            seen_tags = true;
            char bad[64];
            if (auth_parse_tags(word + 5, tags, bad, sizeof bad) != 0) {
                snprintf(err, err_size, "unknown tag '%s' (administrator, monitoring, "
                         "policymaker, management)", bad);
                return -1;
            }
        } else {
            snprintf(err, err_size, "unexpected '%.64s' (each of loopback, tags=... once)",
                     word);
            return -1;
        }
    }
    return 0;
}

int auth_load_file(struct auth *auth, const char *path, char *err, size_t err_size)
{
    auth->users = NULL;
    auth->users_count = 0;
    init_dummy(auth);
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
        if (strcmp(name, "permission") == 0) {
            char why[256];
            if (parse_permission(auth, save, why, sizeof why) != 0) {
                snprintf(err, err_size, "%s:%d: %s", path, lineno, why);
                fclose(f);
                auth_free(auth);
                return -1;
            }
            continue;
        }
        char *hash64 = strtok_r(NULL, " \t\r\n", &save);
        char *vhosts = strtok_r(NULL, " \t\r\n", &save);
        unsigned char raw[48];
        int n = hash64 ? EVP_DecodeBlock(raw, (const unsigned char *)hash64, (int)strlen(hash64))
                       : -1;
        bool loopback;
        unsigned tags;
        char why[160] = "";
        /* EVP_DecodeBlock counts base64 padding as data: 36 bytes -> 36. */
        if (!vhosts || n < 36 || parse_options(save, &loopback, &tags, why, sizeof why) != 0) {
            snprintf(err, err_size, "%s:%d: expected NAME HASH VHOSTS [loopback] "
                     "[tags=TAG[,TAG...]]%s%s", path, lineno, why[0] ? ": " : "", why);
            fclose(f);
            auth_free(auth);
            return -1;
        }
        add_user(auth, name, raw, raw + 4, vhosts, loopback, tags);
    }
    fclose(f);
    return 0;
}

void auth_free(struct auth *auth)
{
    for (size_t i = 0; i < auth->users_count; i++) {
        free(auth->users[i].name);
        free(auth->users[i].vhosts);
        for (size_t j = 0; j < auth->users[i].permissions_count; j++)
            permission_free(&auth->users[i].permissions[j]);
        free(auth->users[i].permissions);
    }
    free(auth->users);
    auth->users = NULL;
    auth->users_count = 0;
}

const struct auth_user *auth_find_user(const struct auth *auth, struct bytes user)
{
    for (size_t i = 0; i < auth->users_count; i++) {
        if (bytes_equal_cstr(user, auth->users[i].name))
            return &auth->users[i];
    }
    return NULL;
}

enum auth_verdict auth_login(const struct auth *auth, struct bytes user, struct bytes password,
                             bool peer_loopback, const struct auth_user **out)
{
    *out = NULL;
    const struct auth_user *found = NULL;
    for (size_t i = 0; i < auth->users_count && found == NULL; i++) {
        if (bytes_equal_cstr(user, auth->users[i].name))
            found = &auth->users[i];
    }
    /* An unknown user's password is hashed too, against the dummy: the
     * refusal costs one hash either way, so timing tells no names. */
    unsigned char hash[32];
    hash_with_salt(found ? found->salt : auth->dummy_salt, password.ptr, password.len, hash);
    bool match = CRYPTO_memcmp(hash, found ? found->hash : auth->dummy_hash, sizeof hash) == 0;
    OPENSSL_cleanse(hash, sizeof hash);
    if (found == NULL || !match)
        return AUTH_VERDICT_REFUSED;
    if (found->loopback_only && !peer_loopback)
        return AUTH_VERDICT_LOOPBACK_ONLY;
    *out = found;
    return AUTH_VERDICT_OK;
}

const struct auth_user *auth_check(const struct auth *auth, struct bytes user,
                                   struct bytes password, bool peer_loopback)
{
    const struct auth_user *u;
    return auth_login(auth, user, password, peer_loopback, &u) == AUTH_VERDICT_OK ? u : NULL;
}

bool auth_user_has_tag(const struct auth_user *user, enum auth_tag tag)
{
    unsigned have = user->tags;
    if (have & AUTH_TAG_ADMINISTRATOR)
        return true;
    if (have & (AUTH_TAG_MONITORING | AUTH_TAG_POLICYMAKER))
        have |= AUTH_TAG_MANAGEMENT;
    return (have & (unsigned)tag) != 0;
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

const struct auth_permission *auth_user_permission(const struct auth_user *user,
                                                   struct bytes vhost)
{
    for (size_t i = 0; i < user->permissions_count; i++) {
        if (bytes_equal_cstr(vhost, user->permissions[i].vhost))
            return &user->permissions[i];
    }
    return NULL;
}

bool auth_permission_allows(const struct auth_permission *permission,
                            enum auth_permission_kind kind, struct bytes name)
{
    if (permission == NULL)
        return true;
    if (permission->nothing[kind])
        return false;
    /* A shortstr: at most 255 bytes. One with a NUL inside cannot be
     * searched as a C string, so it is refused. */
    char text[256];
    if (name.len >= sizeof text || (name.len && memchr(name.ptr, 0, name.len) != NULL))
        return false;
    if (name.len)
        memcpy(text, name.ptr, name.len);
    text[name.len] = '\0';
    return regexec(&permission->regexes[kind], text, 0, NULL, 0) == 0;
}

const char *auth_permission_kind_name(enum auth_permission_kind kind)
{
    static const char *const names[] = {"configure", "write", "read"};
    ASSERT((unsigned)kind < AUTH_PERMISSION_KIND_COUNT);
    return names[kind];
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
