/*
 * journal_queue.c: one durable queue's message log, on the loop thread.
 *
 * Owns each queue's segment list and its index of live messages (seq ->
 * segment, offset, size, delivered). Decides where every record goes, when
 * a segment rolls, when a fully acked segment is deleted (reclamation) and
 * when the live messages of a mostly acked segment are copied forward
 * (compaction); the journal thread carries the decisions out in order.
 * Never touches the disk itself except in journal_read (paging).
 *
 * Why a segment cannot always be deleted when its messages are all acked:
 * its ACK records may name messages of an older segment that still exists,
 * and deleting those ACKs would bring the messages back at recovery. So each
 * segment remembers ref_min, the oldest other segment its ACK, DELIVERED and
 * PURGE records name, and it is deleted or compacted only when no segment
 * in [ref_min, itself) exists any more. When that blocks two or more dead
 * segments behind the oldest one, the oldest is compacted whatever its live
 * ratio: copying at most one segment's live bytes frees at least two.
 */
#include "store/journal_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"

#define REF_NONE UINT64_MAX

static uint64_t publish_record_size(uint32_t blob_size)
{
    return format_record_size(8 + (uint64_t)blob_size);
}

struct journal_queue *journal__queue_new(struct journal *j, uint64_t id, struct bytes vhost,
                                         struct bytes name)
{
    ASSERT(vhost.len <= 255 && name.len <= 255);
    struct journal_queue *q = xcalloc(1, sizeof(*q));
    q->journal = j;
    q->id = id;
    format_put_u64(q->id_key, id);
    q->key_size = 4 + vhost.len + name.len;
    q->key = xmalloc(q->key_size);
    format_put_u32(q->key, vhost.len);
    if (vhost.len > 0)
        memcpy(q->key + 4, vhost.ptr, vhost.len);
    if (name.len > 0)
        memcpy(q->key + 4 + vhost.len, name.ptr, name.len);
    q->vhost = (struct bytes){q->key + 4, vhost.len};
    q->name = (struct bytes){q->key + 4 + vhost.len, name.len};
    char id_hex[17];
    snprintf(id_hex, sizeof(id_hex), "%016" PRIx64, id);
    journal__path(q->dir, j->queues_dir, id_hex);
    ASSERT(hmap_put(&j->queues, (struct bytes){q->key, q->key_size}, q) == NULL);
    ASSERT(hmap_put(&j->queue_ids, (struct bytes){q->id_key, 8}, q) == NULL);
    return q;
}

void journal__queue_release_files(struct journal_queue *q)
{
    struct journal *j = q->journal;
    for (size_t i = 0; i < q->segments_count; i++) {
        struct segment *s = &q->segments[i];
        if (s->read_fd >= 0)
            j->disk->close(j->disk->ctx, s->read_fd);
        s->read_fd = -1;
        if (s->file != NULL) {
            struct op *op = journal__op_new(OP_RELEASE, 0);
            op->file = s->file;
            journal__op_push(j, op);
            s->file = NULL;
        }
    }
}

static void compaction_end(struct journal_queue *q);

void journal__queue_free(struct journal_queue *q)
{
    if (q->compacting)
        compaction_end(q);
    for (size_t i = 0; i < q->segments_count; i++) {
        ASSERT(q->segments[i].file == NULL); /* released to the journal thread first */
        ASSERT(q->segments[i].read_fd < 0);
    }
    free(q->segments);
    free(q->entries);
    free(q->key);
    free(q);
}

struct segment *journal__segment_push(struct journal_queue *q, uint64_t number)
{
    ASSERT(q->segments_count == 0 || q->segments[q->segments_count - 1].number < number);
    ASSERT(number < UINT32_MAX); /* the index keeps segment numbers in 32 bits */
    if (q->segments_count == q->segments_cap) {
        q->segments_cap = q->segments_cap ? 2 * q->segments_cap : 8;
        q->segments = xrealloc(q->segments, q->segments_cap * sizeof(*q->segments));
    }
    struct segment *s = &q->segments[q->segments_count++];
    memset(s, 0, sizeof(*s));
    s->number = number;
    s->ref_min = REF_NONE;
    s->read_fd = -1;
    char name[32];
    snprintf(name, sizeof(name), "%016" PRIx64 ".seg", number);
    char path[JOURNAL_PATH_SIZE];
    journal__path(path, q->dir, name);
    s->file = journal__file_new(path);
    return s;
}

struct segment *journal__segment_find(struct journal_queue *q, uint64_t number)
{
    size_t lo = 0;
    size_t hi = q->segments_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (q->segments[mid].number < number)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < q->segments_count && q->segments[lo].number == number)
        return &q->segments[lo];
    return NULL;
}

static struct segment *current(struct journal_queue *q)
{
    return q->segments_count > 0 ? &q->segments[q->segments_count - 1] : NULL;
}

/* Closes the current segment (the journal thread fdatasyncs it first, so a
 * torn write can only ever be in the last segment) and starts the next. */
static struct segment *roll(struct journal_queue *q)
{
    struct journal *j = q->journal;
    struct segment *cur = current(q);
    uint64_t number = 0;
    if (cur != NULL) {
        struct op *op = journal__op_new(OP_CLOSE, 0);
        op->file = cur->file;
        journal__op_push(j, op);
        number = cur->number + 1;
        q->maintain_pending = true; /* cur may be dead already: see maintain_if_pending */
    }
    struct segment *s = journal__segment_push(q, number);
    uint8_t header[FORMAT_FILE_HEADER_SIZE];
    format_file_header_encode(header, FORMAT_MAGIC_SEGMENT, q->id, number);
    q->ticket_last = journal__append_bytes(j, s->file, 0, header, sizeof(header));
    s->size = FORMAT_FILE_HEADER_SIZE;
    return s;
}

/* Would a record of record_size bytes start a new segment (see reserve)? */
static bool reserve_rolls(struct journal_queue *q, uint64_t record_size)
{
    struct segment *cur = current(q);
    return cur == NULL || (cur->size > FORMAT_FILE_HEADER_SIZE &&
                           cur->size + record_size > q->journal->opts.segment_size_max);
}

/* Where the next record of record_size bytes goes: the current segment, or a
 * new one when it would pass segment_size_max (a record bigger than that
 * gets a segment of its own). */
static struct segment *reserve(struct journal_queue *q, uint64_t record_size, uint64_t *offset)
{
    struct segment *cur = current(q);
    if (reserve_rolls(q, record_size))
        cur = roll(q);
    *offset = cur->size;
    cur->size += record_size;
    ASSERT(*offset <= UINT32_MAX - record_size);
    return cur;
}

/* Appends a record naming seqs of messages whose publishes are in
 * ref_segment or later (REF_NONE: none), which the record's segment must
 * not outlive (its ref_min). */
static uint64_t append_ref_record(struct journal_queue *q, enum record_type type,
                                  const uint8_t *payload, uint32_t size, uint64_t ref_segment)
{
    uint64_t offset;
    struct segment *s = reserve(q, format_record_size(size), &offset);
    if (ref_segment != REF_NONE && ref_segment < s->number && ref_segment < s->ref_min)
        s->ref_min = ref_segment;
    q->ticket_last =
        journal__append_record(q->journal, s->file, offset, type, payload, size, NULL, 0);
    return q->ticket_last;
}

static uint64_t append_seq_record(struct journal_queue *q, enum record_type type, uint64_t seq,
                                  uint64_t ref_segment)
{
    uint8_t payload[8];
    format_put_u64(payload, seq);
    return append_ref_record(q, type, payload, sizeof payload, ref_segment);
}

void journal__queue_remark_delivered(struct journal_queue *q, uint64_t seq,
                                     uint64_t segment_number)
{
    ASSERT(q->segments_count > 0);
    append_seq_record(q, RECORD_DELIVERED, seq, segment_number);
}

/* ---- The index ----------------------------------------------------------- */

/* The index of the first entry in use whose seq is >= seq. */
static size_t entry_lower_bound(const struct journal_queue *q, uint64_t seq)
{
    size_t lo = q->entries_head;
    size_t hi = q->entries_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (q->entries[mid].seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct entry *entry_find(struct journal_queue *q, uint64_t seq)
{
    size_t i = entry_lower_bound(q, seq);
    if (i < q->entries_count && q->entries[i].seq == seq)
        return &q->entries[i];
    return NULL;
}

/* Drops acked entries from the array once they are at least half of it. */
static void entries_pack(struct journal_queue *q)
{
    size_t used = q->entries_count - q->entries_head;
    if (used < 64 || q->live_count * 2 > used)
        return;
    size_t kept = 0;
    for (size_t i = q->entries_head; i < q->entries_count; i++) {
        if (!(q->entries[i].flags & ENTRY_ACKED))
            q->entries[kept++] = q->entries[i];
    }
    ASSERT(kept == q->live_count);
    q->entries_head = 0;
    q->entries_count = kept;
}

static void entry_push(struct journal_queue *q, struct entry e)
{
    ASSERT(q->entries_count == q->entries_head || q->entries[q->entries_count - 1].seq < e.seq);
    if (q->entries_count == q->entries_cap) {
        entries_pack(q);
        if (q->entries_head > 0 && q->entries_count == q->entries_cap) {
            memmove(q->entries, q->entries + q->entries_head,
                    (q->entries_count - q->entries_head) * sizeof(*q->entries));
            q->entries_count -= q->entries_head;
            q->entries_head = 0;
        }
    }
    if (q->entries_count == q->entries_cap) {
        q->entries_cap = q->entries_cap ? 2 * q->entries_cap : 64;
        q->entries = xrealloc(q->entries, q->entries_cap * sizeof(*q->entries));
    }
    q->entries[q->entries_count++] = e;
    q->live_count++;
}

/* The oldest segment that may hold a copy of e's publish, which a record
 * naming e (an ACK, a DELIVERED) must not outlive: e's own, or the one
 * being compacted, which keeps the original of what it copied out until
 * the compaction ends and it is unlinked (one compaction at a time, so
 * no other older copy is left). Referring to e's own only, the segment of
 * an ACK written next to a copy could die first, and recovery brought the
 * acked message back from the original. */
static uint64_t entry_ref(const struct journal_queue *q, const struct entry *e)
{
    uint64_t ref = e->segment_number;
    if (q->compacting && q->compact_number < ref)
        ref = q->compact_number;
    return ref;
}

static void entry_ack(struct journal_queue *q, struct entry *e)
{
    ASSERT(!(e->flags & ENTRY_ACKED));
    ASSERT(q->live_count > 0);
    struct segment *s = journal__segment_find(q, e->segment_number);
    ASSERT(s != NULL && s->live_count > 0);
    s->live_count--;
    s->live_size -= publish_record_size(e->blob_size);
    e->flags |= ENTRY_ACKED;
    q->live_count--;
    while (q->entries_head < q->entries_count &&
           (q->entries[q->entries_head].flags & ENTRY_ACKED))
        q->entries_head++;
}

/* ---- Reclamation and compaction ------------------------------------------ */

static void segment_unlink(struct journal_queue *q, size_t index)
{
    struct journal *j = q->journal;
    ASSERT(index + 1 < q->segments_count); /* never the current segment */
    struct segment *s = &q->segments[index];
    ASSERT(s->live_count == 0 && s->live_size == 0);
    if (s->read_fd >= 0)
        j->disk->close(j->disk->ctx, s->read_fd);
    struct op *op = journal__op_new(OP_UNLINK, 0);
    op->file = s->file;
    q->ticket_last = journal__op_push(j, op);
    if (q->compacting && q->compact_number == s->number)
        compaction_end(q); /* its last messages were copied, or acked first */
    memmove(s, s + 1, (q->segments_count - index - 1) * sizeof(*s));
    q->segments_count--;
}

/* ---- Compaction in slices ------------------------------------------------
 *
 * Copying a segment's live messages forward is queued to the journal
 * thread like any write, and the appends queued after it wait for it: a
 * 64 MiB segment compacted at 25% live is ~16,000 copies, which held every
 * confirm of the broker back for 0.3-1.4 s while a consumer drained a deep
 * queue. So a compaction copies at most compact_slice_bytes, then waits
 * until that slice is synced before the next (journal__compactions_resume,
 * on each synced report): appends wait for one slice at most. Messages
 * acked while it goes on are not copied at all, which for a queue being
 * drained is most of them. One compaction at a time per queue; the
 * segment is unlinked once it holds no live message. */

static void compaction_end(struct journal_queue *q)
{
    struct journal *j = q->journal;
    ASSERT(q->compacting);
    q->compacting = false;
    for (size_t i = 0; i < j->compacting_count; i++) {
        if (j->compacting[i] == q) {
            j->compacting[i] = j->compacting[--j->compacting_count];
            return;
        }
    }
    ASSERT(false); /* a compacting queue is always listed */
}

static void compaction_start(struct journal_queue *q, uint64_t number)
{
    struct journal *j = q->journal;
    ASSERT(!q->compacting);
    if (j->compacting_count == j->compacting_cap) {
        j->compacting_cap = j->compacting_cap ? 2 * j->compacting_cap : 8;
        j->compacting = xrealloc(j->compacting, j->compacting_cap * sizeof(*j->compacting));
    }
    j->compacting[j->compacting_count++] = q;
    q->compacting = true;
    q->compact_number = number;
    q->compact_seq = 0;
    q->compact_ticket = 0;
}

/* Is the slice queued last on disk (so the next may go)? */
static bool compaction_due(const struct journal_queue *q)
{
    return atomic_load(&q->journal->synced_ticket) >= q->compact_ticket;
}

/* Queues a run of copies (see segment_compact_slice). */
static void run_push(struct journal_queue *q, struct op **run)
{
    if (*run != NULL)
        q->ticket_last = journal__op_push(q->journal, *run);
    *run = NULL;
}

/* Copies the next slice of live messages of segments[index] (the segment
 * being compacted) to the current segment, byte for byte; then a DELIVERED
 * record for each that was delivered (after its copy: recovery takes the
 * copy for the message's place, then the mark). Messages next to each
 * other in both segments are copied as one run (one read, one write: a
 * backlog's records are mostly contiguous). True once none is left. */
static bool segment_compact_slice(struct journal_queue *q, size_t index)
{
    struct journal *j = q->journal;
    uint64_t number = q->segments[index].number;
    ASSERT(q->compacting && q->compact_number == number);
    uint64_t moved = 0, budget = j->opts.compact_slice_bytes;
    struct op *run = NULL;
    uint64_t *delivered = NULL;
    size_t delivered_count = 0, delivered_cap = 0;
    bool done = true;
    for (size_t i = entry_lower_bound(q, q->compact_seq); i < q->entries_count; i++) {
        struct entry *e = &q->entries[i];
        if ((e->flags & ENTRY_ACKED) || e->segment_number != number)
            continue;
        if (moved >= budget) {
            q->compact_seq = e->seq; /* the next slice starts here */
            done = false;
            break;
        }
        uint64_t size = publish_record_size(e->blob_size);
        /* A roll queues the segment's close (its fdatasync): the run
         * writing into it must be queued before. */
        if (reserve_rolls(q, size))
            run_push(q, &run);
        uint64_t offset;
        struct segment *dst = reserve(q, size, &offset);
        struct segment *src = &q->segments[index]; /* reserve may have grown the array */
        ASSERT(dst != src);
        if (run != NULL && (run->offset + run->size != offset ||
                            run->source_offset + run->size != e->offset))
            run_push(q, &run);
        if (run == NULL) {
            run = journal__op_new(OP_COPY, 0);
            run->source = src->file;
            run->source_offset = e->offset;
            run->seq = e->seq;
            run->file = dst->file;
            run->offset = offset;
        }
        run->size += size;
        run->seq_last = e->seq;
        run->count++;
        src->live_count--;
        src->live_size -= size;
        dst->live_count++;
        dst->live_size += size;
        e->segment_number = (uint32_t)dst->number;
        e->offset = (uint32_t)offset;
        if (e->flags & ENTRY_DELIVERED) {
            if (delivered_count == delivered_cap) {
                delivered_cap = delivered_cap ? 2 * delivered_cap : 64;
                delivered = xrealloc(delivered, delivered_cap * sizeof(*delivered));
            }
            delivered[delivered_count++] = e->seq;
        }
        moved += size;
    }
    run_push(q, &run);
    for (size_t k = 0; k < delivered_count; k++) {
        struct entry *e = entry_find(q, delivered[k]);
        ASSERT(e != NULL);
        append_seq_record(q, RECORD_DELIVERED, e->seq, entry_ref(q, e));
    }
    free(delivered);
    if (!done) {
        q->compact_ticket = q->ticket_last;
        return false;
    }
    ASSERT(q->segments[index].live_count == 0);
    LOG_DEBUG("journal: queue %016llx compacted segment %llu", (unsigned long long)q->id,
              (unsigned long long)number);
    return true;
}

void journal__compactions_resume(struct journal *j)
{
    /* Backwards: a queue whose compaction ends leaves its slot to the last
     * one, which was already looked at. */
    for (size_t i = j->compacting_count; i > 0; i--) {
        struct journal_queue *q = j->compacting[i - 1];
        if (compaction_due(q))
            journal__queue_maintain(q);
    }
}

void journal__queue_maintain(struct journal_queue *q)
{
    uint32_t percent = q->journal->opts.compact_live_percent;
    size_t i = 0;
    while (i + 1 < q->segments_count) {
        struct segment *s = &q->segments[i];
        bool refs_clear = i == 0 || q->segments[i - 1].number < s->ref_min;
        if (!refs_clear) {
            i++;
            continue;
        }
        if (s->live_count == 0) {
            segment_unlink(q, i);
            continue;
        }
        if (q->compacting && q->compact_number == s->number) {
            if (compaction_due(q) && segment_compact_slice(q, i)) {
                segment_unlink(q, i);
                continue;
            }
            i++;
            continue;
        }
        bool sparse = s->live_size * 100 < s->size * percent;
        size_t dead_behind = 0;
        for (size_t k = i + 1; i == 0 && k + 1 < q->segments_count; k++)
            dead_behind += q->segments[k].live_count == 0;
        if (!q->compacting && (sparse || dead_behind >= 2)) {
            compaction_start(q, s->number);
            if (segment_compact_slice(q, i)) {
                segment_unlink(q, i);
                continue;
            }
        }
        i++;
    }
    ASSERT(q->segments_count > 0);
    q->maintain_pending = false;
}

/* Segments whose messages were all acked while they were current are found
 * only after they roll; the API calls this last, never from inside maintain. */
static void maintain_if_pending(struct journal_queue *q)
{
    if (q->maintain_pending)
        journal__queue_maintain(q);
}

/* A log whose every message is acked (a queue its consumers keep up with,
 * or drained) holds nothing, but its current segment is reclaimed only
 * once it rolls, which an idle queue's never does: a drained deep queue
 * kept up to segment_size_max of dead bytes on disk, and a disk alarm
 * raised by it never cleared. Past an eighth of that the segment is rolled
 * now, so that maintenance unlinks it (every record in it is dead, and the
 * new one refers to none of them); below, the next roll will do. */
static void roll_if_dead(struct journal_queue *q)
{
    struct segment *cur = current(q);
    if (q->live_count == 0 && cur != NULL &&
        cur->size >= q->journal->opts.segment_size_max / 8)
        roll(q);
}

static bool needs_maintenance(struct journal_queue *q, const struct segment *s)
{
    if (s == current(q))
        return false;
    uint32_t percent = q->journal->opts.compact_live_percent;
    return s->live_count == 0 || s->live_size * 100 < s->size * percent;
}

/* ---- The API ------------------------------------------------------------- */

struct journal_queue *journal_queue_open(struct journal *j, struct bytes vhost,
                                         struct bytes name)
{
    ASSERT(j->recovered); /* journal_recover first, or an old log would be overwritten */
    uint8_t key[4 + 255 + 255];
    ASSERT(vhost.len <= 255 && name.len <= 255); /* AMQP short strings */
    format_put_u32(key, vhost.len);
    if (vhost.len > 0)
        memcpy(key + 4, vhost.ptr, vhost.len);
    if (name.len > 0)
        memcpy(key + 4 + vhost.len, name.ptr, name.len);
    struct journal_queue *q = hmap_get(&j->queues, (struct bytes){key, 4 + vhost.len + name.len});
    if (q != NULL) {
        q->opened = true;
        return q;
    }
    uint64_t id = format_queue_id(vhost.ptr, vhost.len, name.ptr, name.len);
    for (;;) {
        uint8_t id_key[8];
        format_put_u64(id_key, id);
        if (hmap_get(&j->queue_ids, (struct bytes){id_key, 8}) == NULL)
            break;
        id++; /* a hash collision: probe (see format.h) */
    }
    q = journal__queue_new(j, id, vhost, name);
    q->opened = true;
    struct op *op = journal__op_new(OP_MKDIR, 0);
    memcpy(op->path, q->dir, sizeof(op->path));
    journal__op_push(j, op);
    uint64_t size = FORMAT_FILE_HEADER_SIZE + format_record_size(q->key_size);
    op = journal__op_new(OP_WRITE_ATOMIC, size);
    journal__path(op->path, q->dir, "queue");
    format_file_header_encode(op->data, FORMAT_MAGIC_QUEUE, id, 0);
    format_record_encode(op->data + FORMAT_FILE_HEADER_SIZE, RECORD_QUEUE_NAME, q->key,
                         q->key_size, NULL, 0);
    op->size = size;
    q->ticket_last = journal__op_push(j, op);
    return q;
}

uint64_t journal_queue_seq_last(const struct journal_queue *q)
{
    return q->seq_last;
}

uint64_t journal_queue_live_count(const struct journal_queue *q)
{
    return q->live_count;
}

uint64_t journal_publish(struct journal_queue *q, uint64_t seq, const void *blob, uint32_t size)
{
    ASSERT(seq > q->seq_last); /* seqs strictly increase per queue */
    ASSERT(seq >= q->purge_below);
    ASSERT(size <= q->journal->opts.blob_size_max);
    uint8_t seq_bytes[8];
    format_put_u64(seq_bytes, seq);
    uint64_t record_size = publish_record_size(size);
    uint64_t offset;
    struct segment *s = reserve(q, record_size, &offset);
    q->ticket_last = journal__append_record(q->journal, s->file, offset, RECORD_PUBLISH,
                                            seq_bytes, 8, blob, size);
    entry_push(q, (struct entry){.seq = seq, .segment_number = (uint32_t)s->number,
                                 .offset = (uint32_t)offset, .blob_size = size});
    s->live_count++;
    s->live_size += record_size;
    q->seq_last = seq;
    uint64_t ticket = q->ticket_last;
    maintain_if_pending(q);
    return ticket;
}

uint64_t journal_delivered(struct journal_queue *q, uint64_t seq)
{
    struct entry *e = entry_find(q, seq);
    if (e == NULL || (e->flags & ENTRY_ACKED))
        return q->journal->ticket_last; /* nothing to record: durable with what precedes */
    if (e->flags & ENTRY_DELIVERED)
        return q->journal->ticket_last;
    e->flags |= ENTRY_DELIVERED;
    uint64_t ticket = append_seq_record(q, RECORD_DELIVERED, seq, entry_ref(q, e));
    maintain_if_pending(q);
    return ticket;
}

uint64_t journal_ack(struct journal_queue *q, uint64_t seq)
{
    struct entry *e = entry_find(q, seq);
    if (e == NULL || (e->flags & ENTRY_ACKED))
        return q->journal->ticket_last;
    uint64_t number = e->segment_number, ref = entry_ref(q, e);
    entry_ack(q, e);
    uint64_t ticket = append_seq_record(q, RECORD_ACK, seq, ref);
    roll_if_dead(q);
    struct segment *s = journal__segment_find(q, number);
    if (s != NULL && needs_maintenance(q, s))
        journal__queue_maintain(q);
    maintain_if_pending(q);
    return ticket;
}

uint64_t journal_ack_range(struct journal_queue *q, uint64_t first, uint64_t last)
{
    ASSERT(first > 0 && first <= last);
    if (first == last)
        return journal_ack(q, first); /* (its maintenance looks at one segment) */
    uint64_t ref = REF_NONE, only = 0;
    size_t acked = 0;
    for (size_t i = entry_lower_bound(q, first); i < q->entries_count; i++) {
        struct entry *e = &q->entries[i];
        if (e->seq > last)
            break;
        if (e->flags & ENTRY_ACKED)
            continue;
        uint64_t e_ref = entry_ref(q, e);
        if (e_ref < ref)
            ref = e_ref;
        only = e->seq;
        acked++;
        entry_ack(q, e); /* (moves entries_head past acked ones; never i's entry) */
    }
    if (acked == 0)
        return q->journal->ticket_last; /* (as journal_ack: durable with what precedes) */
    uint64_t ticket;
    if (acked == 1) {
        ticket = append_seq_record(q, RECORD_ACK, only, ref);
    } else {
        uint8_t payload[16];
        format_put_u64(payload, first);
        format_put_u64(payload + 8, last);
        ticket = append_ref_record(q, RECORD_ACK_RANGE, payload, sizeof payload, ref);
    }
    roll_if_dead(q);
    journal__queue_maintain(q);
    return ticket;
}

uint64_t journal_purge(struct journal_queue *q, uint64_t seq_below)
{
    uint64_t ref = q->segments_count > 0 ? q->segments[0].number : REF_NONE;
    for (size_t i = q->entries_head; i < q->entries_count && q->entries[i].seq < seq_below;) {
        struct entry *e = &q->entries[i];
        if (!(e->flags & ENTRY_ACKED))
            entry_ack(q, e);
        i = i < q->entries_head ? q->entries_head : i + 1;
    }
    if (seq_below > q->purge_below)
        q->purge_below = seq_below;
    uint64_t ticket = append_seq_record(q, RECORD_PURGE, seq_below, ref);
    roll_if_dead(q);
    journal__queue_maintain(q);
    return ticket;
}

uint64_t journal_queue_delete(struct journal_queue *q)
{
    struct journal *j = q->journal;
    if (q->segments_count > 0) {
        uint64_t offset;
        struct segment *s = reserve(q, format_record_size(0), &offset);
        journal__append_record(j, s->file, offset, RECORD_DELETE, NULL, 0, NULL, 0);
    }
    journal__queue_release_files(q);
    char doomed[JOURNAL_PATH_SIZE];
    int n = snprintf(doomed, sizeof(doomed), "%s.deleted-%" PRIu64, q->dir, ++j->deleted_counter);
    ASSERT(n > 0 && (size_t)n < sizeof(doomed));
    struct op *op = journal__op_new(OP_RENAME, 0);
    memcpy(op->path, q->dir, sizeof(op->path));
    memcpy(op->path2, doomed, sizeof(op->path2));
    uint64_t ticket = journal__op_push(j, op);
    op = journal__op_new(OP_REMOVE_TREE, 0);
    memcpy(op->path, doomed, sizeof(op->path));
    journal__op_push(j, op);
    ASSERT(hmap_remove(&j->queues, (struct bytes){q->key, q->key_size}) == q);
    ASSERT(hmap_remove(&j->queue_ids, (struct bytes){q->id_key, 8}) == q);
    journal__queue_free(q);
    return ticket;
}

void journal_queue_abandon(struct journal_queue *q)
{
    struct journal *j = q->journal;
    journal__queue_release_files(q);
    ASSERT(hmap_remove(&j->queues, (struct bytes){q->key, q->key_size}) == q);
    ASSERT(hmap_remove(&j->queue_ids, (struct bytes){q->id_key, 8}) == q);
    journal__queue_free(q);
}

struct journal_queue *journal_queue_recreate(struct journal_queue *q)
{
    struct journal *j = q->journal;
    uint8_t key[4 + 255 + 255];
    ASSERT(q->key_size <= sizeof key);
    memcpy(key, q->key, q->key_size);
    struct bytes vhost = {key + 4, q->vhost.len};
    struct bytes name = {key + 4 + q->vhost.len, q->name.len};
    journal_queue_delete(q);
    return journal_queue_open(j, vhost, name);
}

void journal_queue_delete_unopened(struct journal *j)
{
    ASSERT(j->recovered);
    struct journal_queue **doomed = NULL;
    size_t count = 0;
    uint32_t cursor = 0;
    struct hmap_entry *e;
    while (hmap_next(&j->queues, &cursor, &e)) {
        struct journal_queue *q = e->value;
        if (q->opened)
            continue;
        doomed = xrealloc(doomed, (count + 1) * sizeof(*doomed));
        doomed[count++] = q;
    }
    for (size_t i = 0; i < count; i++) {
        LOG_INFO("journal: deleting queue vhost=%.*s queue=%.*s: not declared",
                 (int)doomed[i]->vhost.len, doomed[i]->vhost.ptr, (int)doomed[i]->name.len,
                 doomed[i]->name.ptr);
        journal_queue_delete(doomed[i]);
    }
    free(doomed);
}

/* ---- Paging -------------------------------------------------------------- */

int journal_locate(const struct journal_queue *q, uint64_t seq, struct journal_location *out)
{
    struct entry *e = entry_find((struct journal_queue *)q, seq);
    if (e == NULL || (e->flags & ENTRY_ACKED))
        return E_JOURNAL_NOT_FOUND;
    out->segment_number = e->segment_number;
    out->offset = e->offset;
    out->blob_size = e->blob_size;
    return OK;
}

int journal_read(struct journal_queue *q, uint64_t seq, void *buf, uint32_t size)
{
    struct journal *j = q->journal;
    struct entry *e = entry_find(q, seq);
    if (e == NULL || (e->flags & ENTRY_ACKED))
        return E_JOURNAL_NOT_FOUND;
    ASSERT(size >= e->blob_size);
    journal__wait_executed(j, q->ticket_last);
    struct segment *s = journal__segment_find(q, e->segment_number);
    ASSERT(s != NULL);
    if (s->read_fd < 0 && j->disk->open(j->disk->ctx, s->file->path, DISK_OPEN_READ,
                                        &s->read_fd) < 0) {
        s->read_fd = -1;
        return E_IO;
    }
    uint64_t record_size = publish_record_size(e->blob_size);
    uint8_t *record = xmalloc(record_size);
    size_t done = 0;
    int rc = j->disk->pread(j->disk->ctx, s->read_fd, record, record_size, e->offset, &done);
    struct format_record_header h;
    uint64_t checked_size = 0;
    if (rc < 0) {
        rc = E_IO;
    } else if (format_record_check(record, done, &h, &checked_size) != FORMAT_CHECK_OK ||
               h.type != RECORD_PUBLISH || checked_size != record_size ||
               format_get_u64(record + FORMAT_RECORD_HEADER_SIZE) != seq) {
        LOG_ERROR("journal: bad record at %s offset %u reading seq %llu", s->file->path,
                  e->offset, (unsigned long long)seq);
        rc = E_JOURNAL_CORRUPT;
    } else {
        memcpy(buf, record + FORMAT_RECORD_HEADER_SIZE + 8, e->blob_size);
        rc = OK;
    }
    free(record);
    return rc;
}
