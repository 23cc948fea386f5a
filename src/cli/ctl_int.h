/*
 * ctl_int.h: what quayctl's files share: ctl.c (main, options, the
 * command table, printing, the cluster and policy commands), ctl_http.c
 * (the HTTP request), ctl_users.c (users, vhosts, permissions, limits) and
 * ctl_rabbit.c (rabbitmqctl's verbs). Not for other modules.
 */
#ifndef QUAY_CLI_CTL_INT_H
#define QUAY_CLI_CTL_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/ctl_json.h"

/* Exit statuses, as sysexits.h names them (see ctl.c). */
#define EXIT_USAGE 64
#define EXIT_DATAERR 65
#define EXIT_UNAVAILABLE 69
#define EXIT_PROTOCOL 76
#define EXIT_NOPERM 77

#define LIST_COLUMNS_MAX 16

/* ---- the HTTP request (ctl_http.c) ---------------------------------------- */

struct endpoint {
    char host[256];
    char port[8];
    bool tls;                /* --https */
    const char *cacert;      /* --cacert, or NULL: the system's CAs */
};

struct buffer {
    char *data;    /* owned, NUL-terminated */
    size_t size;
    size_t cap;
};

struct response {
    int status;
    const char *body;  /* borrowed from the receive buffer */
    size_t body_size;
};

/* --http/--https's HOST:PORT ([V6]:PORT; an empty host is 127.0.0.1). */
int ctl__parse_endpoint(const char *text, struct endpoint *out);
/* The monotonic clock, in milliseconds. */
int64_t ctl__now_ms(void);
/* await-startup's attempts before the last: a refused connection is
 * expected, not news. */
extern bool ctl__quiet_connect;
/* Sends method path (with body, or none) and reads the answer: on
 * success *in holds the response and *res points into it. authorization
 * is the Basic credentials' base64. Returns 0 or an exit status (the
 * error is printed). */
int ctl__http_request(const struct endpoint *ep, const char *method, const char *path,
                      const char *body, const char *authorization, int timeout_ms,
                      struct buffer *in, struct response *res);

/* ---- commands and printing (ctl.c) ---------------------------------------- */

struct column {
    const char *key;
    const char *title;
    bool right;          /* numbers are right-aligned */
};

struct command {
    const char *name;
    const char *method;
    const char *path;                /* for commands with arguments: a prefix */
    const struct column *columns;    /* NULL: key/value pairs */
    size_t columns_count;
    int args_min, args_max;          /* positional arguments after the command */
};

struct options {
    struct endpoint endpoint;
    const char *user;
    const char *password;
    bool json;
    int timeout_ms;
    const struct command *command;
    char *args[LIST_COLUMNS_MAX];    /* the command's positional arguments */
    int args_count;
    const char *to, *vhost;          /* move's and offload's --to and --vhost */
    const char *fraction, *queues;   /* offload's --fraction or --queues */
    const char *backup_of;           /* move's --backup-of */
    const char *tags;                /* add-user's --tags */
};

/* A value as one table cell (a new string). */
char *ctl__cell_text(const struct jvalue *v);
/* Appends s %-encoded as a path segment (RabbitMQ's "/" vhost is %2F). */
bool ctl__append_segment(char *out, size_t cap, const char *s);
/* Appends s as a JSON string. */
bool ctl__append_json_string(char *out, size_t cap, const char *s);
/* Prints the answer; returns the exit status. */
int ctl__show(const struct command *cmd, const struct response *res, bool raw_json);

/* ---- users, vhosts, permissions and limits (ctl_users.c) ------------------ */

bool ctl__is_user_command(const struct command *cmd);
/* The PUT or DELETE of a user, vhost or permission command: its path and
 * body. Returns 0 or an exit status (printed). */
int ctl__build_user_request(const struct options *opt, const char *authorization, char *path,
                            size_t path_cap, char *body, size_t body_cap);
/* set-/clear-vhost-limits and set-/clear-user-limits: one request per
 * limit. Returns the exit status. */
int ctl__run_limits(const struct options *opt, const char *authorization);

/* ---- rabbitmqctl's verbs (ctl_rabbit.c) ----------------------------------- */

/* list-queues, list-exchanges, list-bindings, list-connections [COLUMN...] */
int ctl__run_list(const struct options *opt, const char *authorization);
/* export-definitions and import-definitions FILE */
int ctl__run_definitions(const struct options *opt, const char *authorization);
/* ping, await-startup */
int ctl__run_probe(const struct options *opt, const char *authorization);

#endif
