/*
 * main.c: the quayd server binary. Parses options, takes the data
 * directory's lock, starts the broker on a libuv loop, and shuts down
 * cleanly on SIGTERM/SIGINT (exit status 0).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "broker/alarm.h"
#include "broker/auth.h"
#include "broker/broker.h"
#include "lib/log.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: quayd [options]\n"
            "\n"
            "A clustered AMQP 0-9-1 message broker. With no options it serves AMQP on\n"
            "port 5672 (IPv4 and IPv6), keeps its data under ./quay-data and accepts\n"
            "guest/guest from loopback only.\n"
            "\n"
            "options:\n"
            "  --listen ADDR:PORT      AMQP listener (repeatable; default [::]:5672).\n"
            "                          ADDR may be an IPv4 or [IPv6] address or empty\n"
            "  --data DIR              data directory (default ./quay-data)\n"
            "  --users FILE            users file: NAME HASH VHOST[,VHOST] [loopback]\n"
            "  --log-level LEVEL       error, warn, info (default) or debug\n"
            "  --frame-max BYTES       largest frame offered in tune (default 131072)\n"
            "  --channel-max N         channels per connection (default 2047)\n"
            "  --heartbeat SECONDS     heartbeat offered in tune (default 60, 0 = off)\n"
            "  --max-connections N     refuse connections beyond N (default unlimited)\n"
            "  --max-queues N          queues per vhost (default unlimited)\n"
            "  --max-consumers N       consumers per channel (default unlimited)\n"
            "  --max-message-size B    largest message body (default 134217728)\n"
            "  --memory-high-watermark M  block publishers above this much memory: a\n"
            "                          fraction of RAM (0.4, the default) or a size (512MiB)\n"
            "  --disk-free-limit SIZE  block publishers when the data directory's disk has\n"
            "                          less free space (default 50MB; 0 = off)\n"
            "  --hash-password PW      print a password hash for the users file and exit\n"
            "  --help                  this text\n");
}

enum option_id {
    OPT_LISTEN = 256, OPT_DATA, OPT_USERS, OPT_LOG_LEVEL, OPT_FRAME_MAX, OPT_CHANNEL_MAX,
    OPT_HEARTBEAT, OPT_MAX_CONNECTIONS, OPT_MAX_QUEUES, OPT_MAX_CONSUMERS,
    OPT_MAX_MESSAGE_SIZE, OPT_HASH_PASSWORD, OPT_HELP, OPT_MEMORY_HIGH_WATERMARK,
    OPT_DISK_FREE_LIMIT,
};

static const struct option long_options[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"data", required_argument, NULL, OPT_DATA},
    {"users", required_argument, NULL, OPT_USERS},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"frame-max", required_argument, NULL, OPT_FRAME_MAX},
    {"channel-max", required_argument, NULL, OPT_CHANNEL_MAX},
    {"heartbeat", required_argument, NULL, OPT_HEARTBEAT},
    {"max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS},
    {"max-queues", required_argument, NULL, OPT_MAX_QUEUES},
    {"max-consumers", required_argument, NULL, OPT_MAX_CONSUMERS},
    {"max-message-size", required_argument, NULL, OPT_MAX_MESSAGE_SIZE},
    {"hash-password", required_argument, NULL, OPT_HASH_PASSWORD},
    {"memory-high-watermark", required_argument, NULL, OPT_MEMORY_HIGH_WATERMARK},
    {"disk-free-limit", required_argument, NULL, OPT_DISK_FREE_LIMIT},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static int parse_u64(const char *name, const char *text, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *text == '\0' || *end != '\0' || v > max) {
        fprintf(stderr, "quayd: bad value for --%s: '%s'\n", name, text);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_options(int argc, char **argv, struct broker_config *config)
{
    int opt;
    uint64_t v;
    while ((opt = getopt_long(argc, argv, "h", long_options, NULL)) != -1) {
        switch (opt) {
        case OPT_LISTEN:
            if (config->listen_count == BROKER_LISTENERS_MAX) {
                fprintf(stderr, "quayd: at most %d --listen\n", BROKER_LISTENERS_MAX);
                return -1;
            }
            config->listen[config->listen_count++] = optarg;
            break;
        case OPT_DATA:
            config->data_dir = optarg;
            break;
        case OPT_USERS:
            config->users_file = optarg;
            break;
        case OPT_LOG_LEVEL:
            if (log_level_parse(optarg, &log_level_current) != 0) {
                fprintf(stderr, "quayd: unknown log level '%s'\n", optarg);
                return -1;
            }
            break;
        case OPT_FRAME_MAX:
            if (parse_u64("frame-max", optarg, 1u << 30, &v) || v < 4096)
                return -1;
            config->limits.frame_max = (uint32_t)v;
            break;
        case OPT_CHANNEL_MAX:
            if (parse_u64("channel-max", optarg, 65535, &v) || v == 0)
                return -1;
            config->limits.channel_max = (uint16_t)v;
            break;
        case OPT_HEARTBEAT:
            if (parse_u64("heartbeat", optarg, 65535, &v))
                return -1;
            config->limits.heartbeat_s = (uint16_t)v;
            break;
        case OPT_MAX_CONNECTIONS:
            if (parse_u64("max-connections", optarg, UINT32_MAX, &v))
                return -1;
            config->limits.connections_max = (uint32_t)v;
            break;
        case OPT_MAX_QUEUES:
            if (parse_u64("max-queues", optarg, UINT32_MAX, &v))
                return -1;
            config->limits.queues_max = (uint32_t)v;
            break;
        case OPT_MAX_CONSUMERS:
            if (parse_u64("max-consumers", optarg, UINT32_MAX, &v))
                return -1;
            config->limits.consumers_per_channel_max = (uint32_t)v;
            break;
        case OPT_MAX_MESSAGE_SIZE:
            if (parse_u64("max-message-size", optarg, 512u << 20, &v))
                return -1;
            config->limits.message_size_max = v;
            break;
        case OPT_MEMORY_HIGH_WATERMARK:
            if (alarm_parse_size(optarg, true, &config->memory_high_watermark) != 0) {
                fprintf(stderr, "quayd: bad value for --memory-high-watermark: '%s'\n", optarg);
                return -1;
            }
            break;
        case OPT_DISK_FREE_LIMIT:
            if (alarm_parse_size(optarg, false, &config->disk_free_limit) != 0) {
                fprintf(stderr, "quayd: bad value for --disk-free-limit: '%s'\n", optarg);
                return -1;
            }
            break;
        case OPT_HASH_PASSWORD: {
            char hash[64];
            auth_hash_password(optarg, hash, sizeof hash);
            printf("%s\n", hash);
            exit(0);
        }
        case OPT_HELP:
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "quayd: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    return 0;
}

/* Creates the data directory and holds an exclusive lock on it for the
 * life of the process, so two brokers never share one directory. */
static int lock_data_dir(const char *dir)
{
    if (mkdir(dir, 0750) != 0 && errno != EEXIST) {
        fprintf(stderr, "quayd: cannot create data directory %s: %s\n", dir, strerror(errno));
        return -1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/LOCK", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) {
        fprintf(stderr, "quayd: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr,
                "quayd: data directory %s is in use by another quayd (lock %s held)\n", dir,
                path);
        close(fd);
        return -1;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || write(fd, pid, (size_t)n) != n)
        fprintf(stderr, "quayd: warning: cannot write pid to %s\n", path);
    return fd; /* kept open: the lock lives as long as the process */
}

static struct broker broker;
static uv_signal_t sigterm_handle, sigint_handle;

static void on_signal(uv_signal_t *handle, int signum)
{
    LOG_INFO("signal %d: shutting down", signum);
    uv_close((uv_handle_t *)&sigterm_handle, NULL);
    uv_close((uv_handle_t *)&sigint_handle, NULL);
    (void)handle;
    broker_stop(&broker);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    struct broker_config config;
    broker_config_defaults(&config);
    if (parse_options(argc, argv, &config) != 0)
        return 2;
    int lock_fd = lock_data_dir(config.data_dir);
    if (lock_fd < 0)
        return 1;
    uv_loop_t *loop = uv_default_loop();
    if (config.listen_count == 0)
        config.listen[config.listen_count++] = "[::]:5672"; /* dual-stack */
    if (broker_start(&broker, loop, &config) != 0)
        return 1; /* logged; nothing to clean up in a process that ends */
    uv_signal_init(loop, &sigterm_handle);
    uv_signal_start(&sigterm_handle, on_signal, SIGTERM);
    uv_signal_init(loop, &sigint_handle);
    uv_signal_start(&sigint_handle, on_signal, SIGINT);
    LOG_INFO("quayd ready (data %s)", config.data_dir);
    uv_run(loop, UV_RUN_DEFAULT);
    broker_free(&broker);
    int rc = uv_loop_close(loop);
    if (rc != 0)
        LOG_WARN("loop closed with handles still open: %s", uv_strerror(rc));
    close(lock_fd);
    LOG_INFO("quayd stopped");
    return 0;
}
