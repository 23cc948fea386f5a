/*
 * list.h: intrusive doubly linked lists (the Linux/libuv "queue" idiom).
 *
 * A struct list_node lives inside the object it links, so linking and
 * unlinking never allocate. The head is a sentinel node; an empty list
 * points at itself. Used for consumers, bindings, channels and any set
 * whose members must leave in O(1) from the middle.
 */
#ifndef QUAY_LIB_LIST_H
#define QUAY_LIB_LIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct list_node {
    struct list_node *prev;
    struct list_node *next;
};

#define LIST_INIT(name) {&(name), &(name)}
#define CONTAINER_OF(ptr, type, member) ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

static inline void list_init(struct list_node *head)
{
    head->prev = head;
    head->next = head;
}

static inline bool list_empty(const struct list_node *head)
{
    return head->next == head;
}

/* True when the node is linked into some list (nodes are list_init'ed when
 * unlinked, so this is a cheap membership test). */
static inline bool list_linked(const struct list_node *node)
{
    return node->next != node;
}

static inline void list_insert_after(struct list_node *pos, struct list_node *node)
{
    node->prev = pos;
    node->next = pos->next;
    pos->next->prev = node;
    pos->next = node;
}

static inline void list_push_back(struct list_node *head, struct list_node *node)
{
    list_insert_after(head->prev, node);
}

static inline void list_push_front(struct list_node *head, struct list_node *node)
{
    list_insert_after(head, node);
}

static inline void list_remove(struct list_node *node)
{
    node->prev->next = node->next;
    node->next->prev = node->prev;
    list_init(node);
}

static inline struct list_node *list_first(const struct list_node *head)
{
    return list_empty(head) ? NULL : head->next;
}

#define list_for_each(pos, head) \
    for (struct list_node *pos = (head)->next; pos != (head); pos = pos->next)

/* Every node of from moves, in order, to out (initialized here); from is
 * left empty. */
static inline void list_move_all(struct list_node *out, struct list_node *from)
{
    list_init(out);
    if (list_empty(from))
        return;
    out->next = from->next;
    out->prev = from->prev;
    out->next->prev = out;
    out->prev->next = out;
    list_init(from);
}

/* A walk that visits each node of head once, in any number of calls:
 * *left is the list's count when the walk begins, and each call gives the
 * next node, moved to the back first (so a visit may remove it, and nodes
 * added meanwhile wait behind those left), or NULL once *left is spent or
 * the list is empty (*left is then 0). A node removed before its visit
 * leaves *left high: a few are visited twice. */
static inline struct list_node *list_walk_next(struct list_node *head, uint32_t *left)
{
    if (*left == 0 || list_empty(head)) {
        *left = 0;
        return NULL;
    }
    (*left)--;
    struct list_node *node = head->next;
    list_remove(node);
    list_push_back(head, node);
    return node;
}

/* The nodes on the list: O(n). */
static inline uint32_t list_count(const struct list_node *head)
{
    uint32_t n = 0;
    list_for_each(pos, head)
        n++;
    return n;
}

/* Safe against removal of pos inside the body. */
#define list_for_each_safe(pos, head)                                        \
    for (struct list_node *pos = (head)->next, *pos##_next = pos->next;      \
         pos != (head); pos = pos##_next, pos##_next = pos->next)

#endif
