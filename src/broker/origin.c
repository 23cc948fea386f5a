/*
 * origin.c: per-queue marks of the forwarding streams (origin.h).
 */
#include "broker/origin.h"

#include <stddef.h>

static void forget_idle(struct origin_marks *m, uint64_t now_ms)
{
    for (uint32_t i = 0; i < m->count;) {
        if (now_ms - m->marks[i].seen_ms >= ORIGIN_IDLE_MS)
            m->marks[i] = m->marks[--m->count];
        else
            i++;
    }
}

static struct origin_mark *find(struct origin_marks *m, uint64_t stream)
{
    for (uint32_t i = 0; i < m->count; i++) {
        if (m->marks[i].stream == stream)
            return &m->marks[i];
    }
    return NULL;
}

bool origin_seen(struct origin_marks *m, uint64_t stream, uint64_t seq, uint64_t now_ms,
                 uint64_t *ticket)
{
    if (stream == 0)
        return false;
    forget_idle(m, now_ms);
    struct origin_mark *mark = find(m, stream);
    if (mark == NULL || seq > mark->seq)
        return false;
    mark->seen_ms = now_ms;
    if (ticket)
        *ticket = mark->ticket;
    return true;
}

void origin_record(struct origin_marks *m, uint64_t stream, uint64_t seq, uint64_t now_ms,
                   uint64_t ticket)
{
    if (stream == 0)
        return;
    struct origin_mark *mark = find(m, stream);
    if (mark == NULL) {
        forget_idle(m, now_ms);
        if (m->count == ORIGIN_MARKS_MAX) {
            /* Full: the stream seen least recently goes (a dead link's). */
            uint32_t oldest = 0;
            for (uint32_t i = 1; i < m->count; i++) {
                if (m->marks[i].seen_ms < m->marks[oldest].seen_ms)
                    oldest = i;
            }
            m->marks[oldest] = m->marks[--m->count];
        }
        mark = &m->marks[m->count++];
        *mark = (struct origin_mark){.stream = stream};
    }
    if (seq > mark->seq)
        mark->seq = seq;
    if (ticket > mark->ticket)
        mark->ticket = ticket;
    mark->seen_ms = now_ms;
}
