/*
 * test_json_tree.c: the management API's nested JSON reader
 * (mgmt/json_tree.h), the table conversion on top of it
 * (mgmt/api_table.h), and the list treatment of RabbitMQ's query
 * parameters' pure part (none: api_list.c needs a call, and is covered by
 * 36-rabbitmqadmin).
 *
 * Goal: every RFC 8259 document parses into the tree its text says
 * (nesting, member order, escapes to UTF-8, integers kept as integers),
 * every malformed one is refused with the line, column and byte where it
 * went wrong, and nothing past the input is read; a JSON object becomes
 * an AMQP field table and back unchanged.
 *
 * Method: parse literal texts, walk the tree and compare; compare the
 * error texts' positions with the literal's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/table.h"
#include "lib/errors.h"
#include "mgmt/api_table.h"
#include "lib/json.h"
#include "mgmt/json_tree.h"

static int parse(const char *text, struct json_tree *tree, char *err)
{
    return json_tree_parse(tree, text, strlen(text), err, 200);
}

static void test_nested_document(void **state)
{
    (void)state;
    struct json_tree t;
    char err[200];
    const char *text = "{\"a\": [1, -2, 3.5, true, null, \"x\\u00e9\\ud834\\udd1e\"],"
                       " \"b\": {\"c\": {}}, \"a2\": \"\"}";
    assert_int_equal(parse(text, &t, err), OK);
    const struct json_node *root = json_tree_root(&t);
    assert_int_equal(root->kind, JSON_KIND_OBJECT);
    assert_int_equal(root->children_count, 3);
    const struct json_node *a = json_tree_get(&t, root, "a");
    assert_int_equal(a->kind, JSON_KIND_ARRAY);
    assert_int_equal(a->children_count, 6);
    const struct json_node *n = json_tree_first(&t, a);
    assert_true(n->is_integer && n->integer == 1);
    n = json_tree_next(&t, n);
    assert_true(n->is_integer && n->integer == -2);
    n = json_tree_next(&t, n);
    assert_false(n->is_integer);
    assert_true(n->number == 3.5);
    n = json_tree_next(&t, n);
    assert_true(n->kind == JSON_KIND_BOOL && n->boolean);
    n = json_tree_next(&t, n);
    assert_int_equal(n->kind, JSON_KIND_NULL);
    n = json_tree_next(&t, n);
    assert_string_equal(n->string, "x\xc3\xa9\xf0\x9d\x84\x9e");
    assert_int_equal(n->string_size, 7);
    assert_null(json_tree_next(&t, n));
    const struct json_node *c = json_tree_get(&t, json_tree_get(&t, root, "b"), "c");
    assert_true(c->kind == JSON_KIND_OBJECT && c->children_count == 0);
    assert_int_equal(json_tree_get(&t, root, "a2")->string_size, 0);
    assert_null(json_tree_get(&t, root, "zz"));
    bool v;
    assert_true(json_tree_get_bool(&t, root, "missing", true, &v) && v);
    json_tree_free(&t);
    assert_int_equal(parse("{\"d\": \"true\", \"e\": false, \"f\": 1}", &t, err), OK);
    assert_true(json_tree_get_bool(&t, json_tree_root(&t), "d", false, &v) && v);
    assert_true(json_tree_get_bool(&t, json_tree_root(&t), "e", true, &v) && !v);
    assert_false(json_tree_get_bool(&t, json_tree_root(&t), "f", true, &v));
    json_tree_free(&t);
}

/* Each malformed text, and where its error must be reported. */
static void test_errors_name_their_position(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *where;
    } cases[] = {
        {"", "line 1, column 1 (byte 0)"},
        {"{\"a\": tru}", "line 1, column 7 (byte 6)"},
        {"{\"a\": 1,\n \"b\" 2}", "line 2, column 6 (byte 14)"},
        {"[1, 2", "line 1, column 6 (byte 5)"},
        {"{\"a\": 1} x", "line 1, column 10 (byte 9)"},
        {"\"\\x\"", "line 1, column 4 (byte 3)"},
        {"\"\\ud800\"", "line 1, column 8 (byte 7)"},
        {"01", "line 1, column 1 (byte 0): a number with a leading zero"},
        {"{\"a\": \"\x01\"}", "line 1, column 8 (byte 7)"},
        {"\"\xff\"", "line 1, column 2 (byte 1)"},
        {"1e999", "byte 5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct json_tree t;
        char err[200] = "";
        assert_int_equal(parse(cases[i].text, &t, err), E_SYNTAX);
        if (strstr(err, cases[i].where) == NULL)
            fail_msg("%s: %s (want %s)", cases[i].text, err, cases[i].where);
        assert_null(t.nodes);
    }
    char deep[JSON_TREE_DEPTH_MAX + 2];
    memset(deep, '[', sizeof deep);
    struct json_tree t;
    char err[200];
    assert_int_equal(json_tree_parse(&t, deep, sizeof deep, err, sizeof err), E_SYNTAX);
    assert_non_null(strstr(err, "nested too deeply"));
}

/* Nothing past size is read: the text continues in memory. */
static void test_reads_only_size(void **state)
{
    (void)state;
    const char text[] = "{\"a\": 1}GARBAGE";
    struct json_tree t;
    char err[200];
    assert_int_equal(json_tree_parse(&t, text, 8, err, sizeof err), OK);
    json_tree_free(&t);
    assert_int_equal(json_tree_parse(&t, text, 7, err, sizeof err), E_SYNTAX);
}

static void test_table_round_trip(void **state)
{
    (void)state;
    const char *text = "{\"x-max-length\":10,\"s\":\"v\",\"t\":true,\"n\":null,"
                       "\"f\":{\"in\":[1,\"two\",{\"k\":false}]},\"d\":0.5}";
    struct json_tree t;
    char err[200];
    assert_int_equal(parse(text, &t, err), OK);
    uint8_t buf[512];
    struct table table;
    assert_int_equal(api_table_from_json(&t, json_tree_root(&t), buf, sizeof buf, &table, err,
                                         sizeof err), OK);
    assert_int_equal(table_validate(table.ptr, table.len), OK);
    struct json out;
    json_init(&out);
    api_table_write(&out, table);
    size_t size;
    char *data = json_release(&out, &size);
    assert_int_equal(size, strlen(text));
    assert_memory_equal(data, text, size);
    free(data);
    /* Too big for the buffer, and not an object: refused. */
    assert_int_equal(api_table_from_json(&t, json_tree_root(&t), buf, 8, &table, err,
                                         sizeof err), E_SYNTAX);
    json_tree_free(&t);
    assert_int_equal(parse("[1]", &t, err), OK);
    assert_int_equal(api_table_from_json(&t, json_tree_root(&t), buf, sizeof buf, &table, err,
                                         sizeof err), E_SYNTAX);
    json_tree_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nested_document),
        cmocka_unit_test(test_errors_name_their_position),
        cmocka_unit_test(test_reads_only_size),
        cmocka_unit_test(test_table_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
