/*
 * main.c: the quayd server binary. Parses options, takes the data
 * directory's lock, starts the broker on a libuv loop, and shuts down
 * cleanly on SIGTERM/SIGINT (exit status 0).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
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
#include "cli/services.h"
#include "cluster/consensus.h"
#include "cluster/node.h"
#include "lib/errors.h"
#include "lib/hash.h"
#include "lib/log.h"
#include "mgmt/api_definitions.h"
#include "store/shared_storage.h"

/* The TLS options, in the middle of usage()'s text. */
static const char usage_tls[] =
    "  --tls-listen ADDR:PORT  AMQPS (AMQP over TLS) listener (repeatable;\n"
    "                          conventionally port 5671); needs --tls-cert, --tls-key\n"
    "  --tls-cert F --tls-key F  PEM certificate chain and key (AMQPS, HTTPS)\n"
    "  --tls-ca FILE           PEM CAs that sign client certificates\n"
    "  --tls-verify MODE       client certificates on AMQPS: none (default), peer\n"
    "                          (asked for, verified if given) or require (the\n"
    "                          handshake fails without one); a verified one logs\n"
    "                          in with the mechanism EXTERNAL as its subject CN.\n"
    "                          SIGHUP reloads the certificate, key and CAs\n"
    "  --cluster-tls           the AMQP links between brokers go over AMQPS (the\n"
    "                          first --tls-listen), and Raft over TLS, each end\n"
    "                          presenting --tls-cert and verifying the other's\n"
    "                          against --tls-ca, as well as the cluster secret\n";

/* The cluster options, after the broker's own in usage()'s text. */
static const char usage_cluster[] =
    "  --name NAME             this broker's name in the cluster (default: host name)\n"
    "  --cluster-listen A:P    form or join a cluster: Raft over TCP and member\n"
    "                          heartbeats over UDP on this IPv4 address and port\n"
    "  --join A:P[,A:P...]     join the cluster through these members (without\n"
    "                          --join, a new cluster is formed)\n"
    "  --cluster-secret-file F the cluster secret: the file's bytes (16..1024), the\n"
    "                          same on every broker; required with --cluster-listen\n"
    "  --default-backups N     cluster: backups of a queue declared without\n"
    "                          x-quay-backups (0..3, default 1)\n"
    "  --auto-rebalance on|off cluster: keep queues spread over the brokers, moving\n"
    "                          them after joins, returns and failovers (default on;\n"
    "                          the cluster's first leader sets it for the cluster,\n"
    "                          POST /api/cluster/rebalance changes it at run time)\n"
    "  --partition-handling ignore|pause-minority\n"
    "                          cluster: cut off from the majority for 3 s, close\n"
    "                          clients' connections and refuse new ones until it\n"
    "                          is heard again (pause-minority), or keep them\n"
    "                          (ignore, the default, as RabbitMQ's)\n"
    "  --catch-up-rate SIZE    cluster: bytes a second this broker sends to catch\n"
    "                          up new backups, all queues together, kept smooth\n"
    "                          (default 300MB; 0: as fast as they take it)\n"
    "  --queue-locator L       cluster: where queues declared here live: 'ring'\n"
    "                          (default: placed by the ring; exclusive, auto-delete\n"
    "                          and server-named ones here) or 'others' (always on\n"
    "                          another broker while one is up: a proxy-only front)\n";

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
            "  --http ADDR:PORT        serve the management HTTP API (quayctl) there;\n"
            "                          off by default (e.g. 127.0.0.1:15672). It takes\n"
            "                          HTTP Basic logins of users with a management tag\n"
            "                          (guest/guest without --users); a non-loopback\n"
            "                          ADDR needs --http-allow-plaintext\n"
            "  --https ADDR:PORT       the management API over TLS (--tls-cert, --tls-key):\n"
            "                          may listen on any address\n"
            "  --http-allow-plaintext  let --http listen on a non-loopback address, its\n"
            "                          passwords crossing the network in clear\n"
            "  --http-allowed-hosts NAME[,NAME...]  names the API answers to in the Host\n"
            "                          header besides its addresses (and localhost on\n"
            "                          loopback): a DNS rebinding defence\n");
    fputs(usage_tls, out);
    fprintf(out,
            "  --data DIR              data directory (default ./quay-data)\n"
            "  --shared-storage DIR    keep the journal in DIR/NAME/ on a filesystem every\n"
            "                          broker mounts: a dead broker's durable queues without\n"
            "                          an in-sync backup are taken over from their logs\n"
            "  --users FILE            users file, one user a line:\n"
            "                          NAME HASH VHOST[,VHOST...] [loopback] [tags=TAG,...]\n"
            "                          TAG: administrator, monitoring, policymaker,\n"
            "                          management (the management API's rights; none:\n"
            "                          no API access)\n"
            "  --log-level LEVEL       error, warn, info (default) or debug\n"
            "  --log-format FORMAT     text (default) or json: one object per line, the\n"
            "                          message's leading key=value words as members\n"
            "  --frame-max BYTES       largest frame offered in tune (default 131072)\n"
            "  --channel-max N         channels per connection (default 2047)\n"
            "  --heartbeat SECONDS     heartbeat offered in tune (default 60, 0 = off)\n"
            "  --max-connections N     refuse connections beyond N (default unlimited)\n"
            "  --max-handshaking N     close new connections at once while N have not\n"
            "                          logged in yet (default 1000, 0 = unlimited)\n"
            "  --handshake-timeout MS  close a connection not open after MS (default 10000)\n"
            "  --max-queues N          queues per vhost (default unlimited)\n"
            "  --max-consumers N       consumers per channel (default unlimited)\n"
            "  --max-message-size B    largest message body (default 134217728)\n"
            "  --read-batch-us US      a publisher streaming faster than we read is read in\n"
            "                          batches that wait at most US microseconds\n"
            "                          (default 500, 0 = read whatever arrived at once)\n"
            "  --read-share BYTES      read at most this much of one client's connection\n"
            "                          in a loop turn, so one that never waits cannot\n"
            "                          starve the others (default 131072, 0 = no limit)\n"
            "  --memory-high-watermark M  block publishers above this much memory: a\n"
            "                          fraction of RAM (0.4, the default) or a size (512MiB)\n"
            "  --disk-free-limit SIZE  block publishers when the disk of the data directory or\n"
            "                          of the journal (--shared-storage) has\n"
            "                          less free space (default 50MB; 0 = off)\n"
            "  --config FILE           read options from FILE first: 'name = value' lines\n"
            "                          with the long option names, '#' comments\n");
    fputs(usage_cluster, out);
    fprintf(out,
            "  --definitions FILE      apply RabbitMQ's definitions JSON at start (refused:\n"
            "                          no start); see docs/MANAGEMENT-API.md\n"
            "  --password-hashing-module M  how new and changed passwords are stored:\n"
            "                          rabbit_password_hashing_sha256 (default; RabbitMQ's),\n"
            "                          rabbit_password_hashing_sha512, or\n"
            "                          quay_password_hashing_pbkdf2_sha256 (slow on purpose;\n"
            "                          short names sha256, sha512, pbkdf2). Every form\n"
            "                          logs in whatever this says\n"
            "  --pbkdf2-iterations N   PBKDF2's iterations for new passwords (default 600000;\n"
            "                          1000..10000000)\n"
            "  --hash-password PW      print a password hash for the users file (in the\n"
            "                          form the options before it say) and exit\n"
            "  --help                  this text\n");
}

enum option_id {
    OPT_LISTEN = 256, OPT_DATA, OPT_USERS, OPT_DEFINITIONS, OPT_LOG_LEVEL, OPT_LOG_FORMAT,
    OPT_FRAME_MAX, OPT_CHANNEL_MAX,
    OPT_HEARTBEAT, OPT_MAX_CONNECTIONS, OPT_MAX_QUEUES, OPT_MAX_CONSUMERS,
    OPT_MAX_MESSAGE_SIZE, OPT_HASH_PASSWORD, OPT_HELP, OPT_MEMORY_HIGH_WATERMARK,
    OPT_DISK_FREE_LIMIT, OPT_HTTP,
    OPT_CONFIG, OPT_NAME, OPT_CLUSTER_LISTEN, OPT_JOIN, OPT_CLUSTER_SECRET_FILE,
    OPT_DEFAULT_BACKUPS, OPT_READ_BATCH_US, OPT_READ_SHARE, OPT_QUEUE_LOCATOR, OPT_AUTO_REBALANCE,
    OPT_PARTITION_HANDLING,
    OPT_CATCH_UP_RATE, OPT_HTTP_ALLOW_PLAINTEXT,
    OPT_HTTP_ALLOWED_HOSTS, OPT_MAX_HANDSHAKING, OPT_HANDSHAKE_TIMEOUT,
    OPT_HTTPS, OPT_TLS_LISTEN, OPT_TLS_CERT, OPT_TLS_KEY, OPT_TLS_CA, OPT_TLS_VERIFY,
    OPT_CLUSTER_TLS, OPT_SHARED_STORAGE, OPT_PASSWORD_HASHING_MODULE, OPT_PBKDF2_ITERATIONS,
};

static const struct option long_options[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"data", required_argument, NULL, OPT_DATA},
    {"shared-storage", required_argument, NULL, OPT_SHARED_STORAGE},
    {"users", required_argument, NULL, OPT_USERS},
    {"definitions", required_argument, NULL, OPT_DEFINITIONS},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"log-format", required_argument, NULL, OPT_LOG_FORMAT},
    {"frame-max", required_argument, NULL, OPT_FRAME_MAX},
    {"channel-max", required_argument, NULL, OPT_CHANNEL_MAX},
    {"heartbeat", required_argument, NULL, OPT_HEARTBEAT},
    {"max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS},
    {"max-handshaking", required_argument, NULL, OPT_MAX_HANDSHAKING},
    {"handshake-timeout", required_argument, NULL, OPT_HANDSHAKE_TIMEOUT},
    {"max-queues", required_argument, NULL, OPT_MAX_QUEUES},
    {"max-consumers", required_argument, NULL, OPT_MAX_CONSUMERS},
    {"max-message-size", required_argument, NULL, OPT_MAX_MESSAGE_SIZE},
    {"hash-password", required_argument, NULL, OPT_HASH_PASSWORD},
    {"password-hashing-module", required_argument, NULL, OPT_PASSWORD_HASHING_MODULE},
    {"pbkdf2-iterations", required_argument, NULL, OPT_PBKDF2_ITERATIONS},
    {"memory-high-watermark", required_argument, NULL, OPT_MEMORY_HIGH_WATERMARK},
    {"disk-free-limit", required_argument, NULL, OPT_DISK_FREE_LIMIT},
    {"http", required_argument, NULL, OPT_HTTP},
    {"http-allow-plaintext", no_argument, NULL, OPT_HTTP_ALLOW_PLAINTEXT},
    {"http-allowed-hosts", required_argument, NULL, OPT_HTTP_ALLOWED_HOSTS},
    {"https", required_argument, NULL, OPT_HTTPS},
    {"tls-listen", required_argument, NULL, OPT_TLS_LISTEN},
    {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
    {"tls-key", required_argument, NULL, OPT_TLS_KEY},
    {"tls-ca", required_argument, NULL, OPT_TLS_CA},
    {"tls-verify", required_argument, NULL, OPT_TLS_VERIFY},
    {"cluster-tls", no_argument, NULL, OPT_CLUSTER_TLS},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"name", required_argument, NULL, OPT_NAME},
    {"cluster-listen", required_argument, NULL, OPT_CLUSTER_LISTEN},
    {"join", required_argument, NULL, OPT_JOIN},
    {"cluster-secret-file", required_argument, NULL, OPT_CLUSTER_SECRET_FILE},
    {"default-backups", required_argument, NULL, OPT_DEFAULT_BACKUPS},
    {"read-batch-us", required_argument, NULL, OPT_READ_BATCH_US},
    {"read-share", required_argument, NULL, OPT_READ_SHARE},
    {"queue-locator", required_argument, NULL, OPT_QUEUE_LOCATOR},
    {"auto-rebalance", required_argument, NULL, OPT_AUTO_REBALANCE},
    {"partition-handling", required_argument, NULL, OPT_PARTITION_HANDLING},
    {"catch-up-rate", required_argument, NULL, OPT_CATCH_UP_RATE},
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

/* The cluster options; config->clustered once they are checked
 * (services_start_cluster joins with them). */
static struct cluster_node_config cluster_config;

static void set_cluster_option(int opt, const char *value)
{
    switch (opt) {
    case OPT_NAME: cluster_config.name = value; break;
    case OPT_CLUSTER_LISTEN: cluster_config.listen = value; break;
    case OPT_JOIN: cluster_config.join = value; break;
    case OPT_CLUSTER_SECRET_FILE: cluster_config.secret_file = value; break;
    default: break;
    }
}

/* The numeric limits: each option's bounds and where its value goes. */
static const struct {
    int opt;
    const char *name;
    uint64_t min;
    uint64_t max;
    size_t offset; /* in struct broker_limits */
    size_t size;   /* of that field: 2, 4 or 8 bytes */
} limit_options[] = {
#define LIMIT(opt, name, min, max, field) \
    {opt, name, min, max, offsetof(struct broker_limits, field), \
     sizeof(((struct broker_limits *)0)->field)}
    LIMIT(OPT_FRAME_MAX, "frame-max", 4096, 1u << 30, frame_max),
    LIMIT(OPT_CHANNEL_MAX, "channel-max", 1, 65535, channel_max),
    LIMIT(OPT_HEARTBEAT, "heartbeat", 0, 65535, heartbeat_s),
    LIMIT(OPT_MAX_CONNECTIONS, "max-connections", 0, UINT32_MAX, connections_max),
    LIMIT(OPT_MAX_HANDSHAKING, "max-handshaking", 0, UINT32_MAX, handshaking_max),
    LIMIT(OPT_HANDSHAKE_TIMEOUT, "handshake-timeout", 100, 3600000, handshake_timeout_ms),
    LIMIT(OPT_MAX_QUEUES, "max-queues", 0, UINT32_MAX, queues_max),
    LIMIT(OPT_MAX_CONSUMERS, "max-consumers", 0, UINT32_MAX, consumers_per_channel_max),
    LIMIT(OPT_MAX_MESSAGE_SIZE, "max-message-size", 0, 512u << 20, message_size_max),
    LIMIT(OPT_READ_BATCH_US, "read-batch-us", 0, 100000, read_batch_us),
    LIMIT(OPT_READ_SHARE, "read-share", 0, 1u << 30, read_share),
#undef LIMIT
};

/* Returns 1 if opt is a numeric limit (and sets it), 0 if it is not one,
 * -1 for a bad value. */
static int set_limit(int opt, const char *text, struct broker_limits *limits)
{
    for (size_t i = 0; i < sizeof limit_options / sizeof limit_options[0]; i++) {
        if (limit_options[i].opt != opt)
            continue;
        uint64_t v;
        if (parse_u64(limit_options[i].name, text, limit_options[i].max, &v) != 0)
            return -1;
        if (v < limit_options[i].min) {
            fprintf(stderr, "quayd: --%s must be at least %llu\n", limit_options[i].name,
                    (unsigned long long)limit_options[i].min);
            return -1;
        }
        char *field = (char *)limits + limit_options[i].offset;
        if (limit_options[i].size == 2) {
            uint16_t narrow = (uint16_t)v;
            memcpy(field, &narrow, sizeof narrow);
        } else if (limit_options[i].size == 4) {
            uint32_t narrow = (uint32_t)v;
            memcpy(field, &narrow, sizeof narrow);
        } else {
            memcpy(field, &v, sizeof v);
        }
        return 1;
    }
    return 0;
}

/* The sized options (alarms, the cluster's default backups): 1 if opt is
 * one of them (and it is set), 0 if not, -1 for a bad value. */
static int set_sized(int opt, const char *text, struct broker_config *config)
{
    uint64_t n;
    switch (opt) {
    case OPT_MEMORY_HIGH_WATERMARK:
        if (alarm_parse_size(text, true, &config->memory_high_watermark) == 0)
            return 1;
        fprintf(stderr, "quayd: bad value for --memory-high-watermark: '%s'\n", text);
        return -1;
    case OPT_DISK_FREE_LIMIT:
        if (alarm_parse_size(text, false, &config->disk_free_limit) == 0)
            return 1;
        fprintf(stderr, "quayd: bad value for --disk-free-limit: '%s'\n", text);
        return -1;
    case OPT_DEFAULT_BACKUPS:
        if (parse_u64("default-backups", text, 3, &n) != 0)
            return -1;
        config->default_backups = (uint8_t)n;
        return 1;
    case OPT_CATCH_UP_RATE:
        if (alarm_parse_size(text, false, &config->catch_up_rate) == 0)
            return 1;
        fprintf(stderr, "quayd: bad value for --catch-up-rate: '%s' (bytes a second, e.g. "
                "100MB)\n", text);
        return -1;
    case OPT_AUTO_REBALANCE:
        if (strcmp(text, "on") == 0 || strcmp(text, "off") == 0) {
            config->auto_rebalance = text[1] == 'n';
            return 1;
        }
        fprintf(stderr, "quayd: bad value for --auto-rebalance: '%s' (on or off)\n", text);
        return -1;
    case OPT_PARTITION_HANDLING:
        if (strcmp(text, "ignore") == 0 || strcmp(text, "pause-minority") == 0) {
            config->pause_minority = text[0] == 'p';
            return 1;
        }
        fprintf(stderr, "quayd: bad value for --partition-handling: '%s' (ignore or "
                "pause-minority)\n", text);
        return -1;
    case OPT_QUEUE_LOCATOR:
        if (strcmp(text, "ring") == 0 || strcmp(text, "others") == 0) {
            config->queue_locator = text[0] == 'r' ? QUEUE_LOCATOR_RING : QUEUE_LOCATOR_OTHERS;
            return 1;
        }
        fprintf(stderr, "quayd: bad value for --queue-locator: '%s' (ring or others)\n", text);
        return -1;
    default:
        return 0;
    }
}

/* --http-allow-plaintext was given (check_http_options reads it). */
static bool http_allow_plaintext;

/* A comma-separated list of host names: none empty, no spaces. */
static bool host_list_ok(const char *list)
{
    for (const char *p = list;; p++) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n > 255 || strcspn(p, " \t") < n)
            return false;
        p += n;
        if (*p == '\0')
            return true;
    }
}

/* The management API's options: 1 if opt is one of them (and it is set),
 * 0 if not, -1 for a bad value. */
static int set_http_option(int opt, const char *text, struct broker_config *config)
{
    struct sockaddr_storage ss;
    switch (opt) {
    case OPT_HTTP:
    case OPT_HTTPS:
        if (listener_parse_address(text, &ss) != 0) {
            fprintf(stderr, "quayd: bad value for --%s: '%s'\n", opt == OPT_HTTP ? "http" : "https",
                    text);
            return -1;
        }
        config->http_listen = text;
        config->http_tls = opt == OPT_HTTPS;
        return 1;
    case OPT_HTTP_ALLOW_PLAINTEXT:
        http_allow_plaintext = true;
        return 1;
    case OPT_HTTP_ALLOWED_HOSTS:
        if (!host_list_ok(text)) {
            fprintf(stderr, "quayd: bad value for --http-allowed-hosts: '%s' (NAME[,NAME...])\n",
                    text);
            return -1;
        }
        config->http_allowed_hosts = text;
        return 1;
    default:
        return 0;
    }
}

/* The TLS options: 1 if opt is one of them (and it is set), 0 if not, -1
 * for a bad value. */
static int set_tls_option(int opt, const char *text, struct broker_config *config)
{
    struct sockaddr_storage ss;
    switch (opt) {
    case OPT_TLS_LISTEN:
        if (listener_parse_address(text, &ss) != 0) {
            fprintf(stderr, "quayd: bad value for --tls-listen: '%s'\n", text);
            return -1;
        }
        if (config->tls_listen_count == BROKER_LISTENERS_MAX) {
            fprintf(stderr, "quayd: at most %d --tls-listen\n", BROKER_LISTENERS_MAX);
            return -1;
        }
        config->tls_listen[config->tls_listen_count++] = text;
        return 1;
    case OPT_TLS_CERT: config->tls.cert_file = text; return 1;
    case OPT_TLS_KEY: config->tls.key_file = text; return 1;
    case OPT_TLS_CA: config->tls.ca_file = text; return 1;
    case OPT_CLUSTER_TLS: config->cluster_tls = true; return 1;
    case OPT_TLS_VERIFY:
        if (tls_verify_parse(text, &config->tls.verify) == 0)
            return 1;
        fprintf(stderr, "quayd: bad value for --tls-verify: '%s' (none, peer or require)\n",
                text);
        return -1;
    default:
        return 0;
    }
}

/* A TLS listener needs a certificate and key; the files themselves are
 * loaded (and their errors reported) by broker_start. */
static int check_tls_options(const struct broker_config *config)
{
    bool wanted = config->tls_listen_count > 0 || config->http_tls;
    bool given = config->tls.cert_file != NULL || config->tls.key_file != NULL ||
                 config->tls.ca_file != NULL;
    if (wanted && (config->tls.cert_file == NULL || config->tls.key_file == NULL)) {
        fprintf(stderr, "quayd: --tls-listen and --https need --tls-cert and --tls-key\n");
        return -1;
    }
    if (!wanted && given) {
        fprintf(stderr, "quayd: --tls-cert, --tls-key and --tls-ca need --tls-listen or "
                        "--https\n");
        return -1;
    }
    if (config->tls.verify != TLS_VERIFY_NONE && config->tls.ca_file == NULL) {
        fprintf(stderr, "quayd: --tls-verify peer or require needs --tls-ca\n");
        return -1;
    }
    if (config->cluster_tls && (config->tls_listen_count == 0 || !config->clustered ||
                                config->tls.verify == TLS_VERIFY_NONE)) {
        fprintf(stderr, "quayd: --cluster-tls needs --cluster-listen, --tls-listen (the links\n"
                        "connect there) and --tls-verify peer or require (with --tls-ca)\n");
        return -1;
    }
    return 0;
}

/* Over plain HTTP the API's Basic credentials travel in clear, so it
 * listens beyond loopback only over TLS (--https), or when the operator
 * says that is fine (a private network, or a TLS proxy in front). */
static int check_http_options(const struct broker_config *config)
{
    if (config->http_listen == NULL || config->http_tls)
        return 0;
    struct sockaddr_storage ss;
    int rc = listener_parse_address(config->http_listen, &ss);
    if (rc != 0)
        return -1; /* checked when parsed */
    bool loopback = false;
    if (ss.ss_family == AF_INET) {
        loopback = ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24 == 127;
    } else if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
        loopback = IN6_IS_ADDR_LOOPBACK(a) ||
                   (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    if (loopback)
        return 0;
    if (http_allow_plaintext) {
        LOG_WARN("the management API listens on %s without TLS (--http-allow-plaintext): "
                 "its passwords cross the network in clear", config->http_listen);
        return 0;
    }
    fprintf(stderr,
            "quayd: --http %s is not a loopback address: the API's passwords would cross\n"
            "the network in clear. Serve it over TLS (--https with --tls-cert, --tls-key),\n"
            "listen on 127.0.0.1 (and reach it through an SSH tunnel or a TLS proxy), or\n"
            "add --http-allow-plaintext.\n",
            config->http_listen);
    return -1;
}

/* --definitions FILE: loaded once the broker started (load_definitions). */
static const char *definitions_file;

/* Checks the definitions file and starts applying it (api_definitions.h).
 * Returns 0, or -1 (logged): the broker should not start. */
static int load_definitions(struct broker *broker)
{
    FILE *f = fopen(definitions_file, "rb");
    char *text = NULL;
    size_t size = 0, cap = 0, n;
    if (f == NULL) {
        LOG_ERROR("--definitions %s: %s", definitions_file, strerror(errno));
        return -1;
    }
    do {
        if (size + 65536 > cap) {
            cap = cap ? cap * 2 : 131072;
            text = realloc(text, cap);
            if (text == NULL)
                abort();
        }
        n = fread(text + size, 1, cap - size, f);
        size += n;
    } while (n > 0);
    bool read_error = ferror(f);
    fclose(f);
    char err[512];
    int rc = read_error ? -1 : api_definitions_load(broker, definitions_file, text, size, err,
                                                    sizeof err);
    if (rc != 0)
        LOG_ERROR("--definitions %s: %s", definitions_file, read_error ? "cannot read" : err);
    free(text);
    return rc;
}

/* --password-hashing-module, --pbkdf2-iterations: 1 taken, 0 not one of
 * them, -1 refused; --hash-password prints a hash in the form the options
 * before it say, and exits. */
static int set_password_option(int opt, const char *value, struct broker_config *config)
{
    struct password_policy *policy = &config->password_policy;
    if (policy->iterations == 0)
        policy->iterations = PASSWORD_PBKDF2_ITERATIONS_DEFAULT;
    if (opt == OPT_PASSWORD_HASHING_MODULE) {
        int a = password_algorithm_parse(value);
        if (a < 0 || a == PASSWORD_MD5) {
            fprintf(stderr, "quayd: --password-hashing-module: '%s' is not one of "
                    "rabbit_password_hashing_sha256, rabbit_password_hashing_sha512, "
                    "quay_password_hashing_pbkdf2_sha256\n", value);
            return -1;
        }
        policy->algorithm = (enum password_algorithm)a;
        return 1;
    }
    if (opt == OPT_HASH_PASSWORD) {
        char hash[PASSWORD_TEXT_MAX + 1];
        auth_hash_password(policy, value, hash, sizeof hash);
        printf("%s\n", hash);
        exit(0);
    }
    if (opt != OPT_PBKDF2_ITERATIONS)
        return 0;
    char *end;
    errno = 0;
    unsigned long n = strtoul(value, &end, 10);
    if (errno != 0 || end == value || *end != '\0' || n < PASSWORD_PBKDF2_ITERATIONS_MIN ||
        n > PASSWORD_PBKDF2_ITERATIONS_MAX) {
        fprintf(stderr, "quayd: --pbkdf2-iterations: '%s' is not in 1000..10000000\n", value);
        return -1;
    }
    policy->iterations = (uint32_t)n;
    return 1;
}

static int parse_options(int argc, char **argv, struct broker_config *config)
{
    int opt;
    while ((opt = getopt_long(argc, argv, "h", long_options, NULL)) != -1) {
        int limit = set_limit(opt, optarg, &config->limits);
        if (limit == 0)
            limit = set_sized(opt, optarg, config);
        if (limit == 0)
            limit = set_http_option(opt, optarg, config);
        if (limit == 0)
            limit = set_tls_option(opt, optarg, config);
        if (limit == 0)
            limit = set_password_option(opt, optarg, config);
        if (limit < 0)
            return -1;
        if (limit > 0)
            continue;
        switch (opt) {
        case OPT_LISTEN:
            if (config->listen_count == BROKER_LISTENERS_MAX) {
                fprintf(stderr, "quayd: at most %d --listen\n", BROKER_LISTENERS_MAX);
                return -1;
            }
            config->listen[config->listen_count++] = optarg;
            break;
        case OPT_CONFIG: /* read before the command line: load_config_file */
        case OPT_NAME:
        case OPT_CLUSTER_LISTEN:
        case OPT_JOIN:
        case OPT_CLUSTER_SECRET_FILE:
            set_cluster_option(opt, optarg);
            break;
        case OPT_DATA:
            config->data_dir = optarg;
            break;
        case OPT_SHARED_STORAGE:
            config->shared_storage_dir = optarg;
            break;
        case OPT_USERS:
            config->users_file = optarg;
            break;
        case OPT_DEFINITIONS:
            definitions_file = optarg;
            break;
        case OPT_LOG_LEVEL:
            if (log_level_parse(optarg, &log_level_current) != 0) {
                fprintf(stderr, "quayd: unknown log level '%s'\n", optarg);
                return -1;
            }
            break;
        case OPT_LOG_FORMAT: {
            enum log_format format;
            if (log_format_parse(optarg, &format) != 0) {
                fprintf(stderr, "quayd: bad value for --log-format: '%s' (text or json)\n",
                        optarg);
                return -1;
            }
            log_set_format(format);
            break;
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

/* --config FILE: one option per line, "name = value" (or a bare "name"),
 * with the long option names; '#' starts a comment. The file is parsed
 * before the command line, so the command line wins for single options and
 * repeatable ones (--listen) add up. The text stays in static buffers: the
 * configuration keeps pointers into it. */
#define CONFIG_FILE_SIZE_MAX 65536
#define CONFIG_ARGS_MAX 128
static char config_text[CONFIG_FILE_SIZE_MAX];
static char config_args_text[CONFIG_FILE_SIZE_MAX + 3 * CONFIG_ARGS_MAX];
static char *config_argv[CONFIG_ARGS_MAX + 2];

static const char *find_config_option(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--config") == 0)
            return i + 1 < argc ? argv[i + 1] : NULL;
        if (strncmp(argv[i], "--config=", 9) == 0)
            return argv[i] + 9;
    }
    return NULL;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\r')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

/* Turns the file's lines into "--name=value" arguments for parse_options. */
static int load_config_file(const char *path, struct broker_config *config)
{
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        fprintf(stderr, "quayd: cannot read config file %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t size = fread(config_text, 1, sizeof config_text - 1, f);
    bool whole = feof(f) && !ferror(f);
    fclose(f);
    if (!whole) {
        fprintf(stderr, "quayd: config file %s is unreadable or over %d bytes\n", path,
                CONFIG_FILE_SIZE_MAX - 1);
        return -1;
    }
    config_text[size] = '\0';
    int argc = 0, line_number = 0;
    size_t used = 0;
    config_argv[argc++] = "quayd";
    for (char *line = config_text, *next; line != NULL; line = next) {
        next = strchr(line, '\n');
        if (next != NULL)
            *next++ = '\0';
        line_number++;
        char *comment = strchr(line, '#');
        if (comment != NULL)
            *comment = '\0';
        char *equals = strchr(line, '=');
        if (equals != NULL)
            *equals = '\0';
        char *name = trim(line), *value = equals != NULL ? trim(equals + 1) : NULL;
        if (*name == '\0' && value == NULL)
            continue;
        if (*name == '\0' || strcmp(name, "config") == 0 || argc == CONFIG_ARGS_MAX) {
            fprintf(stderr, "quayd: %s:%d: expected 'name = value' (no nested config, at "
                    "most %d lines)\n", path, line_number, CONFIG_ARGS_MAX);
            return -1;
        }
        config_argv[argc++] = config_args_text + used;
        used += (size_t)snprintf(config_args_text + used, sizeof config_args_text - used,
                                 value != NULL ? "--%s=%s" : "--%s", name, value) + 1;
    }
    config_argv[argc] = NULL;
    optind = 0; /* GNU getopt: start over, for this vector and then argv */
    if (parse_options(argc, config_argv, config) != 0) {
        fprintf(stderr, "quayd: (in config file %s)\n", path);
        return -1;
    }
    optind = 0;
    return 0;
}

/* Clustering is on with --cluster-listen. Its options are checked before
 * anything starts, so a broker without a usable secret refuses to start. */
static int check_cluster_options(struct broker_config *config)
{
    if (cluster_config.listen == NULL) {
        if (cluster_config.join != NULL || cluster_config.secret_file != NULL) {
            fprintf(stderr, "quayd: --join and --cluster-secret-file need --cluster-listen\n");
            return -1;
        }
        return 0;
    }
    char err[1024];
    if (cluster_node_config_check(&cluster_config, err, sizeof err) != 0) {
        fprintf(stderr, "quayd: %s\n", err);
        return -1;
    }
    config->clustered = true;
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

/* --shared-storage: the journal goes to DIR/<name>/, locked like the data
 * directory (flock: honoured across NFS v4 clients and GFS2 nodes; the
 * fencing that does not rely on it is journal_adopt's rename). */
static int open_shared_storage(struct broker_config *config)
{
    static char journal_dir[4096];
    static char storage_id[SHARED_STORAGE_ID_SIZE + 1];
    if (config->shared_storage_dir == NULL)
        return 0;
    if (!config->clustered || cluster_config.name == NULL) {
        fprintf(stderr, "quayd: --shared-storage needs --cluster-listen and --name\n");
        return -1;
    }
    char err[512];
    if (shared_storage_open(config->shared_storage_dir, cluster_config.name, journal_dir,
                            sizeof journal_dir, storage_id, err, sizeof err) != 0) {
        fprintf(stderr, "quayd: --shared-storage: %s\n", err);
        return -1;
    }
    config->journal_dir = journal_dir;
    config->storage_id = storage_id;
    return lock_data_dir(journal_dir) < 0 ? -1 : 0; /* the lock lives with the process */
}

static struct broker broker;
static uv_signal_t sigterm_handle, sigint_handle, sighup_handle;

static void on_signal(uv_signal_t *handle, int signum)
{
    LOG_INFO("signal %d: shutting down", signum);
    uv_close((uv_handle_t *)&sigterm_handle, NULL);
    uv_close((uv_handle_t *)&sigint_handle, NULL);
    uv_close((uv_handle_t *)&sighup_handle, NULL);
    (void)handle;
    broker_stop(&broker);
}

static void on_sighup(uv_signal_t *handle, int signum)
{
    (void)handle;
    LOG_INFO("signal %d: reloading the TLS certificates", signum);
    broker_reload_tls(&broker);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    /* Before any table exists: every name clients choose is hashed under it. */
    if (hash_seed_random() != OK) {
        fprintf(stderr, "quayd: no randomness for the hash key (getrandom failed)\n");
        return 1;
    }
    struct broker_config config;
    broker_config_defaults(&config);
    const char *config_file = find_config_option(argc, argv);
    if (config_file != NULL && load_config_file(config_file, &config) != 0)
        return 2;
    if (parse_options(argc, argv, &config) != 0 || check_cluster_options(&config) != 0 ||
        check_http_options(&config) != 0 || check_tls_options(&config) != 0)
        return 2;
    int lock_fd = lock_data_dir(config.data_dir);
    if (lock_fd < 0 || open_shared_storage(&config) != 0)
        return 1;
    uv_loop_t *loop = uv_default_loop();
    if (config.listen_count == 0)
        config.listen[config.listen_count++] = "[::]:5672"; /* dual-stack */
    /* The broker first, then what is plugged into it (cli/services.h). */
    if (broker_start(&broker, loop, &config) != 0 ||
        (config.clustered && services_start_cluster(&broker, &cluster_config) != 0) ||
        (config.http_listen != NULL && services_start_http(&broker) != 0))
        return 1; /* logged; nothing to clean up in a process that ends */
    if (definitions_file != NULL && load_definitions(&broker) != 0)
        return 1;
    uv_signal_init(loop, &sigterm_handle);
    uv_signal_start(&sigterm_handle, on_signal, SIGTERM);
    uv_signal_init(loop, &sigint_handle);
    uv_signal_start(&sigint_handle, on_signal, SIGINT);
    /* SIGHUP reloads the TLS files (and is otherwise ignored: a closed
     * terminal does not stop the broker). */
    uv_signal_init(loop, &sighup_handle);
    uv_signal_start(&sighup_handle, on_sighup, SIGHUP);
    LOG_INFO("quayd ready (data %s)", config.data_dir);
    uv_run(loop, UV_RUN_DEFAULT);
    broker_free(&broker);
    consensus_release_remains(); /* the loop has run dry */
    int rc = uv_loop_close(loop);
    if (rc != 0)
        LOG_WARN("loop closed with handles still open: %s", uv_strerror(rc));
    close(lock_fd);
    LOG_INFO("quayd stopped");
    return 0;
}
