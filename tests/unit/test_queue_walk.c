/*
 * test_queue_walk.c: broker/queue_walk.h. Goal: a walk paused between
 * steps (as GET /metrics pauses between loop turns) visits exactly the
 * queues that were there when it began and are still there when it
 * reaches them, each once, whatever is declared and deleted meanwhile,
 * and never reads a freed queue (this runs under ASan in the sanitized
 * build). Method: a real vhost and its queues, declared and deleted
 * between the walk's steps; the names a walk returns are checked against
 * the expected list.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "bare_broker.h"
#include "broker/broker.h"
#include "broker/message.h"
#include "broker/queue.h"
#include "broker/queue_walk.h"
#include "broker/vhost.h"

static struct broker broker;
static struct vhost *vhost;

static int setup(void **state)
{
    (void)state;
    bare_broker_init(&broker);
    vhost = vhost_new(&broker, BYTES_LIT("/"));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    vhost_free(vhost);
    uv_run(broker.loop, UV_RUN_NOWAIT);
    /* Every queue object left the list when it was freed. */
    assert_true(list_empty(&broker.queues_all));
    return 0;
}

static struct queue *declare(const char *name)
{
    return vhost_queue_declare(vhost, bytes_of_cstr(name), false, false, false,
                               (struct bytes){0});
}

static void delete(const char *name)
{
    struct queue *q = vhost_queue(vhost, bytes_of_cstr(name));
    assert_non_null(q);
    vhost_queue_delete(vhost, q);
}

static size_t list_size(void)
{
    size_t n = 0;
    list_for_each(node, &broker.queues_all) n++;
    return n;
}

/* The walk's next queue is the one named, or the end (NULL). */
static void expect_next(struct queue_walk *walk, const char *name)
{
    struct queue *q = queue_walk_next(walk);
    if (name == NULL) {
        assert_null(q);
        return;
    }
    assert_non_null(q);
    assert_int_equal(q->name.len, strlen(name));
    assert_memory_equal(q->name.ptr, name, q->name.len);
    assert_false(q->deleted);
}

static void visits_each_queue_once_in_join_order(void **state)
{
    (void)state;
    declare("a");
    declare("b");
    declare("c");
    struct queue_walk walk;
    queue_walk_begin(&walk, &broker);
    expect_next(&walk, "a");
    expect_next(&walk, "b");
    expect_next(&walk, "c");
    expect_next(&walk, NULL);
    expect_next(&walk, NULL); /* done stays done */
    queue_walk_end(&walk);
}

static void skips_queues_deleted_ahead_of_it(void **state)
{
    (void)state;
    declare("a");
    declare("b");
    declare("c");
    struct queue_walk walk;
    queue_walk_begin(&walk, &broker);
    expect_next(&walk, "a");
    delete("b");
    expect_next(&walk, "c");
    expect_next(&walk, NULL);
    queue_walk_end(&walk);
}

/* The queue the walk stands on is deleted: it is kept (referenced and
 * linked) until the walk steps off it, then freed, and the walk goes on
 * to its successor. */
static void goes_on_from_a_queue_deleted_under_it(void **state)
{
    (void)state;
    declare("a");
    declare("b");
    declare("c");
    struct queue_walk walk;
    queue_walk_begin(&walk, &broker);
    expect_next(&walk, "a");
    expect_next(&walk, "b");
    delete("b");
    assert_int_equal(list_size(), 3); /* b: deleted, still linked: the walk holds it */
    expect_next(&walk, "c");
    assert_int_equal(list_size(), 2); /* b freed once the walk left it */
    delete("c");
    delete("a");
    expect_next(&walk, NULL);
    assert_int_equal(list_size(), 0);
    queue_walk_end(&walk);
}

/* Declared after the walk began (the table grows and rehashes meanwhile:
 * no matter), or deleted and declared again under the same name: not
 * visited, so no name is written twice. */
static void leaves_out_queues_that_joined_after_it_began(void **state)
{
    (void)state;
    declare("a");
    declare("b");
    struct queue_walk walk;
    queue_walk_begin(&walk, &broker);
    expect_next(&walk, "a");
    delete("a");
    declare("a"); /* a new object under the old name */
    char name[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "new-%d", i);
        declare(name);
    }
    expect_next(&walk, "b");
    expect_next(&walk, NULL);
    queue_walk_end(&walk);
    /* A walk begun now sees them all. */
    queue_walk_begin(&walk, &broker);
    expect_next(&walk, "b");
    expect_next(&walk, "a");
    expect_next(&walk, "new-0");
    queue_walk_end(&walk);
    queue_walk_end(&walk); /* idempotent */
    assert_null(queue_walk_next(&walk));
}

/* A walk ended while standing on a deleted queue frees it. */
static void end_lets_a_deleted_queue_go(void **state)
{
    (void)state;
    declare("a");
    declare("b");
    struct queue_walk walk;
    queue_walk_begin(&walk, &broker);
    expect_next(&walk, "a");
    delete("a");
    assert_int_equal(list_size(), 2);
    queue_walk_end(&walk);
    assert_int_equal(list_size(), 1);
}

/* A queue put back in a table (a cluster's stand-in swapped in and out)
 * keeps its place; an empty broker ends a walk at once. */
static void empty_and_reinserted(void **state)
{
    (void)state;
    struct queue_walk walk;
    queue_walk_begin(&walk, &broker);
    expect_next(&walk, NULL);
    queue_walk_end(&walk);
    struct queue *a = declare("a");
    declare("b");
    broker_queue_joined(&broker, a);
    assert_int_equal(list_size(), 2);
    queue_walk_begin(&walk, &broker);
    expect_next(&walk, "a");
    expect_next(&walk, "b");
    expect_next(&walk, NULL);
    queue_walk_end(&walk);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(visits_each_queue_once_in_join_order, setup, teardown),
        cmocka_unit_test_setup_teardown(skips_queues_deleted_ahead_of_it, setup, teardown),
        cmocka_unit_test_setup_teardown(goes_on_from_a_queue_deleted_under_it, setup, teardown),
        cmocka_unit_test_setup_teardown(leaves_out_queues_that_joined_after_it_began, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(end_lets_a_deleted_queue_go, setup, teardown),
        cmocka_unit_test_setup_teardown(empty_and_reinserted, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
