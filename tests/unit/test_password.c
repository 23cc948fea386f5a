/*
 * test_password.c: stored password hashes (broker/password.h) and the
 * logins that check them (broker/auth.h: auth_login_begin & co.).
 *
 * Goal: each of the four text forms reads back to itself and checks the
 * right password only; a form is told from its text alone and must match
 * a hashing_algorithm given with it; malformed texts (bad base64, another
 * length, PBKDF2 iterations out of bounds, leading zeros, padding) are
 * refused; hashes of other implementations (Python's hashlib for PBKDF2,
 * sha512 and md5, RabbitMQ's documented sha512 example) verify. A login
 * against a PBKDF2 user needs the slow half (AUTH_VERDICT_SLOW) until a
 * success is cached, the cache holds the right password only and a new
 * hash clears it; an unknown user and a wrong password of a sha256 user
 * pay a derivation of the dummy when the policy is PBKDF2, and are
 * refused; a user changed while its check ran is refused.
 *
 * Method: vectors computed with Python's hashlib (salt 01020304 or bytes
 * 0..15, password "secret"), and logins through the two halves as the
 * loop runs them, with 1,000 iterations to keep the test fast.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "broker/auth.h"
#include "broker/password.h"

#define SHA512_SECRET \
    "AQIDBPhTH2L5HGYB1LWOrn+YpvuQmVOXKGqgsuiJRIZTILRoEvblSJo/WAsym3IZTfuaIaK5KR2o5KwFfTv6KsxfMIE="
#define MD5_SECRET "AQIDBDgk9ci8Lfh6CKE9Y0AUfmU="
#define PBKDF2_SECRET \
    "$pbkdf2-sha256$i=1000$AAECAwQFBgcICQoLDA0ODw$Tvsru20utY6o3q7VRBeuL9h/1QqKhWhwk2PaYNRWBgY"
/* RabbitMQ's cluster operator docs: the SHA-512 hash of "some-password". */
#define SHA512_RABBIT \
    "SjWbNXaNEwcoOOZWxG6J1HCF5P83lUavsCto+wh1s9zdOfoZ/CPv6l/SSdK3RC2+1QWmJGdYt5740j3ZLf/0RbpusNc="

static int parse(const char *algorithm, const char *text, struct password_hash *out)
{
    return password_hash_parse(algorithm, text, strlen(text), out);
}

static bool verify(const struct password_hash *h, const char *password)
{
    return password_hash_verify(h, (const uint8_t *)password, strlen(password));
}

static void round_trip(const char *text, enum password_algorithm algorithm)
{
    struct password_hash h;
    assert_int_equal(parse(NULL, text, &h), 0);
    assert_int_equal(h.algorithm, algorithm);
    assert_int_equal(parse(password_algorithm_name(algorithm), text, &h), 0);
    char back[PASSWORD_TEXT_MAX + 1];
    assert_int_equal(password_hash_format(&h, back), strlen(text));
    assert_string_equal(back, text);
}

static void test_forms(void **state)
{
    (void)state;
    struct password_hash h;
    round_trip(SHA512_SECRET, PASSWORD_SHA512);
    round_trip(MD5_SECRET, PASSWORD_MD5);
    round_trip(PBKDF2_SECRET, PASSWORD_PBKDF2_SHA256);
    round_trip("rtC4mNXASyrZf6MgmEmXB1uQj829H8uHd0xcwDodPWrc9RND", PASSWORD_SHA256);
    assert_int_equal(parse(NULL, SHA512_SECRET, &h), 0);
    assert_true(verify(&h, "secret"));
    assert_false(verify(&h, "secreT"));
    assert_false(password_hash_is_slow(&h));
    assert_int_equal(parse(NULL, MD5_SECRET, &h), 0);
    assert_true(verify(&h, "secret"));
    assert_false(verify(&h, ""));
    assert_int_equal(parse(NULL, PBKDF2_SECRET, &h), 0);
    assert_int_equal(h.iterations, 1000);
    assert_true(password_hash_is_slow(&h));
    assert_true(verify(&h, "secret"));
    assert_false(verify(&h, "secret "));
    assert_int_equal(parse("rabbit_password_hashing_sha512", SHA512_RABBIT, &h), 0);
    assert_true(verify(&h, "some-password"));
    /* A name must match the text; short names are for the option only. */
    assert_int_equal(parse("rabbit_password_hashing_sha256", SHA512_SECRET, &h), -1);
    assert_int_equal(parse("rabbit_password_hashing_md5", PBKDF2_SECRET, &h), -1);
    assert_int_equal(parse("quay_password_hashing_pbkdf2_sha256", MD5_SECRET, &h), -1);
    assert_int_equal(parse("sha512", SHA512_SECRET, &h), -1);
    assert_int_equal(parse("rabbit_password_hashing_sha1", SHA512_SECRET, &h), -1);
    assert_int_equal(password_algorithm_parse("pbkdf2"), PASSWORD_PBKDF2_SHA256);
    assert_int_equal(password_algorithm_parse("bcrypt"), -1);
}

static void test_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "$",
        "AQIDBDgk9ci8Lfh6CKE9Y0AUfmU",          /* md5 without its padding */
        "AQIDBDgk9ci8Lfh6CKE9Y0AUfm==",         /* non-zero leftover bits */
        "AQIDBDgk9ci8Lfh6CKE9Y0AU fmU=",
        "$pbkdf2-sha256$i=999$AAECAwQFBgcICQoLDA0ODw$Tvsru20utY6o3q7VRBeuL9h/1QqKhWhwk2PaYNRWBgY",
        "$pbkdf2-sha256$i=10000001$AAECAwQFBgcICQoLDA0ODw$Tvsru20utY6o3q7VRBeuL9h/1QqKhWhwk2PaYNRWBgY",
        "$pbkdf2-sha256$i=01000$AAECAwQFBgcICQoLDA0ODw$Tvsru20utY6o3q7VRBeuL9h/1QqKhWhwk2PaYNRWBgY",
        "$pbkdf2-sha256$i=1000$AAECAwQFBgcICQoLDA0ODw==$Tvsru20utY6o3q7VRBeuL9h/1QqKhWhwk2PaYNRWBgY",
        "$pbkdf2-sha256$i=1000$AAECAwQFBgcICQoLDA0O$Tvsru20utY6o3q7VRBeuL9h/1QqKhWhwk2PaYNRWBgY",
        "$pbkdf2-sha256$i=1000$AAECAwQFBgcICQoLDA0ODw$Tvsru20utY6o3q7VRBeuL9h/1QqKhWhwk2PaYNRWBg",
        "$pbkdf2-sha256$i=1000$AAECAwQFBgcICQoLDA0ODw",
        "$pbkdf2-sha512$i=1000$AAECAwQFBgcICQoLDA0ODw$Tvsru20utY6o3q7VRBeuL9h/1QqKhWhwk2PaYNRWBgY",
        "$pbkdf2-sha256$i=$AAECAwQFBgcICQoLDA0ODw$Tvsru20utY6o3q7VRBeuL9h/1QqKhWhwk2PaYNRWBgY",
        "$pbkdf2-sha256$i=99999999999$AAECAwQFBgcICQoLDA0ODw$Tvsru20utY6o3q7VRBeuL9h/1QqKhWhwk2PaYNRWBgY",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct password_hash h;
        if (parse(NULL, bad[i], &h) != -1)
            fail_msg("accepted: %s", bad[i]);
    }
}

static void test_new_hashes(void **state)
{
    (void)state;
    struct password_policy pbkdf2 = {.algorithm = PASSWORD_PBKDF2_SHA256, .iterations = 1000};
    struct password_policy sha512 = {.algorithm = PASSWORD_SHA512};
    struct password_hash a, b, back;
    password_hash_new(&pbkdf2, (const uint8_t *)"pw", 2, &a);
    password_hash_new(&pbkdf2, (const uint8_t *)"pw", 2, &b);
    assert_false(password_hash_equal(&a, &b)); /* fresh salts */
    assert_true(verify(&a, "pw") && verify(&b, "pw"));
    char text[PASSWORD_TEXT_MAX + 1];
    password_hash_format(&a, text);
    assert_int_equal(strncmp(text, "$pbkdf2-sha256$i=1000$", 22), 0);
    assert_int_equal(parse(NULL, text, &back), 0);
    assert_true(password_hash_equal(&a, &back));
    password_hash_new(&sha512, (const uint8_t *)"pw", 2, &a);
    assert_int_equal(password_hash_format(&a, text), 92);
    assert_true(verify(&a, "pw"));
    password_hash_random(&pbkdf2, &a);
    assert_false(verify(&a, "pw"));
}

/* One login through the loop's two halves: the verdict, and whether the
 * slow half was needed. */
static enum auth_verdict login(struct auth *auth, const char *user, const char *password,
                               bool *slow)
{
    const struct auth_user *u;
    struct auth_job *job;
    enum auth_verdict v = auth_login_begin(auth, bytes_of_cstr(user), bytes_of_cstr(password),
                                           true, &u, &job);
    *slow = v == AUTH_VERDICT_SLOW;
    if (!*slow) {
        assert_null(job);
        return v;
    }
    assert_non_null(job);
    auth_job_run(job);
    return auth_login_end(auth, job, &u);
}

static void test_logins(void **state)
{
    (void)state;
    struct auth auth;
    auth_init(&auth);
    struct password_policy pbkdf2 = {.algorithm = PASSWORD_PBKDF2_SHA256, .iterations = 1000};
    struct password_hash h;
    bool created, slow;
    auth_hash_new(&auth, bytes_of_cstr("old"), &h); /* sha256: the default */
    auth_user_put(&auth, bytes_of_cstr("cheap"), &h, 0, &created);
    auth_set_policy(&auth, &pbkdf2);
    auth_hash_new(&auth, bytes_of_cstr("pw"), &h);
    struct auth_user *kdf = auth_user_put(&auth, bytes_of_cstr("kdf"), &h, 0, &created);
    /* A PBKDF2 user: slow until its success is cached. */
    assert_int_equal(login(&auth, "kdf", "pw", &slow), AUTH_VERDICT_OK);
    assert_true(slow);
    assert_true(kdf->verified_cached);
    assert_int_equal(login(&auth, "kdf", "pw", &slow), AUTH_VERDICT_OK);
    assert_false(slow);
    /* A wrong password is never cached, and pays every time. */
    assert_int_equal(login(&auth, "kdf", "nope", &slow), AUTH_VERDICT_REFUSED);
    assert_true(slow);
    assert_int_equal(login(&auth, "kdf", "nope", &slow), AUTH_VERDICT_REFUSED);
    assert_true(slow);
    /* Unknown user: the dummy, PBKDF2 as the policy; a sha256 user's
     * wrong password pays the dummy too; its right one is cheap. */
    assert_int_equal(login(&auth, "nobody", "pw", &slow), AUTH_VERDICT_REFUSED);
    assert_true(slow);
    assert_int_equal(login(&auth, "cheap", "pw", &slow), AUTH_VERDICT_REFUSED);
    assert_true(slow);
    assert_int_equal(login(&auth, "cheap", "old", &slow), AUTH_VERDICT_OK);
    assert_false(slow);
    /* The same hash put again (the cluster map's mirror does) keeps the
     * cache; a new one clears it and the old password fails. */
    struct password_hash same = kdf->password;
    auth_user_put(&auth, bytes_of_cstr("kdf"), &same, 0, &created);
    assert_true(kdf->verified_cached);
    auth_hash_new(&auth, bytes_of_cstr("new"), &h);
    auth_user_put(&auth, bytes_of_cstr("kdf"), &h, 0, &created);
    assert_false(kdf->verified_cached);
    assert_int_equal(login(&auth, "kdf", "pw", &slow), AUTH_VERDICT_REFUSED);
    assert_true(slow);
    assert_int_equal(login(&auth, "kdf", "new", &slow), AUTH_VERDICT_OK);
    assert_true(slow);
    /* Changed while its check ran: refused, nothing cached. */
    auth_hash_new(&auth, bytes_of_cstr("third"), &h);
    auth_user_put(&auth, bytes_of_cstr("kdf"), &h, 0, &created);
    const struct auth_user *u;
    struct auth_job *job, *twin;
    assert_int_equal(auth_login_begin(&auth, bytes_of_cstr("kdf"), bytes_of_cstr("third"), true,
                                      &u, &job), AUTH_VERDICT_SLOW);
    assert_int_equal(auth_login_begin(&auth, bytes_of_cstr("kdf"), bytes_of_cstr("third"), false,
                                      &u, &twin), AUTH_VERDICT_SLOW);
    assert_true(auth_job_same(job, twin));
    auth_job_run(job);
    auth_hash_new(&auth, bytes_of_cstr("fourth"), &h);
    auth_user_put(&auth, bytes_of_cstr("kdf"), &h, 0, &created);
    assert_int_equal(auth_login_end(&auth, job, &u), AUTH_VERDICT_REFUSED);
    assert_null(u);
    assert_false(kdf->verified_cached);
    /* A twin settled from the cache: refused here, nothing was cached. */
    assert_int_equal(auth_login_settle(&auth, twin, &u), AUTH_VERDICT_REFUSED);
    /* And loopback-only users are told so only with the right password. */
    kdf->loopback_only = true;
    assert_int_equal(auth_login(&auth, bytes_of_cstr("kdf"), bytes_of_cstr("fourth"), false, &u),
                     AUTH_VERDICT_LOOPBACK_ONLY);
    assert_int_equal(auth_login(&auth, bytes_of_cstr("kdf"), bytes_of_cstr("x"), false, &u),
                     AUTH_VERDICT_REFUSED);
    auth_free(&auth);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forms),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_new_hashes),
        cmocka_unit_test(test_logins),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
