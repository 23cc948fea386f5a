/*
 * login.c: see login.h. One loop thread: the waiting list and the counts
 * are file-wide, so a check that ends after its broker shut down (every
 * login cancelled) touches nothing but its own memory.
 */
#include "broker/login.h"

#include <stdlib.h>
#include <uv.h>

#include "broker/broker.h"
#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/list.h"

struct login {
    uv_work_t work;
    struct broker *broker;        /* borrowed; alive while any of its group is not cancelled */
    struct auth_job *job;         /* owned */
    login_done_fn done;
    void *ctx;
    struct login *leader;         /* a follower's: whose check it waits for; else NULL */
    struct list_node followers;   /* a leader's */
    struct list_node link;        /* a leader in waiting, a follower in its leader's list */
    bool running;                 /* handed to the thread pool */
    bool cancelled;
};

static struct list_node waiting = LIST_INIT(waiting);      /* leaders, in order */
static struct list_node running_list = LIST_INIT(running_list); /* leaders in the pool */
static unsigned running_count;
static unsigned pending_count;

unsigned login_pending_count(void)
{
    return pending_count;
}

static unsigned running_max(void)
{
    unsigned n = uv_available_parallelism() / 2;
    return n > 0 ? n : 1;
}

static void free_login(struct login *l)
{
    auth_job_free(l->job);
    free(l);
}

static void on_work(uv_work_t *work)
{
    struct login *l = work->data;
    auth_job_run(l->job);
}

static void start_next(uv_loop_t *loop);

/* The followers learn from the cache what their leader's check found. */
static void answer_followers(struct login *leader)
{
    struct list_node mine = LIST_INIT(mine);
    while (!list_empty(&leader->followers)) {
        struct list_node *n = leader->followers.next;
        list_remove(n);
        list_push_back(&mine, n);
    }
    while (!list_empty(&mine)) {
        struct login *f = CONTAINER_OF(mine.next, struct login, link);
        list_remove(&f->link);
        f->leader = NULL;
        const struct auth_user *user;
        enum auth_verdict verdict = auth_login_settle(&f->broker->auth, f->job, &user);
        f->job = NULL;
        pending_count--;
        f->done(f->ctx, verdict, user);
        free(f);
    }
}

static void on_work_done(uv_work_t *work, int status)
{
    (void)status;
    struct login *l = work->data;
    uv_loop_t *loop = work->loop;
    ASSERT(running_count > 0);
    running_count--;
    list_remove(&l->link);
    if (l->cancelled && list_empty(&l->followers)) {
        free_login(l);
        start_next(loop);
        return;
    }
    const struct auth_user *user;
    enum auth_verdict verdict = auth_login_end(&l->broker->auth, l->job, &user);
    l->job = NULL;
    if (!l->cancelled) {
        pending_count--;
        l->done(l->ctx, verdict, user);
    }
    answer_followers(l);
    free(l);
    start_next(loop);
}

static void start_next(uv_loop_t *loop)
{
    while (running_count < running_max() && !list_empty(&waiting)) {
        struct login *l = CONTAINER_OF(waiting.next, struct login, link);
        list_remove(&l->link);
        list_push_back(&running_list, &l->link);
        l->running = true;
        running_count++;
        l->work.data = l;
        int rc = uv_queue_work(loop, &l->work, on_work, on_work_done);
        ASSERT(rc == 0);
    }
}

/* A leader waiting or running with the same check, or NULL. */
static struct login *same_check(const struct auth_job *job)
{
    list_for_each(n, &waiting) {
        struct login *l = CONTAINER_OF(n, struct login, link);
        if (auth_job_same(l->job, job))
            return l;
    }
    list_for_each(n, &running_list) {
        struct login *l = CONTAINER_OF(n, struct login, link);
        if (auth_job_same(l->job, job))
            return l;
    }
    return NULL;
}

struct login *login_start(struct broker *broker, struct bytes user, struct bytes password,
                          bool peer_loopback, login_done_fn done, void *ctx,
                          enum auth_verdict *verdict, const struct auth_user **out)
{
    struct auth_job *job;
    *verdict = auth_login_begin(&broker->auth, user, password, peer_loopback, out, &job);
    if (*verdict != AUTH_VERDICT_SLOW)
        return NULL;
    struct login *l = xcalloc(1, sizeof *l);
    *l = (struct login){.broker = broker, .job = job, .done = done, .ctx = ctx};
    list_init(&l->followers);
    pending_count++;
    struct login *leader = same_check(job);
    if (leader != NULL) {
        l->leader = leader;
        list_push_back(&leader->followers, &l->link);
        return l;
    }
    list_push_back(&waiting, &l->link);
    start_next(broker->loop);
    return l;
}

void login_cancel(struct login *l)
{
    ASSERT(!l->cancelled);
    l->cancelled = true;
    pending_count--;
    if (l->leader != NULL) {
        list_remove(&l->link);
        free_login(l);
    } else if (!l->running && list_empty(&l->followers)) {
        list_remove(&l->link);
        free_login(l);
    }
    /* else: it runs (or will) for itself or for its followers */
}
