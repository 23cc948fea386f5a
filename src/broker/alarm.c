/*
 * alarm.c: see alarm.h.
 */
#include "broker/alarm.h"

#include <malloc.h>
#if defined(__SANITIZE_ADDRESS__)
/* From the sanitizer runtime (sanitizer/allocator_interface.h, which gcc
 * does not install). */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "broker/broker.h"
#include "broker/connection.h"
#include "broker/durable.h"
#include "broker/message.h"
#include "lib/assert.h"
#include "lib/log.h"

/* The disk is sampled again after the time the space left above the
 * limit takes to write at DISK_FAST_WRITE_BYTES_PER_MS (250 MB/s, as
 * RabbitMQ's disk monitor assumes): once a second with room to spare, at
 * every broker tick (250 ms) close to the limit, where a publisher of
 * large messages fills a second's headroom. The alarm can still come
 * late by a tick's writes plus what is in flight: the limit is that
 * margin (50 MB by default). */
#define DISK_SAMPLE_MAX_MS 1000
#define DISK_FAST_WRITE_BYTES_PER_MS 250000
/* The heap besides the messages (mallinfo2) is sampled once in this
 * long, and at every tick once the estimate is past HEAP_NEAR of the
 * paging limit: mallinfo2 walks every free chunk the allocator has, 1-1.5
 * ms (once 4.5) of the loop with the fragmented heap of a broker holding
 * 200 MB of messages, and the message bytes, the part that moves fast,
 * are counted as they change. */
#define HEAP_SAMPLE_MS 2000
#define HEAP_NEAR(limit) ((limit) / 4 * 3)
/* A blocked publisher's socket silent this long gets keepalive probes. */
#define BLOCKED_KEEPALIVE_IDLE_S 30
/* Per-message memory beyond its bytes: the struct, the queue entry, malloc. */
#define MESSAGE_OVERHEAD_BYTES 96

int alarm_parse_size(const char *text, bool fraction_allowed, uint64_t *out)
{
    char *end;
    double value = strtod(text, &end);
    if (end == text || value < 0)
        return -1;
    if (fraction_allowed && strchr(text, '.') && *end == '\0') {
        if (value > 1.0)
            return -1;
        long pages = sysconf(_SC_PHYS_PAGES);
        long page_size = sysconf(_SC_PAGESIZE);
        *out = (uint64_t)(value * (double)pages * (double)page_size);
        return 0;
    }
    static const struct {
        const char *suffix;
        double factor;
    } units[] = {{"", 1},      {"B", 1},        {"kB", 1e3},     {"KiB", 1024.0},
                 {"MB", 1e6},  {"MiB", 1048576.0}, {"GB", 1e9}, {"GiB", 1073741824.0},
                 {"K", 1024.0}, {"M", 1048576.0}, {"G", 1073741824.0}};
    for (size_t i = 0; i < ARRAY_SIZE(units); i++) {
        if (strcasecmp(end, units[i].suffix) == 0) {
            *out = (uint64_t)(value * units[i].factor);
            return 0;
        }
    }
    return -1;
}

void alarm_init(struct alarm *alarm, uint64_t memory_high_watermark, uint64_t disk_free_limit)
{
    memset(alarm, 0, sizeof *alarm);
    alarm->memory_high_watermark = memory_high_watermark;
    alarm->disk_free_limit = disk_free_limit;
}

static uint64_t message_bytes(void)
{
    return message_live_bytes + message_live_count * MESSAGE_OVERHEAD_BYTES;
}

/* Bytes the allocator has handed out and not had back. glibc's malloc
 * reports it through mallinfo2; AddressSanitizer replaces malloc and
 * reports its own figure (mallinfo2 would see nothing). */
static uint64_t heap_in_use(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return __sanitizer_get_current_allocated_bytes();
#else
    struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
#endif
}

uint64_t alarm_memory_estimate(const struct alarm *alarm)
{
    int64_t estimate = (int64_t)message_bytes() + alarm->heap_other_bytes;
    return estimate > 0 ? (uint64_t)estimate : 0;
}

static void block(struct broker *broker, struct connection *connection)
{
    if (connection->blocked || connection->state != CONNECTION_STATE_OPEN)
        return;
    connection->blocked = true;
    if (connection->client_blocked) {
        /* RabbitMQ's reasons; memory wins when both alarms are on. */
        struct method m = {.id = METHOD_CONNECTION_BLOCKED};
        bool memory = broker->alarm.memory_on || broker->alarm.cluster_memory_on;
        m.connection_blocked.reason =
            memory ? BYTES_LIT("low on memory") : BYTES_LIT("low on disk");
        connection_send_method(connection, 0, &m);
    }
    conn_pause_reading(&connection->conn, CONN_PAUSE_ALARM);
    /* Not read, it is watched through the kernel (connection_tick); with
     * heartbeats off only keepalive tells of a host that vanished. */
    conn_keepalive(&connection->conn, BLOCKED_KEEPALIVE_IDLE_S);
}

static void unblock(struct connection *connection)
{
    if (!connection->blocked)
        return;
    connection->blocked = false;
    if (connection->client_blocked && connection->state == CONNECTION_STATE_OPEN) {
        struct method m = {.id = METHOD_CONNECTION_UNBLOCKED};
        connection_send_method(connection, 0, &m);
    }
    conn_resume_reading(&connection->conn, CONN_PAUSE_ALARM);
}

static void set_alarm(struct broker *broker, bool *flag, bool on, const char *what)
{
    if (*flag == on)
        return;
    bool was_active = alarm_active(&broker->alarm);
    *flag = on;
    bool active = alarm_active(&broker->alarm);
    LOG_WARN("%s alarm %s (memory estimate %llu of %llu bytes, disk free %llu, limit %llu)",
             what, on ? "set: blocking publishers" : "cleared",
             (unsigned long long)alarm_memory_estimate(&broker->alarm),
             (unsigned long long)broker->alarm.memory_high_watermark,
             (unsigned long long)broker->alarm.disk_free_bytes,
             (unsigned long long)broker->alarm.disk_free_limit);
    if (active == was_active)
        return;
    list_for_each(node, &broker->connections) {
        struct connection *connection = CONTAINER_OF(node, struct connection, broker_link);
        if (active && connection->publisher)
            block(broker, connection);
        else if (!active)
            unblock(connection);
    }
}

void alarm_set_cluster(struct broker *broker, bool memory, bool disk)
{
    set_alarm(broker, &broker->alarm.cluster_memory_on, memory, "another broker's memory");
    set_alarm(broker, &broker->alarm.cluster_disk_on, disk, "another broker's disk");
}

void alarm_check_publish(struct broker *broker)
{
    struct alarm *alarm = &broker->alarm;
    if (alarm->memory_high_watermark && !alarm->memory_on &&
        alarm_memory_estimate(alarm) > alarm->memory_high_watermark)
        set_alarm(broker, &alarm->memory_on, true, "memory");
}

void alarm_note_publisher(struct broker *broker, struct connection *connection)
{
    connection->publisher = true;
    if (alarm_active(&broker->alarm))
        block(broker, connection);
}

void alarm_tick(struct broker *broker, uint64_t now_ms)
{
    struct alarm *alarm = &broker->alarm;
    if (alarm->memory_high_watermark) {
        /* Past half the mark, persistent messages on durable queues leave
         * memory for the journal (RabbitMQ's paging ratio, 0.5), so only
         * what cannot be paged pushes toward the alarm. */
        uint64_t paging_limit = alarm->memory_high_watermark / 2;
        if (now_ms >= alarm->heap_next_sample_ms ||
            alarm_memory_estimate(alarm) > HEAP_NEAR(paging_limit)) {
            alarm->heap_other_bytes = (int64_t)heap_in_use() - (int64_t)message_bytes();
            alarm->heap_next_sample_ms = now_ms + HEAP_SAMPLE_MS;
        }
        uint64_t estimate = alarm_memory_estimate(alarm);
        if (estimate > paging_limit) {
            durable_page_out(broker, estimate - paging_limit);
            estimate = alarm_memory_estimate(alarm);
        }
        if (estimate > alarm->memory_high_watermark)
            set_alarm(broker, &alarm->memory_on, true, "memory");
        else if (estimate < alarm->memory_high_watermark / 10 * 9)
            set_alarm(broker, &alarm->memory_on, false, "memory");
    }
    if (alarm->disk_free_limit && now_ms >= alarm->disk_next_sample_ms) {
        alarm->disk_next_sample_ms = now_ms + DISK_SAMPLE_MAX_MS;
        /* The messages' filesystem and the data directory's (Raft's log,
         * the cluster id): with --shared-storage they may differ, and
         * either one full stops the broker's writes. */
        const char *dirs[] = {broker->config.data_dir, broker->config.journal_dir};
        uint64_t least = UINT64_MAX;
        for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
            struct statvfs vfs;
            if (dirs[i] != NULL && statvfs(dirs[i], &vfs) == 0 &&
                (uint64_t)vfs.f_bavail * vfs.f_frsize < least)
                least = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        }
        if (least != UINT64_MAX) {
            alarm->disk_free_bytes = least;
            set_alarm(broker, &alarm->disk_on, least < alarm->disk_free_limit, "disk");
            uint64_t room = least > alarm->disk_free_limit ? least - alarm->disk_free_limit : 0;
            uint64_t wait = room / DISK_FAST_WRITE_BYTES_PER_MS;
            alarm->disk_next_sample_ms = now_ms + (wait < DISK_SAMPLE_MAX_MS ? wait
                                                                            : DISK_SAMPLE_MAX_MS);
        }
    }
}
