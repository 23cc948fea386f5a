/*
 * test_consensus.c: the Raft layer (cluster/consensus.c) and its
 * authenticated transport (cluster/raft_transport.c), on real sockets.
 *
 * Goal: a broker with the right secret can connect and join; a wrong
 * secret, a stalled peer or a foreign protocol is refused before libraft
 * sees a byte and cannot disrupt the cluster; a bootstrapped broker plus
 * joiners (one via a follower, redirected) make one leader and 3 voters;
 * proposals are applied on every member in the same order; a follower
 * refuses proposals; after the leader stops a new one is elected and the
 * survivors keep applying; a late joiner catches up from a snapshot; a 6th
 * member is a standby (at most 5 voters); removing a voter promotes a
 * standby.
 * Method: several struct consensus (and bare transports) on ONE uv loop,
 * 127.0.0.1 with free ports, data dirs under a mkdtemp dir. Every wait is a
 * bounded loop on the uv clock; raw-socket peers run in a helper thread.
 * Prints the measured election, failover and commit-latency figures.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <raft.h>
#include <raft/uv.h>
#include <uv.h>

#include "cluster/consensus.h"
#include "cluster/raft_transport.h"
#include "lib/log.h"

#define NODES_MAX 8
#define ELECTION_MS 400
#define HEARTBEAT_MS 60

static const uint8_t SECRET[] = "correct horse battery staple 42";
static const uint8_t WRONG_SECRET[] = "incorrect horse battery staple!";

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    socklen_t len = sizeof sa;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* ---- the loop ---- */

static uv_loop_t loop;
static uv_timer_t tick_timer;

static void on_tick(uv_timer_t *t)
{
    (void)t;
}

static void loop_setup(void)
{
    assert_int_equal(uv_loop_init(&loop), 0);
    uv_timer_init(&loop, &tick_timer);
    uv_timer_start(&tick_timer, on_tick, 5, 5); /* UV_RUN_ONCE returns often */
}

static void loop_teardown(void)
{
    uv_close((uv_handle_t *)&tick_timer, NULL);
    for (int i = 0; i < 100 && uv_run(&loop, UV_RUN_NOWAIT) != 0; i++)
        ;
    assert_int_equal(uv_loop_close(&loop), 0);
    consensus_release_remains();
}

/* Run the loop until pred(arg) or timeout_ms; returns pred's last value. */
static bool run_until(bool (*pred)(void *), void *arg, double timeout_ms)
{
    double deadline = now_ms() + timeout_ms;
    while (!pred(arg)) {
        if (now_ms() > deadline)
            return false;
        uv_run(&loop, UV_RUN_ONCE);
    }
    return true;
}

static bool never(void *arg)
{
    (void)arg;
    return false;
}

static void run_for(double ms)
{
    run_until(never, NULL, ms);
}

/* ---- a node: struct consensus plus a state machine that appends ---- */

struct node {
    int index;
    uint64_t id;
    char address[32];
    char dir[256];
    struct consensus *c;
    bool running;
    bool closed;
    uint64_t *values; /* the applied log, the whole state */
    size_t count;
    size_t cap;
    uint64_t last_index;
    int restores;
    int join_status;
    bool join_done;
};

static char root_dir[128];
static struct node nodes[NODES_MAX];

static void values_push(struct node *n, uint64_t v)
{
    if (n->count == n->cap) {
        n->cap = n->cap ? n->cap * 2 : 64;
        n->values = realloc(n->values, n->cap * sizeof *n->values);
        assert_non_null(n->values);
    }
    n->values[n->count++] = v;
}

static int fsm_apply(void *ctx, uint64_t index, const uint8_t *cmd, size_t size, void **result)
{
    struct node *n = ctx;
    assert_true(index > n->last_index); /* in log order, once */
    n->last_index = index;
    if (size != 8)
        return -1;
    uint64_t v;
    memcpy(&v, cmd, 8);
    values_push(n, v);
    *result = (void *)(uintptr_t)n->count; /* not owned: a small value */
    return 0;
}

static int fsm_snapshot(void *ctx, uint8_t **data, size_t *size)
{
    struct node *n = ctx;
    *size = 8 + n->count * 8;
    *data = malloc(*size);
    assert_non_null(*data);
    uint64_t count = n->count;
    memcpy(*data, &count, 8);
    if (n->count > 0)
        memcpy(*data + 8, n->values, n->count * 8);
    return 0;
}

static int fsm_restore(void *ctx, const uint8_t *data, size_t size)
{
    struct node *n = ctx;
    assert_true(size >= 8);
    uint64_t count;
    memcpy(&count, data, 8);
    assert_int_equal(size, 8 + count * 8);
    n->count = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t v;
        memcpy(&v, data + 8 + i * 8, 8);
        values_push(n, v);
    }
    n->restores++;
    return 0;
}

static void node_init_all(void)
{
    snprintf(root_dir, sizeof root_dir, "/tmp/quay-consensus-XXXXXX");
    assert_non_null(mkdtemp(root_dir));
    for (int i = 0; i < NODES_MAX; i++) {
        struct node *n = &nodes[i];
        memset(n, 0, sizeof *n);
        n->index = i;
        n->id = (uint64_t)i + 1;
        snprintf(n->address, sizeof n->address, "127.0.0.1:%d", free_port());
        snprintf(n->dir, sizeof n->dir, "%s/n%d", root_dir, i + 1);
        assert_int_equal(mkdir(n->dir, 0700), 0);
    }
}

static void node_start_opts(struct node *n, bool bootstrap, const uint8_t *secret,
                            unsigned threshold)
{
    struct consensus_config cfg = {
        .id = n->id, .address = n->address, .dir = n->dir,
        .secret = secret, .secret_size = sizeof SECRET - 1, .bootstrap = bootstrap,
        .election_timeout_ms = ELECTION_MS, .heartbeat_ms = HEARTBEAT_MS,
        .snapshot_threshold = threshold, .snapshot_trailing = threshold ? 4 : 0,
        .handshake_timeout_ms = 1000, .join_timeout_ms = 10000};
    struct consensus_callbacks cb = {
        .ctx = n, .apply = fsm_apply, .snapshot = fsm_snapshot, .restore = fsm_restore};
    char err[256] = "";
    int rv = consensus_start(&n->c, &loop, &cfg, &cb, err, sizeof err);
    if (rv != 0)
        fail_msg("node %d: %s (%d)", n->index + 1, err, rv);
    n->running = true;
    n->closed = false;
}

static void on_node_closed(void *ctx)
{
    struct node *n = ctx;
    n->closed = true;
}

static bool node_is_closed(void *arg)
{
    return ((struct node *)arg)->closed;
}

static void node_stop(struct node *n)
{
    assert_true(n->running);
    n->running = false;
    consensus_stop(n->c, on_node_closed, n);
    n->c = NULL;
    assert_true(run_until(node_is_closed, n, 5000));
}

static void nodes_cleanup(void)
{
    for (int i = 0; i < NODES_MAX; i++) {
        if (nodes[i].running)
            node_stop(&nodes[i]);
        free(nodes[i].values);
        nodes[i].values = NULL;
    }
    nftw(root_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void on_joined(void *ctx, int status, void *result)
{
    (void)result;
    struct node *n = ctx;
    n->join_done = true;
    n->join_status = status;
}

static void node_join(struct node *n, const char *peer)
{
    const char *peers[] = {peer};
    n->join_done = false;
    assert_int_equal(consensus_join(n->c, peers, 1, on_joined, n), 0);
}

static bool node_joined(void *arg)
{
    return ((struct node *)arg)->join_done;
}

/* The unique leader among running nodes that all agree on, or -1. */
static int leader_index(void)
{
    int leader = -1;
    for (int i = 0; i < NODES_MAX; i++) {
        if (nodes[i].running && consensus_is_leader(nodes[i].c)) {
            if (leader >= 0)
                return -1;
            leader = i;
        }
    }
    return leader;
}

static bool has_leader(void *arg)
{
    (void)arg;
    return leader_index() >= 0;
}

struct voters_want {
    int leader;
    unsigned voters;
    unsigned standbys;
};

static bool config_is(void *arg)
{
    struct voters_want *w = arg;
    struct consensus_member m[NODES_MAX];
    size_t count = consensus_members(nodes[w->leader].c, m, NODES_MAX);
    unsigned v = 0, s = 0;
    for (size_t i = 0; i < count && i < NODES_MAX; i++) {
        v += m[i].role == CONSENSUS_ROLE_VOTER;
        s += m[i].role == CONSENSUS_ROLE_STANDBY;
    }
    return v == w->voters && s == w->standbys;
}

/* ---- proposals ---- */

struct proposals {
    int done_count;
    int ok_count;
    int last_status;
};

static void on_proposed(void *ctx, int status, void *result)
{
    struct proposals *p = ctx;
    p->done_count++;
    p->last_status = status;
    if (status == 0) {
        p->ok_count++;
        assert_true((uintptr_t)result > 0);
    }
}

static void on_member_done(void *ctx, int status, void *result)
{
    struct proposals *p = ctx;
    assert_null(result);
    p->done_count++;
    p->last_status = status;
    p->ok_count += status == 0;
}

struct propose_wait {
    struct proposals *p;
    int want;
};

static bool proposals_reached(void *arg)
{
    struct propose_wait *w = arg;
    return w->p->done_count >= w->want;
}

/* Propose count values (base, base+1, ...) on the leader in one go. */
static void propose_batch(int leader, uint64_t base, int count)
{
    struct proposals p = {0};
    for (int i = 0; i < count; i++) {
        uint64_t v = base + (uint64_t)i;
        assert_int_equal(consensus_propose(nodes[leader].c, (uint8_t *)&v, 8, on_proposed, &p), 0);
    }
    struct propose_wait w = {&p, count};
    assert_true(run_until(proposals_reached, &w, 10000));
    assert_int_equal(p.ok_count, count);
}

struct applied_want {
    size_t count;
};

static bool all_running_applied(void *arg)
{
    struct applied_want *w = arg;
    for (int i = 0; i < NODES_MAX; i++) {
        if (nodes[i].running && nodes[i].count < w->count)
            return false;
    }
    return true;
}

/* Every running node holds the same sequence as the reference. */
static void assert_same_order(int reference)
{
    for (int i = 0; i < NODES_MAX; i++) {
        if (!nodes[i].running || i == reference)
            continue;
        assert_int_equal(nodes[i].count, nodes[reference].count);
        assert_memory_equal(nodes[i].values, nodes[reference].values,
                            nodes[i].count * sizeof(uint64_t));
    }
}

struct caught_up_want {
    int leader;
    size_t followers;
};

/* The leader's log is committed and applied here, and each follower is
 * streaming (pipeline), heard, and holds all of it. */
static bool followers_caught_up(void *arg)
{
    const struct caught_up_want *w = arg;
    struct consensus_log log;
    consensus_log_state(nodes[w->leader].c, &log);
    if (log.commit_index != log.last_index || log.applied_index != log.last_index)
        return false;
    struct consensus_follower fs[NODES_MAX];
    size_t n = consensus_followers(nodes[w->leader].c, fs, NODES_MAX);
    if (n != w->followers)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (fs[i].state != CONSENSUS_REPLICATION_PIPELINE || !fs[i].heard ||
            fs[i].match_index != log.last_index || fs[i].next_index != log.last_index + 1)
            return false;
    }
    return true;
}

/* What /api/cluster shows: the leader's log state and its followers'
 * progress; a follower reports no followers of its own. */
static void assert_followers_caught_up(int leader, size_t want)
{
    struct caught_up_want w = {leader, want};
    assert_true(run_until(followers_caught_up, &w, 3000));
    struct consensus_log log;
    consensus_log_state(nodes[leader].c, &log);
    assert_true(log.last_index > 0);
    assert_int_equal(log.term, consensus_term(nodes[leader].c));
    struct consensus_follower fs[NODES_MAX];
    size_t n = consensus_followers(nodes[leader].c, fs, NODES_MAX);
    for (size_t i = 0; i < n; i++) {
        assert_int_not_equal(fs[i].id, nodes[leader].id);
        assert_string_equal(consensus_replication_name(fs[i].state), "pipeline");
    }
    for (int i = 0; i < NODES_MAX; i++) {
        if (nodes[i].running && i != leader)
            assert_int_equal(consensus_followers(nodes[i].c, fs, NODES_MAX), 0);
    }
}

/* ---- test 1: the transport handshake, without libraft ---- */

struct transport_probe {
    int accepted;
    uint64_t accepted_id;
    char accepted_address[64];
    int connected;
    int connect_status;
    int transports_closed;
};

static struct transport_probe probe;

static void probe_accept(struct raft_uv_transport *t, raft_id id, const char *address,
                         uv_stream_t *stream)
{
    (void)t;
    probe.accepted++;
    probe.accepted_id = id;
    snprintf(probe.accepted_address, sizeof probe.accepted_address, "%s", address);
    uv_close((uv_handle_t *)stream, (uv_close_cb)raft_free);
}

static void probe_connected(struct raft_uv_connect *req, uv_stream_t *stream, int status)
{
    (void)req;
    probe.connected++;
    probe.connect_status = status;
    if (status == 0) {
        assert_non_null(stream);
        uv_close((uv_handle_t *)stream, (uv_close_cb)raft_free);
    } else {
        assert_null(stream);
    }
}

static bool probe_connect_done(void *arg)
{
    return probe.connected >= *(int *)arg;
}

static void probe_transport_closed(struct raft_uv_transport *t)
{
    (void)t;
    probe.transports_closed++;
}

/* A raw TCP peer in a helper thread: what a non-member or an attacker does. */
struct raw_peer {
    int port;
    enum { RAW_STALL, RAW_FOREIGN, RAW_BAD_PROOF } mode;
    int result; /* RAW_BAD_PROOF: accept status byte; else 0 if closed by the server */
    double closed_after_ms;
    volatile int finished;
};

static int raw_read_full(int fd, uint8_t *buf, size_t size)
{
    size_t have = 0;
    while (have < size) {
        ssize_t r = recv(fd, buf + have, size - have, 0);
        if (r <= 0)
            return -1;
        have += (size_t)r;
    }
    return 0;
}

static void *raw_peer_main(void *arg)
{
    struct raw_peer *rp = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)rp->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    double start = now_ms();
    rp->result = -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        uint8_t buf[128] = {0};
        if (rp->mode == RAW_FOREIGN) {
            /* libraft's own TCP handshake: protocol 1, id 9, a 32-byte address */
            buf[7] = 1, buf[15] = 9, buf[23] = 32;
            memcpy(buf + 24, "127.0.0.1:9009", 14);
            send(fd, buf, 24 + 32, MSG_NOSIGNAL);
        } else if (rp->mode == RAW_BAD_PROOF) {
            const char *addr = "127.0.0.1:1";
            memcpy(buf, "QYRA", 4);
            buf[4] = 1, buf[5] = 1, buf[7] = (uint8_t)strlen(addr), buf[15] = 77;
            memcpy(buf + 56, addr, strlen(addr));
            send(fd, buf, 56 + strlen(addr), MSG_NOSIGNAL);
            uint8_t challenge[80], proof[32] = {0}, accept[8];
            if (raw_read_full(fd, challenge, sizeof challenge) == 0 &&
                send(fd, proof, sizeof proof, MSG_NOSIGNAL) == sizeof proof &&
                raw_read_full(fd, accept, sizeof accept) == 0)
                rp->result = accept[4];
        }
        uint8_t b;
        if (recv(fd, &b, 1, 0) == 0 && rp->mode != RAW_BAD_PROOF)
            rp->result = 0; /* the server closed on us */
    }
    rp->closed_after_ms = now_ms() - start;
    close(fd);
    rp->finished = 1;
    return NULL;
}

static bool raw_finished(void *arg)
{
    return ((struct raw_peer *)arg)->finished;
}

static void raw_peer_run(struct raw_peer *rp)
{
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, raw_peer_main, rp), 0);
    assert_true(run_until(raw_finished, rp, 8000));
    pthread_join(th, NULL);
}

static void transport_make(struct raft_uv_transport *t, const uint8_t *secret, uint64_t id,
                           const char *address)
{
    struct raft_transport_config cfg = {.secret = secret, .secret_size = sizeof SECRET - 1,
                                        .handshake_timeout_ms = 300};
    assert_int_equal(raft_transport_init(t, &loop, &cfg), 0);
    assert_int_equal(t->init(t, id, address), 0);
}

static void test_transport_auth(void **state)
{
    (void)state;
    loop_setup();
    memset(&probe, 0, sizeof probe);
    char a_addr[32], b_addr[32], c_addr[32];
    int a_port = free_port();
    snprintf(a_addr, sizeof a_addr, "127.0.0.1:%d", a_port);
    snprintf(b_addr, sizeof b_addr, "127.0.0.1:%d", free_port());
    snprintf(c_addr, sizeof c_addr, "127.0.0.1:%d", free_port());
    struct raft_uv_transport a, b, c;
    transport_make(&a, SECRET, 1, a_addr);
    transport_make(&b, SECRET, 2, b_addr);
    transport_make(&c, WRONG_SECRET, 3, c_addr);
    assert_int_equal(a.listen(&a, probe_accept), 0);

    /* Right secret: both sides get the stream, the server learns who. */
    struct raft_uv_connect req_b = {0}, req_c = {0}, req_wrong_id = {0};
    assert_int_equal(b.connect(&b, &req_b, 1, a_addr, probe_connected), 0);
    int want = 1;
    assert_true(run_until(probe_connect_done, &want, 3000));
    assert_int_equal(probe.connect_status, 0);
    run_for(50);
    assert_int_equal(probe.accepted, 1);
    assert_int_equal(probe.accepted_id, 2);
    assert_string_equal(probe.accepted_address, b_addr);

    /* Wrong secret: refused on both sides, libraft never sees it. */
    assert_int_equal(c.connect(&c, &req_c, 1, a_addr, probe_connected), 0);
    want = 2;
    assert_true(run_until(probe_connect_done, &want, 3000));
    assert_int_not_equal(probe.connect_status, 0);
    /* Right secret, but the address belongs to another id: refused. */
    assert_int_equal(b.connect(&b, &req_wrong_id, 7, a_addr, probe_connected), 0);
    want = 3;
    assert_true(run_until(probe_connect_done, &want, 3000));
    assert_int_not_equal(probe.connect_status, 0);
    run_for(50);
    assert_int_equal(probe.accepted, 1);

    /* Raw peers: a forged proof is denied, a stall and a foreign protocol
     * are dropped within the step timeout. */
    struct raw_peer bad = {.port = a_port, .mode = RAW_BAD_PROOF};
    raw_peer_run(&bad);
    assert_int_equal(bad.result, 1);
    struct raw_peer stall = {.port = a_port, .mode = RAW_STALL};
    raw_peer_run(&stall);
    assert_int_equal(stall.result, 0);
    assert_true(stall.closed_after_ms < 2000);
    struct raw_peer foreign = {.port = a_port, .mode = RAW_FOREIGN};
    raw_peer_run(&foreign);
    assert_int_equal(foreign.result, 0);
    assert_int_equal(probe.accepted, 1);

    struct raft_transport_stats sa, sc;
    raft_transport_stats(&a, &sa);
    raft_transport_stats(&c, &sc);
    assert_int_equal(sa.accepted_count, 1);
    assert_true(sa.auth_failure_count >= 2); /* c left after the challenge; the forged proof */
    assert_int_equal(sc.auth_failure_count, 1);
    assert_true(sa.timeout_count >= 1);
    assert_true(sa.malformed_count >= 1);
    print_message("transport: stalled peer dropped after %.0f ms (step timeout 300 ms)\n",
                  stall.closed_after_ms);

    a.close(&a, probe_transport_closed);
    b.close(&b, probe_transport_closed);
    c.close(&c, probe_transport_closed);
    run_for(100);
    assert_int_equal(probe.transports_closed, 3);
    raft_transport_release(&a);
    raft_transport_release(&b);
    raft_transport_release(&c);
    loop_teardown();
}

/* ---- test 2: form a cluster, replicate, fail over, refuse strangers ---- */

struct figures {
    double elect_ms;
    double join_ms;
    double failover_ms;
    double latency_mean_ms;
    double latency_max_ms;
};

/* n1 bootstraps; n2 joins through the leader, n3 through a follower
 * (redirected). */
static void form_three(struct figures *f)
{
    double t0 = now_ms();
    node_start_opts(&nodes[0], true, SECRET, 0);
    assert_true(run_until(has_leader, NULL, 5000));
    f->elect_ms = now_ms() - t0;
    assert_int_equal(leader_index(), 0);
    double t1 = now_ms();
    node_start_opts(&nodes[1], false, SECRET, 0);
    node_join(&nodes[1], nodes[0].address);
    assert_true(run_until(node_joined, &nodes[1], 10000));
    assert_int_equal(nodes[1].join_status, 0);
    f->join_ms = now_ms() - t1;
    node_start_opts(&nodes[2], false, SECRET, 0);
    node_join(&nodes[2], nodes[1].address);
    assert_true(run_until(node_joined, &nodes[2], 10000));
    assert_int_equal(nodes[2].join_status, 0);
    struct voters_want w3 = {0, 3, 0};
    assert_true(run_until(config_is, &w3, 5000));
    assert_int_equal(leader_index(), 0);
}

/* One proposal at a time, from propose to done on the leader. */
static void measure_commit_latency(int leader, struct figures *f)
{
    double sum = 0;
    for (int i = 0; i < 50; i++) {
        double s = now_ms();
        propose_batch(leader, 5000 + (uint64_t)i, 1);
        double d = now_ms() - s;
        sum += d;
        f->latency_max_ms = d > f->latency_max_ms ? d : f->latency_max_ms;
    }
    f->latency_mean_ms = sum / 50;
}

/* n4 has the wrong secret: it cannot join, and the leader and term stay. */
static void wrong_secret_cannot_join(int leader)
{
    uint64_t term = consensus_term(nodes[leader].c);
    node_start_opts(&nodes[3], false, WRONG_SECRET, 0);
    const char *peers[] = {nodes[1].address, nodes[0].address};
    assert_int_equal(consensus_join(nodes[3].c, peers, 2, on_joined, &nodes[3]), 0);
    run_for(1500);
    assert_false(nodes[3].join_done);
    struct consensus_stats st;
    consensus_stats(nodes[leader].c, &st);
    assert_true(st.auth_failure_count > 0);
    struct voters_want w3 = {leader, 3, 0};
    assert_true(run_until(config_is, &w3, 10)); /* still 3 voters, nobody else */
    assert_int_equal(leader_index(), leader);
    assert_int_equal(consensus_term(nodes[leader].c), term);
    node_stop(&nodes[3]);
    assert_true(nodes[3].join_done);
    assert_int_equal(nodes[3].join_status, CONSENSUS_E_SHUTDOWN);
}

static void test_cluster_basic(void **state)
{
    (void)state;
    loop_setup();
    node_init_all();
    struct figures f = {0};
    form_three(&f);
    int leader = 0;

    /* Replicate: the same order everywhere; a follower refuses. */
    propose_batch(leader, 1000, 50);
    struct applied_want aw = {50};
    assert_true(run_until(all_running_applied, &aw, 5000));
    assert_same_order(leader);
    measure_commit_latency(leader, &f);
    assert_followers_caught_up(leader, 2);
    uint64_t v = 42;
    assert_int_equal(consensus_propose(nodes[1].c, (uint8_t *)&v, 8, on_proposed, NULL),
                     CONSENSUS_E_NOT_LEADER);

    wrong_secret_cannot_join(leader);

    /* The right secret can: a 4th voter. */
    node_start_opts(&nodes[4], false, SECRET, 0);
    node_join(&nodes[4], nodes[2].address);
    assert_true(run_until(node_joined, &nodes[4], 10000));
    struct voters_want w4 = {leader, 4, 0};
    assert_true(run_until(config_is, &w4, 5000));
    aw.count = 100;
    assert_true(run_until(all_running_applied, &aw, 5000));

    /* Stop the leader: a new one, and the survivors keep applying. */
    double t1 = now_ms();
    node_stop(&nodes[leader]);
    assert_true(run_until(has_leader, NULL, 10000));
    f.failover_ms = now_ms() - t1;
    int leader2 = leader_index();
    assert_int_not_equal(leader2, leader);
    propose_batch(leader2, 9000, 20);
    aw.count = 120;
    assert_true(run_until(all_running_applied, &aw, 5000));
    assert_same_order(leader2);
    assert_true(f.failover_ms < 5000); /* measured 0.6-2 s; generous for a loaded CI */
    print_message("cluster: first election %.0f ms, join %.0f ms; new leader %.0f ms after "
                  "stopping the leader (election %d ms, heartbeat %d ms); commit latency "
                  "mean %.2f ms max %.2f ms\n",
                  f.elect_ms, f.join_ms, f.failover_ms, ELECTION_MS, HEARTBEAT_MS,
                  f.latency_mean_ms, f.latency_max_ms);

    /* Stopping with a membership change in flight (an unreachable voter
     * being caught up) completes it with an error and leaks nothing. */
    struct proposals pm = {0};
    assert_int_equal(
        consensus_add_member(nodes[leader2].c, 9, "127.0.0.1:1", on_member_done, &pm), 0);
    run_for(300);
    assert_int_equal(pm.done_count, 0);
    nodes_cleanup();
    assert_int_equal(pm.done_count, 1);
    assert_int_not_equal(pm.last_status, 0);
    loop_teardown();
}

/* ---- test 3: snapshots, a late joiner, standbys, promotion ---- */

static bool no_snapshot_busy(void *arg)
{
    (void)arg;
    for (int i = 0; i < NODES_MAX; i++) {
        struct consensus_log log;
        if (!nodes[i].running)
            continue;
        consensus_log_state(nodes[i].c, &log);
        if (log.snapshot_busy_ms != 0)
            return false;
    }
    return true;
}

static void test_snapshot_and_standby(void **state)
{
    (void)state;
    loop_setup();
    node_init_all();
    node_start_opts(&nodes[0], true, SECRET, 16);
    assert_true(run_until(has_leader, NULL, 5000));
    for (int i = 0; i < 5; i++)
        propose_batch(0, 1 + 20 * (uint64_t)i, 20), run_for(150); /* snapshots are async */
    struct consensus_stats st;
    consensus_stats(nodes[0].c, &st);
    assert_true(st.snapshot_count >= 2);

    /* Joiners 2..6: the first four vote, the sixth member is a standby. */
    for (int i = 1; i < 6; i++) {
        node_start_opts(&nodes[i], false, SECRET, 16);
        node_join(&nodes[i], nodes[i - 1].address);
        assert_true(run_until(node_joined, &nodes[i], 15000));
        assert_int_equal(nodes[i].join_status, 0);
    }
    struct voters_want w = {0, 5, 1};
    assert_true(run_until(config_is, &w, 5000));
    struct applied_want aw = {100};
    assert_true(run_until(all_running_applied, &aw, 10000));
    assert_same_order(0);
    for (int i = 1; i < 6; i++)
        assert_true(nodes[i].restores >= 1); /* caught up from a snapshot */
    struct consensus_member m[NODES_MAX];
    size_t count = consensus_members(nodes[0].c, m, NODES_MAX);
    assert_int_equal(count, 6);
    assert_int_equal(m[5].id, 6);
    assert_int_equal(m[5].role, CONSENSUS_ROLE_STANDBY);

    /* More entries reach the standby too. */
    propose_batch(0, 500, 30);
    aw.count = 130;
    assert_true(run_until(all_running_applied, &aw, 10000));
    assert_same_order(0);
    /* Then idle: every snapshot store finishes without further entries (a
     * store left pending would make libraft ignore the leader's snapshots). */
    assert_true(run_until(no_snapshot_busy, NULL, 3000));

    /* Removing a voter promotes the standby. */
    struct proposals p = {0};
    assert_int_equal(consensus_remove_member(nodes[0].c, 2, on_member_done, &p), 0);
    struct propose_wait pw = {&p, 1};
    assert_true(run_until(proposals_reached, &pw, 5000));
    assert_int_equal(p.last_status, 0);
    node_stop(&nodes[1]);
    struct voters_want w5 = {0, 5, 0};
    assert_true(run_until(config_is, &w5, 10000));
    /* A member restarts on its data dir: it replays snapshot and log into
     * an empty state machine, "join" is a no-op, and it keeps up. */
    node_stop(&nodes[2]);
    propose_batch(0, 700, 10);
    nodes[2].count = 0;
    nodes[2].last_index = 0;
    node_start_opts(&nodes[2], true, SECRET, 16); /* bootstrap is ignored: dir has state */
    node_join(&nodes[2], nodes[0].address);
    assert_true(run_until(node_joined, &nodes[2], 5000));
    assert_int_equal(nodes[2].join_status, 0);
    aw.count = 140;
    assert_true(run_until(all_running_applied, &aw, 10000));
    assert_same_order(0);
    /* A follower cannot change membership. */
    assert_int_equal(consensus_add_member(nodes[2].c, 9, "127.0.0.1:1", NULL, NULL),
                     CONSENSUS_E_NOT_LEADER);
    nodes_cleanup();
    loop_teardown();
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* the process's job, as in quayd */
    if (getenv("QUAY_TEST_DEBUG") == NULL)
        log_level_current = LOG_LEVEL_ERROR;
    else
        log_level_current = LOG_LEVEL_DEBUG;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transport_auth),
        cmocka_unit_test(test_cluster_basic),
        cmocka_unit_test(test_snapshot_and_standby),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
