/*
 * fuzz_frame.c: the frame reader on arbitrary byte streams.
 *
 * Goal: frame_parse never reads outside its input, consumes exactly whole
 * frames, and gives the same answer however the stream is split. Method:
 * parse the input as a stream with a frame_max taken from the first byte;
 * for each frame, re-parse it from a prefix one byte short (must ask for
 * more) and decode the payload as its type says.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "amqp/frame.h"
#include "amqp/method_gen.h"
#include "lib/assert.h"
#include "lib/errors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct frame_reader r = {.frame_max = (data[0] & 1) ? 0 : 512};
    data++;
    size--;
    size_t pos = 0;
    while (pos < size) {
        struct frame f;
        size_t need = 0;
        int rc = frame_parse(&r, data + pos, size - pos, &f, &need);
        if (rc <= 0) {
            ASSERT(rc == 0 || rc == E_FRAME);
            if (rc == 0)
                ASSERT(need > size - pos);
            break;
        }
        size_t n = (size_t)rc;
        ASSERT(n <= size - pos);
        ASSERT(n == (size_t)f.size + FRAME_OVERHEAD);
        ASSERT(f.payload == data + pos + FRAME_HEADER_SIZE);
        struct frame g;
        ASSERT(frame_parse(&r, data + pos, n - 1, &g, &need) == 0);
        ASSERT(need == n);
        if (f.type == FRAME_METHOD) {
            struct method m;
            (void)method_decode(&m, f.payload, f.size);
        } else if (f.type == FRAME_HEADER) {
            struct content_header h;
            if (content_header_decode(&h, f.payload, f.size) == OK) {
                struct basic_properties p;
                (void)basic_properties_decode(&p, h.properties, h.properties_size);
            }
        }
        pos += n;
    }
    return 0;
}
