/*
 * node_config.c: a cluster member's configuration: the options' checks
 * (cluster_node_config_check), the cluster secret file, the broker's
 * stable id (DATA/cluster-id, created once), and addresses ("host:port",
 * and the AMQP address a broker advertises).
 *
 * Start-up only: reads and writes two small files synchronously.
 */
#include "cluster/node.h"
#include "cluster/node_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "lib/assert.h"
#include "lib/log.h"

/* ---- small helpers ---- */

/* "host:port" -> host and port; the host may be bracketed IPv6. */
static int split_address(const char *address, char *host, size_t host_size, int *port)
{
    const char *colon = strrchr(address, ':');
    if (colon == NULL || colon == address || (size_t)(colon - address) >= host_size)
        return -1;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end != '\0' || colon[1] == '\0' || p <= 0 || p > 65535)
        return -1;
    snprintf(host, host_size, "%.*s", (int)(colon - address), address);
    *port = (int)p;
    return 0;
}

int node__parse_ipv4_address(const char *address, struct sockaddr_in *out)
{
    char host[64];
    int port;
    if (split_address(address, host, sizeof host, &port) != 0)
        return -1;
    return uv_ip4_addr(host, port, out) == 0 ? 0 : -1;
}

bool node__name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > CLUSTER_NAME_SIZE_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)s[i] <= ' ' || s[i] == 0x7f)
            return false; /* one token: it is logged as "name=state" */
    }
    return true;
}

/* ---- configuration, secret and id ---- */

static int check_join_list(const char *join, char *err, size_t err_size)
{
    char copy[CLUSTER_NODE_PEERS_MAX * 32 + 64];
    if (strlen(join) >= sizeof copy) {
        snprintf(err, err_size, "--join: list too long");
        return -1;
    }
    snprintf(copy, sizeof copy, "%s", join);
    size_t count = 0;
    char *save = NULL;
    for (char *p = strtok_r(copy, ",", &save); p != NULL; p = strtok_r(NULL, ",", &save)) {
        struct sockaddr_in sa;
        if (node__parse_ipv4_address(p, &sa) != 0) {
            snprintf(err, err_size, "--join: '%s' is not an IPv4 'a.b.c.d:port'", p);
            return -1;
        }
        count++;
    }
    if (count == 0 || count > CLUSTER_NODE_PEERS_MAX) {
        snprintf(err, err_size, "--join: give 1..%d addresses", CLUSTER_NODE_PEERS_MAX);
        return -1;
    }
    return 0;
}

/* Reads the secret file into out (at least SECRET_SIZE_MIN bytes). */
int node__read_secret(const char *path, uint8_t *out, size_t *size_out, char *err,
                      size_t err_size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, err_size, "cannot read the cluster secret file %s: %s", path,
                 strerror(errno));
        return -1;
    }
    uint8_t buf[SECRET_SIZE_MAX + 1];
    size_t size = 0;
    ssize_t n;
    while (size < sizeof buf && (n = read(fd, buf + size, sizeof buf - size)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(err, err_size, "cannot read %s: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        size += (size_t)n;
    }
    close(fd);
    if (size < SECRET_SIZE_MIN || size > SECRET_SIZE_MAX) {
        snprintf(err, err_size, "the cluster secret file %s must hold %d..%d bytes (it has %s%zu)",
                 path, SECRET_SIZE_MIN, SECRET_SIZE_MAX, size > SECRET_SIZE_MAX ? "over " : "",
                 size > SECRET_SIZE_MAX ? (size_t)SECRET_SIZE_MAX : size);
        OPENSSL_cleanse(buf, sizeof buf);
        return -1;
    }
    if (out != NULL) {
        memcpy(out, buf, size);
        *size_out = size;
    }
    OPENSSL_cleanse(buf, sizeof buf);
    return 0;
}

int cluster_node_config_check(const struct cluster_node_config *config, char *err,
                              size_t err_size)
{
    ASSERT(config != NULL);
    struct sockaddr_in sa;
    if (config->listen == NULL || node__parse_ipv4_address(config->listen, &sa) != 0) {
        snprintf(err, err_size, "--cluster-listen must be an IPv4 'a.b.c.d:port' (port > 0)");
        return -1;
    }
    if (config->name != NULL && config->name[0] != '\0' && !node__name_ok(config->name)) {
        snprintf(err, err_size, "--name must be 1..%d printable characters without spaces",
                 CLUSTER_NAME_SIZE_MAX);
        return -1;
    }
    if (config->join != NULL && config->join[0] != '\0' &&
        check_join_list(config->join, err, err_size) != 0)
        return -1;
    if (config->secret_file == NULL || config->secret_file[0] == '\0') {
        snprintf(err, err_size,
                 "clustering needs --cluster-secret-file FILE (the same file on every broker, "
                 "%d..%d bytes); refusing to start without it", SECRET_SIZE_MIN,
                 SECRET_SIZE_MAX);
        return -1;
    }
    return node__read_secret(config->secret_file, NULL, NULL, err, err_size);
}

/* DATA/cluster-id holds the broker id in decimal; it is created once
 * (write, fsync, rename) so restarts keep the id. */
int node__load_or_create_id(const char *data_dir, uint32_t *id_out, char *err,
                            size_t err_size)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/cluster-id", data_dir);
    FILE *f = fopen(path, "re");
    if (f != NULL) {
        unsigned long long v = 0;
        int n = fscanf(f, "%llu", &v);
        fclose(f);
        if (n != 1 || v == 0 || v > UINT32_MAX) {
            snprintf(err, err_size, "%s is corrupt (expected a number 1..%u)", path,
                     UINT32_MAX);
            return -1;
        }
        *id_out = (uint32_t)v;
        return 0;
    }
    if (errno != ENOENT) {
        snprintf(err, err_size, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    uint32_t id = 0;
    while (id == 0) {
        if (RAND_bytes((unsigned char *)&id, sizeof id) != 1) {
            snprintf(err, err_size, "no randomness for a broker id");
            return -1;
        }
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    char text[16];
    int len = snprintf(text, sizeof text, "%" PRIu32 "\n", id);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    bool ok = fd >= 0 && write(fd, text, (size_t)len) == len && fsync(fd) == 0;
    if (fd >= 0)
        close(fd);
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, err_size, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    LOG_INFO("cluster: new broker id %" PRIu32 " stored in %s", id, path);
    *id_out = id;
    return 0;
}

void cluster_node_amqp_address(const struct sockaddr *bound, const char *cluster_address,
                               char *out, size_t out_size)
{
    ASSERT(bound != NULL && cluster_address != NULL);
    char host[INET6_ADDRSTRLEN] = "";
    int port = 0;
    bool wildcard = false;
    if (bound->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)bound;
        uv_ip6_name(a, host, sizeof host);
        port = ntohs(a->sin6_port);
        wildcard = memcmp(&a->sin6_addr, &in6addr_any, sizeof a->sin6_addr) == 0;
    } else {
        const struct sockaddr_in *a = (const struct sockaddr_in *)bound;
        uv_ip4_name(a, host, sizeof host);
        port = ntohs(a->sin_port);
        wildcard = a->sin_addr.s_addr == htonl(INADDR_ANY);
    }
    char cluster_host[64];
    int cluster_port;
    if (wildcard && split_address(cluster_address, cluster_host, sizeof cluster_host,
                                  &cluster_port) == 0)
        snprintf(out, out_size, "%s:%d", cluster_host, port);
    else if (bound->sa_family == AF_INET6)
        snprintf(out, out_size, "[%s]:%d", host, port);
    else
        snprintf(out, out_size, "%s:%d", host, port);
}
