/*
 * fuzz_heartbeat.c: the brokers' liveness datagram (cluster/heartbeat.h),
 * which anyone who can reach a broker's cluster port over UDP can send.
 *
 * Goal: heartbeat_decode never reads outside its input and takes only what
 * heartbeat_encode could have written: every heartbeat it accepts encodes
 * back to the same bytes. Method: the input is decoded as it is (it must
 * fail: it cannot carry the secret's MAC), and again with the right MAC
 * put on its end, so that the fuzzer reaches the field checks behind it.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "cluster/heartbeat.h"
#include "lib/assert.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t secret[] = "fuzz secret, 16 bytes or more";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct heartbeat hb;
    uint8_t again[HEARTBEAT_SIZE_MAX];
    if (heartbeat_decode(secret, sizeof secret - 1, data, size, &hb)) {
        /* (Only if the fuzzer found HMAC-SHA256's preimage.) */
        ASSERT(heartbeat_encode(&hb, secret, sizeof secret - 1, again) == size);
    }
    if (size > HEARTBEAT_SIZE_MAX - HEARTBEAT_MAC_SIZE)
        return 0;
    uint8_t signed_[HEARTBEAT_SIZE_MAX];
    memcpy(signed_, data, size);
    unsigned int mac_size = 0;
    ASSERT(HMAC(EVP_sha256(), secret, (int)(sizeof secret - 1), data, size, signed_ + size,
                &mac_size) != NULL);
    size_t total = size + HEARTBEAT_MAC_SIZE;
    if (!heartbeat_decode(secret, sizeof secret - 1, signed_, total, &hb))
        return 0;
    ASSERT(hb.id != 0 && strlen(hb.name) >= 1 && strlen(hb.amqp_address) >= 1 &&
           strlen(hb.cluster_address) >= 1);
    size_t n = heartbeat_encode(&hb, secret, sizeof secret - 1, again);
    /* The same bytes, but for the seven header bytes of the process fields
     * (written as zeros without HEARTBEAT_FLAG_PROCESS) and flags nobody
     * knows (dropped). */
    ASSERT(n == total);
    ASSERT(memcmp(again, signed_, 5) == 0 && memcmp(again + 6, signed_ + 6, 3) == 0);
    ASSERT(again[5] == (signed_[5] & (HEARTBEAT_FLAG_STOPPING | HEARTBEAT_FLAG_MEMORY_ALARM |
                                      HEARTBEAT_FLAG_DISK_ALARM | HEARTBEAT_FLAG_PROCESS |
                                      HEARTBEAT_FLAG_CATCHING_UP)));
    if (signed_[5] & HEARTBEAT_FLAG_PROCESS)
        ASSERT(memcmp(again + 9, signed_ + 9, 7) == 0);
    ASSERT(memcmp(again + 16, signed_ + 16, n - 16 - HEARTBEAT_MAC_SIZE) == 0);
    return 0;
}
