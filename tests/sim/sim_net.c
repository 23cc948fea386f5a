/*
 * sim_net.c: the network. s->cut[i][j]: what i sends j is lost. A cut
 * is made on the fixture's link too (raft_fixture_disconnect), so Raft's
 * messages and what the simulator models beside them (heartbeats heard,
 * requests to the leader, replication streams) see the same network.
 */
#include "sim.h"

/* Whether what i sends reaches j. */
bool sim_net_reaches(const struct sim *s, unsigned i, unsigned j)
{
    return s->f.servers[i].alive && s->f.servers[j].alive && (i == j || !s->cut[i][j]);
}

/* Both ways (a replication stream and its acks). */
bool sim_net_reachable(const struct sim *s, unsigned i, unsigned j)
{
    return sim_net_reaches(s, i, j) && sim_net_reaches(s, j, i);
}

/* Cuts (on) or mends what i sends j. */
void sim_net_cut(struct sim *s, unsigned i, unsigned j, bool on)
{
    if (i == j || s->cut[i][j] == on)
        return;
    s->cut[i][j] = on;
    s->net_changes++;
    if (on)
        raft_fixture_disconnect(&s->f, i, j);
    else
        raft_fixture_reconnect(&s->f, i, j);
}

unsigned sim_net_cuts_count(const struct sim *s)
{
    unsigned n = 0;
    for (unsigned i = 0; i < s->f.n; i++) {
        for (unsigned j = 0; j < s->f.n; j++)
            n += s->cut[i][j];
    }
    return n;
}
