/*
 * test_outbox.c: the leader's outbox (cluster/outbox.h) proposes what was
 * added in one loop iteration as one batch, in order, at most OUTBOX_BATCH
 * entries per proposal, from copies (the caller's buffer may change at
 * once); what a proposal adds waits for the next flush; a failed proposal
 * is dropped; close drops what waits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "cluster/outbox.h"
#include "lib/errors.h"

struct seen {
    uint32_t batches;
    uint32_t sizes[64];  /* entries per batch */
    uint32_t values[4096]; /* the entries' first word, in proposal order */
    uint32_t values_count;
    int fail;            /* the answer of the next proposals */
    struct outbox *box;  /* adds one entry from inside its first proposal */
    bool add_inside;
};

static int propose(void *ctx, const struct consensus_cmd *cmds, uint32_t n)
{
    struct seen *seen = ctx;
    assert_true(n > 0 && n <= OUTBOX_BATCH);
    seen->sizes[seen->batches++] = n;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t v;
        assert_int_equal(cmds[i].size, sizeof v);
        memcpy(&v, cmds[i].bytes, sizeof v);
        seen->values[seen->values_count++] = v;
    }
    if (seen->add_inside) {
        seen->add_inside = false;
        uint32_t v = 9999;
        outbox_add(seen->box, (const uint8_t *)&v, sizeof v);
    }
    return seen->fail;
}

static void add(struct outbox *box, uint32_t v)
{
    uint32_t copy = v;
    outbox_add(box, (const uint8_t *)&copy, sizeof copy);
    copy = 0xdead; /* the outbox keeps its own copy */
}

static void on_closed(uv_handle_t *handle)
{
    (*(int *)handle->data)++;
}

struct fixture {
    uv_loop_t loop;
    struct seen seen;
    struct outbox box;
};

static int setup(void **state)
{
    static struct fixture f;
    memset(&f, 0, sizeof f);
    uv_loop_init(&f.loop);
    outbox_init(&f.box, &f.loop, propose, &f.seen);
    *state = &f;
    return 0;
}

/* Closes the outbox (its close callback runs once) and the loop. */
static void close_all(struct outbox *box, uv_loop_t *loop)
{
    int closed = 0;
    box->idle.data = &closed;
    outbox_close(box, on_closed);
    uv_run(loop, UV_RUN_DEFAULT);
    assert_int_equal(closed, 1);
    assert_int_equal(uv_loop_close(loop), 0);
}

static void test_one_iteration_one_batch(void **state)
{
    struct fixture *f = *state;
    for (uint32_t i = 0; i < 600; i++)
        add(&f->box, i);
    assert_int_equal(f->seen.batches, 0); /* nothing inside the adding call */
    uv_run(&f->loop, UV_RUN_NOWAIT);
    /* 600 entries: 256 + 256 + 88, in the order added. */
    assert_int_equal(f->seen.batches, 3);
    assert_int_equal(f->seen.sizes[0], OUTBOX_BATCH);
    assert_int_equal(f->seen.sizes[1], OUTBOX_BATCH);
    assert_int_equal(f->seen.sizes[2], 600 - 2 * OUTBOX_BATCH);
    for (uint32_t i = 0; i < 600; i++)
        assert_int_equal(f->seen.values[i], i);
    /* Nothing more: the idle handle stopped, the loop has nothing to do. */
    assert_int_equal(uv_run(&f->loop, UV_RUN_NOWAIT), 0);
    assert_int_equal(f->seen.batches, 3);

    /* A later iteration is a new batch. */
    add(&f->box, 1000);
    add(&f->box, 1001);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    assert_int_equal(f->seen.batches, 4);
    assert_int_equal(f->seen.sizes[3], 2);

    close_all(&f->box, &f->loop);
}

static void test_added_while_proposing_waits(void **state)
{
    struct fixture *f = *state;
    f->seen.box = &f->box;
    f->seen.add_inside = true;
    add(&f->box, 1);
    add(&f->box, 2);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    assert_int_equal(f->seen.batches, 1);
    assert_int_equal(f->seen.values_count, 2);
    uv_run(&f->loop, UV_RUN_NOWAIT); /* the entry added inside: not lost */
    assert_int_equal(f->seen.batches, 2);
    assert_int_equal(f->seen.values[2], 9999);

    /* A failed proposal is dropped (its requester sends it again). */
    f->seen.fail = E_NOMEM;
    add(&f->box, 3);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    assert_int_equal(f->seen.batches, 3);
    f->seen.fail = OK;
    assert_int_equal(uv_run(&f->loop, UV_RUN_NOWAIT), 0);
    assert_int_equal(f->seen.batches, 3);

    /* Close drops what waits: no proposal after it. */
    add(&f->box, 4);
    close_all(&f->box, &f->loop);
    assert_int_equal(f->seen.batches, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_one_iteration_one_batch, setup),
        cmocka_unit_test_setup(test_added_while_proposing_waits, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
