/*
 * sim.c: one seed of the simulator (sim.h): its randomness and its
 * failure, the fixture's servers (brokers started, joined, closed),
 * simulated time with a controller tick every SIM_TICK_MS, and the run:
 * faults until the end, then the heal and the wait for convergence.
 */
#include "sim.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/consensus.h"
#include "sim_data.h"

char sim_queue_names[SIM_QUEUES][16];

static uint64_t next_random(struct sim *s)
{
    /* xorshift64*: enough for drawing faults, and all ours. */
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return s->rng * 2685821657736338717ull;
}

uint64_t sim_random_below(struct sim *s, uint64_t n)
{
    return next_random(s) % n;
}

void sim_trace(struct sim *s, uint64_t v)
{
    s->trace = (s->trace ^ v) * 1099511628211ull;
}

bool sim_failed(const struct sim *s)
{
    return s->failure[0] != '\0';
}

void sim_fail(struct sim *s, const char *fmt, ...)
{
    if (sim_failed(s))
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(s->failure, sizeof s->failure, "t=%" PRIu64 "ms: ",
                     (uint64_t)raft_fixture_time(&s->f));
    vsnprintf(s->failure + n, sizeof s->failure - (size_t)n, fmt, ap);
    va_end(ap);
}

int sim_queue_index(struct bytes name)
{
    /* "q<n>": read n (called after every apply, for every queue). */
    int i = 0;
    for (uint32_t k = 1; k < name.len && k < 4 && name.ptr[k] >= '0' && name.ptr[k] <= '9'; k++)
        i = i * 10 + (name.ptr[k] - '0');
    return name.len > 1 && i < SIM_QUEUES && bytes_equal_cstr(name, sim_queue_names[i]) ? i : -1;
}

/* As a broker runs it (consensus.c), with snapshots more often than
 * quayd's 1,024 entries: they happen in every seed, and the fixture,
 * which copies and compares the leader's whole log at every step, stays
 * fast (five times faster than with snapshots off). */
void sim_tune(struct raft *r)
{
    struct consensus_config tuning = {.election_timeout_ms = 1000,
                                      .snapshot_threshold = SIM_SNAPSHOT_EVERY,
                                      .snapshot_trailing = SIM_SNAPSHOT_EVERY / 2};
    consensus_tune(r, &tuning);
}

/* Broker i's server: a new one in the fixture (connected to every live
 * one), its map empty. Not started. */
static void add_server(struct sim *s, unsigned i)
{
    struct sim_broker *b = &s->brokers[i];
    b->sim = s;
    b->index = i;
    b->id = i + 1;
    b->incarnation = b->id;
    b->known_since = UINT64_MAX;
    cluster_map_init(&b->map);
    sim_fsm_init(b);
    raft_fixture_grow(&s->f, &b->fsm);
    for (unsigned j = 0; j < i; j++) {
        if (!s->f.servers[j].alive) { /* (grow connects it to the dead too) */
            raft_fixture_saturate(&s->f, i, j);
            raft_fixture_saturate(&s->f, j, i);
        }
    }
    sim_disk_attach(&b->disk, &s->f.servers[i].io);
    sim_tune(raft_fixture_get(&s->f, i));
    /* Election timeouts drawn from the seed: the fixture's own are
     * fixed per server, so elections would not vary between seeds. */
    raft_fixture_set_randomized_election_timeout(&s->f, i, 1000 + sim_random_below(s, 1000));
    raft_fixture_set_network_latency(&s->f, i, 5 + sim_random_below(s, 20));
    raft_fixture_set_disk_latency(&s->f, i, 1 + sim_random_below(s, 10));
}

static void sim_init(struct sim *s, uint64_t seed, bool verbose)
{
    memset(s, 0, sizeof *s);
    s->seed = seed;
    s->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    s->verbose = verbose;
    s->trace = 1469598103934665603ull;
    s->epochs = calloc(SIM_EPOCHS_MAX, sizeof *s->epochs);
    s->data = calloc(1, sizeof *s->data);
    sim_link_init(s);
    s->drain_asked = -1;
    s->forget_asked = -1;
    controller_config_default(&s->config);
    raft_fixture_initialize(&s->f);
    for (unsigned i = 0; i < SIM_BROKERS; i++)
        add_server(s, i);
    struct raft_configuration conf;
    raft_fixture_configuration(&s->f, SIM_BROKERS, &conf);
    raft_fixture_bootstrap(&s->f, &conf);
    raft_configuration_close(&conf);
    raft_fixture_start(&s->f);
}

/* A new broker, its disk empty (quayd --join): it starts, and asks the
 * members to add it (consensus_join; the leader's add_member runs it). */
bool sim_join_new(struct sim *s)
{
    unsigned i = s->f.n;
    if (i >= SIM_SERVERS)
        return false;
    add_server(s, i);
    s->brokers[i].joining = true;
    s->net_changes++; /* (its links come up) */
    if (raft_start(raft_fixture_get(&s->f, i)) != 0)
        sim_fail(s, "b%u: raft_start at its join", i + 1);
    return true;
}

static void sim_close(struct sim *s)
{
    unsigned n = s->f.n;
    raft_fixture_close(&s->f);
    for (unsigned i = 0; i < n; i++) {
        sim_disk_detach(&s->brokers[i].disk);
        cluster_map_free(&s->brokers[i].map);
    }
    free(s->epochs);
    sim_link_free(s);
    free(s->data);
}

/* Runs simulated time up to until_ms, a controller tick every SIM_TICK_MS. */
void sim_run_until(struct sim *s, uint64_t until_ms)
{
    while (!sim_failed(s) && raft_fixture_time(&s->f) < until_ms) {
        uint64_t next = (raft_fixture_time(&s->f) / SIM_TICK_MS + 1) * SIM_TICK_MS;
        while (raft_fixture_time(&s->f) < next && !sim_failed(s)) {
            raft_fixture_step(&s->f);
            sim_link_step(s, raft_fixture_time(&s->f)); /* the data path's frames due */
        }
        sim_controller_tick(s, raft_fixture_time(&s->f));
        /* libraft draws an election timeout in [t, 2t) each time it
         * resets the timer; the fixture's is fixed per server, and four
         * servers within a network latency of each other split the vote
         * for ever (seed 110): drawn again from the seed every tick. */
        for (unsigned i = 0; i < s->f.n; i++)
            raft_fixture_set_randomized_election_timeout(&s->f, i,
                                                         1000 + sim_random_below(s, 1000));
    }
}

/* Where each broker is (after a failure, with -v). */
static void print_brokers(struct sim *s)
{
    for (unsigned i = 0; i < s->f.n; i++) {
        struct raft *r = raft_fixture_get(&s->f, i);
        const struct sim_broker *b = &s->brokers[i];
        printf("  b%u: %s%s, raft state %d term %llu, applied %llu of %llu, %u members, "
               "map version %" PRIu64 ", synced %d\n", b->id,
               s->f.servers[i].alive ? "alive" : "dead", b->forgotten ? " (forgotten)" : "",
               raft_state(r), (unsigned long long)r->current_term,
               (unsigned long long)raft_last_applied(r), (unsigned long long)raft_last_index(r),
               r->configuration.n, b->map.version, b->synced);
    }
}

/* 0: passed. */
int sim_run_seed(uint64_t seed, uint64_t seconds, bool verbose, uint64_t *trace_out)
{
    struct sim *s = calloc(1, sizeof *s);
    sim_init(s, seed, verbose);
    uint64_t end = seconds * 1000;
    uint64_t next_fault = 3000;
    while (!sim_failed(s) && raft_fixture_time(&s->f) < end) {
        sim_run_until(s, next_fault < end ? next_fault : end);
        if (raft_fixture_time(&s->f) >= next_fault) {
            sim_fault_inject(s);
            next_fault += SIM_FAULT_MIN_MS +
                          sim_random_below(s, SIM_FAULT_MAX_MS - SIM_FAULT_MIN_MS);
        }
    }
    sim_fault_heal_all(s);
    char why[256] = "";
    uint64_t healed = raft_fixture_time(&s->f);
    while (!sim_failed(s) && !sim_check_converged(s, why, sizeof why)) {
        if (raft_fixture_time(&s->f) - healed > SIM_HEAL_BOUND_MS) {
            sim_fail(s, "not converged %u s after the faults healed: %s",
                     SIM_HEAL_BOUND_MS / 1000, why);
            break;
        }
        sim_fault_undrain_all(s);
        sim_run_until(s, raft_fixture_time(&s->f) + SIM_TICK_MS);
    }
    /* The data path: every broker serving its queues, then every confirmed
     * message where it should be. */
    while (!sim_failed(s) && !sim_data_check_settled(s, why, sizeof why)) {
        if (raft_fixture_time(&s->f) - healed > SIM_HEAL_BOUND_MS) {
            sim_fail(s, "the data path not settled %u s after the faults healed: %s",
                     SIM_HEAL_BOUND_MS / 1000, why);
            break;
        }
        sim_run_until(s, raft_fixture_time(&s->f) + SIM_TICK_MS);
    }
    if (!sim_failed(s))
        sim_data_check_messages(s);
    int rc = sim_failed(s) ? 1 : 0;
    if (rc != 0)
        printf("FAIL seed %" PRIu64 ": %s (replay: sim_control --seed %" PRIu64 " -v)\n", seed,
               s->failure, seed);
    if (rc != 0 && verbose)
        print_brokers(s);
    else if (verbose)
        printf("ok seed %" PRIu64 ": %" PRIu64 " faults, %" PRIu64 " commands proposed, %" PRIu64
               " applied, converged %" PRIu64 " ms after healing; %u publishes, %" PRIu64
               " confirmed (%" PRIu64 " by primaries), %" PRIu64 " consumed, %" PRIu64
               " frames; known: %" PRIu64 " loss(es); %" PRIu64 " non-durable queue(s) deleted "
               "by their restarted primary (%" PRIu64 " confirmed message(s) with them)\n", seed,
               s->faults, s->proposed, s->applied, (uint64_t)raft_fixture_time(&s->f) - healed,
               s->data->msgs_count, s->data->client_confirms, s->data->confirms,
               s->data->consumed, s->data->frames, s->data->known_losses, s->data->deletions,
               s->data->deleted_msgs);
    *trace_out = s->trace;
    sim_close(s);
    free(s);
    return rc;
}
