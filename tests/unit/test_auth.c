/*
 * test_auth.c: the users table (broker/auth.h): the users file with its
 * optional loopback and tags= words, logins and their verdicts, and what
 * each management tag includes.
 *
 * Goal: old files (no tags) still load, with no tags; tags and loopback
 * come in either order, once each; an unknown tag, a repeated word or any
 * other word refuses the whole file; a login is OK only with the right
 * password, REFUSED alike for an unknown user and a wrong password, and
 * LOOPBACK_ONLY only with the right password from a remote peer; the
 * default guest is a loopback-only administrator; administrator includes
 * every tag, monitoring and policymaker include management and nothing
 * else. Permission lines compile their three regexes once; a user and
 * vhost without one has full access; the regexes are searched unanchored
 * (RabbitMQ's re:run), "" matches nothing, a bad regex, an unknown or
 * later-defined user, a repeated line or a wrong word count refuses the
 * file.
 *
 * Method: write users files to a temporary directory with hashes from
 * auth_hash_password, load them and log in.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker/auth.h"

static char path[64];

/* Writes text (with %s for a hash of "pw") to a fresh file; loads it. */
static int load(struct auth *auth, const char *format, char *err, size_t err_size)
{
    char hash[PASSWORD_TEXT_MAX + 1];
    static const struct password_policy sha256 = {.algorithm = PASSWORD_SHA256};
    auth_hash_password(&sha256, "pw", hash, sizeof hash);
    char text[2048];
    snprintf(text, sizeof text, format, hash, hash, hash, hash, hash, hash);
    snprintf(path, sizeof path, "/tmp/quay-test-auth-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    int rc = auth_load_file(auth, path, err, err_size);
    unlink(path);
    return rc;
}

static const struct auth_user *user_named(const struct auth *auth, const char *name)
{
    for (size_t i = 0; i < auth->users_count; i++) {
        if (strcmp(auth->users[i]->name, name) == 0)
            return auth->users[i];
    }
    fail_msg("no user %s", name);
    return NULL;
}

static void test_users_file_tags(void **state)
{
    (void)state;
    struct auth auth;
    char err[256] = "";
    assert_int_equal(load(&auth,
                          "# old lines load as they did\n"
                          "old %s /\n"
                          "local %s / loopback\n"
                          "adm %s * tags=administrator\n"
                          "both %s /,x tags=monitoring,policymaker loopback\n"
                          "mgmt %s / loopback tags=management\n"
                          "none %s / tags=\n",
                          err, sizeof err),
                     0);
    assert_int_equal(auth.users_count, 6);
    assert_int_equal(user_named(&auth, "old")->tags, 0);
    assert_false(user_named(&auth, "old")->loopback_only);
    assert_true(user_named(&auth, "local")->loopback_only);
    assert_int_equal(user_named(&auth, "adm")->tags, AUTH_TAG_ADMINISTRATOR);
    const struct auth_user *both = user_named(&auth, "both");
    assert_int_equal(both->tags, AUTH_TAG_MONITORING | AUTH_TAG_POLICYMAKER);
    assert_true(both->loopback_only);
    assert_true(auth_user_may_open(both, bytes_of_cstr("/")));
    assert_true(auth_user_may_open(both, bytes_of_cstr("x")));
    assert_false(auth_user_may_open(both, bytes_of_cstr("y")));
    assert_int_equal(user_named(&auth, "mgmt")->tags, AUTH_TAG_MANAGEMENT);
    assert_true(user_named(&auth, "mgmt")->loopback_only);
    assert_int_equal(user_named(&auth, "none")->tags, 0);
    auth_free(&auth);
}

static void test_users_file_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "a %s / tags=admin\n",                      /* unknown tag */
        "a %s / tags=administrator,\n",             /* empty tag */
        "a %s / tags=,administrator\n",
        "a %s / tags=management tags=monitoring\n", /* twice */
        "a %s / loopback loopback\n",
        "a %s / Loopback\n",
        "a %s / administrator\n",                   /* a tag without tags= */
        "a %s / tags administrator\n",
        "a %s\n",                                   /* no vhosts */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct auth auth;
        char err[256] = "";
        assert_int_equal(load(&auth, bad[i], err, sizeof err), -1);
        assert_non_null(strstr(err, ":1: expected NAME HASH VHOSTS"));
        assert_int_equal(auth.users_count, 0);
    }
    struct auth auth;
    char err[256];
    assert_int_equal(load(&auth, "a %s / tags=root\n", err, sizeof err), -1);
    assert_non_null(strstr(err, "unknown tag 'root'"));
}

static enum auth_verdict login(struct auth *auth, const char *user, const char *password,
                               bool loopback, const struct auth_user **out)
{
    return auth_login(auth, bytes_of_cstr(user), bytes_of_cstr(password), loopback, out);
}

static void test_login_verdicts(void **state)
{
    (void)state;
    struct auth auth;
    char err[256];
    assert_int_equal(load(&auth, "remote %s /\nlocal %s / loopback\n", err, sizeof err), 0);
    const struct auth_user *u = (const struct auth_user *)&auth; /* not NULL */
    assert_int_equal(login(&auth, "remote", "pw", false, &u), AUTH_VERDICT_OK);
    assert_ptr_equal(u, user_named(&auth, "remote"));
    assert_int_equal(login(&auth, "remote", "wrong", true, &u), AUTH_VERDICT_REFUSED);
    assert_null(u);
    assert_int_equal(login(&auth, "nobody", "pw", true, &u), AUTH_VERDICT_REFUSED);
    assert_null(u);
    assert_int_equal(login(&auth, "", "", true, &u), AUTH_VERDICT_REFUSED);
    assert_int_equal(login(&auth, "local", "pw", true, &u), AUTH_VERDICT_OK);
    assert_int_equal(login(&auth, "local", "pw", false, &u), AUTH_VERDICT_LOOPBACK_ONLY);
    assert_null(u);
    /* A wrong password from afar says nothing about the loopback rule. */
    assert_int_equal(login(&auth, "local", "wrong", false, &u), AUTH_VERDICT_REFUSED);
    /* auth_check (AMQP) folds the refusals together. */
    assert_null(auth_check(&auth, bytes_of_cstr("local"), bytes_of_cstr("pw"), false));
    assert_non_null(auth_check(&auth, bytes_of_cstr("local"), bytes_of_cstr("pw"), true));
    auth_free(&auth);
}

static void test_default_guest(void **state)
{
    (void)state;
    struct auth auth;
    static const struct password_policy sha256 = {.algorithm = PASSWORD_SHA256};
    auth_init_default(&auth, &sha256);
    const struct auth_user *u;
    assert_int_equal(login(&auth, "guest", "guest", true, &u), AUTH_VERDICT_OK);
    assert_true(auth_user_has_tag(u, AUTH_TAG_ADMINISTRATOR));
    assert_int_equal(login(&auth, "guest", "guest", false, &u), AUTH_VERDICT_LOOPBACK_ONLY);
    assert_int_equal(login(&auth, "guest", "Guest", true, &u), AUTH_VERDICT_REFUSED);
    auth_free(&auth);
}

static void test_tag_inclusion(void **state)
{
    (void)state;
    static const enum auth_tag all[] = {AUTH_TAG_MANAGEMENT, AUTH_TAG_POLICYMAKER,
                                        AUTH_TAG_MONITORING, AUTH_TAG_ADMINISTRATOR};
    /* Rows: the user's one tag (0: none); columns: has_tag of each of all[]. */
    static const struct {
        unsigned tags;
        bool has[4];
    } rows[] = {
        {0, {false, false, false, false}},
        {AUTH_TAG_MANAGEMENT, {true, false, false, false}},
        {AUTH_TAG_POLICYMAKER, {true, true, false, false}},
        {AUTH_TAG_MONITORING, {true, false, true, false}},
        {AUTH_TAG_ADMINISTRATOR, {true, true, true, true}},
        {AUTH_TAG_POLICYMAKER | AUTH_TAG_MONITORING, {true, true, true, false}},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        struct auth_user u = {.tags = rows[r].tags};
        for (size_t t = 0; t < 4; t++)
            assert_int_equal(auth_user_has_tag(&u, all[t]), rows[r].has[t]);
    }
}

static bool allows(const struct auth_user *u, const char *vhost, enum auth_permission_kind kind,
                   const char *name)
{
    return auth_permission_allows(auth_user_permission(u, bytes_of_cstr(vhost)), kind,
                                  bytes_of_cstr(name));
}

static void test_permissions(void **state)
{
    (void)state;
    struct auth auth;
    char err[256] = "";
    assert_int_equal(load(&auth,
                          "u %s /,v\n"
                          "free %s /\n"
                          "# configure, write, read\n"
                          "permission u / ^mine- ^amq\\.default$|^mine- \"\"\n"
                          "permission u v .* mine .*\n",
                          err, sizeof err),
                     0);
    const struct auth_user *u = user_named(&auth, "u");
    assert_int_equal(u->permissions_count, 2);
    assert_true(allows(u, "/", AUTH_PERMISSION_CONFIGURE, "mine-x"));
    assert_false(allows(u, "/", AUTH_PERMISSION_CONFIGURE, "other"));
    assert_false(allows(u, "/", AUTH_PERMISSION_CONFIGURE, "x-mine-"));
    assert_true(allows(u, "/", AUTH_PERMISSION_WRITE, "amq.default"));
    assert_false(allows(u, "/", AUTH_PERMISSION_WRITE, "amq.defaults"));
    assert_true(allows(u, "/", AUTH_PERMISSION_WRITE, "mine-q"));
    assert_false(allows(u, "/", AUTH_PERMISSION_READ, "mine-q")); /* "" */
    assert_false(allows(u, "/", AUTH_PERMISSION_READ, ""));
    /* Unanchored, as RabbitMQ's re:run. */
    assert_true(allows(u, "v", AUTH_PERMISSION_WRITE, "not-mine-either"));
    assert_false(allows(u, "v", AUTH_PERMISSION_WRITE, "other"));
    /* No line for the vhost, or none at all: full access. */
    assert_null(auth_user_permission(u, bytes_of_cstr("w")));
    assert_true(allows(u, "w", AUTH_PERMISSION_READ, "anything"));
    assert_true(allows(user_named(&auth, "free"), "/", AUTH_PERMISSION_CONFIGURE, "x"));
    /* A name with a NUL inside is refused by a regex. */
    struct bytes nul = {(const uint8_t *)"mine-\0x", 7};
    assert_false(auth_permission_allows(auth_user_permission(u, bytes_of_cstr("/")),
                                        AUTH_PERMISSION_CONFIGURE, nul));
    assert_string_equal(auth_permission_kind_name(AUTH_PERMISSION_READ), "read");
    auth_free(&auth);
}

static void test_permissions_refused(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *why;
    } bad[] = {
        {"u %s /\npermission u / ( .* .*\n", "bad configure regex '('"},
        {"u %s /\npermission u / .* .* [a\n", "bad read regex '[a'"},
        {"u %s /\npermission nobody / .* .* .*\n", "unknown user 'nobody'"},
        {"permission u / .* .* .*\nu %s /\n", "unknown user 'u'"},
        {"u %s /\npermission u / .* .*\n", "expected permission USER VHOST"},
        {"u %s /\npermission u / .* .* .* .*\n", "expected permission USER VHOST"},
        {"u %s /\npermission u / .* .* .*\npermission u / a b c\n", "a second permission"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct auth auth;
        char err[256] = "";
        assert_int_equal(load(&auth, bad[i].text, err, sizeof err), -1);
        if (strstr(err, bad[i].why) == NULL)
            fail_msg("case %zu: '%s' lacks '%s'", i, err, bad[i].why);
        assert_int_equal(auth.users_count, 0);
    }
}

/* Changes while running: a put changes the user in place (a connection's
 * reference sees it), a delete leaves the user alive until its last
 * reference goes, permissions are put, replaced and removed, a bad regex
 * changes nothing, and RabbitMQ's hash format decodes only when it is one. */
static void test_runtime_changes(void **state)
{
    (void)state;
    struct auth auth;
    auth_init(&auth);
    struct password_hash raw;
    auth_hash_new(&auth, bytes_of_cstr("pw"), &raw);
    bool created;
    struct auth_user *u = auth_user_put(&auth, bytes_of_cstr("ann"), &raw, 0, &created);
    assert_true(created);
    const struct auth_user *held = auth_check(&auth, bytes_of_cstr("ann"), bytes_of_cstr("pw"),
                                              true);
    assert_ptr_equal(held, u);
    auth_user_ref(held); /* as a connection does */
    assert_ptr_equal(auth_user_put(&auth, bytes_of_cstr("ann"), &raw, AUTH_TAG_MANAGEMENT,
                                   &created), u);
    assert_false(created);
    assert_true(auth_user_has_tag(held, AUTH_TAG_MANAGEMENT));
    const char *texts[] = {"^a-", "", ".*"};
    char err[256];
    assert_int_equal(auth_permission_put(u, bytes_of_cstr("v"), texts, err, sizeof err), 1);
    assert_true(auth_user_may_open(held, bytes_of_cstr("v")));
    assert_true(auth_user_allows(held, bytes_of_cstr("v"), AUTH_PERMISSION_CONFIGURE,
                                 bytes_of_cstr("a-1")));
    assert_false(auth_user_allows(held, bytes_of_cstr("v"), AUTH_PERMISSION_CONFIGURE,
                                  bytes_of_cstr("b")));
    assert_false(auth_user_allows(held, bytes_of_cstr("v"), AUTH_PERMISSION_WRITE,
                                  bytes_of_cstr("a-1")));
    const char *bad[] = {"(", ".*", ".*"};
    assert_int_equal(auth_permission_put(u, bytes_of_cstr("v"), bad, err, sizeof err), -1);
    assert_non_null(strstr(err, "bad configure regex"));
    assert_string_equal(auth_user_permission(u, bytes_of_cstr("v"))->texts[0], "^a-");
    const char *all[] = {".*", ".*", ".*"};
    assert_int_equal(auth_permission_put(u, bytes_of_cstr("v"), all, err, sizeof err), 0);
    assert_true(auth_user_allows(held, bytes_of_cstr("v"), AUTH_PERMISSION_WRITE,
                                 bytes_of_cstr("x")));
    /* No permission: nothing, on a vhost it has open too (cleared). */
    assert_true(auth_permission_delete(u, bytes_of_cstr("v")));
    assert_false(auth_permission_delete(u, bytes_of_cstr("v")));
    assert_false(auth_user_allows(held, bytes_of_cstr("v"), AUTH_PERMISSION_READ,
                                  bytes_of_cstr("x")));
    assert_false(auth_user_may_open(held, bytes_of_cstr("v")));
    /* Deleted: out of the table, no login, alive while referenced. */
    assert_true(auth_user_delete(&auth, bytes_of_cstr("ann")));
    assert_false(auth_user_delete(&auth, bytes_of_cstr("ann")));
    assert_null(auth_find_user(&auth, bytes_of_cstr("ann")));
    assert_null(auth_check(&auth, bytes_of_cstr("ann"), bytes_of_cstr("pw"), true));
    assert_true(held->deleted);
    assert_string_equal(held->name, "ann");
    auth_user_unref(held); /* freed here: ASan would see a leak or a double free */
    /* RabbitMQ's format: base64 of 36 bytes, nothing else. */
    struct password_hash out;
    assert_int_equal(password_hash_parse(NULL, "rtC4mNXASyrZf6MgmEmXB1uQj829H8uHd0xcwDodPWrc9RND",
                                         48, &out), 0);
    assert_int_equal(password_hash_parse(NULL, "xx", 2, &out), -1);
    assert_int_equal(password_hash_parse(NULL, "rtC4mNXASyrZf6MgmEmXB1uQj829H8uHd0xcwDodPWrc9RN!",
                                         48, &out), -1);
    assert_int_equal(password_hash_parse(NULL, "rtC4mNXASyrZf6MgmEmXB1uQj829H8uHd0xcwDodPWrc9RND",
                                         48, &out), 0);
    bool c2;
    struct auth_user *r = auth_user_put(&auth, bytes_of_cstr("r"), &out, 0, &c2);
    char back[PASSWORD_TEXT_MAX + 1];
    auth_user_hash_text(r, back);
    assert_string_equal(back, "rtC4mNXASyrZf6MgmEmXB1uQj829H8uHd0xcwDodPWrc9RND");
    assert_string_equal(auth_user_hash_algorithm(r), "rabbit_password_hashing_sha256");
    assert_non_null(auth_check(&auth, bytes_of_cstr("r"), bytes_of_cstr("pw2"), false));
    auth_free(&auth);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_users_file_tags),
        cmocka_unit_test(test_users_file_refused),
        cmocka_unit_test(test_login_verdicts),
        cmocka_unit_test(test_default_guest),
        cmocka_unit_test(test_tag_inclusion),
        cmocka_unit_test(test_permissions),
        cmocka_unit_test(test_permissions_refused),
        cmocka_unit_test(test_runtime_changes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
