/*
 * exchange.c: exchanges, bindings, the per-type routing indexes and the
 * route walk (see exchange.h for the ownership contract).
 *
 * Owns: every struct exchange (one allocation with its private index, name
 * and declare arguments), every struct binding (one allocation with its
 * private index links, routing key and arguments), the direct buckets and
 * the topic trie nodes. Must never: allocate while routing through direct
 * or fanout exchanges, keep a pointer into a caller's frame after a call
 * returns, or know what a queue is beyond its embedded struct bind_dest.
 *
 * Routing indexes, one per exchange type:
 *
 *   direct   hmap: routing key -> struct direct_bucket (a list of the
 *            bindings with exactly that key). The map key borrows the
 *            routing_key of the bucket's first binding and is re-pointed
 *            when that binding leaves.
 *   fanout   exchange->bindings itself.
 *   topic    a trie over dot-separated words; each node has literal
 *            children (hmap keyed by the child's own copy of its word), at
 *            most one "*" child and one "#" child, and the list of bindings
 *            whose pattern ends there:
 *
 *              root --"a"--> n1 --"*"--> n2 {binding "a.*"}
 *                 \                \--"#"--> n3 {binding "a.#"}
 *                  `--"#"--> n4 {binding "#"}
 *
 *            Nodes with no bindings and no children are freed at once, so
 *            the trie never holds stale nodes.
 *   headers  exchange->bindings, each evaluated with headers_match.
 *
 * Semantics follow RabbitMQ 3.10 (rabbit_exchange_type_topic with its
 * split_topic_key, rabbit_exchange_type_headers, rabbit_binding's sorted
 * arguments); the notes at each function say where that is subtle.
 *
 * Route marks: every exchange_route call takes a new pass number; an
 * exchange or queue whose bind_dest.route_mark equals it was already seen
 * in this call. The counter is file-global (all broker state belongs to
 * the loop thread); when it wraps, every mark reachable through a binding
 * is cleared via the registry of live exchanges, and a dest's mark is
 * cleared when it gains its first binding, so a stale mark can never equal
 * a future pass.
 */
#include "broker/exchange.h"

#include <stdlib.h>
#include <string.h>

#include "amqp/table.h"
#include "lib/alloc.h"
#include "lib/assert.h"

/* Routing and binding keys are AMQP shortstrs. */
#define ROUTING_KEY_SIZE_MAX 255
/* "" is zero words; otherwise one word more than there are dots. */
#define TOPIC_WORDS_MAX (ROUTING_KEY_SIZE_MAX + 1)
/* Word positions 0..TOPIC_WORDS_MAX, one bit each, for the trie walk memo. */
#define TOPIC_VISITED_WORDS ((TOPIC_WORDS_MAX + 1 + 63) / 64)

/* Private per-binding index state; binding->index points here. */
struct binding_index {
    struct list_node link; /* direct: in its bucket; topic: in its trie node */
    void *slot;            /* direct: struct direct_bucket; topic: struct topic_node */
};

/* One allocation per binding: the public part, its index, then the copied
 * routing key and argument bytes. */
struct binding_alloc {
    struct binding binding; /* first, so a struct binding * is the allocation */
    struct binding_index index;
    uint8_t bytes[];
};

struct direct_bucket {
    struct list_node bindings; /* struct binding_index.link, same routing key */
    uint32_t bindings_count;
};

enum topic_word_kind { TOPIC_WORD_LITERAL, TOPIC_WORD_STAR, TOPIC_WORD_HASH };

/* A topic trie node. Owned by its parent (the root by its exchange). */
struct topic_node {
    struct topic_node *parent; /* borrowed; NULL for the root */
    enum topic_word_kind kind;
    struct bytes word;         /* points into word_bytes */
    struct hmap children;      /* literal word -> struct topic_node */
    struct topic_node *star_child;
    struct topic_node *hash_child;
    struct list_node bindings; /* struct binding_index.link */
    uint32_t bindings_count;
    uint64_t visit_pass;       /* walk memo: which topic pass visited[] belongs to */
    uint64_t visited[TOPIC_VISITED_WORDS];
    uint8_t word_bytes[];
};

/* Private per-exchange state; exchange->index points here. */
struct exchange_index {
    struct list_node all_link;    /* in exchanges_all */
    struct exchange *route_next;  /* route work list (valid during one pass only) */
    struct exchange *unused_next; /* bind_dest_unbind_all's pending reports */
    struct hmap direct;           /* EXCHANGE_DIRECT: key -> struct direct_bucket */
    struct topic_node *topic_root; /* EXCHANGE_TOPIC: NULL while no bindings */
    uint32_t topic_nodes_count;
    uint64_t topic_pass;          /* per-exchange trie walk counter (never wraps) */
};

struct exchange_alloc {
    struct exchange exchange; /* first, so a struct exchange * is the allocation */
    struct exchange_index index;
    uint8_t bytes[];
};

/* Every live exchange, so a route-pass wrap can clear all marks. */
static struct list_node exchanges_all = LIST_INIT(exchanges_all);
/* The last route pass number handed out; 0 is never a valid pass. */
static uint32_t route_pass;

static struct exchange_index *index_of(const struct exchange *exchange)
{
    return exchange->index;
}

static struct binding_index *binding_index_of(const struct binding *binding)
{
    return binding->index;
}

static struct binding *binding_of_link(struct list_node *link)
{
    struct binding_index *index = CONTAINER_OF(link, struct binding_index, link);
    return &CONTAINER_OF(index, struct binding_alloc, index)->binding;
}

/* ------------------------------------------------------------------ */
/* Types                                                               */

static const char *const exchange_type_names[] = {
    [EXCHANGE_DIRECT] = "direct",
    [EXCHANGE_FANOUT] = "fanout",
    [EXCHANGE_TOPIC] = "topic",
    [EXCHANGE_HEADERS] = "headers",
};

int exchange_type_parse(struct bytes name, enum exchange_type *out)
{
    for (size_t i = 0; i < ARRAY_SIZE(exchange_type_names); i++) {
        if (bytes_equal_cstr(name, exchange_type_names[i])) {
            *out = (enum exchange_type)i;
            return 0;
        }
    }
    return -1;
}

const char *exchange_type_name(enum exchange_type type)
{
    ASSERT((size_t)type < ARRAY_SIZE(exchange_type_names));
    return exchange_type_names[type];
}

/* ------------------------------------------------------------------ */
/* Topic words                                                         */

/*
 * A cursor over the dot-separated words of a key. RabbitMQ 3.10's
 * split_topic_key turns "" into zero words, and any other key into one word
 * more than it has dots ("a..b" is "a", "", "b"; "a." is "a", ""). A
 * cursor is the byte offset where the current word starts; it is past the
 * last word when start > key.len (so "" starts at 1: already past).
 */
static uint32_t topic_first_word(struct bytes key)
{
    return key.len == 0 ? 1 : 0;
}

static bool topic_at_end(struct bytes key, uint32_t start)
{
    return start > key.len;
}

static uint32_t topic_word_end(struct bytes key, uint32_t start)
{
    uint32_t end = start;
    while (end < key.len && key.ptr[end] != '.')
        end++;
    return end;
}

static struct bytes topic_word(struct bytes key, uint32_t start)
{
    return (struct bytes){key.ptr + start, topic_word_end(key, start) - start};
}

static uint32_t topic_next_word(struct bytes key, uint32_t start)
{
    return topic_word_end(key, start) + 1;
}

static enum topic_word_kind topic_word_kind(struct bytes word)
{
    if (bytes_equal_cstr(word, "*"))
        return TOPIC_WORD_STAR;
    if (bytes_equal_cstr(word, "#"))
        return TOPIC_WORD_HASH;
    return TOPIC_WORD_LITERAL;
}

/*
 * Word-level glob matching: "#" is any sequence of words (like glob "*"),
 * "*" is exactly one word (like glob "?"). Classic backtracking to the
 * last "#", which is exact for this pattern language and O(words^2) at
 * worst. "#" is tested before a literal comparison so that a literal "#"
 * word in the key cannot consume the pattern's wildcard as one word.
 */
bool topic_match(struct bytes pattern, struct bytes routing_key)
{
    uint32_t p = topic_first_word(pattern);
    uint32_t k = topic_first_word(routing_key);
    bool backtrack = false;
    uint32_t backtrack_p = 0; /* the pattern word after the last "#" */
    uint32_t backtrack_k = 0; /* the first key word that "#" has not yet eaten */
    while (!topic_at_end(routing_key, k)) {
        if (!topic_at_end(pattern, p)) {
            struct bytes word = topic_word(pattern, p);
            enum topic_word_kind kind = topic_word_kind(word);
            if (kind == TOPIC_WORD_HASH) {
                backtrack = true;
                p = topic_next_word(pattern, p);
                backtrack_p = p;
                backtrack_k = k;
                continue;
            }
            if (kind == TOPIC_WORD_STAR || bytes_equal(word, topic_word(routing_key, k))) {
                p = topic_next_word(pattern, p);
                k = topic_next_word(routing_key, k);
                continue;
            }
        }
        if (!backtrack)
            return false;
        /* Let the last "#" eat one more word and retry from after it. */
        backtrack_k = topic_next_word(routing_key, backtrack_k);
        k = backtrack_k;
        p = backtrack_p;
    }
    while (!topic_at_end(pattern, p) && topic_word_kind(topic_word(pattern, p)) == TOPIC_WORD_HASH)
        p = topic_next_word(pattern, p);
    return topic_at_end(pattern, p);
}

/* ------------------------------------------------------------------ */
/* Topic trie                                                          */

static struct topic_node *topic_node_new(struct exchange_index *index, struct topic_node *parent,
                                         struct bytes word)
{
    struct topic_node *node = xcalloc(1, sizeof(*node) + word.len);
    node->parent = parent;
    node->kind = parent == NULL ? TOPIC_WORD_LITERAL : topic_word_kind(word);
    if (word.len > 0)
        memcpy(node->word_bytes, word.ptr, word.len);
    node->word = (struct bytes){node->word_bytes, word.len};
    hmap_init(&node->children);
    list_init(&node->bindings);
    index->topic_nodes_count++;
    return node;
}

static bool topic_node_unused(const struct topic_node *node)
{
    return node->bindings_count == 0 && node->children.count == 0 && node->star_child == NULL &&
           node->hash_child == NULL;
}

static struct topic_node *topic_child(struct topic_node *node, struct bytes word)
{
    switch (topic_word_kind(word)) {
    case TOPIC_WORD_STAR: return node->star_child;
    case TOPIC_WORD_HASH: return node->hash_child;
    case TOPIC_WORD_LITERAL: return hmap_get(&node->children, word);
    }
    return NULL;
}

static struct topic_node *topic_child_add(struct exchange_index *index, struct topic_node *node,
                                          struct bytes word)
{
    struct topic_node *child = topic_child(node, word);
    if (child != NULL)
        return child;
    child = topic_node_new(index, node, word);
    switch (child->kind) {
    case TOPIC_WORD_STAR: node->star_child = child; break;
    case TOPIC_WORD_HASH: node->hash_child = child; break;
    case TOPIC_WORD_LITERAL: hmap_put(&node->children, child->word, child); break;
    }
    return child;
}

static void topic_index_add(struct exchange_index *index, struct binding *binding)
{
    if (index->topic_root == NULL)
        index->topic_root = topic_node_new(index, NULL, (struct bytes){NULL, 0});
    struct topic_node *node = index->topic_root;
    struct bytes key = binding->routing_key;
    for (uint32_t w = topic_first_word(key); !topic_at_end(key, w); w = topic_next_word(key, w))
        node = topic_child_add(index, node, topic_word(key, w));
    struct binding_index *bi = binding_index_of(binding);
    bi->slot = node;
    list_push_back(&node->bindings, &bi->link);
    node->bindings_count++;
}

/* Frees node and then every ancestor left with no bindings and no children. */
static void topic_prune(struct exchange_index *index, struct topic_node *node)
{
    while (node != NULL && topic_node_unused(node)) {
        struct topic_node *parent = node->parent;
        if (parent == NULL) {
            ASSERT(index->topic_root == node);
            index->topic_root = NULL;
        } else if (node->kind == TOPIC_WORD_STAR) {
            ASSERT(parent->star_child == node);
            parent->star_child = NULL;
        } else if (node->kind == TOPIC_WORD_HASH) {
            ASSERT(parent->hash_child == node);
            parent->hash_child = NULL;
        } else {
            void *removed = hmap_remove(&parent->children, node->word);
            ASSERT(removed == node);
        }
        hmap_free(&node->children);
        ASSERT(index->topic_nodes_count > 0);
        index->topic_nodes_count--;
        free(node);
        node = parent;
    }
}

static void topic_index_remove(struct exchange_index *index, struct binding *binding)
{
    struct binding_index *bi = binding_index_of(binding);
    struct topic_node *node = bi->slot;
    ASSERT(node != NULL);
    ASSERT(node->bindings_count > 0);
    list_remove(&bi->link);
    node->bindings_count--;
    bi->slot = NULL;
    topic_prune(index, node);
}

/* ------------------------------------------------------------------ */
/* Direct index                                                        */

static void direct_index_add(struct exchange_index *index, struct binding *binding)
{
    struct direct_bucket *bucket = hmap_get(&index->direct, binding->routing_key);
    if (bucket == NULL) {
        bucket = xcalloc(1, sizeof(*bucket));
        list_init(&bucket->bindings);
        /* The map borrows the key from the bucket's first binding. */
        hmap_put(&index->direct, binding->routing_key, bucket);
    }
    struct binding_index *bi = binding_index_of(binding);
    bi->slot = bucket;
    list_push_back(&bucket->bindings, &bi->link);
    bucket->bindings_count++;
}

static void direct_index_remove(struct exchange_index *index, struct binding *binding)
{
    struct binding_index *bi = binding_index_of(binding);
    struct direct_bucket *bucket = bi->slot;
    ASSERT(bucket != NULL);
    ASSERT(bucket->bindings_count > 0);
    list_remove(&bi->link);
    bucket->bindings_count--;
    bi->slot = NULL;
    /* The map's key may borrow from this binding, which is still alive here. */
    if (bucket->bindings_count == 0) {
        void *removed = hmap_remove(&index->direct, binding->routing_key);
        ASSERT(removed == bucket);
        free(bucket);
        return;
    }
    struct binding *first = binding_of_link(list_first(&bucket->bindings));
    void *replaced = hmap_put(&index->direct, first->routing_key, bucket);
    ASSERT(replaced == bucket);
}

/* ------------------------------------------------------------------ */
/* Bindings                                                            */

static void index_add(struct exchange *exchange, struct binding *binding)
{
    switch (exchange->type) {
    case EXCHANGE_DIRECT: direct_index_add(index_of(exchange), binding); break;
    case EXCHANGE_TOPIC: topic_index_add(index_of(exchange), binding); break;
    case EXCHANGE_FANOUT:
    case EXCHANGE_HEADERS: break; /* both walk exchange->bindings */
    }
}

static void index_remove(struct exchange *exchange, struct binding *binding)
{
    switch (exchange->type) {
    case EXCHANGE_DIRECT: direct_index_remove(index_of(exchange), binding); break;
    case EXCHANGE_TOPIC: topic_index_remove(index_of(exchange), binding); break;
    case EXCHANGE_FANOUT:
    case EXCHANGE_HEADERS: break;
    }
}

/* Unlinks a binding from both ends and from its index, then frees it.
 * Leaves reporting an unused source to the caller. */
static void binding_remove(struct binding *binding)
{
    struct exchange *source = binding->source;
    struct bind_dest *dest = binding->dest;
    ASSERT(source->bindings_count > 0);
    ASSERT(dest->bindings_in_count > 0);
    index_remove(source, binding);
    list_remove(&binding->source_link);
    source->bindings_count--;
    list_remove(&binding->dest_link);
    dest->bindings_in_count--;
    free(binding);
}

/*
 * Two argument tables name the same binding when RabbitMQ would store the
 * same sorted list: rabbit_binding keysorts the arguments (a stable sort),
 * so entries may come in any order across keys, but entries with equal
 * keys keep their relative order and must be byte-identical. The k-th
 * entry named K in a must equal the k-th entry named K in b; equal entry
 * counts make that a bijection. O(n^2), but only at bind and unbind time.
 */
static bool table_entry_find(struct table t, struct bytes key, uint32_t rank,
                             struct bytes *entry)
{
    struct table_iter it;
    table_iter_init(&it, t);
    struct bytes k;
    struct field_value v;
    for (const uint8_t *start = it.pos; table_iter_next(&it, &k, &v); start = it.pos) {
        if (bytes_equal(k, key) && rank-- == 0) {
            *entry = (struct bytes){start, (uint32_t)(it.pos - start)};
            return true;
        }
    }
    return false;
}

static uint32_t table_key_rank(struct table t, struct bytes key, const uint8_t *before)
{
    struct table_iter it;
    table_iter_init(&it, t);
    struct bytes k;
    struct field_value v;
    uint32_t rank = 0;
    while (it.pos < before && table_iter_next(&it, &k, &v))
        rank += bytes_equal(k, key) ? 1 : 0;
    return rank;
}

static uint32_t table_entries_count(struct table t)
{
    struct table_iter it;
    table_iter_init(&it, t);
    struct bytes k;
    struct field_value v;
    uint32_t count = 0;
    while (table_iter_next(&it, &k, &v))
        count++;
    return count;
}

static bool arguments_equivalent(struct bytes a, struct bytes b)
{
    if (bytes_equal(a, b))
        return true;
    struct table ta = {a.ptr, a.len};
    struct table tb = {b.ptr, b.len};
    if (table_entries_count(ta) != table_entries_count(tb))
        return false;
    struct table_iter it;
    table_iter_init(&it, ta);
    struct bytes key;
    struct field_value v;
    for (const uint8_t *start = it.pos; table_iter_next(&it, &key, &v); start = it.pos) {
        struct bytes mine = {start, (uint32_t)(it.pos - start)};
        struct bytes theirs;
        if (!table_entry_find(tb, key, table_key_rank(ta, key, start), &theirs))
            return false;
        if (!bytes_equal(mine, theirs))
            return false;
    }
    return true;
}

static struct binding *binding_find(struct exchange *source, struct bind_dest *dest,
                                    struct bytes routing_key, struct bytes arguments)
{
    /* Walk the shorter of the two lists that must both contain it. */
    bool from_dest = dest->bindings_in_count < source->bindings_count;
    struct list_node *head = from_dest ? &dest->bindings_in : &source->bindings;
    list_for_each(pos, head) {
        struct binding *b = from_dest ? CONTAINER_OF(pos, struct binding, dest_link)
                                      : CONTAINER_OF(pos, struct binding, source_link);
        if (b->source == source && b->dest == dest && bytes_equal(b->routing_key, routing_key) &&
            arguments_equivalent(b->arguments, arguments))
            return b;
    }
    return NULL;
}

struct binding *exchange_bind(struct exchange *source, struct bind_dest *dest,
                              struct bytes routing_key, struct bytes arguments)
{
    ASSERT(source != NULL);
    ASSERT(dest != NULL);
    ASSERT(routing_key.len <= ROUTING_KEY_SIZE_MAX);
    struct binding *existing = binding_find(source, dest, routing_key, arguments);
    if (existing != NULL)
        return existing;

    struct binding_alloc *alloc =
        xcalloc(1, sizeof(*alloc) + (size_t)routing_key.len + (size_t)arguments.len);
    struct binding *binding = &alloc->binding;
    binding->source = source;
    binding->dest = dest;
    binding->index = &alloc->index;
    list_init(&alloc->index.link);
    uint8_t *key_copy = alloc->bytes;
    uint8_t *arguments_copy = alloc->bytes + routing_key.len;
    if (routing_key.len > 0)
        memcpy(key_copy, routing_key.ptr, routing_key.len);
    if (arguments.len > 0)
        memcpy(arguments_copy, arguments.ptr, arguments.len);
    binding->routing_key = (struct bytes){key_copy, routing_key.len};
    binding->arguments = (struct bytes){arguments_copy, arguments.len};

    /* A dest that had no binding may carry a mark from before a wrap. */
    if (dest->bindings_in_count == 0)
        dest->route_mark = 0;
    list_push_back(&source->bindings, &binding->source_link);
    source->bindings_count++;
    list_push_back(&dest->bindings_in, &binding->dest_link);
    dest->bindings_in_count++;
    index_add(source, binding);
    DEBUG_ASSERT(binding_find(source, dest, routing_key, arguments) == binding);
    return binding;
}

bool exchange_unbind(struct exchange *source, struct bind_dest *dest, struct bytes routing_key,
                     struct bytes arguments)
{
    ASSERT(source != NULL);
    ASSERT(dest != NULL);
    struct binding *binding = binding_find(source, dest, routing_key, arguments);
    if (binding == NULL)
        return false;
    binding_remove(binding);
    return true;
}

struct binding *exchange_find_binding(struct exchange *source, struct bind_dest *dest,
                                      struct bytes routing_key, struct bytes arguments)
{
    return binding_find(source, dest, routing_key, arguments);
}

bool exchange_has_bindings(const struct exchange *exchange)
{
    DEBUG_ASSERT(list_empty(&exchange->bindings) == (exchange->bindings_count == 0));
    return exchange->bindings_count > 0;
}

void bind_dest_init(struct bind_dest *dest, enum bind_dest_kind kind)
{
    ASSERT(kind == BIND_DEST_QUEUE || kind == BIND_DEST_EXCHANGE);
    dest->kind = kind;
    list_init(&dest->bindings_in);
    dest->bindings_in_count = 0;
    dest->route_mark = 0;
}

/*
 * Removes every binding first and reports afterwards, so the callback sees
 * a consistent state and may free the exchange it is given (the vhost
 * auto-deletes it). The exchange that owns dest itself (a self-binding) is
 * never reported: its owner is deleting it already. The pending list runs
 * through exchange_index.unused_next, so nothing is allocated; a source is
 * added at most once because its count reaches zero at most once here.
 */
void bind_dest_unbind_all(struct bind_dest *dest, exchange_unused_fn on_unused, void *ctx)
{
    ASSERT(dest != NULL);
    const struct exchange *self =
        dest->kind == BIND_DEST_EXCHANGE ? CONTAINER_OF(dest, struct exchange, as_dest) : NULL;
    struct exchange *unused = NULL;
    while (!list_empty(&dest->bindings_in)) {
        struct binding *binding =
            CONTAINER_OF(list_first(&dest->bindings_in), struct binding, dest_link);
        struct exchange *source = binding->source;
        binding_remove(binding);
        if (source->bindings_count == 0 && source != self) {
            index_of(source)->unused_next = unused;
            unused = source;
        }
    }
    ASSERT(dest->bindings_in_count == 0);
    while (unused != NULL) {
        struct exchange *next = index_of(unused)->unused_next;
        index_of(unused)->unused_next = NULL;
        if (on_unused != NULL)
            on_unused(unused, ctx);
        unused = next;
    }
}

/* ------------------------------------------------------------------ */
/* Exchanges                                                           */

struct exchange *exchange_new(struct bytes name, enum exchange_type type, bool durable,
                              bool auto_delete, bool internal, struct bytes arguments)
{
    ASSERT((size_t)type < ARRAY_SIZE(exchange_type_names));
    ASSERT(name.len <= ROUTING_KEY_SIZE_MAX);
    struct exchange_alloc *alloc =
        xcalloc(1, sizeof(*alloc) + (size_t)name.len + (size_t)arguments.len);
    struct exchange *exchange = &alloc->exchange;
    bind_dest_init(&exchange->as_dest, BIND_DEST_EXCHANGE);
    uint8_t *name_copy = alloc->bytes;
    uint8_t *arguments_copy = alloc->bytes + name.len;
    if (name.len > 0)
        memcpy(name_copy, name.ptr, name.len);
    if (arguments.len > 0)
        memcpy(arguments_copy, arguments.ptr, arguments.len);
    exchange->name = (struct bytes){name_copy, name.len};
    exchange->arguments = (struct bytes){arguments_copy, arguments.len};
    exchange->type = type;
    exchange->durable = durable;
    exchange->auto_delete = auto_delete;
    exchange->internal = internal;
    list_init(&exchange->bindings);
    exchange->bindings_count = 0;
    exchange->index = &alloc->index;
    hmap_init(&alloc->index.direct);
    list_push_back(&exchanges_all, &alloc->index.all_link);
    return exchange;
}

#ifndef NDEBUG
/* O(bindings): the counters agree with the lists and every binding is
 * indexed under this exchange. */
static bool exchange_consistent(const struct exchange *exchange)
{
    uint32_t count = 0;
    list_for_each(pos, &exchange->bindings) {
        const struct binding *b = CONTAINER_OF(pos, struct binding, source_link);
        if (b->source != exchange || b->index == NULL)
            return false;
        count++;
    }
    uint32_t in_count = list_count(&exchange->as_dest.bindings_in);
    const struct exchange_index *index = index_of(exchange);
    bool topic_ok = exchange->type != EXCHANGE_TOPIC || count > 0 || index->topic_root == NULL;
    bool direct_ok = exchange->type != EXCHANGE_DIRECT || index->direct.count <= count;
    return count == exchange->bindings_count && in_count == exchange->as_dest.bindings_in_count &&
           topic_ok && direct_ok;
}
#endif

void exchange_unbind_all(struct exchange *exchange)
{
    while (!list_empty(&exchange->bindings))
        binding_remove(CONTAINER_OF(list_first(&exchange->bindings), struct binding, source_link));
}

void exchange_free(struct exchange *exchange)
{
    ASSERT(exchange != NULL);
    DEBUG_ASSERT(exchange_consistent(exchange));
    exchange_unbind_all(exchange);
    /* Sources that lose their last binding here are not reported: a caller
     * that wants them auto-deleted calls bind_dest_unbind_all first. */
    bind_dest_unbind_all(&exchange->as_dest, NULL, NULL);
    struct exchange_index *index = index_of(exchange);
    ASSERT(exchange->bindings_count == 0);
    ASSERT(index->topic_root == NULL);
    ASSERT(index->topic_nodes_count == 0);
    ASSERT(index->direct.count == 0);
    hmap_free(&index->direct);
    list_remove(&index->all_link);
    exchange->index = NULL;
    free(exchange);
}

uint32_t exchange__index_count(const struct exchange *exchange)
{
    const struct exchange_index *index = index_of(exchange);
    switch (exchange->type) {
    case EXCHANGE_DIRECT: return index->direct.count;
    case EXCHANGE_TOPIC: return index->topic_nodes_count;
    case EXCHANGE_FANOUT:
    case EXCHANGE_HEADERS: return exchange->bindings_count;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Headers matching                                                    */

enum x_match { X_MATCH_ALL, X_MATCH_ANY, X_MATCH_ALL_WITH_X, X_MATCH_ANY_WITH_X };

/* RabbitMQ's parse_x_match: only a longstr selects a mode; anything else
 * (absent, another type, an unknown word) means "all". Binding validation
 * (rejecting bad x-match values) is the caller's job. */
static enum x_match x_match_parse(struct table binding_args)
{
    struct field_value v;
    if (!table_get(binding_args, "x-match", &v) || v.kind != 'S')
        return X_MATCH_ALL;
    if (bytes_equal_cstr(v.str, "any"))
        return X_MATCH_ANY;
    if (bytes_equal_cstr(v.str, "all-with-x"))
        return X_MATCH_ALL_WITH_X;
    if (bytes_equal_cstr(v.str, "any-with-x"))
        return X_MATCH_ANY_WITH_X;
    return X_MATCH_ALL;
}

/* A number as Erlang holds it: an integer (possibly above INT64_MAX, only
 * for 'T') or a double ('f' widened to double, as RabbitMQ decodes it). */
struct erlang_number {
    bool is_float;
    bool is_big; /* integer above INT64_MAX, held in big */
    int64_t small;
    uint64_t big;
    double f;
};

static bool erlang_number_of(const struct field_value *v, struct erlang_number *out)
{
    *out = (struct erlang_number){0};
    if (v->kind == 'f' || v->kind == 'd') {
        out->is_float = true;
        out->f = v->kind == 'f' ? (double)v->f32 : v->f64;
        return true;
    }
    if (field_value_as_int(v, &out->small))
        return true;
    if (v->kind == 'T') {
        out->is_big = true;
        out->big = v->u64;
        return true;
    }
    return false;
}

/* Erlang's == between an integer and a float is exact (it converts the
 * less precise side), so the float must be integral and in range. */
static bool erlang_float_equals_int(double f, const struct erlang_number *n)
{
    if (n->is_big) {
        if (!(f >= 9223372036854775808.0 && f < 18446744073709551616.0))
            return false;
        return (uint64_t)f == n->big && (double)(uint64_t)f == f;
    }
    if (!(f >= -9223372036854775808.0 && f < 9223372036854775808.0))
        return false;
    return (int64_t)f == n->small && (double)(int64_t)f == f;
}

static bool erlang_numbers_equal(const struct erlang_number *a, const struct erlang_number *b)
{
    if (a->is_float && b->is_float)
        return a->f == b->f;
    if (a->is_float)
        return erlang_float_equals_int(a->f, b);
    if (b->is_float)
        return erlang_float_equals_int(b->f, a);
    if (a->is_big || b->is_big)
        return a->is_big && b->is_big && a->big == b->big;
    return a->small == b->small;
}

static bool erlang_values_equal(const struct field_value *a, const struct field_value *b,
                                bool nested);

static bool erlang_tables_equal(struct table a, struct table b)
{
    struct table_iter ia, ib;
    table_iter_init(&ia, a);
    table_iter_init(&ib, b);
    struct bytes ka, kb;
    struct field_value va, vb;
    for (;;) {
        bool more_a = table_iter_next(&ia, &ka, &va);
        bool more_b = table_iter_next(&ib, &kb, &vb);
        if (!more_a || !more_b)
            return more_a == more_b;
        if (!bytes_equal(ka, kb) || !erlang_values_equal(&va, &vb, true))
            return false;
    }
}

static bool erlang_arrays_equal(struct bytes a, struct bytes b)
{
    struct array_iter ia, ib;
    array_iter_init(&ia, a);
    array_iter_init(&ib, b);
    struct field_value va, vb;
    for (;;) {
        bool more_a = array_iter_next(&ia, &va);
        bool more_b = array_iter_next(&ib, &vb);
        if (!more_a || !more_b)
            return more_a == more_b;
        if (!erlang_values_equal(&va, &vb, true))
            return false;
    }
}

/*
 * Erlang's == on RabbitMQ's decoded values, which is what headers_match
 * uses (PV == DV; the type is not compared at the top level). So integers
 * of any width, timestamps and floats compare by numeric value (int 1 ==
 * long 1 == double 1.0), longstr and byte array compare by bytes, and an
 * empty table equals an empty array (both are []). Inside tables and
 * arrays the entries are {Key, Type, Value} / {Type, Value} tuples, so
 * there the type letters must match exactly (nested = true).
 */
static bool erlang_values_equal(const struct field_value *a, const struct field_value *b,
                                bool nested)
{
    if (nested && a->kind != b->kind)
        return false;
    struct erlang_number na, nb;
    if (erlang_number_of(a, &na))
        return erlang_number_of(b, &nb) && erlang_numbers_equal(&na, &nb);
    bool a_str = a->kind == 'S' || a->kind == 'x';
    bool b_str = b->kind == 'S' || b->kind == 'x';
    if (a_str || b_str)
        return a_str && b_str && bytes_equal(a->str, b->str);
    bool a_list = a->kind == 'F' || a->kind == 'A';
    bool b_list = b->kind == 'F' || b->kind == 'A';
    if (a_list || b_list) {
        if (!a_list || !b_list)
            return false;
        if (a->kind != b->kind)
            return (a->kind == 'F' ? a->table.len : a->array.len) == 0 &&
                   (b->kind == 'F' ? b->table.len : b->array.len) == 0;
        return a->kind == 'F' ? erlang_tables_equal(a->table, b->table)
                              : erlang_arrays_equal(a->array, b->array);
    }
    if (a->kind != b->kind)
        return false;
    switch (a->kind) {
    case 't': return a->boolean == b->boolean;
    case 'D': return a->decimal.scale == b->decimal.scale && a->decimal.value == b->decimal.value;
    case 'V': return true;
    default: ASSERT(!"unknown field value kind"); return false;
    }
}

static bool headers_key_skipped(struct bytes key, enum x_match mode)
{
    if (bytes_equal_cstr(key, "x-match"))
        return true;
    bool with_x = mode == X_MATCH_ALL_WITH_X || mode == X_MATCH_ANY_WITH_X;
    return !with_x && bytes_has_prefix(key, "x-");
}

/*
 * RabbitMQ sorts both tables by key (stably) and merges them, so the k-th
 * binding entry named K is compared with the k-th header named K, and has
 * no partner if there are fewer. That is what this computes without
 * sorting: rank the entry among its same-named predecessors, then find the
 * header of that rank. A void ('V') binding value matches on presence.
 */
static bool headers_entry_matches(struct table binding_args, const uint8_t *entry_start,
                                  struct bytes key, const struct field_value *pattern,
                                  struct table message_headers)
{
    uint32_t rank = table_key_rank(binding_args, key, entry_start);
    struct bytes raw;
    if (!table_entry_find(message_headers, key, rank, &raw))
        return false;
    if (pattern->kind == 'V')
        return true;
    /* raw is one whole entry: re-read it to get the decoded value. */
    struct table_iter it;
    table_iter_init(&it, (struct table){raw.ptr, raw.len});
    struct bytes raw_key;
    struct field_value data;
    bool read = table_iter_next(&it, &raw_key, &data);
    ASSERT(read);
    return erlang_values_equal(pattern, &data, false);
}

bool headers_match(struct table binding_args, struct table message_headers)
{
    enum x_match mode = x_match_parse(binding_args);
    bool any = mode == X_MATCH_ANY || mode == X_MATCH_ANY_WITH_X;
    struct table_iter it;
    table_iter_init(&it, binding_args);
    struct bytes key;
    struct field_value pattern;
    for (const uint8_t *start = it.pos; table_iter_next(&it, &key, &pattern); start = it.pos) {
        if (headers_key_skipped(key, mode))
            continue;
        bool matched = headers_entry_matches(binding_args, start, key, &pattern, message_headers);
        if (any && matched)
            return true;
        if (!any && !matched)
            return false;
    }
    /* "all" with nothing left to check matches; "any" with no match does not. */
    return !any;
}

/* ------------------------------------------------------------------ */
/* Routing                                                             */

struct route_walk {
    uint32_t pass;
    struct route_result *result;
    struct exchange *tail; /* last exchange on the work list */
};

/* Clears every mark a binding can reach; run once per 2^32 route calls. */
static void route_marks_clear(void)
{
    list_for_each(pos, &exchanges_all) {
        struct exchange_index *index = CONTAINER_OF(pos, struct exchange_index, all_link);
        struct exchange *exchange = &CONTAINER_OF(index, struct exchange_alloc, index)->exchange;
        exchange->as_dest.route_mark = 0;
        list_for_each(b, &exchange->bindings)
            CONTAINER_OF(b, struct binding, source_link)->dest->route_mark = 0;
    }
}

static uint32_t route_pass_next(void)
{
    route_pass++;
    if (route_pass == 0) {
        route_marks_clear();
        route_pass = 1;
    }
    return route_pass;
}

void exchange__route_pass_set(uint32_t pass)
{
    route_pass = pass;
}

/* One matching binding: queue it (once) or follow its exchange (once). */
static void route_offer(struct route_walk *walk, const struct binding *binding)
{
    struct bind_dest *dest = binding->dest;
    if (dest->route_mark == walk->pass)
        return;
    dest->route_mark = walk->pass;
    if (dest->kind == BIND_DEST_EXCHANGE) {
        struct exchange *next = CONTAINER_OF(dest, struct exchange, as_dest);
        index_of(next)->route_next = NULL;
        index_of(walk->tail)->route_next = next;
        walk->tail = next;
        return;
    }
    struct route_result *result = walk->result;
    if (result->count < result->cap)
        result->dests[result->count++] = dest;
    else
        result->overflow = true;
}

static void route_offer_list(struct route_walk *walk, struct list_node *head, bool index_links)
{
    list_for_each(pos, head) {
        const struct binding *b = index_links ? binding_of_link(pos)
                                              : CONTAINER_OF(pos, struct binding, source_link);
        route_offer(walk, b);
    }
}

/* The routing key split once into words, for the trie walk. */
struct topic_walk {
    struct route_walk *route;
    uint64_t pass;
    uint32_t words_count;
    struct bytes words[TOPIC_WORDS_MAX];
};

static bool topic_visit_once(struct topic_node *node, uint64_t pass, uint32_t word_index)
{
    if (node->visit_pass != pass) {
        node->visit_pass = pass;
        memset(node->visited, 0, sizeof(node->visited));
    }
    uint64_t bit = (uint64_t)1 << (word_index % 64);
    if (node->visited[word_index / 64] & bit)
        return false;
    node->visited[word_index / 64] |= bit;
    return true;
}

/*
 * RabbitMQ's trie_match: at node with words[i..] left, follow the literal
 * child for words[i] and the "*" child with i + 1, and the "#" child with
 * every i..n (it eats zero or more words); with no words left, take the
 * node's bindings and follow "#" with none. The memo makes each (node,
 * word position) pair visit once, so "#.#.#..." cannot go exponential.
 */
static void topic_walk_node(struct topic_walk *walk, struct topic_node *node, uint32_t i)
{
    if (!topic_visit_once(node, walk->pass, i))
        return;
    if (i == walk->words_count) {
        route_offer_list(walk->route, &node->bindings, true);
    } else {
        struct topic_node *literal = hmap_get(&node->children, walk->words[i]);
        if (literal != NULL)
            topic_walk_node(walk, literal, i + 1);
        if (node->star_child != NULL)
            topic_walk_node(walk, node->star_child, i + 1);
    }
    if (node->hash_child != NULL) {
        for (uint32_t j = i; j <= walk->words_count; j++)
            topic_walk_node(walk, node->hash_child, j);
    }
}

static void topic_route(struct exchange *exchange, struct bytes routing_key,
                        struct route_walk *route)
{
    struct exchange_index *index = index_of(exchange);
    if (index->topic_root == NULL)
        return;
    struct topic_walk walk = {.route = route, .pass = ++index->topic_pass};
    for (uint32_t w = topic_first_word(routing_key); !topic_at_end(routing_key, w);
         w = topic_next_word(routing_key, w)) {
        ASSERT(walk.words_count < TOPIC_WORDS_MAX);
        walk.words[walk.words_count++] = topic_word(routing_key, w);
    }
    topic_walk_node(&walk, index->topic_root, 0);
}

static void exchange_route_one(struct exchange *exchange, struct bytes routing_key,
                               struct table headers, struct route_walk *walk)
{
    switch (exchange->type) {
    case EXCHANGE_DIRECT: {
        struct direct_bucket *bucket = hmap_get(&index_of(exchange)->direct, routing_key);
        if (bucket != NULL)
            route_offer_list(walk, &bucket->bindings, true);
        break;
    }
    case EXCHANGE_FANOUT: route_offer_list(walk, &exchange->bindings, false); break;
    case EXCHANGE_TOPIC: topic_route(exchange, routing_key, walk); break;
    case EXCHANGE_HEADERS:
        list_for_each(pos, &exchange->bindings) {
            const struct binding *b = CONTAINER_OF(pos, struct binding, source_link);
            struct table args = {b->arguments.ptr, b->arguments.len};
            if (headers_match(args, headers))
                route_offer(walk, b);
        }
        break;
    }
}

/*
 * Breadth-first over exchange-to-exchange bindings, with the same routing
 * key and headers at every hop (as RabbitMQ does). The work list is
 * threaded through exchange_index.route_next, and the route marks make
 * each exchange join it once, so cycles end and nothing is allocated.
 */
void exchange_route(struct exchange *exchange, struct bytes routing_key, struct table headers,
                    struct route_result *result)
{
    ASSERT(exchange != NULL);
    ASSERT(result != NULL);
    ASSERT(result->count <= result->cap);
    ASSERT(routing_key.len <= ROUTING_KEY_SIZE_MAX);
    struct route_walk walk = {.pass = route_pass_next(), .result = result, .tail = exchange};
    exchange->as_dest.route_mark = walk.pass;
    index_of(exchange)->route_next = NULL;
    for (struct exchange *x = exchange; x != NULL; x = index_of(x)->route_next)
        exchange_route_one(x, routing_key, headers, &walk);
    ASSERT(result->count <= result->cap);
}
