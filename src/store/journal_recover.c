/*
 * journal_recover.c: rebuilding every queue's index from its segments at
 * start, on the loop thread, before anything is served.
 *
 * Pass 1 reads each segment whole (one large pread per file, no per-record
 * syscalls) and applies its records to a vector of messages keyed by a
 * seq -> index hash map: the last PUBLISH copy of a seq gives its location,
 * DELIVERED and ACK set flags, PURGE sets a floor. Pass 2 walks the live
 * messages in seq order and hands their blobs to the caller, again reading
 * whole segments (single records only for short out-of-place runs, such as
 * compacted copies), starting from the segment pass 1 read last, which is
 * still in the buffer: a queue of one segment, as most are, is read once (a
 * queue of several reads its last one again after the others: pass 2 goes in
 * seq order and the buffer holds one segment). A bad record is cut only at
 * the tail of the last segment with nothing valid after it; anything else is
 * E_JOURNAL_CORRUPT.
 * Never skips a record and never writes except to cut a torn tail and to
 * finish deletions that a crash interrupted.
 */
#include "store/journal_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/alloc.h"
#include "lib/assert.h"
#include "lib/errors.h"
#include "lib/log.h"

#define RUN_WHOLE_SEGMENT 16 /* live messages in a row that justify reading a whole segment */
#define NO_SEGMENT UINT64_MAX /* struct recovery's buf_segment when buf holds none */

/* seq -> index into the recovery vector; seq 0 is never used (seqs start at 1). */
struct seq_map {
    uint64_t *keys;
    uint32_t *values;
    size_t cap; /* a power of two */
    size_t count;
};

static size_t seq_slot(const struct seq_map *m, uint64_t seq)
{
    return (size_t)((seq * 0x9E3779B97F4A7C15ull) >> 20) & (m->cap - 1);
}

static uint32_t *seq_map_find(struct seq_map *m, uint64_t seq)
{
    if (m->cap == 0)
        return NULL;
    for (size_t i = seq_slot(m, seq);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == seq)
            return &m->values[i];
        if (m->keys[i] == 0)
            return NULL;
    }
}

static void seq_map_put(struct seq_map *m, uint64_t seq, uint32_t value)
{
    ASSERT(seq != 0);
    if ((m->count + 1) * 2 > m->cap) {
        struct seq_map bigger = {0};
        bigger.cap = m->cap ? 2 * m->cap : 1024;
        bigger.keys = xcalloc(bigger.cap, sizeof(*bigger.keys));
        bigger.values = xmalloc(bigger.cap * sizeof(*bigger.values));
        for (size_t i = 0; i < m->cap; i++) {
            if (m->keys[i] != 0)
                seq_map_put(&bigger, m->keys[i], m->values[i]);
        }
        free(m->keys);
        free(m->values);
        *m = bigger;
    }
    size_t i = seq_slot(m, seq);
    while (m->keys[i] != 0 && m->keys[i] != seq)
        i = (i + 1) & (m->cap - 1);
    m->count += m->keys[i] == 0;
    m->keys[i] = seq;
    m->values[i] = value;
}

/* A message as pass 1 sees it: where its last copy is, and the first
 * segment holding any copy (an ACK must keep naming that one: a crash between
 * a compaction's copies and its unlink leaves both copies on disk). */
struct recovered {
    struct entry e;
    uint32_t first_segment;
};

struct recovery {
    struct journal *j;
    struct journal_recovery_stats *stats;
    journal_recover_fn fn;
    void *fn_ctx;
    uint8_t *buf; /* owned: a whole segment */
    size_t buf_cap;
    /* Which segment of the queue being recovered buf holds, and the size
     * of its valid records (a torn tail cut), or NO_SEGMENT: whatever
     * reads into buf says so (read_whole clears it; recover_segment and
     * pass 2 set it once a segment is in). */
    uint64_t buf_segment;
    uint64_t buf_size;
    /* The queue being recovered. */
    struct journal_queue *q;
    struct recovered *v;
    size_t v_count;
    size_t v_cap;
    struct seq_map map;
    bool deleted;
    uint64_t *remark;    /* owned: delivered seqs found in two copies */
    size_t remark_count;
    /* Where it is (journal__recovery_step): the queue directories, sorted,
     * recovered one after the other; for the current one (r->q) its
     * segments, scanned one at a time (pass 1), then its live messages,
     * handed over one at a time (pass 2). */
    enum { PHASE_QUEUE, PHASE_SEGMENTS, PHASE_DELIVER, PHASE_DONE } phase;
    int rc;              /* the first error (then PHASE_DONE) */
    uint64_t *ids;       /* owned */
    size_t ids_count, ids_next;
    uint64_t *numbers;   /* owned: the current queue's segment numbers */
    size_t numbers_count, numbers_next;
    bool stop;           /* a torn first write ends its segments */
    size_t deliver_next; /* pass 2: the next entry of r->q */
};

static int corrupt(struct recovery *r, const char *path, uint64_t offset, const char *why)
{
    LOG_ERROR("journal: %s at %s offset %" PRIu64 "; the journal will not skip it", why, path,
              offset);
    snprintf(r->stats->corrupt_path, sizeof(r->stats->corrupt_path), "%s", path);
    r->stats->corrupt_offset = offset;
    return E_JOURNAL_CORRUPT;
}

/* Reads the whole file into r->buf, which then holds no segment until the
 * caller says which one it read. */
static int read_whole(struct recovery *r, const char *path, uint64_t *size_out)
{
    const struct disk_ops *d = r->j->disk;
    r->buf_segment = NO_SEGMENT;
    int fd;
    int rc = d->open(d->ctx, path, DISK_OPEN_READ, &fd);
    if (rc < 0)
        return rc;
    uint64_t size = 0;
    rc = d->fsize(d->ctx, fd, &size);
    if (rc == 0 && size > r->buf_cap) {
        free(r->buf);
        r->buf_cap = (size_t)size;
        r->buf = xmalloc(r->buf_cap);
    }
    size_t done = 0;
    if (rc == 0 && size > 0)
        rc = d->pread(d->ctx, fd, r->buf, (size_t)size, 0, &done);
    d->close(d->ctx, fd);
    if (rc == 0 && done != size)
        rc = -EIO;
    r->stats->byte_count += done;
    *size_out = size;
    return rc;
}

/* Is there any valid record in buf after offset (a bad record in the middle)? */
static bool valid_record_after(const uint8_t *buf, uint64_t size, uint64_t offset)
{
    for (uint64_t p = offset + FORMAT_RECORD_ALIGN; p + FORMAT_RECORD_HEADER_SIZE <= size;
         p += FORMAT_RECORD_ALIGN) {
        struct format_record_header h;
        uint64_t record_size;
        if (format_get_u16(buf + p + 8) == FORMAT_RECORD_MAGIC &&
            format_record_check(buf + p, size - p, &h, &record_size) == FORMAT_CHECK_OK)
            return true;
    }
    return false;
}

typedef int (*apply_fn)(struct recovery *r, const struct format_record_header *h,
                        const uint8_t *payload, uint64_t offset);

/* Applies every record of buf[from, size); returns the end of the valid
 * records in *valid_end. A bad record is a tail to cut (OK, *valid_end before
 * it) only when tail_allowed and nothing valid follows it. */
static int scan_records(struct recovery *r, const char *path, uint64_t from, uint64_t size,
                        bool tail_allowed, apply_fn apply, uint64_t *valid_end)
{
    uint64_t offset = from;
    while (offset < size) {
        struct format_record_header h;
        uint64_t record_size;
        enum format_check check = format_record_check(r->buf + offset, size - offset, &h,
                                                      &record_size);
        if (check != FORMAT_CHECK_OK) {
            if (!tail_allowed || valid_record_after(r->buf, size, offset))
                return corrupt(r, path, offset, "bad record");
            break;
        }
        int rc = apply(r, &h, r->buf + offset + FORMAT_RECORD_HEADER_SIZE, offset);
        if (rc != OK)
            return rc == E_JOURNAL_CORRUPT ? corrupt(r, path, offset, "bad record contents") : rc;
        offset += record_size;
    }
    *valid_end = offset;
    return OK;
}

static void note_truncated(struct recovery *r, const char *path, uint64_t offset)
{
    LOG_WARN("journal: cut a torn tail at %s offset %" PRIu64, path, offset);
    if (r->stats->truncated_count++ == 0) {
        snprintf(r->stats->truncated_path, sizeof(r->stats->truncated_path), "%s", path);
        r->stats->truncated_offset = offset;
    }
}

static int truncate_file(struct recovery *r, const char *path, uint64_t size)
{
    const struct disk_ops *d = r->j->disk;
    int fd;
    int rc = d->open(d->ctx, path, DISK_OPEN_WRITE, &fd);
    if (rc < 0)
        return rc;
    rc = d->ftruncate(d->ctx, fd, size);
    if (rc == 0)
        rc = d->fdatasync(d->ctx, fd);
    d->close(d->ctx, fd);
    return rc;
}

/* ---- Queue records ------------------------------------------------------- */

static void reference(struct recovery *r, uint64_t publish_segment)
{
    struct segment *s = &r->q->segments[r->q->segments_count - 1];
    if (publish_segment < s->number && publish_segment < s->ref_min)
        s->ref_min = publish_segment;
}

static void ack_recovered(struct recovery *r, uint32_t index)
{
    r->v[index].e.flags |= ENTRY_ACKED;
    reference(r, r->v[index].first_segment);
}

/* ACK_RANGE: every seq in [first, last] recovered so far is gone. A range
 * wider than what was recovered is applied by a walk of that instead, so
 * a record can cost no more than the queue's size. */
static int apply_ack_range(struct recovery *r, const uint8_t *payload, uint32_t size)
{
    if (size != 16)
        return E_JOURNAL_CORRUPT;
    uint64_t first = format_get_u64(payload), last = format_get_u64(payload + 8);
    if (first == 0 || last < first)
        return E_JOURNAL_CORRUPT;
    if (last - first < r->v_count) {
        for (uint64_t seq = first;; seq++) {
            uint32_t *index = seq_map_find(&r->map, seq);
            if (index != NULL)
                ack_recovered(r, *index);
            if (seq == last)
                break;
        }
        return OK;
    }
    for (size_t i = 0; i < r->v_count; i++) {
        if (r->v[i].e.seq >= first && r->v[i].e.seq <= last)
            ack_recovered(r, (uint32_t)i);
    }
    return OK;
}

static int apply_queue_record(struct recovery *r, const struct format_record_header *h,
                              const uint8_t *payload, uint64_t offset)
{
    struct journal_queue *q = r->q;
    struct segment *s = &q->segments[q->segments_count - 1];
    if (h->type == RECORD_DELETE) {
        r->deleted = !r->j->adopting;
        return OK;
    }
    if (h->type == RECORD_ACK_RANGE)
        return apply_ack_range(r, payload, h->payload_size);
    if (h->payload_size < 8 || (h->type != RECORD_PUBLISH && h->payload_size != 8))
        return E_JOURNAL_CORRUPT;
    uint64_t seq = format_get_u64(payload);
    uint32_t *index = seq_map_find(&r->map, seq);
    switch (h->type) {
    case RECORD_PUBLISH: {
        if (seq == 0)
            return E_JOURNAL_CORRUPT;
        struct entry e = {.seq = seq, .segment_number = (uint32_t)s->number,
                          .offset = (uint32_t)offset, .blob_size = h->payload_size - 8};
        if (seq > q->seq_last)
            q->seq_last = seq;
        if (index != NULL) { /* a compacted copy: it moved here */
            e.flags = r->v[*index].e.flags;
            r->v[*index].e = e;
            return OK;
        }
        if (r->v_count == r->v_cap) {
            r->v_cap = r->v_cap ? 2 * r->v_cap : 1024;
            r->v = xrealloc(r->v, r->v_cap * sizeof(*r->v));
        }
        ASSERT(r->v_count < UINT32_MAX);
        seq_map_put(&r->map, seq, (uint32_t)r->v_count);
        r->v[r->v_count++] = (struct recovered){e, e.segment_number};
        return OK;
    }
    case RECORD_DELIVERED:
    case RECORD_ACK:
        if (index != NULL) {
            r->v[*index].e.flags |= h->type == RECORD_ACK ? ENTRY_ACKED : ENTRY_DELIVERED;
            reference(r, r->v[*index].first_segment);
        }
        return OK;
    case RECORD_PURGE:
        if (seq > q->purge_below)
            q->purge_below = seq;
        reference(r, q->segments[0].number);
        return OK;
    default: return E_JOURNAL_CORRUPT;
    }
}

struct name_list {
    char (*names)[64];
    size_t count;
};

static int collect_name(void *ctx, const char *name)
{
    struct name_list *l = ctx;
    if (strlen(name) >= 64)
        return 0;
    l->names = xrealloc(l->names, (l->count + 1) * sizeof(*l->names));
    memcpy(l->names[l->count++], name, strlen(name) + 1);
    return 0;
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a;
    uint64_t y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Parses "<16 hex><suffix>" exactly. */
static bool parse_hex_name(const char *name, const char *suffix, uint64_t *out)
{
    if (strlen(name) != 16 + strlen(suffix) || strcmp(name + 16, suffix) != 0)
        return false;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = name[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return false;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v;
    return true;
}

/* Lists the segment numbers of a queue directory, sorted; removes a stale
 * header temp file and what a crash left of dead segments. */
static int list_segments(struct recovery *r, const char *dir, uint64_t **numbers,
                         size_t *count)
{
    struct name_list names = {0};
    int rc = r->j->disk->readdir(r->j->disk->ctx, dir, collect_name, &names);
    *numbers = NULL;
    *count = 0;
    for (size_t i = 0; rc == 0 && i < names.count; i++) {
        uint64_t number;
        if (parse_hex_name(names.names[i], ".seg", &number)) {
            *numbers = xrealloc(*numbers, (*count + 1) * sizeof(**numbers));
            (*numbers)[(*count)++] = number;
        } else if (strcmp(names.names[i], "queue.tmp") == 0 ||
                   journal__ends_with(names.names[i], JOURNAL_DEAD_SUFFIX)) {
            char path[JOURNAL_PATH_SIZE];
            journal__path(path, dir, names.names[i]);
            r->j->disk->unlink(r->j->disk->ctx, path);
        }
    }
    free(names.names);
    if (*count > 0)
        qsort(*numbers, *count, sizeof(**numbers), compare_u64);
    return rc;
}

static int remove_tree_now(struct journal *j, const char *dir)
{
    struct name_list names = {0};
    int rc = j->disk->readdir(j->disk->ctx, dir, collect_name, &names);
    for (size_t i = 0; rc == 0 && i < names.count; i++) {
        char path[JOURNAL_PATH_SIZE];
        journal__path(path, dir, names.names[i]);
        rc = j->disk->unlink(j->disk->ctx, path);
    }
    free(names.names);
    if (rc == 0)
        rc = j->disk->rmdir(j->disk->ctx, dir);
    if (rc == 0)
        rc = j->disk->fsync_dir(j->disk->ctx, j->queues_dir);
    return rc;
}

/* Reads DIR/queues/<id>/queue into an owned copy of its RECORD_QUEUE_NAME
 * payload. Returns OK, AGAIN when the file is missing, or an error. */
static int read_queue_header(struct recovery *r, const char *dir, uint64_t id, uint8_t **key,
                             uint32_t *key_size)
{
    char path[JOURNAL_PATH_SIZE];
    journal__path(path, dir, "queue");
    uint64_t size = 0;
    int rc = read_whole(r, path, &size);
    if (rc == -ENOENT)
        return AGAIN;
    if (rc < 0)
        return rc;
    struct format_file_header fh;
    struct format_record_header h;
    uint64_t record_size;
    if (size < FORMAT_FILE_HEADER_SIZE ||
        !format_file_header_decode(r->buf, FORMAT_MAGIC_QUEUE, &fh) || fh.queue_id != id ||
        format_record_check(r->buf + FORMAT_FILE_HEADER_SIZE, size - FORMAT_FILE_HEADER_SIZE,
                            &h, &record_size) != FORMAT_CHECK_OK ||
        h.type != RECORD_QUEUE_NAME || h.payload_size < 4)
        return corrupt(r, path, 0, "bad queue header");
    const uint8_t *payload = r->buf + FORMAT_FILE_HEADER_SIZE + FORMAT_RECORD_HEADER_SIZE;
    uint32_t vhost_size = format_get_u32(payload);
    if (vhost_size > h.payload_size - 4 || vhost_size > 255 ||
        h.payload_size - 4 - vhost_size > 255)
        return corrupt(r, path, FORMAT_FILE_HEADER_SIZE, "bad queue name");
    *key = xmalloc(h.payload_size);
    memcpy(*key, payload, h.payload_size);
    *key_size = h.payload_size;
    return OK;
}

static int recover_segment(struct recovery *r, uint64_t number, bool last, bool *stop)
{
    struct journal_queue *q = r->q;
    char name[32];
    snprintf(name, sizeof(name), "%016" PRIx64 ".seg", number);
    char path[JOURNAL_PATH_SIZE];
    journal__path(path, q->dir, name);
    uint64_t size = 0;
    int rc = read_whole(r, path, &size);
    if (rc < 0)
        return rc;
    struct format_file_header fh;
    if (size < FORMAT_FILE_HEADER_SIZE ||
        !format_file_header_decode(r->buf, FORMAT_MAGIC_SEGMENT, &fh) || fh.queue_id != q->id ||
        fh.segment_number != number) {
        if (!last || (size >= FORMAT_FILE_HEADER_SIZE &&
                      valid_record_after(r->buf, size, FORMAT_FILE_HEADER_SIZE - 8)))
            return corrupt(r, path, 0, "bad segment header");
        note_truncated(r, path, 0); /* created, then torn before its first sync */
        *stop = true;
        rc = r->j->disk->unlink(r->j->disk->ctx, path);
        return rc == 0 ? r->j->disk->fsync_dir(r->j->disk->ctx, q->dir) : rc;
    }
    struct segment *s = journal__segment_push(q, number);
    s->file->created = true;
    uint64_t valid_end = size;
    rc = scan_records(r, path, FORMAT_FILE_HEADER_SIZE, size, last, apply_queue_record,
                      &valid_end);
    if (rc != OK)
        return rc;
    if (valid_end < size) {
        note_truncated(r, path, valid_end);
        rc = truncate_file(r, path, valid_end);
    }
    s->size = valid_end;
    r->stats->segment_count++;
    if (rc == 0) {
        r->buf_segment = number; /* pass 2 starts from it */
        r->buf_size = valid_end;
    }
    return rc;
}

static int compare_entry_seq(const void *a, const void *b)
{
    return compare_u64(&((const struct entry *)a)->seq, &((const struct entry *)b)->seq);
}

/* Turns the recovery vector into the queue's index of live messages. */
static void build_index(struct recovery *r)
{
    struct journal_queue *q = r->q;
    size_t live = 0;
    bool sorted = true;
    struct entry *entries = xmalloc((r->v_count + 1) * sizeof(*entries));
    for (size_t i = 0; i < r->v_count; i++) {
        struct entry e = r->v[i].e;
        if (e.seq < q->purge_below || (e.flags & ENTRY_ACKED))
            continue;
        if ((e.flags & ENTRY_DELIVERED) && r->v[i].first_segment != e.segment_number) {
            /* A crash between a compaction's copies and its unlink: the old
             * segment, maybe holding the only DELIVERED, will be reclaimed. */
            r->remark = xrealloc(r->remark, (r->remark_count + 1) * sizeof(*r->remark));
            r->remark[r->remark_count++] = e.seq;
        }
        sorted = sorted && (live == 0 || entries[live - 1].seq < e.seq);
        entries[live++] = e;
    }
    if (!sorted)
        qsort(entries, live, sizeof(*entries), compare_entry_seq);
    free(q->entries);
    q->entries = entries;
    q->entries_cap = r->v_count + 1;
    q->entries_head = 0;
    q->entries_count = live;
    q->live_count = live;
    r->v_count = 0;
    for (size_t i = 0; i < live; i++) {
        struct segment *s = journal__segment_find(q, q->entries[i].segment_number);
        ASSERT(s != NULL);
        s->live_count++;
        s->live_size += format_record_size(8 + (uint64_t)q->entries[i].blob_size);
        DEBUG_ASSERT(i == 0 || q->entries[i - 1].seq < q->entries[i].seq);
    }
}

/* Pass 2, entry i of the queue's live messages (in seq order): its blob
 * handed to the caller, from the segment in buf while they are in it
 * (first the one pass 1 left there). */
static int deliver_one(struct recovery *r, size_t i)
{
    struct journal_queue *q = r->q;
    const struct entry *e = &q->entries[i];
    struct segment *s = journal__segment_find(q, e->segment_number);
    uint64_t record_size = format_record_size(8 + (uint64_t)e->blob_size);
    if (e->segment_number != r->buf_segment) {
        size_t run = 1;
        while (i + run < q->entries_count && run < RUN_WHOLE_SEGMENT &&
               q->entries[i + run].segment_number == e->segment_number)
            run++;
        if (run == RUN_WHOLE_SEGMENT) {
            uint64_t size = 0;
            int rc = read_whole(r, s->file->path, &size);
            if (rc < 0)
                return rc;
            r->buf_segment = e->segment_number;
            r->buf_size = size;
        }
    }
    const uint8_t *record;
    uint8_t *single = NULL;
    uint64_t avail;
    if (e->segment_number == r->buf_segment) {
        record = r->buf + e->offset;
        /* (none when the file shrank since pass 1: checked below) */
        avail = e->offset <= r->buf_size ? r->buf_size - e->offset : 0;
    } else {
        single = xmalloc(record_size);
        size_t done = 0;
        int fd;
        int rc = r->j->disk->open(r->j->disk->ctx, s->file->path, DISK_OPEN_READ, &fd);
        if (rc == 0) {
            rc = r->j->disk->pread(r->j->disk->ctx, fd, single, record_size, e->offset, &done);
            r->j->disk->close(r->j->disk->ctx, fd);
        }
        if (rc < 0) {
            free(single);
            return rc;
        }
        r->stats->byte_count += done;
        record = single;
        avail = done;
    }
    /* Pair assertion, as an error: pass 1 validated this record. */
    struct format_record_header h;
    uint64_t size;
    if (format_record_check(record, avail, &h, &size) != FORMAT_CHECK_OK ||
        h.type != RECORD_PUBLISH || size != record_size ||
        format_get_u64(record + FORMAT_RECORD_HEADER_SIZE) != e->seq) {
        free(single);
        return corrupt(r, s->file->path, e->offset, "record changed during recovery");
    }
    if (r->fn != NULL)
        r->fn(r->fn_ctx, q, q->vhost, q->name, e->seq, (e->flags & ENTRY_DELIVERED) != 0,
              record + FORMAT_RECORD_HEADER_SIZE + 8, e->blob_size);
    r->stats->message_count++;
    free(single);
    return OK;
}

/* Opens the next queue directory: its header and its segments' list
 * (PHASE_SEGMENTS), or, created and never written, removes it. */
static int open_queue(struct recovery *r, uint64_t id)
{
    struct journal *j = r->j;
    char id_hex[17];
    snprintf(id_hex, sizeof(id_hex), "%016" PRIx64, id);
    char dir[JOURNAL_PATH_SIZE];
    journal__path(dir, j->queues_dir, id_hex);
    uint8_t *key = NULL;
    uint32_t key_size = 0;
    uint64_t *numbers = NULL;
    size_t count = 0;
    int rc = read_queue_header(r, dir, id, &key, &key_size);
    if (rc == OK || rc == AGAIN) {
        int list_rc = list_segments(r, dir, &numbers, &count);
        if (list_rc < 0) {
            free(key);
            return list_rc;
        }
    }
    if (rc == AGAIN) { /* created, never written: the queue was never used */
        free(numbers);
        if (count > 0)
            return corrupt(r, dir, 0, "queue directory without its header file");
        return remove_tree_now(j, dir);
    }
    if (rc != OK) {
        free(numbers);
        return rc;
    }
    uint32_t vhost_size = format_get_u32(key);
    struct bytes vhost = {key + 4, vhost_size};
    struct bytes name = {key + 4 + vhost_size, key_size - 4 - vhost_size};
    if (hmap_get(&j->queues, (struct bytes){key, key_size}) != NULL) {
        free(key);
        free(numbers);
        return corrupt(r, dir, 0, "a second directory for one queue");
    }
    r->q = journal__queue_new(j, id, vhost, name);
    free(key);
    r->deleted = false;
    /* The header's read left no segment in buf: a number names a segment
     * of one queue only. */
    ASSERT(r->buf_segment == NO_SEGMENT);
    r->numbers = numbers;
    r->numbers_count = count;
    r->numbers_next = 0;
    r->stop = false;
    r->phase = PHASE_SEGMENTS;
    return OK;
}

/* Pass 1 is over: the queue's index (PHASE_DELIVER), or, deleted, the
 * next queue. */
static void index_queue(struct recovery *r)
{
    free(r->numbers);
    r->numbers = NULL;
    free(r->map.keys);
    free(r->map.values);
    memset(&r->map, 0, sizeof(r->map));
    build_index(r);
    r->stats->queue_count++;
    r->phase = PHASE_QUEUE;
    if (r->deleted) {
        r->stats->deleted_queue_count++;
        journal_queue_delete(r->q);
        return;
    }
    r->deliver_next = 0;
    r->phase = PHASE_DELIVER;
}

/* Pass 2 is over: what a half-done compaction left is mended. */
static void finish_queue(struct recovery *r)
{
    /* A reader (journal_open_reader: a taker reading a staged log, which
     * its own log then holds) writes nothing: what it read is handed over
     * as it is, delivered marks included, and the copy goes whole. */
    if (r->j->reader)
        r->remark_count = 0;
    for (size_t i = 0; i < r->remark_count; i++) {
        struct journal_location loc;
        ASSERT(journal_locate(r->q, r->remark[i], &loc) == OK);
        journal__queue_remark_delivered(r->q, r->remark[i], loc.segment_number);
    }
    r->remark_count = 0;
    if (r->q->segments_count > 0 && !r->j->reader)
        journal__queue_maintain(r->q);
    r->phase = PHASE_QUEUE;
}

/* One unit of work: a queue opened, one segment scanned, one message
 * handed over. */
static int advance(struct recovery *r)
{
    switch (r->phase) {
    case PHASE_QUEUE:
        if (r->ids_next == r->ids_count) {
            r->phase = PHASE_DONE;
            return OK;
        }
        return open_queue(r, r->ids[r->ids_next++]);
    case PHASE_SEGMENTS:
        if (r->numbers_next < r->numbers_count && !r->stop) {
            size_t k = r->numbers_next++;
            return recover_segment(r, r->numbers[k], k + 1 == r->numbers_count, &r->stop);
        }
        index_queue(r);
        return OK;
    case PHASE_DELIVER:
        if (r->deliver_next < r->q->entries_count)
            return deliver_one(r, r->deliver_next++);
        finish_queue(r);
        return OK;
    case PHASE_DONE:
        break;
    }
    return OK;
}

static int collect_queue_dir(void *ctx, const char *name)
{
    return collect_name(ctx, name);
}

struct recovery *journal__recovery_start(struct journal *j, journal_recover_fn fn, void *ctx,
                                        struct journal_recovery_stats *stats)
{
    memset(stats, 0, sizeof(*stats));
    struct recovery *r = xcalloc(1, sizeof *r);
    *r = (struct recovery){.j = j, .stats = stats, .fn = fn, .fn_ctx = ctx,
                           .buf_segment = NO_SEGMENT, .phase = PHASE_QUEUE};
    struct name_list names = {0};
    int rc = j->disk->readdir(j->disk->ctx, j->queues_dir, collect_queue_dir, &names);
    for (size_t i = 0; rc == 0 && i < names.count; i++) {
        uint64_t id;
        char path[JOURNAL_PATH_SIZE];
        journal__path(path, j->queues_dir, names.names[i]);
        if (strstr(names.names[i], ".deleted-") != NULL) {
            rc = remove_tree_now(j, path); /* a deletion the crash interrupted */
            stats->deleted_queue_count++;
        } else if (parse_hex_name(names.names[i], "", &id)) {
            r->ids = xrealloc(r->ids, (r->ids_count + 1) * sizeof(*r->ids));
            r->ids[r->ids_count++] = id;
        } else {
            LOG_WARN("journal: ignoring %s", path);
        }
    }
    free(names.names);
    if (r->ids_count > 0)
        qsort(r->ids, r->ids_count, sizeof(*r->ids), compare_u64);
    if (rc != OK) {
        r->rc = rc;
        r->phase = PHASE_DONE;
    }
    return r;
}

int journal__recovery_step(struct recovery *r, uint64_t until_ns)
{
    /* (The clock every 16 units: a unit is a segment, or one message.) */
    for (uint32_t n = 1; r->phase != PHASE_DONE; n++) {
        int rc = advance(r);
        if (rc != OK) {
            r->rc = rc;
            r->phase = PHASE_DONE;
            break;
        }
        if (until_ns != 0 && n % 16 == 0 && uv_hrtime() >= until_ns)
            return r->phase == PHASE_DONE ? OK : AGAIN;
    }
    return r->rc;
}

int journal__recovery_finish(struct recovery *r)
{
    struct journal *j = r->j;
    bool cut_short = r->phase != PHASE_DONE; /* (not recovered: nothing to log) */
    int rc = cut_short ? E_IO : r->rc;
    free(r->ids);
    free(r->numbers);
    free(r->map.keys);
    free(r->map.values);
    free(r->buf);
    free(r->v);
    free(r->remark);
    free(r);
    if (rc < 0 && rc != E_JOURNAL_CORRUPT && !cut_short) {
        LOG_ERROR("journal: recovery failed: %s", strerror(-rc));
        rc = E_IO;
    }
    j->recovered = rc == OK;
    if (rc == OK)
        journal__adopted_report(j);
    return rc;
}

int journal_recover(struct journal *j, journal_recover_fn fn, void *ctx,
                    struct journal_recovery_stats *stats)
{
    struct recovery *r = journal__recovery_start(j, fn, ctx, stats);
    journal__recovery_step(r, 0);
    return journal__recovery_finish(r);
}
