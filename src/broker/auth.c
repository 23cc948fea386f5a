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
#include "lib/alloc.h"
#include "lib/assert.h"

static char *str_dup_n(const void *s, size_t n)
{
    char *copy = xmalloc(n + 1);
    if (n)
        memcpy(copy, s, n);
    copy[n] = '\0';
    return copy;
}

static char *str_dup(const char *s)
{
    return str_dup_n(s, strlen(s));
}

void auth_set_policy(struct auth *auth, const struct password_policy *policy)
{
    auth->policy = *policy;
    /* Fresh random dummy credentials: no password hashes to them in
     * practice, and nobody can log in with them (they belong to no user). */
    password_hash_random(policy, &auth->dummy);
}

void auth_init(struct auth *auth)
{
    auth->users = NULL;
    auth->users_count = 0;
    static const struct password_policy sha256 = {.algorithm = PASSWORD_SHA256};
    auth_set_policy(auth, &sha256);
    int ok = RAND_bytes(auth->cache_key, sizeof auth->cache_key);
    ASSERT(ok == 1);
}

/* ---- permissions ------------------------------------------------------ */

static void permission_free(struct auth_permission *p)
{
    for (int kind = 0; kind < AUTH_PERMISSION_KIND_COUNT; kind++) {
        if (!p->nothing[kind] && !p->everything[kind])
            regfree(&p->regexes[kind]);
        free(p->texts[kind]);
        p->texts[kind] = NULL;
    }
    free(p->vhost);
    p->vhost = NULL;
}

int auth_regex_check(const char *text, char *err, size_t err_size)
{
    regex_t re;
    int rc = regcomp(&re, text, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        char why[128];
        regerror(rc, &re, why, sizeof why);
        snprintf(err, err_size, "invalid regular expression '%.64s': %s", text, why);
        return -1;
    }
    regfree(&re);
    return 0;
}

/* Compiles the three regexes into p (vhost already set). Returns 0, or -1
 * with why in err and nothing left to free but p->vhost. */
static int permission_compile(struct auth_permission *p,
                              const char *const texts[AUTH_PERMISSION_KIND_COUNT], char *err,
                              size_t err_size)
{
    for (int kind = 0; kind < AUTH_PERMISSION_KIND_COUNT; kind++) {
        const char *text = texts[kind];
        p->nothing[kind] = text[0] == '\0';
        p->everything[kind] = strcmp(text, ".*") == 0;
        int rc = p->nothing[kind] || p->everything[kind]
                     ? 0 : regcomp(&p->regexes[kind], text, REG_EXTENDED | REG_NOSUB);
        if (rc != 0) {
            char why[128];
            regerror(rc, &p->regexes[kind], why, sizeof why);
            snprintf(err, err_size, "bad %s regex '%.64s': %s",
                     auth_permission_kind_name((enum auth_permission_kind)kind), text, why);
            for (int k = 0; k < kind; k++) {
                if (!p->nothing[k] && !p->everything[k])
                    regfree(&p->regexes[k]);
                free(p->texts[k]);
                p->texts[k] = NULL;
            }
            return -1;
        }
        p->texts[kind] = str_dup(text);
    }
    return 0;
}

static struct auth_permission *find_permission(const struct auth_user *user, struct bytes vhost)
{
    for (size_t i = 0; i < user->permissions_count; i++) {
        if (bytes_equal_cstr(vhost, user->permissions[i].vhost))
            return &user->permissions[i];
    }
    return NULL;
}

int auth_permission_put(struct auth_user *user, struct bytes vhost,
                        const char *const texts[AUTH_PERMISSION_KIND_COUNT], char *err,
                        size_t err_size)
{
    ASSERT(vhost.len > 0);
    struct auth_permission p = {.vhost = str_dup_n(vhost.ptr, vhost.len)};
    if (permission_compile(&p, texts, err, err_size) != 0) {
        free(p.vhost);
        return -1;
    }
    user->permissions_generation++;
    struct auth_permission *old = find_permission(user, vhost);
    if (old != NULL) {
        permission_free(old);
        *old = p;
        return 0;
    }
    struct auth_permission *grown =
        xrealloc(user->permissions, sizeof *grown * (user->permissions_count + 1));
    user->permissions = grown;
    grown[user->permissions_count++] = p;
    return 1;
}

bool auth_permission_delete(struct auth_user *user, struct bytes vhost)
{
    struct auth_permission *p = find_permission(user, vhost);
    if (p == NULL)
        return false;
    permission_free(p);
    user->permissions_generation++;
    /* Keep the order: listings show permissions as they were granted. */
    size_t i = (size_t)(p - user->permissions);
    memmove(p, p + 1, sizeof *p * (user->permissions_count - i - 1));
    user->permissions_count--;
    return true;
}

void auth_vhost_deleted(struct auth *auth, struct bytes vhost)
{
    for (size_t i = 0; i < auth->users_count; i++)
        auth_permission_delete(auth->users[i], vhost);
}

/* ---- users -------------------------------------------------------------- */

static void user_free(struct auth_user *u)
{
    for (size_t j = 0; j < u->permissions_count; j++)
        permission_free(&u->permissions[j]);
    free(u->permissions);
    free(u->name);
    OPENSSL_cleanse(&u->password, sizeof u->password);
    OPENSSL_cleanse(u->verified, sizeof u->verified);
    free(u);
}

void auth_user_ref(const struct auth_user *user)
{
    if (user == &auth_cluster_user)
        return;
    /* Rule zero: the count is bookkeeping, not the user's data; connections
     * hold users const because they never change them. */
    struct auth_user *u = (struct auth_user *)user;
    ASSERT(u->refs > 0);
    u->refs++;
}

void auth_user_unref(const struct auth_user *user)
{
    if (user == &auth_cluster_user)
        return;
    struct auth_user *u = (struct auth_user *)user;
    ASSERT(u->refs > 0);
    if (--u->refs == 0) {
        ASSERT(u->deleted);
        user_free(u);
    }
}

static struct auth_user *find_user(const struct auth *auth, struct bytes name)
{
    for (size_t i = 0; i < auth->users_count; i++) {
        if (bytes_equal_cstr(name, auth->users[i]->name))
            return auth->users[i];
    }
    return NULL;
}

const struct auth_user *auth_find_user(const struct auth *auth, struct bytes user)
{
    return find_user(auth, user);
}

struct auth_user *auth_user_put(struct auth *auth, struct bytes name,
                                const struct password_hash *hash, unsigned tags, bool *created)
{
    ASSERT(name.len > 0);
    struct auth_user *u = find_user(auth, name);
    *created = u == NULL;
    if (u == NULL) {
        struct auth_user **users = xrealloc(auth->users, sizeof *users * (auth->users_count + 1));
        auth->users = users;
        u = xcalloc(1, sizeof *u);
        u->name = str_dup_n(name.ptr, name.len);
        u->refs = 1; /* the table's */
        users[auth->users_count++] = u;
    }
    if (!password_hash_equal(&u->password, hash)) {
        u->password = *hash;
        u->verified_cached = false; /* a new password: the old one's check is void */
        OPENSSL_cleanse(u->verified, sizeof u->verified);
    }
    u->tags = tags;
    return u;
}

bool auth_user_delete(struct auth *auth, struct bytes name)
{
    for (size_t i = 0; i < auth->users_count; i++) {
        struct auth_user *u = auth->users[i];
        if (!bytes_equal_cstr(name, u->name))
            continue;
        memmove(&auth->users[i], &auth->users[i + 1],
                sizeof *auth->users * (auth->users_count - i - 1));
        auth->users_count--;
        u->deleted = true;
        auth_user_unref(u);
        return true;
    }
    return false;
}

size_t auth_user_hash_text(const struct auth_user *user, char out[PASSWORD_TEXT_MAX + 1])
{
    return password_hash_format(&user->password, out);
}

const char *auth_user_hash_algorithm(const struct auth_user *user)
{
    return password_algorithm_name(user->password.algorithm);
}

void auth_hash_new(const struct auth *auth, struct bytes password, struct password_hash *out)
{
    password_hash_new(&auth->policy, password.ptr, password.len, out);
}

/* A user of the file, with full access to each vhost of its list. */
static struct auth_user *add_user(struct auth *auth, const char *name,
                                  const struct password_hash *hash, const char *vhosts,
                                  bool loopback_only, unsigned tags)
{
    bool created;
    struct auth_user *u = auth_user_put(auth, bytes_of_cstr(name), hash, tags, &created);
    u->loopback_only = loopback_only;
    static const char *const full[AUTH_PERMISSION_KIND_COUNT] = {".*", ".*", ".*"};
    for (const char *p = vhosts; *p != '\0';) {
        size_t len = strcspn(p, ",");
        struct bytes vhost = {(const uint8_t *)p, (uint32_t)len};
        if (len == 1 && p[0] == '*')
            u->any_vhost = true;
        else if (len > 0 && find_permission(u, vhost) == NULL) {
            int rc = auth_permission_put(u, vhost, full, NULL, 0);
            ASSERT(rc == 1); /* ".*" is never compiled */
        }
        p += len + (p[len] == ',');
    }
    return u;
}

void auth_add_internal(struct auth *auth, const char *name, char *password,
                       size_t password_size)
{
    unsigned char raw[24];
    ASSERT(password_size > 2 * sizeof raw);
    int ok = RAND_bytes(raw, sizeof raw) == 1;
    ASSERT(ok); /* no randomness: nothing here is safe */
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(password + 2 * i, 3, "%02x", raw[i]);
    /* 192 random bits: a slow hash would add nothing but its cost. */
    static const struct password_policy sha256 = {.algorithm = PASSWORD_SHA256};
    struct password_hash hash;
    password_hash_new(&sha256, (const uint8_t *)password, 2 * sizeof raw, &hash);
    OPENSSL_cleanse(raw, sizeof raw);
    struct auth_user *u = add_user(auth, name, &hash, "*", true, 0);
    u->internal = true;
}

/* The (user, vhost) pairs that had a permission line: at most one each. */
struct seen_lines {
    char **keys; /* owned: "user\0vhost" as "user vhost" (names have no blanks) */
    size_t count;
};

static bool seen_before(struct seen_lines *seen, const char *user, const char *vhost)
{
    char key[600];
    snprintf(key, sizeof key, "%s %s", user, vhost);
    for (size_t i = 0; i < seen->count; i++) {
        if (strcmp(seen->keys[i], key) == 0)
            return true;
    }
    char **grown = xrealloc(seen->keys, sizeof *grown * (seen->count + 1));
    seen->keys = grown;
    grown[seen->count++] = str_dup(key);
    return false;
}

static void seen_free(struct seen_lines *seen)
{
    for (size_t i = 0; i < seen->count; i++)
        free(seen->keys[i]);
    free(seen->keys);
}

/* "permission USER VHOST CONFIGURE WRITE READ" after the word "permission"
 * (save: the rest of the line). Returns 0, or -1 with why in err. */
static int parse_permission(struct auth *auth, struct seen_lines *seen, char *save, char *err,
                            size_t err_size)
{
    char *words[6];
    int count = 0;
    for (char *word; count < 6 && (word = strtok_r(NULL, " \t\r\n", &save)) != NULL;)
        words[count++] = word;
    if (count != 5) {
        snprintf(err, err_size, "expected permission USER VHOST CONFIGURE WRITE READ");
        return -1;
    }
    struct auth_user *user = find_user(auth, bytes_of_cstr(words[0]));
    if (!user) {
        snprintf(err, err_size, "permission for unknown user '%.64s' (users come first)",
                 words[0]);
        return -1;
    }
    if (seen_before(seen, words[0], words[1])) {
        snprintf(err, err_size, "a second permission for user '%.64s' in vhost '%.64s'",
                 words[0], words[1]);
        return -1;
    }
    /* A permission is what opens a vhost (RabbitMQ): one for a vhost the
     * user's line does not name would quietly widen it. */
    if (!auth_user_may_open(user, bytes_of_cstr(words[1]))) {
        snprintf(err, err_size, "permission for user '%.64s' in vhost '%.64s', which is not "
                 "among its VHOSTS", words[0], words[1]);
        return -1;
    }
    const char *texts[AUTH_PERMISSION_KIND_COUNT];
    for (int kind = 0; kind < AUTH_PERMISSION_KIND_COUNT; kind++)
        texts[kind] = strcmp(words[2 + kind], "\"\"") == 0 ? "" : words[2 + kind];
    return auth_permission_put(user, bytes_of_cstr(words[1]), texts, err, err_size) < 0 ? -1 : 0;
}

void auth_init_default(struct auth *auth, const struct password_policy *policy)
{
    auth_init(auth);
    auth_set_policy(auth, policy);
    struct password_hash hash;
    auth_hash_new(auth, BYTES_LIT("guest"), &hash);
    add_user(auth, "guest", &hash, "/", true, AUTH_TAG_ADMINISTRATOR);
}

void auth_hash_password(const struct password_policy *policy, const char *password, char *out,
                        size_t out_size)
{
    struct password_hash hash;
    password_hash_new(policy, (const uint8_t *)password, strlen(password), &hash);
    ASSERT(out_size >= PASSWORD_TEXT_MAX + 1);
    password_hash_format(&hash, out);
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
    auth_init(auth);
    struct seen_lines seen = {0};
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
            if (parse_permission(auth, &seen, save, why, sizeof why) != 0) {
                snprintf(err, err_size, "%s:%d: %s", path, lineno, why);
                seen_free(&seen);
                fclose(f);
                auth_free(auth);
                return -1;
            }
            continue;
        }
        char *hash64 = strtok_r(NULL, " \t\r\n", &save);
        char *vhosts = strtok_r(NULL, " \t\r\n", &save);
        struct password_hash hash;
        int n = hash64 ? password_hash_parse(NULL, hash64, strlen(hash64), &hash) : -1;
        bool loopback;
        unsigned tags;
        char why[160] = "";
        if (!vhosts || n != 0 || parse_options(save, &loopback, &tags, why, sizeof why) != 0) {
            snprintf(err, err_size, "%s:%d: expected NAME HASH VHOSTS [loopback] "
                     "[tags=TAG[,TAG...]]%s%s", path, lineno, why[0] ? ": " : "", why);
            seen_free(&seen);
            fclose(f);
            auth_free(auth);
            return -1;
        }
        if (find_user(auth, bytes_of_cstr(name)) != NULL) {
            snprintf(err, err_size, "%s:%d: user '%.64s' twice", path, lineno, name);
            seen_free(&seen);
            fclose(f);
            auth_free(auth);
            return -1;
        }
        add_user(auth, name, &hash, vhosts, loopback, tags);
    }
    seen_free(&seen);
    fclose(f);
    return 0;
}

void auth_free(struct auth *auth)
{
    for (size_t i = 0; i < auth->users_count; i++) {
        auth->users[i]->deleted = true;
        auth_user_unref(auth->users[i]);
    }
    free(auth->users);
    auth->users = NULL;
    auth->users_count = 0;
}

/* ---- logins ------------------------------------------------------------------ */

struct auth_job {
    char name[256];               /* the user asked for, NUL-ended */
    uint32_t name_size;
    bool peer_loopback;
    bool known;                   /* the user existed when the job began */
    struct password_hash hash;    /* checked against: the user's, or the dummy */
    /* A wrong password's extra cost: PBKDF2 with these iterations of
     * the dummy, so that a user stored with fewer iterations than the
     * policy's fails as slowly as an unknown one. */
    struct password_hash pad;
    bool match;                   /* auth_job_run's answer */
    uint32_t password_size;
    uint8_t password[];           /* cleansed when freed */
};

/* HMAC-SHA256(cache_key, password): what auth_user.verified holds. */
static void cache_digest(const struct auth *auth, struct bytes password, unsigned char out[32])
{
    static const uint8_t empty[1];
    unsigned size = 0;
    uint8_t *r = HMAC(EVP_sha256(), auth->cache_key, (int)sizeof auth->cache_key,
                      password.len ? password.ptr : empty, password.len, out, &size);
    ASSERT(r != NULL && size == 32);
}

static enum auth_verdict admit(const struct auth_user *found, bool peer_loopback,
                               const struct auth_user **out)
{
    if (found->loopback_only && !peer_loopback)
        return AUTH_VERDICT_LOOPBACK_ONLY;
    *out = found;
    return AUTH_VERDICT_OK;
}

static struct auth_job *job_new(struct bytes user, struct bytes password, bool peer_loopback,
                                const struct password_hash *hash, bool known)
{
    struct auth_job *job = xcalloc(1, sizeof *job + password.len + 1);
    job->name_size = user.len < sizeof job->name ? user.len : (uint32_t)sizeof job->name - 1;
    if (job->name_size)
        memcpy(job->name, user.ptr, job->name_size);
    job->peer_loopback = peer_loopback;
    job->known = known && job->name_size == user.len;
    job->hash = *hash;
    job->password_size = password.len;
    if (password.len)
        memcpy(job->password, password.ptr, password.len);
    return job;
}

void auth_job_free(struct auth_job *job)
{
    if (job == NULL)
        return;
    OPENSSL_cleanse(job->password, job->password_size);
    free(job);
}

bool auth_job_same(const struct auth_job *a, const struct auth_job *b)
{
    return a->known == b->known && a->name_size == b->name_size &&
           memcmp(a->name, b->name, a->name_size) == 0 &&
           password_hash_equal(&a->hash, &b->hash) && a->password_size == b->password_size &&
           CRYPTO_memcmp(a->password, b->password, a->password_size) == 0;
}

enum auth_verdict auth_login_settle(struct auth *auth, struct auth_job *job,
                                    const struct auth_user **out)
{
    struct auth_job *again;
    enum auth_verdict verdict = auth_login_begin(
        auth, (struct bytes){(const uint8_t *)job->name, job->name_size},
        (struct bytes){job->password, job->password_size}, job->peer_loopback, out, &again);
    auth_job_free(again);
    auth_job_free(job);
    return verdict == AUTH_VERDICT_SLOW ? AUTH_VERDICT_REFUSED : verdict;
}

void auth_job_run(struct auth_job *job)
{
    job->match = password_hash_verify(&job->hash, job->password, job->password_size);
    if (!job->match && job->pad.iterations > 0)
        password_hash_verify(&job->pad, job->password, job->password_size);
}

enum auth_verdict auth_login_begin(struct auth *auth, struct bytes user, struct bytes password,
                                   bool peer_loopback, const struct auth_user **out,
                                   struct auth_job **job)
{
    *out = NULL;
    *job = NULL;
    struct auth_user *found = find_user(auth, user);
    /* Every login pays the cache's HMAC, so a hit is the only shortcut,
     * and only the right password of an existing user gets one. */
    unsigned char digest[32];
    cache_digest(auth, password, digest);
    bool cached = found != NULL && found->verified_cached &&
                  CRYPTO_memcmp(digest, found->verified, sizeof digest) == 0;
    OPENSSL_cleanse(digest, sizeof digest);
    if (cached)
        return admit(found, peer_loopback, out);
    const struct password_hash *hash = found != NULL ? &found->password : &auth->dummy;
    if (password_hash_is_slow(hash)) {
        *job = job_new(user, password, peer_loopback, hash, found != NULL);
        if (password_hash_is_slow(&auth->dummy) && auth->dummy.iterations > hash->iterations) {
            (*job)->pad = auth->dummy;
            (*job)->pad.iterations = auth->dummy.iterations - hash->iterations;
        }
        return AUTH_VERDICT_SLOW;
    }
    /* An unknown user's password is hashed too, against the dummy: the
     * refusal costs one hash either way, so timing tells no names. */
    bool match = password_hash_verify(hash, password.ptr, password.len) && found != NULL;
    if (match)
        return admit(found, peer_loopback, out);
    if (password_hash_is_slow(&auth->dummy)) {
        /* A cheap user's wrong password pays what an unknown user's does. */
        *job = job_new(user, password, peer_loopback, &auth->dummy, false);
        return AUTH_VERDICT_SLOW;
    }
    return AUTH_VERDICT_REFUSED;
}

enum auth_verdict auth_login_end(struct auth *auth, struct auth_job *job,
                                 const struct auth_user **out)
{
    *out = NULL;
    struct auth_user *found =
        job->known ? find_user(auth, (struct bytes){(const uint8_t *)job->name, job->name_size})
                   : NULL;
    /* The user may have changed while the job ran: only the hash it was
     * checked against counts. */
    enum auth_verdict verdict = AUTH_VERDICT_REFUSED;
    if (found != NULL && job->match && password_hash_equal(&found->password, &job->hash)) {
        cache_digest(auth, (struct bytes){job->password, job->password_size}, found->verified);
        found->verified_cached = true;
        verdict = admit(found, job->peer_loopback, out);
    }
    auth_job_free(job);
    return verdict;
}

enum auth_verdict auth_login(struct auth *auth, struct bytes user, struct bytes password,
                             bool peer_loopback, const struct auth_user **out)
{
    struct auth_job *job;
    enum auth_verdict verdict = auth_login_begin(auth, user, password, peer_loopback, out, &job);
    if (verdict != AUTH_VERDICT_SLOW)
        return verdict;
    auth_job_run(job);
    return auth_login_end(auth, job, out);
}

const struct auth_user *auth_check(struct auth *auth, struct bytes user,
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
    return user->any_vhost || find_permission(user, vhost) != NULL;
}

const struct auth_permission *auth_user_permission(const struct auth_user *user,
                                                   struct bytes vhost)
{
    return find_permission(user, vhost);
}

bool auth_permission_allows(const struct auth_permission *permission,
                            enum auth_permission_kind kind, struct bytes name)
{
    if (permission == NULL || permission->everything[kind])
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

bool auth_user_allows(const struct auth_user *user, struct bytes vhost,
                      enum auth_permission_kind kind, struct bytes name)
{
    const struct auth_permission *p = find_permission(user, vhost);
    if (p == NULL)
        return user->any_vhost; /* cleared while connected: nothing (RabbitMQ) */
    return auth_permission_allows(p, kind, name);
}

uint32_t auth_tag_names(unsigned tags, const char *out[4])
{
    static const struct {
        enum auth_tag tag;
        const char *name;
    } names[] = {{AUTH_TAG_ADMINISTRATOR, "administrator"},
                 {AUTH_TAG_MONITORING, "monitoring"},
                 {AUTH_TAG_POLICYMAKER, "policymaker"},
                 {AUTH_TAG_MANAGEMENT, "management"}};
    uint32_t n = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (tags & (unsigned)names[i].tag)
            out[n++] = names[i].name;
    }
    return n;
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
const struct auth_user auth_cluster_user = {.name = cluster_user_name, .any_vhost = true};

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
