/*
 * bare_broker.h: a struct broker for unit tests of queues and vhosts: no
 * listeners, journal or cluster, its lists and tables empty. One place to
 * initialise them, so a list added to struct broker is added here and not
 * in every test that builds one.
 */
#ifndef QUAY_TESTS_BARE_BROKER_H
#define QUAY_TESTS_BARE_BROKER_H

#include <string.h>
#include <uv.h>

#include "broker/broker.h"

static inline void bare_broker_init(struct broker *broker)
{
    memset(broker, 0, sizeof *broker);
    broker->loop = uv_default_loop();
    list_init(&broker->flow_congested);
    list_init(&broker->queues_all);
    list_init(&broker->connections);
    hmap_init(&broker->vhosts);
}

#endif
