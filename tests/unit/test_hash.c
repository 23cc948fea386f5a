/*
 * test_hash.c: the tables' hash and map.
 *
 * Goal: SipHash gives the published outputs (the reference SipHash-2-4
 * vectors for the key 00..0f, every length 0..63, and SipHash-1-3's, the
 * variant the tables use); hash_bytes is keyed (another key, other
 * hashes; never 0); the map finds and removes among many entries (probe
 * runs shifted back by removals). Method: known answers, then 10,000 keys
 * put, looked up, half removed, looked up again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "lib/errors.h"
#include "lib/hash.h"

static const uint64_t K0 = 0x0706050403020100ull, K1 = 0x0f0e0d0c0b0a0908ull;

/* The reference implementation's SipHash-2-4 outputs (vectors.h of
 * github.com/veorq/SipHash) for the key 00..0f and the messages 00 01 ..
 * (i-1) of every length i from 0 to 63, as little-endian 64-bit values. */
static const uint64_t SIPHASH24_VECTORS[64] = {
    0x726fdb47dd0e0e31ull, 0x74f839c593dc67fdull, 0x0d6c8009d9a94f5aull, 0x85676696d7fb7e2dull,
    0xcf2794e0277187b7ull, 0x18765564cd99a68dull, 0xcbc9466e58fee3ceull, 0xab0200f58b01d137ull,
    0x93f5f5799a932462ull, 0x9e0082df0ba9e4b0ull, 0x7a5dbbc594ddb9f3ull, 0xf4b32f46226bada7ull,
    0x751e8fbc860ee5fbull, 0x14ea5627c0843d90ull, 0xf723ca908e7af2eeull, 0xa129ca6149be45e5ull,
    0x3f2acc7f57c29bdbull, 0x699ae9f52cbe4794ull, 0x4bc1b3f0968dd39cull, 0xbb6dc91da77961bdull,
    0xbed65cf21aa2ee98ull, 0xd0f2cbb02e3b67c7ull, 0x93536795e3a33e88ull, 0xa80c038ccd5ccec8ull,
    0xb8ad50c6f649af94ull, 0xbce192de8a85b8eaull, 0x17d835b85bbb15f3ull, 0x2f2e6163076bcfadull,
    0xde4daaaca71dc9a5ull, 0xa6a2506687956571ull, 0xad87a3535c49ef28ull, 0x32d892fad841c342ull,
    0x7127512f72f27cceull, 0xa7f32346f95978e3ull, 0x12e0b01abb051238ull, 0x15e034d40fa197aeull,
    0x314dffbe0815a3b4ull, 0x027990f029623981ull, 0xcadcd4e59ef40c4dull, 0x9abfd8766a33735cull,
    0x0e3ea96b5304a7d0ull, 0xad0c42d6fc585992ull, 0x187306c89bc215a9ull, 0xd4a60abcf3792b95ull,
    0xf935451de4f21df2ull, 0xa9538f0419755787ull, 0xdb9acddff56ca510ull, 0xd06c98cd5c0975ebull,
    0xe612a3cb9ecba951ull, 0xc766e62cfcadaf96ull, 0xee64435a9752fe72ull, 0xa192d576b245165aull,
    0x0a8787bf8ecb74b2ull, 0x81b3e73d20b49b6full, 0x7fa8220ba3b2eceaull, 0x245731c13ca42499ull,
    0xb78dbfaf3a8d83bdull, 0xea1ad565322a1a0bull, 0x60e61c23a3795013ull, 0x6606d7e446282b93ull,
    0x6ca4ecb15c5f91e1ull, 0x9f626da15c9625f3ull, 0xe51b38608ef25f57ull, 0x958a324ceb064572ull,
};

static void test_siphash_vectors(void **state)
{
    (void)state;
    uint8_t msg[64];
    for (unsigned i = 0; i < sizeof msg; i++)
        msg[i] = (uint8_t)i;
    for (size_t n = 0; n < sizeof msg; n++)
        assert_true(siphash(K0, K1, 2, 4, msg, n) == SIPHASH24_VECTORS[n]);
}

/* SipHash-1-3, the tables' variant: published outputs of other
 * implementations (Ruby's digest-sip_hash, Rust's SipHasher13), for the
 * key 00..0f and for the all-zero key. */
static void test_siphash13_vectors(void **state)
{
    (void)state;
    assert_true(siphash(K0, K1, 1, 3, NULL, 0) == 0xabac0158050fc4dcull);
    static const struct {
        const char *text;
        uint64_t hash;
    } zero_key[] = {
        {"", 0xd1fba762150c532cull},
        {"test", 0xe0969da9b8fb378dull},
        {"siphash", 0x8264ceeccb16bcbeull},
        {"digest-sip_hash", 0xce31007e34130c0aull},
    };
    for (size_t i = 0; i < sizeof zero_key / sizeof zero_key[0]; i++)
        assert_true(siphash(0, 0, 1, 3, (const uint8_t *)zero_key[i].text,
                            strlen(zero_key[i].text)) == zero_key[i].hash);
    uint8_t x1000[1000];
    memset(x1000, 'x', sizeof x1000);
    assert_true(siphash(0, 0, 1, 3, x1000, sizeof x1000) == 0x1b47c0cc4dd21f05ull);
}

static void test_keyed(void **state)
{
    (void)state;
    const uint8_t name[] = "orders.eu-west";
    uint64_t before = hash_bytes(name, sizeof name - 1);
    assert_int_equal(hash_seed_random(), OK);
    uint64_t after = hash_bytes(name, sizeof name - 1);
    assert_true(before != after); /* 2^-64 to fail by chance */
    assert_true(after == hash_bytes(name, sizeof name - 1));
    assert_true(hash_bytes(NULL, 0) != 0);
}

static void test_map(void **state)
{
    (void)state;
    enum { N = 10000 };
    static char names[N][16];
    struct hmap map;
    hmap_init(&map);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "q.%d", i);
        assert_null(hmap_put(&map, bytes_of_cstr(names[i]), names[i]));
    }
    assert_int_equal(map.count, N);
    for (int i = 0; i < N; i++)
        assert_ptr_equal(hmap_get(&map, bytes_of_cstr(names[i])), names[i]);
    for (int i = 0; i < N; i += 2)
        assert_ptr_equal(hmap_remove(&map, bytes_of_cstr(names[i])), names[i]);
    for (int i = 0; i < N; i++)
        assert_ptr_equal(hmap_get(&map, bytes_of_cstr(names[i])), i % 2 ? names[i] : NULL);
    assert_int_equal(map.count, N / 2);
    hmap_free(&map);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_siphash_vectors),
        cmocka_unit_test(test_siphash13_vectors),
        cmocka_unit_test(test_keyed),
        cmocka_unit_test(test_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
