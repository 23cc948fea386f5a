/*
 * login.h: password checks that must not run on the loop.
 *
 * A PBKDF2 check (broker/password.h) takes about 0.2 s of CPU on the
 * development machine: on the loop, every login would stop every
 * connection for that long, and a stranger sending wrong passwords
 * would stop the broker. So a login whose check is slow is handed to
 * libuv's thread pool (uv_queue_work) and its caller (an AMQP connection
 * in its handshake, an HTTP request) waits for the answer. At most half
 * the machine's cores (at least one) run checks at once, so the loop
 * keeps a core; the others wait in order. Logins that need the same
 * check (the same user, stored hash and password: a client reconnecting
 * many times at once) share one derivation: the later ones wait for the
 * first and then find its success cached (auth.h), or are refused with it.
 */
#ifndef QUAY_BROKER_LOGIN_H
#define QUAY_BROKER_LOGIN_H

#include <stdbool.h>

#include "broker/auth.h"
#include "lib/types.h"

struct broker;
struct login;

/* Called on the loop with the verdict (AUTH_VERDICT_OK with the user, or
 * a refusal with NULL). The login is gone when it is called. */
typedef void (*login_done_fn)(void *ctx, enum auth_verdict verdict,
                              const struct auth_user *user);

/* Checks a login. When the answer is at hand (a cheap hash, a cached
 * check) returns NULL with *verdict and *user set, and done is never
 * called. Else returns the pending login: done is called later from the
 * loop, unless login_cancel comes first. */
struct login *login_start(struct broker *broker, struct bytes user, struct bytes password,
                          bool peer_loopback, login_done_fn done, void *ctx,
                          enum auth_verdict *verdict, const struct auth_user **out);
/* Its caller went away (the connection closed): done will not be called.
 * A check already running finishes on its thread and is dropped. */
void login_cancel(struct login *login);
/* Logins started and not yet answered (for tests and the logs). */
unsigned login_pending_count(void);

#endif
