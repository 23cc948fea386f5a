/*
 * journal_defs.c: the definitions log (vhosts, users, permissions, durable
 * exchanges and queues, bindings) on the loop thread.
 *
 * Owns the in-memory map (kind, key) -> value that the log describes, the
 * log's size and its live size. A put or delete appends one record through
 * the journal thread; when the file passes definitions_compact_size and is
 * more than half dead, the whole map is written as a snapshot to
 * definitions.tmp, fdatasync'ed and renamed over the log (OP_WRITE_ATOMIC),
 * so a crash leaves either the old log or the new one. The file is read
 * once, synchronously, in journal_open. Never interprets values.
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

#define DEF_KEY_SIZE_MAX (64u * 1024u)

static uint64_t put_record_size(uint32_t key_size, uint32_t value_size)
{
    return format_record_size(8 + (uint64_t)key_size + value_size);
}

/* key_size counts the kind byte in front of the caller's key. */
static void def_put(struct journal *j, const uint8_t *key, uint32_t key_size,
                    const uint8_t *value, uint32_t value_size)
{
    ASSERT(key_size >= 1 && key[0] >= JOURNAL_DEF_VHOST && key[0] <= JOURNAL_DEF_KIND_MAX);
    struct def_entry *d = hmap_get(&j->definitions, (struct bytes){key, key_size});
    if (d == NULL) {
        d = xcalloc(1, sizeof(*d));
        d->key = xmalloc(key_size);
        memcpy(d->key, key, key_size);
        d->key_size = key_size;
        ASSERT(hmap_put(&j->definitions, (struct bytes){d->key, d->key_size}, d) == NULL);
    } else {
        j->definitions_live_size -= put_record_size(d->key_size - 1, d->value_size);
        free(d->value);
    }
    d->value = xmalloc(value_size > 0 ? value_size : 1);
    if (value_size > 0)
        memcpy(d->value, value, value_size);
    d->value_size = value_size;
    d->order = ++j->definitions_order;
    j->definitions_live_size += put_record_size(key_size - 1, value_size);
}

static void def_delete(struct journal *j, const uint8_t *key, uint32_t key_size)
{
    struct def_entry *d = hmap_remove(&j->definitions, (struct bytes){key, key_size});
    if (d == NULL)
        return;
    ASSERT(j->definitions_live_size >= put_record_size(d->key_size - 1, d->value_size));
    j->definitions_live_size -= put_record_size(d->key_size - 1, d->value_size);
    free(d->key);
    free(d->value);
    free(d);
}

/* Applies one record read back from the file: the pair of the encoder below. */
static int apply_record(struct journal *j, const struct format_record_header *h,
                        const uint8_t *payload)
{
    if ((h->type != RECORD_DEF_PUT && h->type != RECORD_DEF_DELETE) || h->payload_size < 8)
        return E_JOURNAL_CORRUPT;
    uint32_t kind = format_get_u32(payload);
    uint32_t key_size = format_get_u32(payload + 4);
    if (kind < JOURNAL_DEF_VHOST || kind > JOURNAL_DEF_KIND_MAX || key_size > DEF_KEY_SIZE_MAX ||
        key_size > h->payload_size - 8)
        return E_JOURNAL_CORRUPT;
    if (h->type == RECORD_DEF_DELETE && key_size != h->payload_size - 8)
        return E_JOURNAL_CORRUPT;
    uint8_t *key = xmalloc(key_size + 1);
    key[0] = (uint8_t)kind;
    memcpy(key + 1, payload + 8, key_size);
    if (h->type == RECORD_DEF_PUT)
        def_put(j, key, key_size + 1, payload + 8 + key_size, h->payload_size - 8 - key_size);
    else
        def_delete(j, key, key_size + 1);
    free(key);
    return OK;
}

static int write_fresh(struct journal *j, const char *path, char *err, size_t err_size)
{
    uint8_t header[FORMAT_FILE_HEADER_SIZE];
    format_file_header_encode(header, FORMAT_MAGIC_DEFINITIONS, 0, 0);
    int fd;
    int rc = j->disk->open(j->disk->ctx, path, DISK_OPEN_CREATE | DISK_OPEN_TRUNCATE, &fd);
    if (rc == 0) {
        rc = j->disk->pwrite(j->disk->ctx, fd, header, sizeof(header), 0);
        if (rc == 0)
            rc = j->disk->fdatasync(j->disk->ctx, fd);
        j->disk->close(j->disk->ctx, fd);
    }
    if (rc == 0)
        rc = j->disk->fsync_dir(j->disk->ctx, j->dir);
    if (rc < 0) {
        snprintf(err, err_size, "cannot create %s: %s", path, strerror(-rc));
        return E_IO;
    }
    j->definitions_size = FORMAT_FILE_HEADER_SIZE;
    return OK;
}

static int read_all(struct journal *j, const char *path, uint8_t **buf, uint64_t *size)
{
    int fd;
    int rc = j->disk->open(j->disk->ctx, path, DISK_OPEN_WRITE, &fd);
    if (rc < 0)
        return rc;
    rc = j->disk->fsize(j->disk->ctx, fd, size);
    *buf = xmalloc(*size + 1);
    size_t done = 0;
    if (rc == 0)
        rc = j->disk->pread(j->disk->ctx, fd, *buf, (size_t)*size, 0, &done);
    if (rc == 0 && done != *size)
        rc = -EIO;
    j->disk->close(j->disk->ctx, fd);
    return rc;
}

/* Scans the log; a bad record with nothing valid after it is a torn tail. */
static int replay(struct journal *j, const char *path, const uint8_t *buf, uint64_t size,
                  uint64_t *valid_end, char *err, size_t err_size)
{
    uint64_t offset = FORMAT_FILE_HEADER_SIZE;
    while (offset < size) {
        struct format_record_header h;
        uint64_t record_size;
        enum format_check check = format_record_check(buf + offset, size - offset, &h,
                                                      &record_size);
        if (check == FORMAT_CHECK_OK &&
            apply_record(j, &h, buf + offset + FORMAT_RECORD_HEADER_SIZE) == OK) {
            offset += record_size;
            continue;
        }
        bool tail = check != FORMAT_CHECK_OK;
        for (uint64_t p = offset + 8; tail && p + FORMAT_RECORD_HEADER_SIZE <= size; p += 8)
            tail = format_record_check(buf + p, size - p, &h, &record_size) != FORMAT_CHECK_OK;
        if (!tail) {
            snprintf(err, err_size, "bad record at %s offset %" PRIu64
                     "; move the file aside and restore definitions from a backup",
                     path, offset);
            return E_JOURNAL_CORRUPT;
        }
        break;
    }
    *valid_end = offset;
    return OK;
}

int journal__definitions_open(struct journal *j, char *err, size_t err_size)
{
    char path[JOURNAL_PATH_SIZE];
    char tmp[JOURNAL_PATH_SIZE];
    journal__path(path, j->dir, "definitions");
    journal__path(tmp, j->dir, "definitions.tmp");
    j->disk->unlink(j->disk->ctx, tmp); /* a snapshot that was never renamed */
    uint8_t *buf = NULL;
    uint64_t size = 0;
    int rc = read_all(j, path, &buf, &size);
    struct format_file_header fh;
    if (rc == -ENOENT || (rc == 0 && size < FORMAT_FILE_HEADER_SIZE)) {
        rc = write_fresh(j, path, err, err_size);
    } else if (rc < 0) {
        snprintf(err, err_size, "cannot read %s: %s", path, strerror(-rc));
        rc = E_IO;
    } else if (!format_file_header_decode(buf, FORMAT_MAGIC_DEFINITIONS, &fh)) {
        snprintf(err, err_size, "bad file header in %s", path);
        rc = E_JOURNAL_CORRUPT;
    } else {
        uint64_t valid_end = size;
        rc = replay(j, path, buf, size, &valid_end, err, err_size);
        j->definitions_size = valid_end;
        if (rc == OK && valid_end < size) {
            LOG_WARN("journal: cut a torn tail at %s offset %" PRIu64, path, valid_end);
            int fd;
            rc = j->disk->open(j->disk->ctx, path, DISK_OPEN_WRITE, &fd);
            if (rc == 0) {
                rc = j->disk->ftruncate(j->disk->ctx, fd, valid_end);
                if (rc == 0)
                    rc = j->disk->fdatasync(j->disk->ctx, fd);
                j->disk->close(j->disk->ctx, fd);
            }
            if (rc < 0) {
                snprintf(err, err_size, "cannot truncate %s: %s", path, strerror(-rc));
                rc = E_IO;
            }
        }
    }
    free(buf);
    if (rc == OK) {
        j->definitions_file = journal__file_new(path);
        j->definitions_file->created = true;
    }
    return rc;
}

void journal__definitions_free(struct journal *j)
{
    uint32_t cursor = 0;
    struct hmap_entry *e;
    while (hmap_next(&j->definitions, &cursor, &e)) {
        struct def_entry *d = e->value;
        free(d->key);
        free(d->value);
        free(d);
    }
    hmap_free(&j->definitions);
    hmap_init(&j->definitions);
    free(j->definitions_file); /* only when the thread never saw it */
    j->definitions_file = NULL;
}

static int compare_defs(const void *a, const void *b)
{
    const struct def_entry *x = *(struct def_entry *const *)a;
    const struct def_entry *y = *(struct def_entry *const *)b;
    if (x->key[0] != y->key[0])
        return x->key[0] < y->key[0] ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static struct def_entry **sorted_defs(struct journal *j, size_t *count)
{
    struct def_entry **all = xmalloc((j->definitions.count + 1) * sizeof(*all));
    size_t n = 0;
    uint32_t cursor = 0;
    struct hmap_entry *e;
    while (hmap_next(&j->definitions, &cursor, &e))
        all[n++] = e->value;
    ASSERT(n == j->definitions.count);
    qsort(all, n, sizeof(*all), compare_defs);
    *count = n;
    return all;
}

void journal_recover_definitions(struct journal *j, journal_definition_fn fn, void *ctx)
{
    ASSERT(fn != NULL);
    ASSERT(!j->definitions_walking);
    size_t count;
    struct def_entry **all = sorted_defs(j, &count);
    j->definitions_walking = true;
    for (size_t i = 0; i < count; i++) {
        struct def_entry *d = all[i];
        fn(ctx, (enum journal_def_kind)d->key[0], (struct bytes){d->key + 1, d->key_size - 1},
           (struct bytes){d->value, d->value_size});
    }
    j->definitions_walking = false;
    free(all);
}

uint64_t journal_definitions_count(const struct journal *j)
{
    return j->definitions.count;
}

/* Rewrites the log as a snapshot of the map, atomically. */
static uint64_t compact(struct journal *j)
{
    size_t count;
    struct def_entry **all = sorted_defs(j, &count);
    uint64_t size = FORMAT_FILE_HEADER_SIZE + j->definitions_live_size;
    struct op *op = journal__op_new(OP_WRITE_ATOMIC, size);
    format_file_header_encode(op->data, FORMAT_MAGIC_DEFINITIONS, 0, 0);
    uint64_t offset = FORMAT_FILE_HEADER_SIZE;
    for (size_t i = 0; i < count; i++) {
        struct def_entry *d = all[i];
        uint8_t prefix[8 + DEF_KEY_SIZE_MAX];
        format_put_u32(prefix, d->key[0]);
        format_put_u32(prefix + 4, d->key_size - 1);
        memcpy(prefix + 8, d->key + 1, d->key_size - 1);
        format_record_encode(op->data + offset, RECORD_DEF_PUT, prefix, 8 + d->key_size - 1,
                             d->value, d->value_size);
        offset += put_record_size(d->key_size - 1, d->value_size);
    }
    free(all);
    ASSERT(offset == size);
    op->size = size;
    op->file = j->definitions_file;
    journal__path(op->path, j->dir, "definitions");
    j->definitions_size = size;
    return journal__op_push(j, op);
}

static uint64_t append_def(struct journal *j, enum record_type type, enum journal_def_kind kind,
                           struct bytes key, struct bytes value)
{
    ASSERT(kind >= JOURNAL_DEF_VHOST && kind <= JOURNAL_DEF_KIND_MAX);
    ASSERT(key.len <= DEF_KEY_SIZE_MAX);
    /* A delete frees the entry a replay callback may be reading, a put
     * the value it may be reading. */
    ASSERT(!j->definitions_walking);
    ASSERT(value.len <= j->opts.blob_size_max);
    uint8_t prefix[8 + DEF_KEY_SIZE_MAX];
    format_put_u32(prefix, (uint32_t)kind);
    format_put_u32(prefix + 4, key.len);
    if (key.len > 0)
        memcpy(prefix + 8, key.ptr, key.len);
    uint64_t ticket = journal__append_record(j, j->definitions_file, j->definitions_size, type,
                                             prefix, 8 + key.len, value.ptr, value.len);
    j->definitions_size += format_record_size(8 + (uint64_t)key.len + value.len);
    /* Apply exactly as replay will: the record's kind byte, then the key. */
    prefix[7] = (uint8_t)kind;
    if (type == RECORD_DEF_PUT)
        def_put(j, prefix + 7, key.len + 1, value.ptr, value.len);
    else
        def_delete(j, prefix + 7, key.len + 1);
    if (j->definitions_size > j->opts.definitions_compact_size &&
        j->definitions_size > 2 * (j->definitions_live_size + FORMAT_FILE_HEADER_SIZE))
        ticket = compact(j);
    return ticket;
}

uint64_t journal_define(struct journal *j, enum journal_def_kind kind, struct bytes key,
                        struct bytes value)
{
    return append_def(j, RECORD_DEF_PUT, kind, key, value);
}

uint64_t journal_undefine(struct journal *j, enum journal_def_kind kind, struct bytes key)
{
    return append_def(j, RECORD_DEF_DELETE, kind, key, (struct bytes){NULL, 0});
}
