/*
 * sim_client.c: the data path's clients (sim_data.h). Publishers send
 * confirmed publishes through any broker that serves; a broker that is not
 * the queue's primary in its map forwards the publish to the primary over
 * their link, naming the queue's epoch in its map (forward.c); the
 * primary takes it when fence_forward_fresh says it may, parks it while
 * its map lags the epoch (fence_map_behind, member_park_forward), else
 * refuses it. A publish whose confirm does not come (a nack, its link or
 * its broker died) is sent again later, through any broker, until one
 * does. Consumers take the oldest message of a queue at its primary and
 * ack it.
 */
#include "sim_data.h"

#include "cluster/fence.h"

#define SIM_PUBLISHES_PER_TICK 4   /* at most: 0 .. this - 1, drawn */
#define SIM_CONSUMES_PER_TICK 2

static uint64_t now_ms(struct sim *s)
{
    return raft_fixture_time(&s->f);
}

static bool serves(const struct sim *s, unsigned i)
{
    return s->f.servers[i].alive && s->brokers[i].synced && !s->brokers[i].forgotten;
}

static void retry_later(struct sim *s, struct sim_msg *m)
{
    m->state = SIM_MSG_WAITING;
    m->retry_ms = now_ms(s) + 50 + sim_data_random_below(s, 400);
}

void sim_client_answer(struct sim *s, uint32_t msg, uint32_t attempt, bool ok)
{
    struct sim_msg *m = &s->data->msgs[msg];
    if (m->state != SIM_MSG_INFLIGHT || m->attempt != attempt)
        return; /* an answer to an attempt the publisher gave up */
    if (!ok) {
        retry_later(s, m);
        return;
    }
    m->state = SIM_MSG_CONFIRMED;
    m->confirmed_ms = now_ms(s);
    s->data->client_confirms++;
}

/* One attempt of msg through broker c (connected to it now). */
static void publish_through(struct sim *s, uint32_t msg, unsigned c)
{
    struct sim_msg *m = &s->data->msgs[msg];
    struct sim_broker *b = &s->brokers[c];
    const struct map_queue *q = cluster_map_queue(&b->map, B("/"), B(sim_queue_names[m->queue]));
    m->attempt++;
    m->state = SIM_MSG_INFLIGHT;
    m->via = m->to = (uint8_t)c;
    if (q == NULL || !q->available) {
        retry_later(s, m);
        return;
    }
    if (q->primary_id == b->id) {
        sim_data_publish(s, c, m->queue, msg, m->attempt, c, 0);
        return;
    }
    unsigned p = q->primary_id - 1;
    struct sim_frame f = {.kind = SIM_F_FORWARD, .queue = m->queue, .epoch = q->epoch,
                          .msg = msg, .attempt = m->attempt};
    m->to = (uint8_t)p;
    if (!sim_link_send(s, c, p, f))
        retry_later(s, m); /* (quay waits for the link a while first) */
}

static void park(struct sim *s, unsigned from, unsigned p, const struct sim_frame *f)
{
    struct sim_data *d = s->data;
    if (d->parked_count[p] == SIM_PARKED_MAX) {
        sim_link_send(s, p, from, (struct sim_frame){.kind = SIM_F_ANSWER, .msg = f->msg,
                                                    .attempt = f->attempt});
        return;
    }
    d->parked[p][d->parked_count[p]++] =
        (struct sim_parked){.f = *f, .since = now_ms(s), .gen = sim_link_gen(s, from, p),
                            .from = (uint8_t)from};
}

/* A forward at its primary p (member_forward_fresh, member_map_behind);
 * give_up: it waited long enough for the map (member__route_parked). */
static bool route(struct sim *s, unsigned from, unsigned p, const struct sim_frame *f,
                  bool give_up)
{
    const struct sim_broker *b = &s->brokers[p];
    const struct map_queue *q = cluster_map_queue(&b->map, B("/"), B(sim_queue_names[f->queue]));
    if (!give_up && fence_map_behind(&b->map, q, f->epoch))
        return false;
    if (!give_up && fence_forward_fresh(q, b->id, f->epoch)) {
        sim_data_publish(s, p, f->queue, f->msg, f->attempt, from, sim_link_gen(s, from, p));
        return true;
    }
    /* (quay relays a forward that names an older epoch through its own
     * stand-in: fence_forward_relays; here the proxy is nacked and its
     * publisher sends it again.) */
    sim_link_send(s, p, from, (struct sim_frame){.kind = SIM_F_ANSWER, .msg = f->msg,
                                                .attempt = f->attempt});
    return true;
}

void sim_client_forward_arrives(struct sim *s, unsigned from, unsigned p, const struct sim_frame *f)
{
    if (!route(s, from, p, f, false))
        park(s, from, p, f);
}

/* Parked forwards: routed once the map has their epoch, refused after
 * SIM_WAIT_MAP_MS; gone with their link. */
void sim_client_parked_tick(struct sim *s, uint64_t now)
{
    struct sim_data *d = s->data;
    for (unsigned p = 0; p < s->f.n; p++) {
        uint32_t kept = 0;
        for (uint32_t i = 0; i < d->parked_count[p]; i++) {
            struct sim_parked w = d->parked[p][i];
            if (w.gen != sim_link_gen(s, w.from, p) || !sim_link_up(s, w.from, p) ||
                route(s, w.from, p, &w.f, now - w.since >= SIM_WAIT_MAP_MS))
                continue;
            d->parked[p][kept++] = w;
        }
        d->parked_count[p] = kept;
    }
}

/* The publishers whose attempt went through i lose their connection. */
void sim_client_killed(struct sim *s, unsigned i)
{
    struct sim_data *d = s->data;
    for (uint32_t k = 0; k < d->msgs_count; k++) {
        if (d->msgs[k].state == SIM_MSG_INFLIGHT && d->msgs[k].via == i)
            retry_later(s, &d->msgs[k]);
    }
}

/* The forwards in flight between i and j: their proxies nack them. */
void sim_client_link_down(struct sim *s, unsigned i, unsigned j)
{
    struct sim_data *d = s->data;
    for (uint32_t k = 0; k < d->msgs_count; k++) {
        struct sim_msg *m = &d->msgs[k];
        if (m->state == SIM_MSG_INFLIGHT && m->via != m->to &&
            ((m->via == i && m->to == j) || (m->via == j && m->to == i)))
            retry_later(s, m);
    }
}

static int pick_broker(struct sim *s)
{
    unsigned c = (unsigned)sim_data_random_below(s, s->f.n);
    for (unsigned k = 0; k < s->f.n; k++, c = (c + 1) % s->f.n) {
        if (serves(s, c))
            return (int)c;
    }
    return -1;
}

void sim_client_tick(struct sim *s, uint64_t now)
{
    struct sim_data *d = s->data;
    /* Publishers send again what was not confirmed. */
    for (uint32_t k = 0; k < d->msgs_count; k++) {
        struct sim_msg *m = &d->msgs[k];
        int c;
        if (m->state == SIM_MSG_WAITING && now >= m->retry_ms && (c = pick_broker(s)) >= 0)
            publish_through(s, k, (unsigned)c);
    }
    uint64_t n = sim_data_random_below(s, SIM_PUBLISHES_PER_TICK);
    for (uint64_t k = 0; k < n && d->msgs_count < SIM_MSGS_MAX; k++) {
        int c = pick_broker(s);
        if (c < 0)
            break;
        uint32_t msg = d->msgs_count++;
        d->msgs[msg] = (struct sim_msg){.queue = (uint8_t)sim_data_random_below(s, SIM_QUEUES)};
        publish_through(s, msg, (unsigned)c);
    }
    /* Consumers: at whichever broker holds a queue as its primary. */
    for (unsigned k = 0; k < SIM_CONSUMES_PER_TICK; k++) {
        unsigned qi = (unsigned)sim_data_random_below(s, SIM_QUEUES);
        for (unsigned p = 0; p < s->f.n; p++) {
            if (serves(s, p))
                sim_data_consume(s, p, qi);
        }
    }
}
