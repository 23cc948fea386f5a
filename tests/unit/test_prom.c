/*
 * test_prom.c: the Prometheus text writer (mgmt/prom.h) behind GET /metrics.
 *
 * Goal: the exact bytes of the exposition format 0.0.4: HELP and TYPE lines,
 * samples with and without labels, numbers at their extremes, label values
 * escaped as the format demands (backslash, double quote, line feed) and
 * made valid UTF-8 (U+FFFD per bad byte, valid sequences byte for byte),
 * and labels rendered once and used in samples of several families, with
 * a label of a sample's own added or not.
 *
 * Method: write small texts and compare the buffer with literal expected
 * text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "lib/json.h"
#include "mgmt/prom.h"

/* Compares the buffer with expected, then frees it. */
static void expect_text(struct json *j, const char *expected)
{
    size_t size;
    char *data = json_release(j, &size);
    assert_int_equal(size, strlen(expected));
    assert_memory_equal(data, expected, size);
    free(data);
}

static void test_families(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    struct prom p;
    prom_init(&p, &j);
    prom_gauge(&p, "a_b", "Help text", 0);
    prom_counter(&p, "c_total", "Counted", UINT64_MAX);
    prom_family(&p, "q", PROM_TYPE_GAUGE, "Per queue");
    prom_sample_begin(&p);
    prom_label_str(&p, "vhost", "/");
    prom_label_str(&p, "queue", "orders");
    prom_sample_end(&p, 12);
    assert_int_equal(p.samples_count, 3);
    expect_text(&j, "# HELP a_b Help text\n# TYPE a_b gauge\na_b 0\n"
                    "# HELP c_total Counted\n# TYPE c_total counter\n"
                    "c_total 18446744073709551615\n"
                    "# HELP q Per queue\n# TYPE q gauge\nq{vhost=\"/\",queue=\"orders\"} 12\n");
}

static void test_label_escaping(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    struct prom p;
    prom_init(&p, &j);
    prom_family(&p, "q", PROM_TYPE_GAUGE, "h");
    /* quote, backslash, line feed; tab and other controls pass (the format
     * escapes only those three); é (valid), then a lone 0xFF and a cut
     * 3-byte sequence (invalid: U+FFFD each byte). */
    static const uint8_t name[] = {'a', '"', '\\', '\n', '\t', 0xC3, 0xA9, 0xFF, 0xE2, 0x82};
    prom_sample_begin(&p);
    prom_label(&p, "queue", (struct bytes){name, sizeof name});
    prom_sample_end(&p, 1);
    expect_text(&j, "# HELP q h\n# TYPE q gauge\n"
                    "q{queue=\"a\\\"\\\\\\n\t\xC3\xA9\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"} 1\n");
}

static void test_long_label_grows_the_buffer(void **state)
{
    (void)state;
    struct json j;
    json_init(&j);
    struct prom p;
    prom_init(&p, &j);
    prom_family(&p, "q", PROM_TYPE_GAUGE, "h");
    uint8_t name[255];
    memset(name, '\n', sizeof name); /* every byte escaped: twice as long */
    for (int i = 0; i < 100; i++) {
        prom_sample_begin(&p);
        prom_label(&p, "queue", (struct bytes){name, sizeof name});
        prom_sample_end(&p, (uint64_t)i);
    }
    size_t head = strlen("# HELP q h\n# TYPE q gauge\n");
    size_t sample = strlen("q{queue=\"\"} 0\n") + 2 * sizeof name;
    assert_int_equal(j.size, head + 10 * sample + 90 * (sample + 1));
    json_free(&j);
}

static void test_rendered_labels(void **state)
{
    (void)state;
    struct json j, labels;
    json_init(&j);
    json_init(&labels);
    struct prom p, l;
    prom_init(&p, &j);
    prom_init(&l, &labels);
    prom_labels_begin(&l); /* rendered once... */
    prom_label_str(&l, "vhost", "/");
    prom_label_str(&l, "queue", "a\"b");
    prom_labels_end(&l);
    size_t first = labels.size;
    prom_labels_begin(&l); /* no labels: nothing */
    prom_labels_end(&l);
    assert_int_equal(labels.size, first);
    assert_int_equal(l.samples_count, 0);
    prom_family(&p, "x", PROM_TYPE_GAUGE, "X"); /* ...used in two families */
    prom_sample_rendered(&p, labels.data, first, 0);
    prom_sample_rendered(&p, "", 0, UINT64_MAX);
    prom_family(&p, "y", PROM_TYPE_GAUGE, "Y");
    prom_sample_rendered(&p, labels.data, first, 42);
    /* ...and with a label of the sample's own added inside the braces */
    prom_family(&p, "z", PROM_TYPE_GAUGE, "Z");
    prom_sample_rendered_with(&p, labels.data, first, ",role=\"primary\"", 1);
    prom_sample_rendered_with(&p, labels.data, first, "", 0);
    assert_int_equal(p.samples_count, 5);
    json_free(&labels);
    expect_text(&j, "# HELP x X\n# TYPE x gauge\nx{vhost=\"/\",queue=\"a\\\"b\"} 0\n"
                    "x 18446744073709551615\n"
                    "# HELP y Y\n# TYPE y gauge\ny{vhost=\"/\",queue=\"a\\\"b\"} 42\n"
                    "# HELP z Z\n# TYPE z gauge\n"
                    "z{vhost=\"/\",queue=\"a\\\"b\",role=\"primary\"} 1\n"
                    "z{vhost=\"/\",queue=\"a\\\"b\"} 0\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_label_escaping),
        cmocka_unit_test(test_long_label_grows_the_buffer),
        cmocka_unit_test(test_rendered_labels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
