/*
 * sim_disk.c: see sim_disk.h. Appends complete in the order they were
 * submitted (one disk latency per server), so the truncate waiting for
 * the n-th append runs right when it completes, before its callback.
 */
#include "sim_disk.h"

#include <stdlib.h>
#include <string.h>

#include <raft/fixture.h>

#include "lib/assert.h"

struct wrapped_append {
    struct raft_io_append inner; /* first: the stub calls back with it */
    struct raft_io_append *outer;
    raft_io_append_cb cb;
    struct sim_disk *disk;
};

static struct sim_disk *registry[RAFT_FIXTURE_MAX_SERVERS];

static struct sim_disk *disk_of(const struct raft_io *io)
{
    for (unsigned i = 0; i < RAFT_FIXTURE_MAX_SERVERS; i++) {
        if (registry[i] != NULL && registry[i]->io == io)
            return registry[i];
    }
    ASSERT(false);
    return NULL;
}

/* Raft's index i is the stub's i - offset. */
static int truncate_at(struct sim_disk *d, raft_index index)
{
    return d->truncate(d->io, index > d->offset ? index - d->offset : 1);
}

static void append_done(struct raft_io_append *req, int status)
{
    struct wrapped_append *w = (struct wrapped_append *)req;
    struct sim_disk *d = w->disk;
    d->completed++;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < d->truncates_count; i++) {
        if (d->truncates[i].after <= d->completed)
            truncate_at(d, d->truncates[i].index);
        else
            d->truncates[kept++] = d->truncates[i];
    }
    d->truncates_count = kept;
    w->cb(w->outer, status);
    free(w);
}

static int append(struct raft_io *io, struct raft_io_append *req,
                  const struct raft_entry entries[], unsigned n, raft_io_append_cb cb)
{
    struct sim_disk *d = disk_of(io);
    struct wrapped_append *w = calloc(1, sizeof *w);
    ASSERT(w != NULL);
    *w = (struct wrapped_append){.outer = req, .cb = cb, .disk = d};
    int rv = d->append(io, &w->inner, entries, n, append_done);
    if (rv != 0) {
        free(w);
        return rv;
    }
    req->cb = cb;
    d->submitted++;
    return 0;
}

static int truncate_log(struct raft_io *io, raft_index index)
{
    struct sim_disk *d = disk_of(io);
    if (index == 1) {
        /* The stub's own, flushing a snapshot put without trailing
         * entries (Raft never truncates its first entry, the bootstrap's
         * configuration): what it appends next follows the snapshot. */
        d->offset = d->put_index;
        return d->truncate(io, 1);
    }
    if (d->completed == d->submitted)
        return truncate_at(d, index);
    ASSERT(d->truncates_count < SIM_DISK_TRUNCATES_MAX);
    d->truncates[d->truncates_count].index = index;
    d->truncates[d->truncates_count].after = d->submitted;
    d->truncates_count++;
    return 0;
}

static int snapshot_put(struct raft_io *io, unsigned trailing, struct raft_io_snapshot_put *req,
                        const struct raft_snapshot *snapshot, raft_io_snapshot_put_cb cb)
{
    struct sim_disk *d = disk_of(io);
    if (trailing == 0)
        d->put_index = snapshot->index;
    return d->snapshot_put(io, trailing, req, snapshot, cb);
}

/* The stub's load, with the entries the snapshot covers dropped and the
 * start index right. */
static int load(struct raft_io *io, raft_term *term, raft_id *voted_for,
                struct raft_snapshot **snapshot, raft_index *start_index,
                struct raft_entry *entries[], size_t *n_entries)
{
    struct sim_disk *d = disk_of(io);
    int rv = d->load(io, term, voted_for, snapshot, start_index, entries, n_entries);
    if (rv != 0)
        return rv;
    raft_index first = d->offset + 1;
    size_t drop = 0;
    if (*snapshot != NULL && (*snapshot)->index >= first)
        drop = (size_t)((*snapshot)->index - first + 1);
    if (drop > *n_entries)
        drop = *n_entries;
    if (drop > 0 && drop == *n_entries) {
        raft_free((*entries)[0].batch); /* (one batch holds them all) */
        raft_free(*entries);
        *entries = NULL;
    } else if (drop > 0) {
        memmove(*entries, *entries + drop, (*n_entries - drop) * sizeof **entries);
    }
    *n_entries -= drop;
    *start_index = first + drop;
    return 0;
}

void sim_disk_attach(struct sim_disk *disk, struct raft_io *io)
{
    *disk = (struct sim_disk){.io = io, .append = io->append, .truncate = io->truncate,
                              .load = io->load, .snapshot_put = io->snapshot_put};
    io->append = append;
    io->truncate = truncate_log;
    io->load = load;
    io->snapshot_put = snapshot_put;
    for (unsigned i = 0; i < RAFT_FIXTURE_MAX_SERVERS; i++) {
        if (registry[i] == NULL) {
            registry[i] = disk;
            return;
        }
    }
    ASSERT(false);
}

bool sim_disk_idle(const struct sim_disk *disk)
{
    return disk->completed == disk->submitted;
}

void sim_disk_detach(struct sim_disk *disk)
{
    for (unsigned i = 0; i < RAFT_FIXTURE_MAX_SERVERS; i++) {
        if (registry[i] == disk)
            registry[i] = NULL;
    }
}
