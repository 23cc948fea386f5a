/*
 * sim_link.c: the data path's links (sim_data.h). One link per pair of
 * brokers, a FIFO of frames each way with its own latency (drawn from the
 * seed). It is up while the network lets both ways through and both
 * brokers live; when it goes down, everything in flight on it is lost (a
 * TCP connection reset) and both ends learn it (streams fail, forwards are
 * nacked); when it comes back it is a new link (its generation grows). A
 * basic.quay-sync at the head of a link holds it until the receiver's map
 * has the version it names (member_sync_wait), at most SIM_WAIT_MAP_MS.
 */
#include "sim_data.h"

#include <stdlib.h>
#include <string.h>

uint64_t sim_data_random_below(struct sim *s, uint64_t n)
{
    struct sim_data *d = s->data;
    d->rng ^= d->rng >> 12;
    d->rng ^= d->rng << 25;
    d->rng ^= d->rng >> 27;
    return d->rng * 2685821657736338717ull % n;
}

void sim_link_init(struct sim *s)
{
    struct sim_data *d = s->data;
    d->rng = s->seed * 0xD1B54A32D192ED03ull + 7;
    for (unsigned i = 0; i < SIM_SERVERS; i++) {
        for (unsigned j = 0; j < SIM_SERVERS; j++)
            d->links[i][j].latency_ms = 1 + (uint32_t)sim_data_random_below(s, 15);
    }
    d->net_seen = UINT64_MAX;
}

void sim_link_free(struct sim *s)
{
    for (unsigned i = 0; i < SIM_SERVERS; i++) {
        for (unsigned j = 0; j < SIM_SERVERS; j++)
            free(s->data->links[i][j].frames);
    }
}

bool sim_link_up(const struct sim *s, unsigned i, unsigned j)
{
    return i == j || s->data->up[i][j];
}

uint32_t sim_link_gen(const struct sim *s, unsigned i, unsigned j)
{
    return s->data->gen[i < j ? i : j][i < j ? j : i];
}

bool sim_link_send(struct sim *s, unsigned i, unsigned j, struct sim_frame f)
{
    struct sim_data *d = s->data;
    if (i == j || !d->up[i][j])
        return false;
    struct sim_link *l = &d->links[i][j];
    if (l->count == l->cap) {
        uint32_t cap = l->cap ? l->cap * 2 : 64;
        struct sim_frame *frames = malloc(sizeof *frames * cap);
        for (uint32_t k = 0; k < l->count; k++)
            frames[k] = l->frames[(l->head + k) % l->cap];
        free(l->frames);
        l->frames = frames;
        l->head = 0;
        l->cap = cap;
    }
    uint64_t at = raft_fixture_time(&s->f) + l->latency_ms;
    if (l->count > 0) {
        uint64_t last = l->frames[(l->head + l->count - 1) % l->cap].at_ms;
        if (last > at)
            at = last; /* in order */
    }
    f.at_ms = at;
    l->frames[(l->head + l->count) % l->cap] = f;
    l->count++;
    if (at < d->next_at)
        d->next_at = at;
    d->frames++;
    return true;
}

static void link_drop(struct sim_link *l)
{
    l->head = l->count = 0;
}

/* The links follow the network: down when either way is cut or either
 * broker is dead; a new one when both ways heal. */
static void follow_network(struct sim *s)
{
    struct sim_data *d = s->data;
    d->net_seen = s->net_changes;
    for (unsigned i = 0; i < s->f.n; i++) {
        for (unsigned j = i + 1; j < s->f.n; j++) {
            bool up = sim_net_reachable(s, i, j);
            if (up == d->up[i][j])
                continue;
            d->up[i][j] = d->up[j][i] = up;
            d->gen[i][j]++;
            if (up)
                continue;
            link_drop(&d->links[i][j]);
            link_drop(&d->links[j][i]);
            sim_data_link_down(s, i, j);
            sim_client_link_down(s, i, j);
        }
    }
}

/* Whether the frame at the head of i -> j waits for j's map. */
static bool held(const struct sim *s, unsigned j, const struct sim_frame *f, uint64_t now)
{
    return f->kind == SIM_F_SYNC && s->brokers[j].map.version < f->seq &&
           now < f->at_ms + SIM_WAIT_MAP_MS;
}

void sim_link_step(struct sim *s, uint64_t now)
{
    struct sim_data *d = s->data;
    if (d->net_seen != s->net_changes)
        follow_network(s);
    if (now < d->next_at)
        return;
    uint64_t next = UINT64_MAX;
    d->next_at = UINT64_MAX; /* (what is sent while delivering lowers it) */
    for (unsigned i = 0; i < s->f.n && !sim_failed(s); i++) {
        for (unsigned j = 0; j < s->f.n; j++) {
            struct sim_link *l = &d->links[i][j];
            while (l->count > 0 && !sim_failed(s)) {
                struct sim_frame f = l->frames[l->head];
                if (f.at_ms > now || held(s, j, &f, now))
                    break;
                l->head = (l->head + 1) % l->cap;
                l->count--;
                sim_data_receive(s, i, j, &f);
            }
            if (l->count > 0) {
                const struct sim_frame *h = &l->frames[l->head];
                uint64_t at = held(s, j, h, now) ? now + 1 : h->at_ms;
                if (at < next)
                    next = at;
            }
        }
    }
    if (next < d->next_at)
        d->next_at = next;
}
