/*
 * test_heartbeat.c: the liveness datagram's codec (cluster/heartbeat.h).
 * Goal: what is encoded decodes the same; a datagram under another secret,
 * with a byte changed, cut, or with sizes that do not add up, an id 0 or a
 * NUL in a name (each signed right) is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "cluster/heartbeat.h"

static const uint8_t secret[] = "sixteen bytes or more of secret";
#define SECRET_SIZE (sizeof secret - 1)

static struct heartbeat sample(void)
{
    struct heartbeat hb = {.id = 42, .sequence = 1234567890123ull, .stopping = true,
                           .alarms = HEARTBEAT_FLAG_DISK_ALARM};
    strcpy(hb.name, "b1");
    strcpy(hb.amqp_address, "10.0.0.1:5672");
    strcpy(hb.cluster_address, "10.0.0.1:7001");
    return hb;
}

/* Signs data[0..size) again (after a change), as a peer with the secret could. */
static size_t resign(uint8_t *data, size_t size)
{
    unsigned int n = 0;
    HMAC(EVP_sha256(), secret, (int)SECRET_SIZE, data, size, data + size, &n);
    return size + n;
}

static void test_round_trip(void **state)
{
    (void)state;
    struct heartbeat hb = sample(), out;
    uint8_t buf[HEARTBEAT_SIZE_MAX];
    size_t n = heartbeat_encode(&hb, secret, SECRET_SIZE, buf);
    assert_int_equal(n, HEARTBEAT_HEADER_SIZE + 2 + 13 + 13 + HEARTBEAT_MAC_SIZE);
    assert_true(heartbeat_decode(secret, SECRET_SIZE, buf, n, &out));
    assert_int_equal(out.id, 42);
    assert_true(out.sequence == 1234567890123ull);
    assert_true(out.stopping);
    assert_int_equal(out.alarms, HEARTBEAT_FLAG_DISK_ALARM);
    assert_string_equal(out.name, "b1");
    assert_string_equal(out.amqp_address, "10.0.0.1:5672");
    assert_string_equal(out.cluster_address, "10.0.0.1:7001");
}

/* The process fields (HEARTBEAT_FLAG_PROCESS): the incarnation (24 bits)
 * and the low 32 bits of the map version go in the header's spare bytes,
 * which a decoder from before them ignores; a heartbeat without them (a
 * sender from before) decodes with both 0; an incarnation 0 under the
 * flag is refused. */
static void test_process_fields(void **state)
{
    (void)state;
    struct heartbeat hb = sample(), out;
    hb.incarnation = 0xABCDEF;
    hb.map_version = 0x89ABCDEFu;
    uint8_t buf[HEARTBEAT_SIZE_MAX];
    size_t n = heartbeat_encode(&hb, secret, SECRET_SIZE, buf);
    assert_int_equal(n, HEARTBEAT_HEADER_SIZE + 2 + 13 + 13 + HEARTBEAT_MAC_SIZE);
    assert_true(heartbeat_decode(secret, SECRET_SIZE, buf, n, &out));
    assert_int_equal(out.incarnation, 0xABCDEF);
    assert_int_equal(out.map_version, 0x89ABCDEFu);
    assert_int_equal(out.alarms, HEARTBEAT_FLAG_DISK_ALARM);
    assert_true(out.stopping);
    assert_false(out.catching_up);
    hb.catching_up = true; /* its own flag, beside the others */
    n = heartbeat_encode(&hb, secret, SECRET_SIZE, buf);
    assert_int_equal(buf[5] & HEARTBEAT_FLAG_CATCHING_UP, HEARTBEAT_FLAG_CATCHING_UP);
    assert_true(heartbeat_decode(secret, SECRET_SIZE, buf, n, &out));
    assert_true(out.catching_up);
    assert_int_equal(out.map_version, 0x89ABCDEFu);
    assert_true(out.stopping);
    assert_int_equal(out.id, 42);
    assert_int_equal(buf[8], 13); /* the cluster address's size is where it was */
    /* An old sender: no flag, zeros. */
    struct heartbeat old = sample();
    n = heartbeat_encode(&old, secret, SECRET_SIZE, buf);
    assert_int_equal(buf[5] & HEARTBEAT_FLAG_PROCESS, 0);
    for (size_t i = 9; i < 16; i++)
        assert_int_equal(buf[i], 0);
    assert_true(heartbeat_decode(secret, SECRET_SIZE, buf, n, &out));
    assert_int_equal(out.incarnation, 0);
    assert_int_equal(out.map_version, 0);
    buf[5] |= HEARTBEAT_FLAG_PROCESS; /* the flag with incarnation 0, signed right */
    assert_false(heartbeat_decode(secret, SECRET_SIZE, buf, resign(buf, n - HEARTBEAT_MAC_SIZE),
                                  &out));
}

static void test_refusals(void **state)
{
    (void)state;
    struct heartbeat hb = sample(), out;
    uint8_t buf[HEARTBEAT_SIZE_MAX];
    size_t n = heartbeat_encode(&hb, secret, SECRET_SIZE, buf);
    static const uint8_t other[] = "another secret of sixteen bytes";
    assert_false(heartbeat_decode(other, sizeof other - 1, buf, n, &out));
    for (size_t i = 0; i < n; i++) { /* any byte changed */
        buf[i] ^= 0x20;
        assert_false(heartbeat_decode(secret, SECRET_SIZE, buf, n, &out));
        buf[i] ^= 0x20;
    }
    for (size_t cut = 0; cut < n; cut++)
        assert_false(heartbeat_decode(secret, SECRET_SIZE, buf, cut, &out));
    size_t body = n - HEARTBEAT_MAC_SIZE;
    buf[6] = 3; /* sizes that do not add up, signed right */
    assert_false(heartbeat_decode(secret, SECRET_SIZE, buf, resign(buf, body), &out));
    buf[6] = 2;
    memset(buf + 16, 0, 8); /* id 0 */
    assert_false(heartbeat_decode(secret, SECRET_SIZE, buf, resign(buf, body), &out));
    buf[23] = 42;
    buf[HEARTBEAT_HEADER_SIZE + 1] = '\0'; /* a NUL in the name */
    assert_false(heartbeat_decode(secret, SECRET_SIZE, buf, resign(buf, body), &out));
    buf[HEARTBEAT_HEADER_SIZE + 1] = '1';
    assert_true(heartbeat_decode(secret, SECRET_SIZE, buf, resign(buf, body), &out));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_process_fields),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
