/*
 * test_login.c: slow password checks off the loop (broker/login.h).
 *
 * Goal: a login whose check is cheap is answered at once (no callback);
 * a PBKDF2 one is answered from the loop once its check ran on the
 * thread pool, with the user on success and nothing on failure; logins
 * making the same check share one (the followers answered from the
 * cache: OK with the right password, refused with a wrong one); a
 * cancelled login is never answered, whether it waited, ran, led
 * others (who are still answered) or followed; nothing is left pending
 * or leaked (ASan) once the loop has run.
 *
 * Method: a zeroed struct broker with only its loop and users table (all
 * login.c touches), users stored with 1,000-iteration PBKDF2, and
 * uv_run until the pool's work is done.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "broker/broker.h"
#include "broker/login.h"

struct answer {
    int calls;
    enum auth_verdict verdict;
    const struct auth_user *user;
};

static void on_done(void *ctx, enum auth_verdict verdict, const struct auth_user *user)
{
    struct answer *a = ctx;
    a->calls++;
    a->verdict = verdict;
    a->user = user;
}

static struct broker *new_broker(uv_loop_t *loop)
{
    struct broker *b = calloc(1, sizeof *b);
    assert_non_null(b);
    b->loop = loop;
    auth_init(&b->auth);
    struct password_policy pbkdf2 = {.algorithm = PASSWORD_PBKDF2_SHA256, .iterations = 1000};
    auth_set_policy(&b->auth, &pbkdf2);
    struct password_hash h;
    bool created;
    auth_hash_new(&b->auth, bytes_of_cstr("pw"), &h);
    auth_user_put(&b->auth, bytes_of_cstr("ann"), &h, 0, &created);
    auth_hash_new(&b->auth, bytes_of_cstr("pw2"), &h);
    auth_user_put(&b->auth, bytes_of_cstr("bob"), &h, 0, &created);
    return b;
}

static void free_broker(struct broker *b)
{
    auth_free(&b->auth);
    free(b);
}

static struct login *start(struct broker *b, const char *user, const char *password,
                           struct answer *a)
{
    enum auth_verdict v;
    const struct auth_user *u;
    struct login *l = login_start(b, bytes_of_cstr(user), bytes_of_cstr(password), true,
                                  on_done, a, &v, &u);
    if (l == NULL) {
        a->calls++;
        a->verdict = v;
        a->user = u;
    }
    return l;
}

static void test_answers(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct broker *b = new_broker(&loop);
    struct answer ok = {0}, twin = {0}, wrong = {0}, wrong_twin = {0}, nobody = {0};
    assert_non_null(start(b, "ann", "pw", &ok));
    assert_non_null(start(b, "ann", "pw", &twin));       /* follows the first */
    assert_non_null(start(b, "bob", "nope", &wrong));
    assert_non_null(start(b, "bob", "nope", &wrong_twin));
    assert_non_null(start(b, "nobody", "pw", &nobody));  /* the dummy: slow too */
    assert_int_equal(login_pending_count(), 5);
    assert_int_equal(ok.calls + twin.calls, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(login_pending_count(), 0);
    const struct auth_user *ann = auth_find_user(&b->auth, bytes_of_cstr("ann"));
    assert_int_equal(ok.calls, 1);
    assert_int_equal(ok.verdict, AUTH_VERDICT_OK);
    assert_ptr_equal(ok.user, ann);
    assert_int_equal(twin.calls, 1);
    assert_int_equal(twin.verdict, AUTH_VERDICT_OK);
    assert_ptr_equal(twin.user, ann);
    assert_int_equal(wrong.calls, 1);
    assert_int_equal(wrong.verdict, AUTH_VERDICT_REFUSED);
    assert_null(wrong.user);
    assert_int_equal(wrong_twin.verdict, AUTH_VERDICT_REFUSED);
    assert_int_equal(nobody.verdict, AUTH_VERDICT_REFUSED);
    /* Cached now: answered at once. */
    struct answer again = {0};
    assert_null(start(b, "ann", "pw", &again));
    assert_int_equal(again.verdict, AUTH_VERDICT_OK);
    free_broker(b);
    assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_cancels(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct broker *b = new_broker(&loop);
    /* A running leader cancelled with a follower: the follower is still
     * answered. A waiting login cancelled, and a follower cancelled. */
    struct answer lead = {0}, follow = {0}, waits = {0}, gone_follower = {0}, alone = {0};
    struct login *l1 = start(b, "ann", "pw", &lead);
    struct login *l2 = start(b, "ann", "pw", &follow);
    struct login *l3 = start(b, "bob", "pw2", &waits);   /* waits if one core runs checks */
    struct login *l4 = start(b, "bob", "pw2", &gone_follower);
    struct login *l5 = start(b, "nobody", "x", &alone);
    assert_true(l1 && l2 && l3 && l4 && l5);
    login_cancel(l1);
    login_cancel(l4);
    login_cancel(l5);
    assert_int_equal(login_pending_count(), 2);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(login_pending_count(), 0);
    assert_int_equal(lead.calls, 0);
    assert_int_equal(follow.calls, 1);
    assert_int_equal(follow.verdict, AUTH_VERDICT_OK);
    assert_int_equal(waits.calls, 1);
    assert_int_equal(waits.verdict, AUTH_VERDICT_OK);
    assert_int_equal(gone_follower.calls, 0);
    assert_int_equal(alone.calls, 0);
    /* A login cancelled before the loop ever ran: nothing left behind. */
    struct answer never = {0};
    struct login *l6 = start(b, "nobody", "y", &never);
    assert_non_null(l6);
    login_cancel(l6);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(never.calls, 0);
    assert_int_equal(login_pending_count(), 0);
    free_broker(b);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answers),
        cmocka_unit_test(test_cancels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
