/*
 * alarm.h: the memory and disk alarms (RabbitMQ's vm_memory_high_watermark
 * and disk_free_limit).
 *
 * While an alarm is on, every connection that publishes is sent
 * connection.blocked (if its client announced the capability) and is no
 * longer read from (but still watched: connection_tick asks the kernel
 * whether its peer is gone); consumers keep draining. When memory falls
 * back under the mark (and disk space over the limit) they get
 * connection.unblocked and are read again.
 *
 * Memory is estimated in O(1) on every publish: the bytes of live messages
 * plus the rest of the heap as last sampled (the allocator's count of bytes
 * in use, every tick). So a
 * flood is stopped within one read batch per connection, not one tick.
 */
#ifndef QUAY_BROKER_ALARM_H
#define QUAY_BROKER_ALARM_H

#include <stdbool.h>
#include <stdint.h>

struct broker;
struct connection;

struct alarm {
    uint64_t memory_high_watermark;  /* bytes; 0 = no memory alarm */
    uint64_t disk_free_limit;        /* bytes; 0 = no disk alarm */
    int64_t heap_other_bytes;        /* heap in use that is not message bytes */
    uint64_t heap_next_sample_ms;    /* loop time of the next heap_other_bytes sample */
    uint64_t disk_free_bytes;        /* last sample: the least of the data and journal dirs' */
    uint64_t disk_next_sample_ms;    /* loop time of the next statvfs */
    bool memory_on;
    bool disk_on;
    /* Another broker of the cluster has its alarm on: the alarms are
     * cluster-wide (alarm_set_cluster). */
    bool cluster_memory_on;
    bool cluster_disk_on;
};

/* Parses "0.4" (a fraction of physical memory) or "512MiB"/"2GB"/"1048576". */
int alarm_parse_size(const char *text, bool fraction_allowed, uint64_t *out);

void alarm_init(struct alarm *alarm, uint64_t memory_high_watermark, uint64_t disk_free_limit);
/* Periodic sampling (heap, disk); raises and clears alarms. */
void alarm_tick(struct broker *broker, uint64_t now_ms);
/* After a message was made: raises the memory alarm if the estimate is
 * over the mark. O(1). */
void alarm_check_publish(struct broker *broker);
static inline bool alarm_active(const struct alarm *alarm)
{
    return alarm->memory_on || alarm->disk_on || alarm->cluster_memory_on ||
           alarm->cluster_disk_on;
}
/* The other brokers' alarms (a clustered broker's member, every tick):
 * publishers here are blocked while one is on, as for our own. */
void alarm_set_cluster(struct broker *broker, bool memory, bool disk);
/* The estimate of the heap in use, in bytes. */
uint64_t alarm_memory_estimate(const struct alarm *alarm);
/* Past half the mark (RabbitMQ's paging ratio): durable queues page out. */
static inline bool alarm_over_paging_limit(const struct alarm *alarm)
{
    return alarm->memory_high_watermark &&
           alarm_memory_estimate(alarm) > alarm->memory_high_watermark / 2;
}
/* A connection published: block it now if an alarm is on. */
void alarm_note_publisher(struct broker *broker, struct connection *connection);

#endif
