/*
 * sim_disk.c: see sim_disk.h. Appends complete in the order they were
 * submitted (one disk latency per server), so the truncate waiting for
 * the n-th append runs right when it completes, before its callback.
 */
#include "sim_disk.h"

#include <stdlib.h>

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

static void append_done(struct raft_io_append *req, int status)
{
    struct wrapped_append *w = (struct wrapped_append *)req;
    struct sim_disk *d = w->disk;
    d->completed++;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < d->truncates_count; i++) {
        if (d->truncates[i].after <= d->completed)
            d->truncate(d->io, d->truncates[i].index);
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
    if (d->completed == d->submitted)
        return d->truncate(io, index);
    ASSERT(d->truncates_count < SIM_DISK_TRUNCATES_MAX);
    d->truncates[d->truncates_count].index = index;
    d->truncates[d->truncates_count].after = d->submitted;
    d->truncates_count++;
    return 0;
}

void sim_disk_attach(struct sim_disk *disk, struct raft_io *io)
{
    *disk = (struct sim_disk){.io = io, .append = io->append, .truncate = io->truncate};
    io->append = append;
    io->truncate = truncate_log;
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
