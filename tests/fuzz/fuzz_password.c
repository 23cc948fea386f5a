/*
 * fuzz_password.c: the stored password hash reader (broker/password.h),
 * which every hash from a client goes through: PUT /api/users with a
 * password_hash, definitions imports, the users file, the cluster map and
 * the journal.
 *
 * Goal: password_hash_parse never reads outside its input, and accepts
 * only canonical texts: whatever it accepts is written back by
 * password_hash_format exactly as it came (so one hash has one spelling,
 * and the map, the journal and exports carry it unchanged), with a PBKDF2
 * iteration count within bounds. Method: the first byte picks the
 * hashing_algorithm given with the text (none, each of the four names, an
 * unknown one); the rest is the text. Nothing is verified (a PBKDF2
 * check is deliberately slow).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "broker/password.h"
#include "lib/assert.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const names[] = {
        NULL, "rabbit_password_hashing_sha256", "rabbit_password_hashing_sha512",
        "rabbit_password_hashing_md5", "quay_password_hashing_pbkdf2_sha256", "sha256",
        "rabbit_password_hashing_sha1"};
    if (size == 0)
        return 0;
    const char *algorithm = names[data[0] % (sizeof names / sizeof names[0])];
    /* A copy of exactly the text's size: a read past it is ASan's. */
    char *text = malloc(size - 1 ? size - 1 : 1);
    ASSERT(text != NULL);
    memcpy(text, data + 1, size - 1);
    struct password_hash h;
    if (password_hash_parse(algorithm, text, size - 1, &h) == 0) {
        ASSERT(h.algorithm < PASSWORD_ALGORITHM_COUNT);
        ASSERT(h.salt_size <= PASSWORD_SALT_MAX && h.digest_size <= PASSWORD_DIGEST_MAX);
        ASSERT(h.algorithm != PASSWORD_PBKDF2_SHA256 ||
               (h.iterations >= PASSWORD_PBKDF2_ITERATIONS_MIN &&
                h.iterations <= PASSWORD_PBKDF2_ITERATIONS_MAX));
        char back[PASSWORD_TEXT_MAX + 1];
        size_t n = password_hash_format(&h, back);
        ASSERT(n == size - 1 && memcmp(back, text, n) == 0);
        struct password_hash again;
        ASSERT(password_hash_parse(NULL, back, n, &again) == 0 && password_hash_equal(&h, &again));
    }
    free(text);
    return 0;
}
