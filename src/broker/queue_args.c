/*
 * queue_args.c: RabbitMQ 3.10's argument rules for queue.declare,
 * basic.consume and exchange.declare, and its wording.
 *
 * Owns nothing but constant tables. Everything here was observed on a
 * RabbitMQ 3.10.8 node (see tests/integration/RABBITMQ-ARGS.md); where the
 * order of checks matters it follows RabbitMQ's, not the table's. Must
 * never allocate, do I/O or keep a pointer to its input.
 *
 * RabbitMQ prints values with Erlang's io_lib (~s for binaries, ~p for the
 * rest), so the helpers below render a field value as the Erlang term
 * rabbit_binary_parser decodes it into: integers, floats in Erlang's
 * shortest notation (1.0e3, 100.0), <<"bin">>, true, undefined, {S,V} for
 * decimals, [{<<"k">>,type,V}] for tables and [{type,V}] for arrays.
 */
#include "broker/queue_args.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amqp/reply_code_gen.h"
#include "lib/assert.h"

/* ---- bounded text output ----------------------------------------------- */

/* A NUL-terminated string being built in a caller buffer; bytes past the
 * end are dropped. */
struct text {
    char *buf; /* borrowed */
    size_t size;
    size_t len;
};

static void text_init(struct text *t, char *buf, size_t size)
{
    ASSERT(buf != NULL);
    ASSERT(size > 0);
    t->buf = buf;
    t->size = size;
    t->len = 0;
    buf[0] = '\0';
}

static void put_mem(struct text *t, const void *p, size_t n)
{
    size_t room = t->size - 1 - t->len;
    if (n > room)
        n = room;
    if (n > 0)
        memcpy(t->buf + t->len, p, n);
    t->len += n;
    t->buf[t->len] = '\0';
}

static void put_str(struct text *t, const char *s)
{
    put_mem(t, s, strlen(s));
}

static void put_bytes(struct text *t, struct bytes b)
{
    put_mem(t, b.ptr, b.len);
}

static void put_i64(struct text *t, int64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof(tmp), "%lld", (long long)v);
    put_mem(t, tmp, (size_t)n);
}

static void put_u64(struct text *t, uint64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long)v);
    put_mem(t, tmp, (size_t)n);
}

/* ---- type names and Erlang terms ---------------------------------------- */

const char *field_kind_name(uint8_t kind)
{
    switch (kind) {
    case 't': return "bool";
    case 'b': return "byte";
    case 'B': return "unsignedbyte";
    case 's': return "short";
    case 'u': return "unsignedshort";
    case 'I': return "signedint";
    case 'i': return "unsignedint";
    case 'l': return "long";
    case 'f': return "float";
    case 'd': return "double";
    case 'D': return "decimal";
    case 'S': return "longstr";
    case 'x': return "binary";
    case 'A': return "array";
    case 'T': return "timestamp";
    case 'F': return "table";
    case 'V': return "void";
    default: return "unknown";
    }
}

/* The integer kinds RabbitMQ accepts where it wants an integer (its
 * ?INTEGER_ARG_TYPES): not timestamp, not decimal. */
static bool kind_is_integer(uint8_t kind)
{
    return kind != 0 && strchr("bBsuIil", kind) != NULL;
}

static bool kind_is_unsigned(uint8_t kind)
{
    return kind == 'B' || kind == 'u' || kind == 'i' || kind == 'T';
}

static double value_as_double(const struct field_value *v)
{
    return v->kind == 'f' ? (double)v->f32 : v->f64;
}

/* Erlang's float_to_list(F, [short]) as io_lib prints it (OTP 25): the
 * shortest digits that read back as d, in fixed notation unless scientific
 * notation is strictly shorter or |d| >= 2^53. */
static void put_erlang_float(struct text *t, double d)
{
    if (d == 0) {
        put_str(t, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    char sci[40];
    for (int precision = 0; precision < 17; precision++) {
        snprintf(sci, sizeof(sci), "%.*e", precision, d);
        if (strtod(sci, NULL) == d)
            break;
    }
    /* sci is [-]D[.DDD]e[+-]XX: collect the digits and the exponent. */
    const char *p = sci;
    if (*p == '-') {
        put_str(t, "-");
        p++;
    }
    char digits[24];
    size_t digit_count = 0;
    for (; *p != 'e'; p++) {
        if (*p != '.' && digit_count < sizeof(digits))
            digits[digit_count++] = *p;
    }
    int exponent = atoi(p + 1);
    while (digit_count > 1 && digits[digit_count - 1] == '0')
        digit_count--;
    int count = (int)digit_count;
    int place = exponent - (count - 1); /* value = digits * 10^place */
    char exp_text[8];
    int exp_len = snprintf(exp_text, sizeof(exp_text), "%d", exponent);
    int sci_len = (count == 1 ? 3 : count + 1) + 1 + exp_len;

    if (place < 0 && exponent >= 0) {
        put_mem(t, digits, (size_t)exponent + 1);
        put_str(t, ".");
        put_mem(t, digits + exponent + 1, (size_t)(count - exponent - 1));
        return;
    }
    if (exponent < 0 && 2 + (-exponent - 1) + count <= sci_len) {
        put_str(t, "0.");
        for (int i = 0; i < -exponent - 1; i++)
            put_str(t, "0");
        put_mem(t, digits, digit_count);
        return;
    }
    if (place >= 0 && count + place + 2 <= sci_len && fabs(d) < 9007199254740992.0) {
        put_mem(t, digits, digit_count);
        for (int i = 0; i < place; i++)
            put_str(t, "0");
        put_str(t, ".0");
        return;
    }
    put_mem(t, digits, 1);
    put_str(t, ".");
    if (count == 1)
        put_str(t, "0");
    else
        put_mem(t, digits + 1, digit_count - 1);
    put_str(t, "e");
    put_mem(t, exp_text, (size_t)exp_len);
}

/* io_lib's printable latin1 characters (the default +pc latin1). */
static bool byte_is_printable(uint8_t c)
{
    return (c >= 32 && c <= 126) || c >= 160 || c == '\n' || c == '\r' || c == '\t' ||
           c == '\v' || c == '\b' || c == '\f' || c == 27;
}

static bool bytes_are_printable(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!byte_is_printable(p[i]))
            return false;
    }
    return true;
}

/* One character inside "..." as io_lib writes it. */
static void put_escaped(struct text *t, uint8_t c)
{
    switch (c) {
    case '"': put_str(t, "\\\""); break;
    case '\\': put_str(t, "\\\\"); break;
    case '\n': put_str(t, "\\n"); break;
    case '\r': put_str(t, "\\r"); break;
    case '\t': put_str(t, "\\t"); break;
    case '\v': put_str(t, "\\v"); break;
    case '\b': put_str(t, "\\b"); break;
    case '\f': put_str(t, "\\f"); break;
    case 27: put_str(t, "\\e"); break;
    default: put_mem(t, &c, 1); break;
    }
}

static void put_escaped_run(struct text *t, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put_escaped(t, p[i]);
}

static void put_byte_list(struct text *t, const uint8_t *p, size_t n, bool *first)
{
    for (size_t i = 0; i < n; i++) {
        if (!*first)
            put_str(t, ",");
        *first = false;
        put_u64(t, p[i]);
    }
}

/* ~p of a binary: <<"text">> when printable, else <<1,2,3>>. */
static void put_erlang_binary(struct text *t, struct bytes b)
{
    put_str(t, "<<");
    if (b.len > 0 && bytes_are_printable(b.ptr, b.len)) {
        put_str(t, "\"");
        put_escaped_run(t, b.ptr, b.len);
        put_str(t, "\"");
    } else {
        bool first = true;
        put_byte_list(t, b.ptr, b.len, &first);
    }
    put_str(t, ">>");
}

/* ~p of the Erlang string pre ++ value ++ post (a list of bytes): "..."
 * when every byte is printable, else a list of integers. */
static void put_erlang_string(struct text *t, const char *pre, struct bytes value,
                              const char *post)
{
    const uint8_t *a = (const uint8_t *)pre;
    const uint8_t *c = (const uint8_t *)post;
    if (bytes_are_printable(a, strlen(pre)) && bytes_are_printable(value.ptr, value.len) &&
        bytes_are_printable(c, strlen(post))) {
        put_str(t, "\"");
        put_escaped_run(t, a, strlen(pre));
        put_escaped_run(t, value.ptr, value.len);
        put_escaped_run(t, c, strlen(post));
        put_str(t, "\"");
        return;
    }
    bool first = true;
    put_str(t, "[");
    put_byte_list(t, a, strlen(pre), &first);
    put_byte_list(t, value.ptr, value.len, &first);
    put_byte_list(t, c, strlen(post), &first);
    put_str(t, "]");
}

static void put_term(struct text *t, const struct field_value *v);

static void put_table_term(struct text *t, struct table table)
{
    struct table_iter it;
    struct bytes key;
    struct field_value value;
    bool first = true;
    table_iter_init(&it, table);
    put_str(t, "[");
    while (table_iter_next(&it, &key, &value)) {
        put_str(t, first ? "{" : ",{");
        first = false;
        put_erlang_binary(t, key);
        put_str(t, ",");
        put_str(t, field_kind_name(value.kind));
        put_str(t, ",");
        put_term(t, &value);
        put_str(t, "}");
    }
    put_str(t, "]");
}

static void put_array_term(struct text *t, struct bytes array)
{
    struct array_iter it;
    struct field_value value;
    bool first = true;
    array_iter_init(&it, array);
    put_str(t, "[");
    while (array_iter_next(&it, &value)) {
        put_str(t, first ? "{" : ",{");
        first = false;
        put_str(t, field_kind_name(value.kind));
        put_str(t, ",");
        put_term(t, &value);
        put_str(t, "}");
    }
    put_str(t, "]");
}

/* ~p of the term rabbit_binary_parser makes of v. */
static void put_term(struct text *t, const struct field_value *v)
{
    switch (v->kind) {
    case 'b':
    case 's':
    case 'I':
    case 'l': put_i64(t, v->i64); break;
    case 'B':
    case 'u':
    case 'i':
    case 'T': put_u64(t, v->u64); break;
    case 'f':
    case 'd': put_erlang_float(t, value_as_double(v)); break;
    case 'D':
        put_str(t, "{");
        put_u64(t, v->decimal.scale);
        put_str(t, ",");
        put_u64(t, v->decimal.value);
        put_str(t, "}");
        break;
    case 'S':
    case 'x': put_erlang_binary(t, v->str); break;
    case 't': put_str(t, v->boolean ? "true" : "false"); break;
    case 'V': put_str(t, "undefined"); break;
    case 'F': put_table_term(t, v->table); break;
    case 'A': put_array_term(t, v->array); break;
    default: NEVER(true); break;
    }
}

/* The value as rabbit_misc prints it: ~s for a binary, ~p otherwise. */
static void put_value(struct text *t, const struct field_value *v)
{
    if (v->kind == 'S' || v->kind == 'x')
        put_bytes(t, v->str);
    else
        put_term(t, v);
}

size_t field_value_format(const struct field_value *v, char *out, size_t size)
{
    ASSERT(v != NULL);
    struct text t;
    text_init(&t, out, size);
    put_value(&t, v);
    return t.len;
}

/* ---- Erlang term equality (=:=) ------------------------------------------ */

enum term_class { TERM_INT, TERM_FLOAT, TERM_BINARY, TERM_BOOL, TERM_UNDEFINED, TERM_LIST,
                  TERM_DECIMAL };

static enum term_class term_class_of(uint8_t kind)
{
    switch (kind) {
    case 'f':
    case 'd': return TERM_FLOAT;
    case 'S':
    case 'x': return TERM_BINARY;
    case 't': return TERM_BOOL;
    case 'V': return TERM_UNDEFINED;
    case 'F':
    case 'A': return TERM_LIST;
    case 'D': return TERM_DECIMAL;
    default: return TERM_INT;
    }
}

static bool int_terms_equal(const struct field_value *a, const struct field_value *b)
{
    bool a_unsigned = kind_is_unsigned(a->kind);
    bool b_unsigned = kind_is_unsigned(b->kind);
    if (a_unsigned && b_unsigned)
        return a->u64 == b->u64;
    if (!a_unsigned && !b_unsigned)
        return a->i64 == b->i64;
    const struct field_value *s = a_unsigned ? b : a;
    const struct field_value *u = a_unsigned ? a : b;
    return s->i64 >= 0 && (uint64_t)s->i64 == u->u64;
}

static bool terms_equal(const struct field_value *a, const struct field_value *b);

/* Nested entries are tuples that carry their type atom, so the letters
 * must match as well as the values. */
static bool nested_equal(const struct field_value *a, const struct field_value *b)
{
    return a->kind == b->kind && terms_equal(a, b);
}

static bool tables_equal(struct table a, struct table b)
{
    struct table_iter ia, ib;
    struct bytes ka, kb;
    struct field_value va, vb;
    table_iter_init(&ia, a);
    table_iter_init(&ib, b);
    for (;;) {
        bool more_a = table_iter_next(&ia, &ka, &va);
        bool more_b = table_iter_next(&ib, &kb, &vb);
        if (!more_a || !more_b)
            return more_a == more_b;
        if (!bytes_equal(ka, kb) || !nested_equal(&va, &vb))
            return false;
    }
}

static bool arrays_equal(struct bytes a, struct bytes b)
{
    struct array_iter ia, ib;
    struct field_value va, vb;
    array_iter_init(&ia, a);
    array_iter_init(&ib, b);
    for (;;) {
        bool more_a = array_iter_next(&ia, &va);
        bool more_b = array_iter_next(&ib, &vb);
        if (!more_a || !more_b)
            return more_a == more_b;
        if (!nested_equal(&va, &vb))
            return false;
    }
}

/* Whether RabbitMQ considers two argument values the same: equal Erlang
 * terms, so long and signedint 5 match, longstr and binary "a" match,
 * signedint 1 and double 1.0 do not, and an empty table equals an empty
 * array (both are []). */
static bool terms_equal(const struct field_value *a, const struct field_value *b)
{
    enum term_class ca = term_class_of(a->kind);
    if (ca != term_class_of(b->kind))
        return false;
    switch (ca) {
    case TERM_INT: return int_terms_equal(a, b);
    case TERM_FLOAT: return value_as_double(a) == value_as_double(b);
    case TERM_BINARY: return bytes_equal(a->str, b->str);
    case TERM_BOOL: return a->boolean == b->boolean;
    case TERM_UNDEFINED: return true;
    case TERM_DECIMAL:
        return a->decimal.scale == b->decimal.scale && a->decimal.value == b->decimal.value;
    case TERM_LIST:
        if (a->kind != b->kind) /* [] =:= [] */
            return (a->kind == 'F' ? a->table.len : a->array.len) == 0 &&
                   (b->kind == 'F' ? b->table.len : b->array.len) == 0;
        return a->kind == 'F' ? tables_equal(a->table, b->table)
                              : arrays_equal(a->array, b->array);
    }
    return false;
}

/* ---- argument catalogue ----------------------------------------------- */

#define TYPE_BIT(type) (1u << (type))
#define CLASSIC TYPE_BIT(QUEUE_TYPE_CLASSIC)
#define QUORUM TYPE_BIT(QUEUE_TYPE_QUORUM)
#define STREAM TYPE_BIT(QUEUE_TYPE_STREAM)
#define ALL_TYPES (CLASSIC | QUORUM | STREAM)

/* Every queue argument RabbitMQ 3.10 knows, with the queue types that
 * accept it, in the order it compares them on redeclare (the classic part
 * of the order is observed; quorum/stream-only keys come after it). A known
 * key on a queue type that does not list it is refused at declare; unknown
 * keys are ignored. quay's own two are compared for every type and are not
 * "known" to the per-type check. */
struct known_arg {
    const char *key;
    unsigned types;
};

static const struct known_arg known_args[] = {
    {"x-expires", CLASSIC | QUORUM},
    {"x-message-ttl", CLASSIC | QUORUM},
    {"x-dead-letter-exchange", CLASSIC | QUORUM},
    {"x-dead-letter-routing-key", CLASSIC | QUORUM},
    {"x-max-length", CLASSIC | QUORUM},
    {"x-max-length-bytes", ALL_TYPES},
    {"x-max-in-memory-length", QUORUM},
    {"x-max-in-memory-bytes", QUORUM},
    {"x-max-priority", CLASSIC},
    {"x-overflow", CLASSIC | QUORUM},
    {"x-queue-mode", CLASSIC},
    {"x-single-active-consumer", CLASSIC | QUORUM},
    {"x-queue-type", ALL_TYPES},
    {"x-queue-master-locator", CLASSIC},
    {"x-dead-letter-strategy", QUORUM},
    {"x-quorum-initial-group-size", QUORUM},
    {"x-delivery-limit", QUORUM},
    {"x-queue-leader-locator", QUORUM | STREAM},
    {"x-max-age", STREAM},
    {"x-stream-max-segment-size-bytes", STREAM},
    {"x-initial-cluster-size", STREAM},
};

static const char *const quay_args[] = {"x-quay-backups", "x-quay-dedup-window",
                                        "x-quay-replicate"};

static const char *const type_module[] = {
    [QUEUE_TYPE_CLASSIC] = "rabbit_classic_queue",
    [QUEUE_TYPE_QUORUM] = "rabbit_quorum_queue",
    [QUEUE_TYPE_STREAM] = "rabbit_stream_queue",
};

/* ---- failures ------------------------------------------------------------ */

/* What a check is about: "queue 'q' in vhost '/'" and where to report. */
struct subject {
    const char *what; /* "queue" or "exchange" */
    struct bytes name;
    struct bytes vhost;
    uint16_t *reply_code;
    struct text text;
};

static void subject_init(struct subject *s, const char *what, struct bytes name,
                         struct bytes vhost, uint16_t *reply_code, char *text, size_t size)
{
    ASSERT(reply_code != NULL);
    s->what = what;
    s->name = name;
    s->vhost = vhost;
    s->reply_code = reply_code;
    text_init(&s->text, text, size);
}

/* rabbit_misc:rs/1: "queue 'q' in vhost '/'". */
static void put_subject(struct subject *s)
{
    put_str(&s->text, s->what);
    put_str(&s->text, " '");
    put_bytes(&s->text, s->name);
    put_str(&s->text, "' in vhost '");
    put_bytes(&s->text, s->vhost);
    put_str(&s->text, "'");
}

/* Starts "invalid arg 'KEY' for queue 'q' in vhost '/': " (406); the
 * caller appends the reason. */
static struct text *fail_invalid(struct subject *s, const char *key)
{
    *s->reply_code = REPLY_PRECONDITION_FAILED;
    put_str(&s->text, "invalid arg '");
    put_str(&s->text, key);
    put_str(&s->text, "' for ");
    put_subject(s);
    put_str(&s->text, ": ");
    return &s->text;
}

static bool fail_reason(struct subject *s, const char *key, const char *reason)
{
    put_str(fail_invalid(s, key), reason);
    return false;
}

/* {unacceptable_type,longstr} */
static bool fail_type(struct subject *s, const char *key, uint8_t kind)
{
    struct text *t = fail_invalid(s, key);
    put_str(t, "{unacceptable_type,");
    put_str(t, field_kind_name(kind));
    put_str(t, "}");
    return false;
}

/* {value_negative,-1} and the like. */
static bool fail_number(struct subject *s, const char *key, const char *tag, int64_t n)
{
    struct text *t = fail_invalid(s, key);
    put_str(t, "{");
    put_str(t, tag);
    put_str(t, ",");
    put_i64(t, n);
    put_str(t, "}");
    return false;
}

/* "invalid type 'signedint' for arg 'KEY' in queue 'q' in vhost '/'": the
 * channel's own check of exchange-name arguments. */
static bool fail_name_type(struct subject *s, const char *key, uint8_t kind)
{
    *s->reply_code = REPLY_PRECONDITION_FAILED;
    put_str(&s->text, "invalid type '");
    put_str(&s->text, field_kind_name(kind));
    put_str(&s->text, "' for arg '");
    put_str(&s->text, key);
    put_str(&s->text, "' in ");
    put_subject(s);
    return false;
}

static bool fail_unsupported(struct subject *s, struct bytes key, enum queue_type type)
{
    *s->reply_code = REPLY_PRECONDITION_FAILED;
    put_str(&s->text, "invalid arg '");
    put_bytes(&s->text, key);
    put_str(&s->text, "' for ");
    put_subject(s);
    put_str(&s->text, " of queue type ");
    put_str(&s->text, type_module[type]);
    return false;
}

/* Where RabbitMQ 3.10 crashes: connection.close(541, "INTERNAL_ERROR"). */
static bool fail_internal(struct subject *s)
{
    *s->reply_code = REPLY_INTERNAL_ERROR;
    s->text.len = 0;
    s->text.buf[0] = '\0';
    return false;
}

/* ---- value checks (rabbit_amqqueue's check_*_arg) ------------------------ */

/* check_int_arg: any integer kind; "expected integer, got T" otherwise. */
static bool check_int(struct subject *s, const char *key, const struct field_value *v,
                      int64_t *n)
{
    if (!kind_is_integer(v->kind) || !field_value_as_int(v, n)) {
        struct text *t = fail_invalid(s, key);
        put_str(t, "\"expected integer, got ");
        put_str(t, field_kind_name(v->kind));
        put_str(t, "\"");
        return false;
    }
    return true;
}

static bool check_non_negative(struct subject *s, const char *key,
                               const struct field_value *v, int64_t *n)
{
    if (!check_int(s, key, v, n))
        return false;
    if (*n < 0)
        return fail_number(s, key, "value_negative", *n);
    return true;
}

/* rabbit_misc:check_expiry: 0 .. ten years. */
static bool check_expiry(struct subject *s, const char *key, const struct field_value *v,
                         int64_t *n)
{
    if (!check_non_negative(s, key, v, n))
        return false;
    if (*n > QUEUE_ARGS_EXPIRY_MAX_MS)
        return fail_number(s, key, "value_too_large", *n);
    return true;
}

static bool check_bool(struct subject *s, const char *key, const struct field_value *v)
{
    return v->kind == 't' ? true : fail_type(s, key, v->kind);
}

static bool check_longstr(struct subject *s, const char *key, const struct field_value *v)
{
    return v->kind == 'S' ? true : fail_type(s, key, v->kind);
}

/* ---- queue.declare ------------------------------------------------------ */

static bool parse_queue_type(struct subject *s, struct table args, struct queue_args *out)
{
    static const char key[] = "x-queue-type";
    struct field_value v;
    if (!table_get(args, key, &v))
        return true;
    if (!check_longstr(s, key, &v))
        return false;
    if (bytes_equal_cstr(v.str, "classic"))
        out->type = QUEUE_TYPE_CLASSIC;
    else if (bytes_equal_cstr(v.str, "quorum"))
        out->type = QUEUE_TYPE_QUORUM;
    else if (bytes_equal_cstr(v.str, "stream"))
        out->type = QUEUE_TYPE_STREAM;
    else {
        put_erlang_string(fail_invalid(s, key), "unsupported queue type '", v.str, "'");
        return false;
    }
    return true;
}

/* x-expires, x-message-ttl, x-dead-letter-routing-key, x-max-length,
 * x-max-length-bytes, x-max-priority: RabbitMQ's order. */
static bool parse_numbers(struct subject *s, struct table args, struct queue_args *out)
{
    struct field_value v;
    int64_t n;
    if (table_get(args, "x-expires", &v)) {
        if (!check_int(s, "x-expires", &v, &n))
            return false;
        if (n == 0)
            return fail_number(s, "x-expires", "value_zero", n);
        if (!check_expiry(s, "x-expires", &v, &out->expires_ms))
            return false;
    }
    if (table_get(args, "x-message-ttl", &v) &&
        !check_expiry(s, "x-message-ttl", &v, &out->message_ttl_ms))
        return false;
    if (table_get(args, "x-dead-letter-routing-key", &v)) {
        if (!check_longstr(s, "x-dead-letter-routing-key", &v))
            return false;
        struct field_value dlx;
        if (!table_get(args, "x-dead-letter-exchange", &dlx))
            return fail_reason(s, "x-dead-letter-routing-key",
                               "routing_key_but_no_dlx_defined");
        out->has_dead_letter_routing_key = true;
        out->dead_letter_routing_key = v.str;
    }
    if (table_get(args, "x-max-length", &v) &&
        !check_non_negative(s, "x-max-length", &v, &out->max_length))
        return false;
    if (table_get(args, "x-max-length-bytes", &v) &&
        !check_non_negative(s, "x-max-length-bytes", &v, &out->max_length_bytes))
        return false;
    if (table_get(args, "x-max-priority", &v)) {
        if (!check_non_negative(s, "x-max-priority", &v, &n))
            return false;
        if (n > QUEUE_ARGS_PRIORITY_MAX)
            return fail_number(s, "x-max-priority", "max_value_exceeded", n);
        out->max_priority = (uint8_t)n;
    }
    return true;
}

/* x-overflow, x-queue-mode, x-single-active-consumer. */
static bool parse_modes(struct subject *s, struct table args, struct queue_args *out)
{
    struct field_value v;
    if (table_get(args, "x-overflow", &v)) {
        if (!check_longstr(s, "x-overflow", &v))
            return false;
        if (bytes_equal_cstr(v.str, "drop-head"))
            out->overflow = QUEUE_OVERFLOW_DROP_HEAD;
        else if (bytes_equal_cstr(v.str, "reject-publish"))
            out->overflow = QUEUE_OVERFLOW_REJECT_PUBLISH;
        else if (bytes_equal_cstr(v.str, "reject-publish-dlx"))
            out->overflow = QUEUE_OVERFLOW_REJECT_PUBLISH_DLX;
        else
            return fail_reason(s, "x-overflow", "invalid_overflow");
    }
    if (table_get(args, "x-queue-mode", &v)) {
        if (!check_longstr(s, "x-queue-mode", &v))
            return false;
        if (!bytes_equal_cstr(v.str, "default") && !bytes_equal_cstr(v.str, "lazy")) {
            put_erlang_string(fail_invalid(s, "x-queue-mode"), "unsupported queue mode '",
                              v.str, "'");
            return false;
        }
        out->lazy = bytes_equal_cstr(v.str, "lazy");
    }
    if (table_get(args, "x-single-active-consumer", &v)) {
        if (!check_bool(s, "x-single-active-consumer", &v))
            return false;
        out->single_active_consumer = v.boolean;
    }
    return true;
}

/* quay's own arguments, worded the way RabbitMQ words its own. */
static bool parse_quay(struct subject *s, struct table args, struct queue_args *out)
{
    struct field_value v;
    int64_t n;
    if (table_get(args, "x-quay-backups", &v)) {
        if (!check_non_negative(s, "x-quay-backups", &v, &n))
            return false;
        if (n > QUEUE_ARGS_BACKUPS_MAX)
            return fail_number(s, "x-quay-backups", "max_value_exceeded", n);
        out->quay_backups = (int32_t)n;
    }
    if (table_get(args, "x-quay-dedup-window", &v) &&
        !check_expiry(s, "x-quay-dedup-window", &v, &out->quay_dedup_window_ms))
        return false;
    if (table_get(args, "x-quay-replicate", &v)) {
        if (!check_longstr(s, "x-quay-replicate", &v))
            return false;
        if (!bytes_equal_cstr(v.str, "all") && !bytes_equal_cstr(v.str, "transient")) {
            put_erlang_string(fail_invalid(s, "x-quay-replicate"), "unsupported replication '",
                              v.str, "'");
            return false;
        }
        out->quay_replicate_transient = bytes_equal_cstr(v.str, "transient");
    }
    return true;
}

/* A known argument of another queue type, first in wire order. */
static bool check_type_supports(struct subject *s, struct table args, enum queue_type type)
{
    struct table_iter it;
    struct bytes key;
    struct field_value v;
    table_iter_init(&it, args);
    while (table_iter_next(&it, &key, &v)) {
        for (size_t i = 0; i < sizeof(known_args) / sizeof(known_args[0]); i++) {
            if (bytes_equal_cstr(key, known_args[i].key) &&
                (known_args[i].types & TYPE_BIT(type)) == 0)
                return fail_unsupported(s, key, type);
        }
    }
    return true;
}

bool queue_args_parse(struct table args, struct bytes queue_name, struct bytes vhost,
                      struct queue_args *out, uint16_t *reply_code, char *text,
                      size_t text_size)
{
    ASSERT(out != NULL);
    struct subject s;
    subject_init(&s, "queue", queue_name, vhost, reply_code, text, text_size);
    *out = (struct queue_args){
        .message_ttl_ms = -1,
        .expires_ms = -1,
        .max_length = -1,
        .max_length_bytes = -1,
        .overflow = QUEUE_OVERFLOW_DROP_HEAD,
        .type = QUEUE_TYPE_CLASSIC,
        .quay_backups = -1,
        .quay_dedup_window_ms = -1,
    };
    /* rabbit_channel checks the dead-letter exchange's type before
     * rabbit_amqqueue checks anything. */
    struct field_value v;
    if (table_get(args, "x-dead-letter-exchange", &v)) {
        if (v.kind != 'S')
            return fail_name_type(&s, "x-dead-letter-exchange", v.kind);
        out->has_dead_letter_exchange = true;
        out->dead_letter_exchange = v.str;
    }
    if (!parse_queue_type(&s, args, out) || !parse_numbers(&s, args, out) ||
        !parse_modes(&s, args, out) || !parse_quay(&s, args, out) ||
        !check_type_supports(&s, args, out->type))
        return false;
    /* 3.10 accepts client-local, min-masters and random, and crashes on
     * anything else when it places the queue. */
    if (out->type == QUEUE_TYPE_CLASSIC && table_get(args, "x-queue-master-locator", &v) &&
        (v.kind != 'S' || !(bytes_equal_cstr(v.str, "client-local") ||
                            bytes_equal_cstr(v.str, "min-masters") ||
                            bytes_equal_cstr(v.str, "random"))))
        return fail_internal(&s);
    return true;
}

/* ---- equivalence ---------------------------------------------------------- */

/* rabbit_misc:val/1 for a value present on one side only. */
static void put_typed(struct text *t, const struct field_value *v)
{
    put_str(t, "the value '");
    put_value(t, v);
    put_str(t, "' of type '");
    put_str(t, field_kind_name(v->kind));
    put_str(t, "'");
}

/* rabbit_misc:val/1 for a bare value: void is undefined, printed "none". */
static void put_bare(struct text *t, const struct field_value *v)
{
    if (v->kind == 'V') {
        put_str(t, "none");
        return;
    }
    put_str(t, "'");
    put_value(t, v);
    put_str(t, "'");
}

/* Compares one key; fills the failure text if the values differ. */
static bool key_equivalent(struct subject *s, const char *key, struct table current,
                           struct table received)
{
    struct field_value c, r;
    bool has_c = table_get(current, key, &c);
    bool has_r = table_get(received, key, &r);
    if (!has_c && !has_r)
        return true;
    if (strcmp(key, "x-queue-type") == 0) {
        /* 3.10 lets a redeclare omit the type, and lets "classic" match a
         * queue declared without one. */
        if (!has_r)
            return true;
        if (!has_c && r.kind == 'S' && bytes_equal_cstr(r.str, "classic"))
            return true;
    }
    if (has_c && has_r && terms_equal(&c, &r))
        return true;
    /* rabbit_misc:val/1 takes a bare decimal {S,V} for {Type,Value} and
     * crashes formatting it. */
    if (has_c && has_r && (c.kind == 'D' || r.kind == 'D'))
        return fail_internal(s);
    *s->reply_code = REPLY_PRECONDITION_FAILED;
    struct text *t = &s->text;
    put_str(t, "inequivalent arg '");
    put_str(t, key);
    put_str(t, "' for ");
    put_subject(s);
    put_str(t, ": received ");
    if (has_c && has_r)
        put_bare(t, &r);
    else if (has_r)
        put_typed(t, &r);
    else
        put_str(t, "none");
    put_str(t, " but current is ");
    if (has_c && has_r)
        put_bare(t, &c);
    else if (has_c)
        put_typed(t, &c);
    else
        put_str(t, "none");
    return false;
}

static enum queue_type declared_type(struct table current)
{
    struct field_value v;
    if (table_get(current, "x-queue-type", &v) && v.kind == 'S') {
        if (bytes_equal_cstr(v.str, "quorum"))
            return QUEUE_TYPE_QUORUM;
        if (bytes_equal_cstr(v.str, "stream"))
            return QUEUE_TYPE_STREAM;
    }
    return QUEUE_TYPE_CLASSIC;
}

bool queue_args_equivalent(struct table current, struct table received,
                           struct bytes queue_name, struct bytes vhost, uint16_t *reply_code,
                           char *text, size_t text_size)
{
    struct subject s;
    subject_init(&s, "queue", queue_name, vhost, reply_code, text, text_size);
    unsigned type_bit = TYPE_BIT(declared_type(current));
    for (size_t i = 0; i < sizeof(known_args) / sizeof(known_args[0]); i++) {
        if ((known_args[i].types & type_bit) != 0 &&
            !key_equivalent(&s, known_args[i].key, current, received))
            return false;
    }
    for (size_t i = 0; i < sizeof(quay_args) / sizeof(quay_args[0]); i++) {
        if (!key_equivalent(&s, quay_args[i], current, received))
            return false;
    }
    return true;
}

/* ---- basic.consume -------------------------------------------------------- */

bool consumer_args_parse(struct table args, struct bytes queue_name, struct bytes vhost,
                         int64_t *priority_out, uint16_t *reply_code, char *text,
                         size_t text_size)
{
    ASSERT(priority_out != NULL);
    struct subject s;
    subject_init(&s, "queue", queue_name, vhost, reply_code, text, text_size);
    *priority_out = 0;
    struct field_value v;
    if (table_get(args, "x-priority", &v) && !check_int(&s, "x-priority", &v, priority_out))
        return false;
    if (table_get(args, "x-cancel-on-ha-failover", &v) &&
        !check_bool(&s, "x-cancel-on-ha-failover", &v))
        return false;
    if (table_get(args, "x-stream-offset", &v))
        return fail_unsupported(&s, BYTES_LIT("x-stream-offset"), QUEUE_TYPE_CLASSIC);
    /* rabbit_channel's parse_credit_args crashes on a non-table x-credit. */
    if (table_get(args, "x-credit", &v) && v.kind != 'F')
        return fail_internal(&s);
    return true;
}

/* ---- exchange.declare ------------------------------------------------------ */

bool exchange_args_parse(struct table args, struct bytes exchange_name, struct bytes vhost,
                         bool *has_alternate, struct bytes *alternate, uint16_t *reply_code,
                         char *text, size_t text_size)
{
    ASSERT(has_alternate != NULL);
    ASSERT(alternate != NULL);
    struct subject s;
    subject_init(&s, "exchange", exchange_name, vhost, reply_code, text, text_size);
    *has_alternate = false;
    *alternate = (struct bytes){NULL, 0};
    struct field_value v;
    if (!table_get(args, "alternate-exchange", &v))
        return true;
    if (v.kind != 'S')
        return fail_name_type(&s, "alternate-exchange", v.kind);
    *has_alternate = true;
    *alternate = v.str;
    return true;
}

bool exchange_args_equivalent(struct table current, struct table received,
                              struct bytes exchange_name, struct bytes vhost,
                              uint16_t *reply_code, char *text, size_t text_size)
{
    struct subject s;
    subject_init(&s, "exchange", exchange_name, vhost, reply_code, text, text_size);
    return key_equivalent(&s, "alternate-exchange", current, received);
}

/* ---- redeclare ------------------------------------------------------------ */

static const char *bool_text(bool b)
{
    return b ? "true" : "false";
}

/* Writes the "inequivalent arg" text for the first differing flag. */
static bool flags_differ(const char *arg, struct bytes received, struct bytes current,
                         const char *kind, struct bytes name, struct bytes vhost,
                         uint16_t *reply_code, char *text, size_t text_size)
{
    *reply_code = REPLY_PRECONDITION_FAILED;
    snprintf(text, text_size,
             "inequivalent arg '%s' for %s '%.*s' in vhost '%.*s': received '%.*s' but current "
             "is '%.*s'",
             arg, kind, (int)name.len, (const char *)name.ptr, (int)vhost.len,
             (const char *)vhost.ptr, (int)received.len, (const char *)received.ptr,
             (int)current.len, (const char *)current.ptr);
    return false;
}

#define FLAG_DIFFERS(field, kind, name)                                                      \
    if (current->field != received->field)                                                   \
        return flags_differ(#field, bytes_of_cstr(bool_text(received->field)),               \
                            bytes_of_cstr(bool_text(current->field)), kind, name, vhost,     \
                            reply_code, text, text_size)

bool queue_redeclare_equivalent(const struct queue_decl *current,
                                const struct queue_decl *received, struct bytes queue_name,
                                struct bytes vhost, uint16_t *reply_code, char *text,
                                size_t text_size)
{
    FLAG_DIFFERS(durable, "queue", queue_name);
    FLAG_DIFFERS(auto_delete, "queue", queue_name);
    return queue_args_equivalent(current->arguments, received->arguments, queue_name, vhost,
                                 reply_code, text, text_size);
}

bool exchange_redeclare_equivalent(const struct exchange_decl *current,
                                   const struct exchange_decl *received,
                                   struct bytes exchange_name, struct bytes vhost,
                                   uint16_t *reply_code, char *text, size_t text_size)
{
    if (!bytes_equal(current->type, received->type))
        return flags_differ("type", received->type, current->type, "exchange", exchange_name,
                            vhost, reply_code, text, text_size);
    FLAG_DIFFERS(durable, "exchange", exchange_name);
    FLAG_DIFFERS(auto_delete, "exchange", exchange_name);
    FLAG_DIFFERS(internal, "exchange", exchange_name);
    return exchange_args_equivalent(current->arguments, received->arguments, exchange_name,
                                    vhost, reply_code, text, text_size);
}

#undef FLAG_DIFFERS
