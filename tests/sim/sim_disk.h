/*
 * sim_disk.h: the simulator's seam over libraft's in-memory fixture disk
 * (tests/sim). libraft 0.15's stub I/O truncates its log at once, also
 * behind appends still in flight: it then copies entries it does not have
 * (a heap overflow, seed 329) and writes the in-flight ones after the
 * truncation. libraft's real (uv) I/O runs a truncate after the appends
 * before it; this seam does the same: a truncate behind appends in flight
 * waits until the last of them completes.
 *
 * The stub also has no notion of where its entries start: it keeps them
 * from index 1 behind a snapshot taken with trailing entries, yet its load
 * says they start after the snapshot (a restart then replays the wrong
 * entries: seed 161 with snapshots on); after a snapshot installed from
 * the leader (trailing 0) it holds the entries after it, and a truncate
 * at index i then keeps i - 1 of them. This seam keeps the offset of the
 * stub's first entry, translates truncates, and loads the entries after
 * the snapshot only.
 */
#ifndef QUAY_SIM_DISK_H
#define QUAY_SIM_DISK_H

#include <stdbool.h>
#include <stdint.h>

#include <raft.h>

#define SIM_DISK_TRUNCATES_MAX 64

struct sim_disk {
    struct raft_io *io;
    int (*append)(struct raft_io *io, struct raft_io_append *req,
                  const struct raft_entry entries[], unsigned n, raft_io_append_cb cb);
    int (*truncate)(struct raft_io *io, raft_index index);
    int (*load)(struct raft_io *io, raft_term *term, raft_id *voted_for,
                struct raft_snapshot **snapshot, raft_index *start_index,
                struct raft_entry *entries[], size_t *n_entries);
    int (*snapshot_put)(struct raft_io *io, unsigned trailing, struct raft_io_snapshot_put *req,
                        const struct raft_snapshot *snapshot, raft_io_snapshot_put_cb cb);
    raft_index offset;    /* the stub's first entry is offset + 1 */
    raft_index put_index; /* the snapshot put in flight without trailing entries */
    uint64_t submitted, completed; /* appends */
    struct {
        raft_index index;
        uint64_t after; /* once this many appends completed */
    } truncates[SIM_DISK_TRUNCATES_MAX];
    uint32_t truncates_count;
};

/* Wraps io's append and truncate (disk lives as long as io). */
void sim_disk_attach(struct sim_disk *disk, struct raft_io *io);
/* Forgets disk (before the fixture is closed and freed). */
void sim_disk_detach(struct sim_disk *disk);
/* Whether nothing is in flight (a restart may read what is on it). */
bool sim_disk_idle(const struct sim_disk *disk);

#endif
