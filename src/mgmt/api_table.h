/*
 * api_table.h: AMQP field tables as RabbitMQ's management API shows and
 * takes them (a queue's "arguments", a message's "headers"):
 *
 *   JSON          AMQP                  AMQP             JSON
 *   string   ->   S (long string)       S, x         ->  string
 *   integer  ->   l (signed 64)         integer kinds->  integer
 *   fraction ->   d (double)            f, d, D      ->  number
 *   bool     ->   t                     t            ->  bool
 *   object   ->   F (table)             F            ->  object
 *   array    ->   A (array)             A            ->  array
 *   null     ->   V (void)              V            ->  null
 *
 * Memory: tables are written into the caller's buffer.
 */
#ifndef QUAY_MGMT_API_TABLE_H
#define QUAY_MGMT_API_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/types.h"

struct json;
struct json_tree;
struct json_node;

/* Writes the encoded table t (validated) as a JSON object. */
void api_table_write(struct json *out, struct table t);
/* Encodes object obj (NULL or JSON null: an empty table) into buf[cap].
 * OK with *out set, or E_SYNTAX with why in err (not an object, a key
 * over 255 bytes, too big). */
int api_table_from_json(const struct json_tree *tree, const struct json_node *obj, uint8_t *buf,
                        size_t cap, struct table *out, char *err, size_t err_size);

#endif
