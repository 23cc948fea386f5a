/*
 * heartbeat.c: see heartbeat.h.
 */
#include "cluster/heartbeat.h"

#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "amqp/wire.h"
#include "lib/assert.h"

#define MAGIC "QYHB"
#define VERSION 1

static void mac_of(const uint8_t *secret, size_t secret_size, const uint8_t *data, size_t size,
                   uint8_t *mac)
{
    unsigned int mac_size = 0;
    uint8_t *r = HMAC(EVP_sha256(), secret, (int)secret_size, data, size, mac, &mac_size);
    ASSERT(r != NULL);
    ASSERT(mac_size == HEARTBEAT_MAC_SIZE);
}

static size_t put_field(uint8_t *out, const char *text)
{
    size_t n = strlen(text);
    ASSERT(n >= 1 && n <= CLUSTER_NAME_SIZE_MAX);
    memcpy(out, text, n);
    return n;
}

size_t heartbeat_encode(const struct heartbeat *hb, const uint8_t *secret, size_t secret_size,
                        uint8_t *out)
{
    ASSERT(hb->id != 0);
    ASSERT(hb->incarnation <= HEARTBEAT_INCARNATION_MAX);
    memset(out, 0, HEARTBEAT_HEADER_SIZE);
    memcpy(out, MAGIC, 4);
    out[4] = VERSION;
    out[5] = (uint8_t)((hb->stopping ? HEARTBEAT_FLAG_STOPPING : 0) |
                       (hb->alarms & (HEARTBEAT_FLAG_MEMORY_ALARM | HEARTBEAT_FLAG_DISK_ALARM)) |
                       (hb->incarnation != 0 ? HEARTBEAT_FLAG_PROCESS : 0) |
                       (hb->catching_up ? HEARTBEAT_FLAG_CATCHING_UP : 0));
    if (hb->incarnation != 0) {
        out[9] = (uint8_t)(hb->incarnation >> 16);
        out[10] = (uint8_t)(hb->incarnation >> 8);
        out[11] = (uint8_t)hb->incarnation;
        wire_put_u32(out + 12, hb->map_version);
    }
    wire_put_u64(out + 16, hb->id);
    wire_put_u64(out + 24, hb->sequence);
    size_t size = HEARTBEAT_HEADER_SIZE;
    size_t n = put_field(out + size, hb->name);
    out[6] = (uint8_t)n;
    size += n;
    n = put_field(out + size, hb->amqp_address);
    out[7] = (uint8_t)n;
    size += n;
    n = put_field(out + size, hb->cluster_address);
    out[8] = (uint8_t)n;
    size += n;
    mac_of(secret, secret_size, out, size, out + size);
    return size + HEARTBEAT_MAC_SIZE;
}

/* A name of size bytes at *p, without NUL, into out (NUL-terminated). */
static bool copy_field(char *out, const uint8_t **p, size_t size)
{
    memcpy(out, *p, size);
    out[size] = '\0';
    *p += size;
    return strlen(out) == size;
}

bool heartbeat_decode(const uint8_t *secret, size_t secret_size, const uint8_t *data,
                      size_t size, struct heartbeat *out)
{
    if (size < HEARTBEAT_HEADER_SIZE + 3 + HEARTBEAT_MAC_SIZE || size > HEARTBEAT_SIZE_MAX ||
        memcmp(data, MAGIC, 4) != 0 || data[4] != VERSION || data[6] == 0 || data[7] == 0 ||
        data[8] == 0)
        return false;
    size_t fields = (size_t)data[6] + data[7] + data[8];
    if (fields != size - HEARTBEAT_HEADER_SIZE - HEARTBEAT_MAC_SIZE)
        return false;
    uint8_t mac[HEARTBEAT_MAC_SIZE];
    mac_of(secret, secret_size, data, size - HEARTBEAT_MAC_SIZE, mac);
    if (CRYPTO_memcmp(mac, data + size - HEARTBEAT_MAC_SIZE, HEARTBEAT_MAC_SIZE) != 0)
        return false;
    uint64_t id = wire_get_u64(data + 16);
    if (id == 0 || id > UINT32_MAX)
        return false;
    memset(out, 0, sizeof *out);
    out->id = (uint32_t)id;
    out->sequence = wire_get_u64(data + 24);
    out->stopping = (data[5] & HEARTBEAT_FLAG_STOPPING) != 0;
    out->alarms = data[5] & (HEARTBEAT_FLAG_MEMORY_ALARM | HEARTBEAT_FLAG_DISK_ALARM);
    out->catching_up = (data[5] & HEARTBEAT_FLAG_CATCHING_UP) != 0;
    if (data[5] & HEARTBEAT_FLAG_PROCESS) {
        out->incarnation = (uint32_t)data[9] << 16 | (uint32_t)data[10] << 8 | data[11];
        out->map_version = wire_get_u32(data + 12);
        if (out->incarnation == 0)
            return false;
    }
    const uint8_t *p = data + HEARTBEAT_HEADER_SIZE;
    return copy_field(out->name, &p, data[6]) && copy_field(out->amqp_address, &p, data[7]) &&
           copy_field(out->cluster_address, &p, data[8]);
}
