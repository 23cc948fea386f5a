/*
 * test_exchange.c: routing semantics of direct, fanout, topic and headers
 * exchanges, exchange-to-exchange walks and binding lifetime.
 *
 * Goal: quay must route exactly like RabbitMQ 3.10. Method: fake queues
 * (a struct bind_dest embedded in a test struct) are bound to real
 * exchanges and routed to; topic patterns are checked three ways (a table
 * of RabbitMQ-derived cases, the pure topic_match, the trie walk) and
 * cross-checked on random patterns against a naive recursive reference;
 * header tables are built with the codec's table_writer. Lifetime tests
 * rely on ASan's leak check and on exchange__index_count.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "amqp/table.h"
#include "broker/exchange.h"

#define NO_ARGS ((struct bytes){NULL, 0})
#define NO_HEADERS ((struct table){NULL, 0})
#define ROUTE_CAP 64

struct fake_queue {
    struct bind_dest as_dest;
    int id;
};

static void fake_queue_init(struct fake_queue *q, int id)
{
    bind_dest_init(&q->as_dest, BIND_DEST_QUEUE);
    q->id = id;
}

static struct exchange *new_exchange(const char *name, enum exchange_type type)
{
    return exchange_new(bytes_of_cstr(name), type, false, false, false, NO_ARGS);
}

static struct binding *bind_q(struct exchange *x, struct fake_queue *q, const char *key)
{
    return exchange_bind(x, &q->as_dest, bytes_of_cstr(key), NO_ARGS);
}

static struct binding *bind_x(struct exchange *x, struct exchange *dest, const char *key)
{
    return exchange_bind(x, &dest->as_dest, bytes_of_cstr(key), NO_ARGS);
}

struct routed {
    struct bind_dest *slots[ROUTE_CAP];
    struct route_result result;
};

static uint32_t route_headers(struct routed *r, struct exchange *x, const char *key,
                              struct table headers)
{
    r->result = (struct route_result){.dests = r->slots, .count = 0, .cap = ROUTE_CAP};
    exchange_route(x, bytes_of_cstr(key), headers, &r->result);
    return r->result.count;
}

static uint32_t route(struct routed *r, struct exchange *x, const char *key)
{
    return route_headers(r, x, key, NO_HEADERS);
}

static bool routed_to(const struct routed *r, const struct fake_queue *q)
{
    uint32_t seen = 0;
    for (uint32_t i = 0; i < r->result.count; i++)
        seen += r->result.dests[i] == &q->as_dest ? 1 : 0;
    assert_true(seen <= 1); /* never twice */
    return seen == 1;
}

/* ------------------------------------------------------------------ */
/* Types                                                               */

static void test_type_names(void **state)
{
    (void)state;
    static const char *const names[] = {"direct", "fanout", "topic", "headers"};
    for (int i = 0; i < 4; i++) {
        enum exchange_type type;
        assert_int_equal(exchange_type_parse(bytes_of_cstr(names[i]), &type), 0);
        assert_int_equal(type, i);
        assert_string_equal(exchange_type_name(type), names[i]);
    }
    enum exchange_type type;
    assert_int_equal(exchange_type_parse(BYTES_LIT("x-consistent-hash"), &type), -1);
    assert_int_equal(exchange_type_parse(BYTES_LIT("Direct"), &type), -1);
    assert_int_equal(exchange_type_parse(BYTES_LIT(""), &type), -1);
}

/* ------------------------------------------------------------------ */
/* Direct                                                              */

static void test_direct(void **state)
{
    (void)state;
    struct exchange *x = new_exchange("d", EXCHANGE_DIRECT);
    struct fake_queue q1, q2, q3;
    fake_queue_init(&q1, 1);
    fake_queue_init(&q2, 2);
    fake_queue_init(&q3, 3);
    struct binding *b1 = bind_q(x, &q1, "k");
    bind_q(x, &q2, "k");
    bind_q(x, &q3, "j");
    bind_q(x, &q3, ""); /* the empty key is an ordinary key */
    assert_ptr_equal(bind_q(x, &q1, "k"), b1); /* re-bind is a no-op */
    assert_int_equal(x->bindings_count, 4);
    assert_int_equal(exchange__index_count(x), 3);

    struct routed r;
    assert_int_equal(route(&r, x, "k"), 2);
    assert_true(routed_to(&r, &q1) && routed_to(&r, &q2));
    assert_int_equal(route(&r, x, "j"), 1);
    assert_true(routed_to(&r, &q3));
    assert_int_equal(route(&r, x, ""), 1);
    assert_int_equal(route(&r, x, "K"), 0);
    assert_int_equal(route(&r, x, "k.x"), 0);

    /* Unbind the bucket's first binding (whose key the map borrows). */
    assert_true(exchange_unbind(x, &q1.as_dest, BYTES_LIT("k"), NO_ARGS));
    assert_false(exchange_unbind(x, &q1.as_dest, BYTES_LIT("k"), NO_ARGS));
    assert_false(exchange_unbind(x, &q3.as_dest, BYTES_LIT("k"), NO_ARGS));
    assert_int_equal(route(&r, x, "k"), 1);
    assert_true(routed_to(&r, &q2));
    assert_int_equal(q1.as_dest.bindings_in_count, 0);
    assert_true(exchange_unbind(x, &q2.as_dest, BYTES_LIT("k"), NO_ARGS));
    assert_int_equal(route(&r, x, "k"), 0);
    assert_int_equal(exchange__index_count(x), 2);
    exchange_free(x);
    assert_int_equal(q3.as_dest.bindings_in_count, 0);
}

/* One queue bound twice with the same key (different arguments) is
 * routed to once. */
static void test_direct_same_queue_twice(void **state)
{
    (void)state;
    uint8_t buf[64];
    struct table_writer w;
    table_writer_init(&w, buf, sizeof(buf));
    table_put_int(&w, "a", 1);
    struct table t = table_writer_table(&w);
    struct exchange *x = new_exchange("d", EXCHANGE_DIRECT);
    struct fake_queue q;
    fake_queue_init(&q, 1);
    struct binding *plain = bind_q(x, &q, "k");
    struct binding *with_args = exchange_bind(x, &q.as_dest, BYTES_LIT("k"),
                                              (struct bytes){t.ptr, t.len});
    assert_ptr_not_equal(plain, with_args);
    assert_int_equal(q.as_dest.bindings_in_count, 2);
    struct routed r;
    assert_int_equal(route(&r, x, "k"), 1);
    assert_true(exchange_unbind(x, &q.as_dest, BYTES_LIT("k"), NO_ARGS));
    assert_int_equal(route(&r, x, "k"), 1);
    exchange_free(x);
    assert_int_equal(q.as_dest.bindings_in_count, 0);
}

/* ------------------------------------------------------------------ */
/* Fanout                                                              */

static void test_fanout(void **state)
{
    (void)state;
    struct exchange *x = new_exchange("f", EXCHANGE_FANOUT);
    struct fake_queue q[3];
    for (int i = 0; i < 3; i++)
        fake_queue_init(&q[i], i);
    bind_q(x, &q[0], "ignored");
    bind_q(x, &q[1], "");
    bind_q(x, &q[2], "#");
    struct routed r;
    assert_int_equal(route(&r, x, "anything"), 3);
    assert_int_equal(route(&r, x, ""), 3);
    for (int i = 0; i < 3; i++)
        assert_true(routed_to(&r, &q[i]));
    assert_true(exchange_unbind(x, &q[1].as_dest, BYTES_LIT(""), NO_ARGS));
    assert_int_equal(route(&r, x, "x"), 2);
    assert_false(routed_to(&r, &q[1]));

    /* A full result stops collecting and says so. */
    struct bind_dest *slots[1];
    struct route_result small = {.dests = slots, .count = 0, .cap = 1};
    exchange_route(x, BYTES_LIT("x"), NO_HEADERS, &small);
    assert_int_equal(small.count, 1);
    assert_true(small.overflow);
    exchange_free(x);
}

/* ------------------------------------------------------------------ */
/* Topic                                                               */

struct topic_case {
    const char *pattern;
    const char *key;
    bool match;
};

/* RabbitMQ 3.10: a key is split on '.', "" is zero words (split_topic_key),
 * "a..b" has an empty middle word, '*' is one word, '#' zero or more. */
static const struct topic_case topic_cases[] = {
    {"#", "", true},           {"#", "a", true},          {"#", "a.b.c", true},
    {"#", ".", true},          {"*", "", false},          {"*", "a", true},
    {"*", "a.b", false},       {"*", ".", false},         {"", "", true},
    {"", "a", false},          {"", ".", false},          {"a", "a", true},
    {"a", "b", false},         {"a", "a.b", false},       {"A", "a", false},
    {"a.#", "a", true},        {"a.#", "a.b", true},      {"a.#", "a.b.c", true},
    {"a.#", "b.a", false},     {"a.#", "a.", true},       {"#.a", "a", true},
    {"#.a", "b.a", true},      {"#.a", "b.c.a", true},    {"#.a", "a.b", false},
    {"a.#.b", "a.b", true},    {"a.#.b", "a.x.y.b", true}, {"a.#.b", "a.x.y", false},
    {"#.#", "", true},         {"#.#", "a.b", true},      {"#.#.#", "a", true},
    {"a.#.#.b", "a.b", true},  {"a.#.#.b", "a.c.d.b", true}, {"a.#.#.b", "a.c", false},
    {"a.*.#", "a", false},     {"a.*.#", "a.b", true},    {"a.*.#", "a.b.c", true},
    {"a.*.#", "a.", true},     {"*.*", "a.", true},       {"*.*", "a", false},
    {"*.*", ".", true},        {"*.b", ".b", true},       {"a..b", "a..b", true},
    {"a.*.b", "a..b", true},   {"a..b", "a.x.b", false},  {"a..b", "a.b", false},
    {".", ".", true},          {".", "", false},          {"a.", "a", false},
    {"a.", "a.", true},        {"a.*", "a.", true},       {"a.*", "a", false},
    {"#.*", "", false},        {"#.*", "a", true},        {"#.*", "a.b.c", true},
    {"*.#", "", false},        {"*.#", "a", true},        {"#.", ".", true},
    {"#.", "a", false},        {"#.", "a.", true},        {"#.b.#", "b", true},
    {"#.b.#", "a.b.c", true},  {"#.b.#", "a.c", false},   {"*.#.*", "a", false},
    {"*.#.*", "a.b", true},    {"*.#.*", "a.b.c.d", true}, {"a.*.*", "a.b", false},
    {"a.b.c", "a.b.c", true},  {"a.b.c", "a.b.c.d", false}, {"a.b.c.d", "a.b.c", false},
    /* Words '*' and '#' in a routing key are plain words to match. */
    {"#", "#", true},          {"#.a", "#.b.a", true},    {"*", "*", true},
    {"a.b", "a.*", false},     {"a.*", "a.*", true},      {"#.x", "x.#", false},
    /* Only whole words are wildcards. */
    {"a*", "ab", false},       {"a#", "a", false},        {"a#", "a#", true},
};

static void test_topic_match_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(topic_cases) / sizeof(topic_cases[0]); i++) {
        const struct topic_case *c = &topic_cases[i];
        bool got = topic_match(bytes_of_cstr(c->pattern), bytes_of_cstr(c->key));
        if (got != c->match)
            fail_msg("topic_match(\"%s\", \"%s\") = %d", c->pattern, c->key, got);
    }
}

/* The same table through the trie: one binding per exchange. */
static void test_topic_trie_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(topic_cases) / sizeof(topic_cases[0]); i++) {
        const struct topic_case *c = &topic_cases[i];
        struct exchange *x = new_exchange("t", EXCHANGE_TOPIC);
        struct fake_queue q;
        fake_queue_init(&q, 1);
        bind_q(x, &q, c->pattern);
        struct routed r;
        uint32_t count = route(&r, x, c->key);
        if (count != (c->match ? 1u : 0u))
            fail_msg("trie: pattern \"%s\" key \"%s\" routed %u", c->pattern, c->key, count);
        exchange_free(x);
    }
}

/* All patterns in one exchange: each key reaches exactly the queues whose
 * pattern matches it. */
static void test_topic_trie_shared(void **state)
{
    (void)state;
    enum { N = sizeof(topic_cases) / sizeof(topic_cases[0]) };
    static struct fake_queue q[N];
    struct exchange *x = new_exchange("t", EXCHANGE_TOPIC);
    for (int i = 0; i < N; i++) {
        fake_queue_init(&q[i], i);
        bind_q(x, &q[i], topic_cases[i].pattern);
    }
    static struct bind_dest *slots[N];
    for (int k = 0; k < N; k++) {
        const char *key = topic_cases[k].key;
        struct route_result r = {.dests = slots, .count = 0, .cap = N};
        exchange_route(x, bytes_of_cstr(key), NO_HEADERS, &r);
        uint32_t expected = 0;
        for (int i = 0; i < N; i++) {
            bool want = topic_match(bytes_of_cstr(topic_cases[i].pattern), bytes_of_cstr(key));
            expected += want ? 1 : 0;
            bool got = false;
            for (uint32_t j = 0; j < r.count; j++)
                got = got || slots[j] == &q[i].as_dest;
            if (got != want)
                fail_msg("key \"%s\" pattern \"%s\": got %d", key, topic_cases[i].pattern, got);
        }
        assert_int_equal(r.count, expected);
        assert_false(r.overflow);
    }
    exchange_free(x);
}

/* Binding many patterns then unbinding them all leaves no trie node. */
static void test_topic_trie_no_stale_nodes(void **state)
{
    (void)state;
    enum { N = sizeof(topic_cases) / sizeof(topic_cases[0]) };
    struct exchange *x = new_exchange("t", EXCHANGE_TOPIC);
    struct fake_queue q1, q2;
    fake_queue_init(&q1, 1);
    fake_queue_init(&q2, 2);
    assert_int_equal(exchange__index_count(x), 0);
    for (int i = 0; i < N; i++) {
        bind_q(x, &q1, topic_cases[i].pattern);
        bind_q(x, &q2, topic_cases[i].pattern);
    }
    assert_true(exchange__index_count(x) > 10);
    /* Unbind in a different order than bound. */
    for (int i = N - 1; i >= 0; i--) {
        exchange_unbind(x, &q1.as_dest, bytes_of_cstr(topic_cases[i].pattern), NO_ARGS);
        exchange_unbind(x, &q2.as_dest, bytes_of_cstr(topic_cases[i].pattern), NO_ARGS);
    }
    assert_int_equal(x->bindings_count, 0);
    assert_int_equal(exchange__index_count(x), 0);
    struct routed r;
    assert_int_equal(route(&r, x, "a.b"), 0);

    /* A shared prefix survives its longer sibling: root, "a", "b". */
    bind_q(x, &q1, "a.b.c");
    bind_q(x, &q1, "a.b");
    assert_int_equal(exchange__index_count(x), 4);
    assert_true(exchange_unbind(x, &q1.as_dest, BYTES_LIT("a.b.c"), NO_ARGS));
    assert_int_equal(exchange__index_count(x), 3);
    assert_int_equal(route(&r, x, "a.b"), 1);
    assert_int_equal(route(&r, x, "a.b.c"), 0);
    assert_true(exchange_unbind(x, &q1.as_dest, BYTES_LIT("a.b"), NO_ARGS));
    assert_int_equal(exchange__index_count(x), 0);
    exchange_free(x);
}

/* Naive reference: recursive over word lists, straight from the rules. */
static bool reference_match(char **p, int pn, char **k, int kn)
{
    if (pn == 0)
        return kn == 0;
    if (strcmp(p[0], "#") == 0) {
        for (int skip = 0; skip <= kn; skip++) {
            if (reference_match(p + 1, pn - 1, k + skip, kn - skip))
                return true;
        }
        return false;
    }
    if (kn == 0)
        return false;
    if (strcmp(p[0], "*") == 0 || strcmp(p[0], k[0]) == 0)
        return reference_match(p + 1, pn - 1, k + 1, kn - 1);
    return false;
}

static int split_words(char *s, char **words)
{
    if (*s == '\0')
        return 0;
    int n = 0;
    words[n++] = s;
    for (char *c = s; *c; c++) {
        if (*c == '.') {
            *c = '\0';
            words[n++] = c + 1;
        }
    }
    return n;
}

static uint32_t rng_state = 12345;

static uint32_t rng_next(void)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return (rng_state >> 16) & 0x7fff;
}

static void random_key(char *out, bool wildcards)
{
    static const char *const words[] = {"a", "b", "", "*", "#"};
    int n = (int)(rng_next() % 5);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *w = words[rng_next() % (wildcards ? 5 : 3)];
        if (i > 0)
            strcat(out, ".");
        strcat(out, w);
    }
}

/* topic_match, the trie walk and the reference agree on random inputs. */
static void test_topic_random_cross_check(void **state)
{
    (void)state;
    enum { PATTERNS = 60, KEYS = 400 };
    static char patterns[PATTERNS][32];
    static struct fake_queue q[PATTERNS];
    static struct bind_dest *slots[PATTERNS];
    struct exchange *x = new_exchange("t", EXCHANGE_TOPIC);
    for (int i = 0; i < PATTERNS; i++) {
        random_key(patterns[i], true);
        fake_queue_init(&q[i], i);
        bind_q(x, &q[i], patterns[i]);
    }
    for (int n = 0; n < KEYS; n++) {
        char key[32];
        random_key(key, n % 4 == 0); /* sometimes literal '*' and '#' words */
        struct route_result r = {.dests = slots, .count = 0, .cap = PATTERNS};
        exchange_route(x, bytes_of_cstr(key), NO_HEADERS, &r);
        for (int i = 0; i < PATTERNS; i++) {
            char pcopy[32], kcopy[32];
            char *pw[16], *kw[16];
            strcpy(pcopy, patterns[i]);
            strcpy(kcopy, key);
            int pn = split_words(pcopy, pw);
            int kn = split_words(kcopy, kw);
            bool want = reference_match(pw, pn, kw, kn);
            bool pure = topic_match(bytes_of_cstr(patterns[i]), bytes_of_cstr(key));
            bool trie = false;
            for (uint32_t j = 0; j < r.count; j++)
                trie = trie || slots[j] == &q[i].as_dest;
            if (pure != want || trie != want)
                fail_msg("pattern \"%s\" key \"%s\": ref %d pure %d trie %d", patterns[i], key,
                         want, pure, trie);
        }
    }
    for (int i = 0; i < PATTERNS; i++)
        exchange_unbind(x, &q[i].as_dest, bytes_of_cstr(patterns[i]), NO_ARGS);
    assert_int_equal(exchange__index_count(x), 0);
    exchange_free(x);
}

/* Many '#' against a long key must not go exponential. */
static void test_topic_pathological(void **state)
{
    (void)state;
    char pattern[256] = "", key[256] = "";
    for (int i = 0; i < 60; i++)
        strcat(pattern, "#.");
    strcat(pattern, "z");
    for (int i = 0; i < 120; i++)
        strcat(key, "a.");
    strcat(key, "b");
    struct exchange *x = new_exchange("t", EXCHANGE_TOPIC);
    struct fake_queue q;
    fake_queue_init(&q, 1);
    bind_q(x, &q, pattern);
    struct routed r;
    assert_int_equal(route(&r, x, key), 0);
    assert_false(topic_match(bytes_of_cstr(pattern), bytes_of_cstr(key)));
    key[strlen(key) - 1] = 'z';
    assert_int_equal(route(&r, x, key), 1);
    assert_true(topic_match(bytes_of_cstr(pattern), bytes_of_cstr(key)));
    exchange_free(x);
}

/* ------------------------------------------------------------------ */
/* Headers                                                             */

struct tbuf {
    uint8_t bytes[512];
    struct table_writer w;
};

static struct table_writer *tw(struct tbuf *b)
{
    table_writer_init(&b->w, b->bytes, sizeof(b->bytes));
    return &b->w;
}

static struct table tdone(struct tbuf *b)
{
    assert_false(b->w.overflow);
    return table_writer_table(&b->w);
}

static void put_str(struct table_writer *w, const char *key, const char *v)
{
    table_put_longstr(w, key, bytes_of_cstr(v));
}

static void put_value(struct table_writer *w, const char *key, struct field_value v)
{
    table_put_field(w, bytes_of_cstr(key), &v);
}

static void test_headers_all_any(void **state)
{
    (void)state;
    struct tbuf all, any, dflt, h;
    struct table_writer *w = tw(&all);
    put_str(w, "x-match", "all");
    table_put_int(w, "a", 1);
    put_str(w, "b", "x");
    w = tw(&any);
    put_str(w, "x-match", "any");
    table_put_int(w, "a", 1);
    put_str(w, "b", "x");
    w = tw(&dflt); /* no x-match: all */
    table_put_int(w, "a", 1);
    put_str(w, "b", "x");

    w = tw(&h);
    put_str(w, "b", "x"); /* order does not matter */
    table_put_int(w, "a", 1);
    table_put_int(w, "c", 9);
    assert_true(headers_match(tdone(&all), tdone(&h)));
    assert_true(headers_match(tdone(&any), tdone(&h)));
    assert_true(headers_match(tdone(&dflt), tdone(&h)));

    w = tw(&h);
    table_put_int(w, "a", 1);
    assert_false(headers_match(tdone(&all), tdone(&h)));
    assert_true(headers_match(tdone(&any), tdone(&h)));
    assert_false(headers_match(tdone(&dflt), tdone(&h)));

    w = tw(&h);
    table_put_int(w, "a", 2);
    put_str(w, "b", "y");
    assert_false(headers_match(tdone(&all), tdone(&h)));
    assert_false(headers_match(tdone(&any), tdone(&h)));

    assert_false(headers_match(tdone(&all), NO_HEADERS));
    assert_false(headers_match(tdone(&any), NO_HEADERS));

    /* An unknown x-match value (or a non-longstr one) means all. */
    w = tw(&dflt);
    put_str(w, "x-match", "some");
    table_put_int(w, "a", 1);
    table_put_int(w, "b", 1);
    w = tw(&h);
    table_put_int(w, "a", 1);
    assert_false(headers_match(tdone(&dflt), tdone(&h)));
    w = tw(&dflt);
    put_value(w, "x-match", (struct field_value){.kind = 'x', .str = BYTES_LIT("any")});
    table_put_int(w, "a", 1);
    table_put_int(w, "b", 1);
    assert_false(headers_match(tdone(&dflt), tdone(&h)));
}

static void test_headers_empty_and_x_keys(void **state)
{
    (void)state;
    struct tbuf b, h;
    struct table_writer *w = tw(&h);
    put_str(w, "x-foo", "1");
    table_put_int(w, "a", 1);
    struct table headers = tdone(&h);

    /* "all" with no keys matches everything; "any" with none, nothing. */
    assert_true(headers_match(NO_HEADERS, headers));
    assert_true(headers_match(NO_HEADERS, NO_HEADERS));
    w = tw(&b);
    put_str(w, "x-match", "any");
    assert_false(headers_match(tdone(&b), headers));

    /* x- keys are not matched... */
    w = tw(&b);
    put_str(w, "x-match", "any");
    put_str(w, "x-foo", "1");
    assert_false(headers_match(tdone(&b), headers));
    w = tw(&b);
    put_str(w, "x-match", "all");
    put_str(w, "x-foo", "nope");
    assert_true(headers_match(tdone(&b), NO_HEADERS));

    /* ...except with the -with-x variants (x-match itself still is not). */
    w = tw(&b);
    put_str(w, "x-match", "any-with-x");
    put_str(w, "x-foo", "1");
    assert_true(headers_match(tdone(&b), headers));
    w = tw(&b);
    put_str(w, "x-match", "all-with-x");
    put_str(w, "x-foo", "1");
    table_put_int(w, "a", 1);
    assert_true(headers_match(tdone(&b), headers));
    w = tw(&b);
    put_str(w, "x-match", "all-with-x");
    put_str(w, "x-bar", "1");
    table_put_int(w, "a", 1);
    assert_false(headers_match(tdone(&b), headers));
    w = tw(&b);
    put_str(w, "x-match", "all-with-x");
    assert_true(headers_match(tdone(&b), NO_HEADERS));
    w = tw(&b);
    put_str(w, "x-match", "any-with-x");
    assert_false(headers_match(tdone(&b), headers));
}

static void test_headers_void(void **state)
{
    (void)state;
    struct tbuf b, h;
    struct table_writer *w = tw(&b);
    put_value(w, "a", (struct field_value){.kind = 'V'});
    struct table binding = tdone(&b);
    w = tw(&h);
    put_str(w, "a", "anything");
    assert_true(headers_match(binding, tdone(&h)));
    w = tw(&h);
    put_value(w, "a", (struct field_value){.kind = 'V'});
    assert_true(headers_match(binding, tdone(&h)));
    w = tw(&h);
    put_str(w, "b", "x");
    assert_false(headers_match(binding, tdone(&h)));
    assert_false(headers_match(binding, NO_HEADERS));
    /* A void header does not equal a non-void binding value. */
    w = tw(&b);
    put_str(w, "a", "");
    assert_false(headers_match(tdone(&b), tdone(&h)));
}

/* headers_match compares with Erlang's == (RabbitMQ: PV == DV), so the
 * type letter only matters inside nested tables and arrays. */
static bool values_match(struct field_value binding_value, struct field_value header_value)
{
    struct tbuf b, h;
    put_value(tw(&b), "k", binding_value);
    put_value(tw(&h), "k", header_value);
    return headers_match(tdone(&b), tdone(&h));
}

static void test_headers_value_equality(void **state)
{
    (void)state;
    struct field_value i1 = {.kind = 'I', .i64 = 1};
    struct field_value l1 = {.kind = 'l', .i64 = 1};
    struct field_value b1 = {.kind = 'b', .i64 = 1};
    struct field_value u1 = {.kind = 'u', .u64 = 1};
    struct field_value d1 = {.kind = 'd', .f64 = 1.0};
    struct field_value f1 = {.kind = 'f', .f32 = 1.0f};
    struct field_value d15 = {.kind = 'd', .f64 = 1.5};
    struct field_value lm1 = {.kind = 'l', .i64 = -1};
    struct field_value im1 = {.kind = 'I', .i64 = -1};
    struct field_value t1 = {.kind = 't', .boolean = true};
    struct field_value s_abc = {.kind = 'S', .str = BYTES_LIT("abc")};
    struct field_value x_abc = {.kind = 'x', .str = BYTES_LIT("abc")};
    struct field_value s_abd = {.kind = 'S', .str = BYTES_LIT("abd")};
    struct field_value ts_big = {.kind = 'T', .u64 = UINT64_MAX};
    struct field_value ts_2_63 = {.kind = 'T', .u64 = (uint64_t)1 << 63};
    struct field_value d_2_63 = {.kind = 'd', .f64 = 9223372036854775808.0};
    struct field_value l_max = {.kind = 'l', .i64 = INT64_MAX};
    struct field_value dec_a = {.kind = 'D', .decimal = {2, 100}};
    struct field_value dec_b = {.kind = 'D', .decimal = {1, 10}};

    assert_true(values_match(i1, l1));
    assert_true(values_match(l1, b1));
    assert_true(values_match(u1, i1));
    assert_true(values_match(d1, l1));
    assert_true(values_match(f1, d1));
    assert_true(values_match(lm1, im1));
    assert_false(values_match(d15, l1));
    assert_false(values_match(lm1, u1));
    assert_false(values_match(t1, l1));
    assert_true(values_match(t1, t1));
    assert_true(values_match(s_abc, x_abc));
    assert_false(values_match(s_abc, s_abd));
    assert_false(values_match(s_abc, l1));
    assert_true(values_match(ts_big, ts_big));
    assert_false(values_match(ts_big, l_max));
    assert_true(values_match(ts_2_63, d_2_63));
    assert_false(values_match(l_max, d_2_63));
    assert_true(values_match(dec_a, dec_a));
    assert_false(values_match(dec_a, dec_b));
    assert_false(values_match(dec_a, l1));
}

static void test_headers_nested(void **state)
{
    (void)state;
    struct tbuf b, h;
    /* Nested tables compare as {Key, Type, Value} lists: types exact. */
    struct table_writer *w = tw(&b);
    size_t m = table_put_table_begin(w, "k");
    table_put_int(w, "n", 1);
    table_put_table_end(w, m);
    struct table binding = tdone(&b);
    w = tw(&h);
    m = table_put_table_begin(w, "k");
    table_put_int(w, "n", 1);
    table_put_table_end(w, m);
    assert_true(headers_match(binding, tdone(&h)));
    w = tw(&h);
    m = table_put_table_begin(w, "k");
    table_put_i32(w, "n", 1);
    table_put_table_end(w, m);
    assert_false(headers_match(binding, tdone(&h)));

    /* Arrays likewise; and an empty table equals an empty array ([]). */
    w = tw(&b);
    m = table_put_array_begin(w, "k");
    table_array_put_int(w, 7);
    table_array_put_longstr(w, BYTES_LIT("s"));
    table_put_array_end(w, m);
    binding = tdone(&b);
    w = tw(&h);
    m = table_put_array_begin(w, "k");
    table_array_put_int(w, 7);
    table_array_put_longstr(w, BYTES_LIT("s"));
    table_put_array_end(w, m);
    assert_true(headers_match(binding, tdone(&h)));
    w = tw(&h);
    m = table_put_array_begin(w, "k");
    table_array_put_int(w, 7);
    table_put_array_end(w, m);
    assert_false(headers_match(binding, tdone(&h)));
    w = tw(&b);
    m = table_put_table_begin(w, "k");
    table_put_table_end(w, m);
    w = tw(&h);
    m = table_put_array_begin(w, "k");
    table_put_array_end(w, m);
    assert_true(headers_match(tdone(&b), tdone(&h)));
}

/* RabbitMQ sorts both tables stably by key and merges: the k-th binding
 * entry named K meets the k-th header named K. */
static void test_headers_duplicate_keys(void **state)
{
    (void)state;
    struct tbuf b, h;
    struct table_writer *w = tw(&b);
    table_put_int(w, "a", 1);
    table_put_int(w, "a", 2);
    struct table binding = tdone(&b);
    w = tw(&h);
    table_put_int(w, "a", 1);
    table_put_int(w, "a", 2);
    assert_true(headers_match(binding, tdone(&h)));
    w = tw(&h);
    table_put_int(w, "a", 2);
    table_put_int(w, "a", 1);
    assert_false(headers_match(binding, tdone(&h)));
    w = tw(&h);
    table_put_int(w, "a", 1);
    assert_false(headers_match(binding, tdone(&h)));
}

static void test_headers_exchange(void **state)
{
    (void)state;
    struct tbuf b1, b2, b3, h;
    struct table_writer *w = tw(&b1);
    put_str(w, "x-match", "all");
    put_str(w, "format", "pdf");
    put_str(w, "type", "report");
    w = tw(&b2);
    put_str(w, "x-match", "any");
    put_str(w, "format", "zip");
    put_str(w, "type", "log");
    tw(&b3); /* empty: all of nothing, matches every message */
    struct table t1 = tdone(&b1), t2 = tdone(&b2), t3 = tdone(&b3);

    struct exchange *x = new_exchange("h", EXCHANGE_HEADERS);
    struct fake_queue q1, q2, q3;
    fake_queue_init(&q1, 1);
    fake_queue_init(&q2, 2);
    fake_queue_init(&q3, 3);
    exchange_bind(x, &q1.as_dest, BYTES_LIT(""), (struct bytes){t1.ptr, t1.len});
    exchange_bind(x, &q2.as_dest, BYTES_LIT(""), (struct bytes){t2.ptr, t2.len});
    exchange_bind(x, &q3.as_dest, BYTES_LIT(""), (struct bytes){t3.ptr, t3.len});

    struct routed r;
    w = tw(&h);
    put_str(w, "type", "report");
    put_str(w, "format", "pdf");
    assert_int_equal(route_headers(&r, x, "ignored", tdone(&h)), 2);
    assert_true(routed_to(&r, &q1) && routed_to(&r, &q3));
    w = tw(&h);
    put_str(w, "type", "log");
    assert_int_equal(route_headers(&r, x, "", tdone(&h)), 2);
    assert_true(routed_to(&r, &q2) && routed_to(&r, &q3));
    assert_int_equal(route_headers(&r, x, "", NO_HEADERS), 1);
    assert_true(routed_to(&r, &q3));
    exchange_free(x);
}

/* ------------------------------------------------------------------ */
/* Binding identity                                                    */

/* RabbitMQ keysorts binding arguments, so entries with different keys may
 * come in any order; entries with the same key keep theirs. */
static struct bytes args_of(struct table t)
{
    return (struct bytes){t.ptr, t.len};
}

static void test_binding_identity(void **state)
{
    (void)state;
    struct tbuf ab, ba, aa12, aa21;
    struct table_writer *w = tw(&ab);
    table_put_int(w, "a", 1);
    put_str(w, "b", "x");
    w = tw(&ba);
    put_str(w, "b", "x");
    table_put_int(w, "a", 1);
    w = tw(&aa12);
    table_put_int(w, "a", 1);
    table_put_int(w, "a", 2);
    w = tw(&aa21);
    table_put_int(w, "a", 2);
    table_put_int(w, "a", 1);
    struct table tab = tdone(&ab), tba = tdone(&ba), t12 = tdone(&aa12), t21 = tdone(&aa21);

    struct exchange *x = new_exchange("h", EXCHANGE_HEADERS);
    struct fake_queue q;
    fake_queue_init(&q, 1);
    struct binding *b = exchange_bind(x, &q.as_dest, BYTES_LIT("k"), args_of(tab));
    assert_ptr_equal(exchange_bind(x, &q.as_dest, BYTES_LIT("k"), args_of(tba)), b);
    assert_ptr_not_equal(exchange_bind(x, &q.as_dest, BYTES_LIT("j"), args_of(tab)), b);
    struct binding *b12 = exchange_bind(x, &q.as_dest, BYTES_LIT("k"), args_of(t12));
    struct binding *b21 = exchange_bind(x, &q.as_dest, BYTES_LIT("k"), args_of(t21));
    assert_ptr_not_equal(b12, b21);
    assert_int_equal(x->bindings_count, 4);
    assert_true(exchange_unbind(x, &q.as_dest, BYTES_LIT("k"), args_of(tba)));
    assert_false(exchange_unbind(x, &q.as_dest, BYTES_LIT("k"), args_of(tab)));
    assert_false(exchange_unbind(x, &q.as_dest, BYTES_LIT("k"), NO_ARGS));
    assert_int_equal(x->bindings_count, 3);
    assert_int_equal(q.as_dest.bindings_in_count, 3);
    exchange_free(x);
    assert_int_equal(q.as_dest.bindings_in_count, 0);
}

/* ------------------------------------------------------------------ */
/* Exchange-to-exchange                                                */

static void test_e2e_chain(void **state)
{
    (void)state;
    struct exchange *a = new_exchange("a", EXCHANGE_FANOUT);
    struct exchange *b = new_exchange("b", EXCHANGE_DIRECT);
    struct exchange *c = new_exchange("c", EXCHANGE_TOPIC);
    struct fake_queue q1, q2, q3;
    fake_queue_init(&q1, 1);
    fake_queue_init(&q2, 2);
    fake_queue_init(&q3, 3);
    bind_x(a, b, "");
    bind_x(b, c, "k.x"); /* the routing key stays the same at every hop */
    bind_q(a, &q1, "");
    bind_q(b, &q2, "k.x");
    bind_q(c, &q3, "k.*");
    struct routed r;
    assert_int_equal(route(&r, a, "k.x"), 3);
    assert_true(routed_to(&r, &q1) && routed_to(&r, &q2) && routed_to(&r, &q3));
    assert_int_equal(route(&r, a, "k.y"), 1);
    assert_int_equal(route(&r, b, "k.x"), 2);
    assert_int_equal(route(&r, c, "k.y"), 1);
    assert_int_equal(b->as_dest.bindings_in_count, 1);
    exchange_free(a);
    exchange_free(b);
    exchange_free(c);
    assert_int_equal(q3.as_dest.bindings_in_count, 0);
}

static void test_e2e_cycle(void **state)
{
    (void)state;
    struct exchange *a = new_exchange("a", EXCHANGE_FANOUT);
    struct exchange *b = new_exchange("b", EXCHANGE_FANOUT);
    struct fake_queue qa, qb;
    fake_queue_init(&qa, 1);
    fake_queue_init(&qb, 2);
    bind_x(a, b, "");
    bind_x(b, a, "");
    bind_x(a, a, ""); /* a self-binding too */
    bind_q(a, &qa, "");
    bind_q(b, &qb, "");
    struct routed r;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(route(&r, a, "k"), 2);
        assert_true(routed_to(&r, &qa) && routed_to(&r, &qb));
        assert_int_equal(route(&r, b, "k"), 2);
    }
    exchange_free(b);
    assert_int_equal(a->bindings_count, 2);
    assert_int_equal(route(&r, a, "k"), 1);
    exchange_free(a);
}

/* A queue reachable along several paths is routed to once. */
static void test_e2e_dedup(void **state)
{
    (void)state;
    struct exchange *a = new_exchange("a", EXCHANGE_FANOUT);
    struct exchange *b = new_exchange("b", EXCHANGE_DIRECT);
    struct exchange *c = new_exchange("c", EXCHANGE_TOPIC);
    struct exchange *d = new_exchange("d", EXCHANGE_FANOUT);
    struct fake_queue q;
    fake_queue_init(&q, 1);
    bind_x(a, b, "");
    bind_x(a, c, "");
    bind_x(b, d, "k");
    bind_x(c, d, "#");
    bind_q(a, &q, "");
    bind_q(b, &q, "k");
    bind_q(c, &q, "*");
    bind_q(d, &q, "");
    struct routed r;
    assert_int_equal(route(&r, a, "k"), 1);
    assert_true(routed_to(&r, &q));
    exchange_free(d);
    exchange_free(c);
    exchange_free(b);
    exchange_free(a);
    assert_int_equal(q.as_dest.bindings_in_count, 0);
}

/* ------------------------------------------------------------------ */
/* Lifetime                                                            */

struct unused_log {
    struct exchange *seen[8];
    int count;
    bool free_them;
};

static void on_unused(struct exchange *exchange, void *ctx)
{
    struct unused_log *log = ctx;
    assert_false(exchange_has_bindings(exchange));
    assert_true(log->count < 8);
    log->seen[log->count++] = exchange;
    if (log->free_them)
        exchange_free(exchange); /* what the vhost does for auto-delete */
}

static void test_unbind_all(void **state)
{
    (void)state;
    struct exchange *x1 = new_exchange("x1", EXCHANGE_DIRECT);
    struct exchange *x2 = new_exchange("x2", EXCHANGE_TOPIC);
    struct exchange *x3 = new_exchange("x3", EXCHANGE_FANOUT);
    struct exchange *up = new_exchange("up", EXCHANGE_FANOUT);
    struct fake_queue q, other;
    fake_queue_init(&q, 1);
    fake_queue_init(&other, 2);
    bind_q(x1, &q, "a");
    bind_q(x1, &q, "b");
    bind_q(x2, &q, "#");
    bind_q(x2, &other, "#");
    bind_q(x3, &q, "");
    bind_x(up, x3, "");
    assert_int_equal(q.as_dest.bindings_in_count, 4);

    struct unused_log log = {.free_them = true};
    bind_dest_unbind_all(&q.as_dest, on_unused, &log);
    assert_int_equal(q.as_dest.bindings_in_count, 0);
    assert_int_equal(log.count, 2); /* x1 and x3 became unused; x2 still has other */
    assert_true((log.seen[0] == x1 && log.seen[1] == x3) ||
                (log.seen[0] == x3 && log.seen[1] == x1));
    /* Freeing x3 removed up's binding to it (not reported: no callback). */
    assert_int_equal(up->bindings_count, 0);
    assert_int_equal(x2->bindings_count, 1);
    struct routed r;
    assert_int_equal(route(&r, x2, "z"), 1);
    assert_true(routed_to(&r, &other));

    /* With no callback nothing is reported; an exchange is not reported
     * for its own self-binding when its incoming bindings are removed. */
    bind_q(x2, &q, "z");
    bind_dest_unbind_all(&q.as_dest, NULL, NULL);
    assert_int_equal(x2->bindings_count, 1);
    bind_x(up, up, "");
    log = (struct unused_log){.free_them = false};
    bind_dest_unbind_all(&up->as_dest, on_unused, &log);
    assert_int_equal(log.count, 0);
    assert_int_equal(up->bindings_count, 0);
    exchange_free(x2);
    exchange_free(up);
}

/* exchange_free removes bindings in both directions and leaves the
 * other ends consistent. */
static void test_exchange_free_both_directions(void **state)
{
    (void)state;
    struct exchange *x = new_exchange("x", EXCHANGE_TOPIC);
    struct exchange *src = new_exchange("src", EXCHANGE_DIRECT);
    struct exchange *dst = new_exchange("dst", EXCHANGE_FANOUT);
    struct fake_queue q;
    fake_queue_init(&q, 1);
    bind_x(src, x, "k");
    bind_q(src, &q, "k");
    bind_q(x, &q, "#");
    bind_q(x, &q, "a.*");
    bind_x(x, dst, "#");
    bind_x(dst, x, ""); /* cycle back */
    bind_x(x, x, "self");
    bind_q(dst, &q, "");
    assert_int_equal(x->bindings_count, 4);
    assert_int_equal(x->as_dest.bindings_in_count, 3);

    exchange_free(x);
    assert_int_equal(src->bindings_count, 1);
    assert_int_equal(dst->bindings_count, 1);
    assert_int_equal(dst->as_dest.bindings_in_count, 0);
    assert_int_equal(q.as_dest.bindings_in_count, 2);
    struct routed r;
    assert_int_equal(route(&r, src, "k"), 1);
    assert_int_equal(route(&r, dst, "k"), 1);
    exchange_free(src);
    exchange_free(dst);
    assert_int_equal(q.as_dest.bindings_in_count, 0);
}

/* The route-pass counter wraps without a stale mark hiding a queue. */
static void test_route_pass_wrap(void **state)
{
    (void)state;
    struct exchange *e1 = new_exchange("e1", EXCHANGE_FANOUT);
    struct exchange *e2 = new_exchange("e2", EXCHANGE_FANOUT);
    struct fake_queue q1, q2, late;
    fake_queue_init(&q1, 1);
    fake_queue_init(&q2, 2);
    fake_queue_init(&late, 3);
    bind_q(e1, &q1, "");
    bind_q(e2, &q2, "");
    struct routed r;
    exchange__route_pass_set(1);
    assert_int_equal(route(&r, e2, ""), 1); /* pass 2 marks q2 */
    assert_int_equal(q2.as_dest.route_mark, 2);
    exchange__route_pass_set(UINT32_MAX - 1);
    assert_int_equal(route(&r, e1, ""), 1); /* pass UINT32_MAX */
    assert_int_equal(route(&r, e1, ""), 1); /* wraps: marks cleared, pass 1 */
    assert_int_equal(route(&r, e2, ""), 1); /* pass 2 again: q2 must not look seen */
    assert_true(routed_to(&r, &q2));
    late.as_dest.route_mark = 3; /* as if left over from long ago, while unbound */
    bind_q(e2, &late, "");
    assert_int_equal(route(&r, e2, ""), 2); /* pass 3: late's mark was cleared on bind */
    assert_true(routed_to(&r, &late));
    exchange_free(e1);
    exchange_free(e2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_names),
        cmocka_unit_test(test_direct),
        cmocka_unit_test(test_direct_same_queue_twice),
        cmocka_unit_test(test_fanout),
        cmocka_unit_test(test_topic_match_table),
        cmocka_unit_test(test_topic_trie_table),
        cmocka_unit_test(test_topic_trie_shared),
        cmocka_unit_test(test_topic_trie_no_stale_nodes),
        cmocka_unit_test(test_topic_random_cross_check),
        cmocka_unit_test(test_topic_pathological),
        cmocka_unit_test(test_headers_all_any),
        cmocka_unit_test(test_headers_empty_and_x_keys),
        cmocka_unit_test(test_headers_void),
        cmocka_unit_test(test_headers_value_equality),
        cmocka_unit_test(test_headers_nested),
        cmocka_unit_test(test_headers_duplicate_keys),
        cmocka_unit_test(test_headers_exchange),
        cmocka_unit_test(test_binding_identity),
        cmocka_unit_test(test_e2e_chain),
        cmocka_unit_test(test_e2e_cycle),
        cmocka_unit_test(test_e2e_dedup),
        cmocka_unit_test(test_unbind_all),
        cmocka_unit_test(test_exchange_free_both_directions),
        cmocka_unit_test(test_route_pass_wrap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
