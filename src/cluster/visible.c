/*
 * visible.c: see visible.h. Each peer remembers the highest map version it
 * told us it applied (applied_version) and the highest we asked it for
 * (asked_version): one question per version and peer is enough, however
 * many changes wait on it.
 */
#include "cluster/visible.h"

#include "amqp/method_gen.h"
#include "broker/broker.h"
#include "cluster/link.h"
#include "cluster/member.h"
#include "lib/assert.h"
#include "lib/log.h"

static bool peer_counts(const struct member_peer *peer)
{
    return peer->up && peer->link != NULL && link_is_up(peer->link);
}

static bool visible_everywhere(struct member *member, uint64_t version)
{
    for (uint32_t i = 0; i < member->peers_count; i++) {
        const struct member_peer *peer = member->peers[i];
        if (peer_counts(peer) && peer->applied_version < version)
            return false;
    }
    return true;
}

static void ask(struct member_peer *peer, uint64_t version)
{
    if (!peer_counts(peer) || peer->applied_version >= version ||
        peer->asked_version >= version)
        return;
    struct link_channel *ch = member_map_channel(peer);
    if (ch == NULL)
        return;
    struct method m = {.id = METHOD_BASIC_QUAY_SYNC};
    m.basic_quay_sync.version = version;
    m.basic_quay_sync.answer = true;
    link_send(ch, &m);
    peer->asked_version = version;
}

/* Ends the waits that are done: seen everywhere, or late (all: every one). */
static void end_waits(struct member *member, bool all)
{
    uint64_t now = uv_now(member->broker->loop);
    list_for_each_safe(n, &member->visible_waits) {
        struct visible_wait *w = CONTAINER_OF(n, struct visible_wait, link);
        bool late = now >= w->deadline_ms;
        if (!all && !late && !visible_everywhere(member, w->version))
            continue;
        if (late && !all)
            LOG_WARN("cluster: map version %llu not confirmed by every broker within %u ms: "
                     "answered anyway", (unsigned long long)w->version, VISIBLE_WAIT_MS);
        list_remove(&w->link);
        w->done(w);
    }
}

bool visible_wait(struct member *member, struct visible_wait *w, uint64_t version)
{
    if (member->stopping)
        return false;
    for (uint32_t i = 0; i < member->peers_count; i++)
        ask(member->peers[i], version);
    if (visible_everywhere(member, version))
        return false;
    w->version = version;
    w->deadline_ms = uv_now(member->broker->loop) + VISIBLE_WAIT_MS;
    list_push_back(&member->visible_waits, &w->link);
    return true;
}

void visible_cancel(struct visible_wait *w)
{
    if (w->link.next != NULL && list_linked(&w->link))
        list_remove(&w->link);
}

void visible_peer_answered(struct member_peer *peer, uint64_t version)
{
    if (version > peer->applied_version)
        peer->applied_version = version;
    if (!list_empty(&peer->member->visible_waits))
        end_waits(peer->member, false);
}

void visible_peer_lost(struct member_peer *peer)
{
    /* A new link or channel asks again: the peer may have restarted. */
    peer->applied_version = 0;
    peer->asked_version = 0;
    if (!peer->member->stopping && !list_empty(&peer->member->visible_waits))
        end_waits(peer->member, false);
}

void visible_tick(struct member *member)
{
    if (!list_empty(&member->visible_waits))
        end_waits(member, false);
}

void visible_stop(struct member *member)
{
    end_waits(member, true);
}
