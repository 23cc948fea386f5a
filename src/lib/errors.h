/*
 * errors.h: the one return vocabulary used inside quay, and the one
 * registry of its error codes (as SQLite keeps every result code in one
 * header): no other file defines a code (tools/tidy.py fails on a negative
 * E_* or *_E_* enum member or #define anywhere else).
 *
 * OK (0) means done, AGAIN (positive) means "not finished, call again when
 * more input or space is available", and negative values are errors.
 * The codec maps its errors to the AMQP reply code the spec names, so a
 * caller can turn any decode failure into the right connection.close.
 *
 * Each module owns a range of values, named below with what each code
 * means. A value never changes once released (codes are logged and
 * compared); a new code takes the next free value of its module's range,
 * a new module a new range. QUAY_ERRORS lists every code once and builds
 * both the enum and error_name() (errors.c); tests/unit/test_errors.c walks
 * the same list, so the three cannot drift.
 */
#ifndef QUAY_LIB_ERRORS_H
#define QUAY_LIB_ERRORS_H

/* X(name, value) for every code of quay, grouped by module. */
#define QUAY_ERRORS(X)                                                                             \
    /* ---- results, every layer: OK (0) done, AGAIN (1) call again later ---- */                  \
    X(OK, 0)                                                                                       \
    X(AGAIN, 1)                                                                                    \
    /* ---- lib/ and amqp/: -1..-19, the errors every layer shares ---- */                         \
    X(E_FRAME, -1)                       /* malformed frame (AMQP 501 frame-error) */              \
    X(E_SYNTAX, -2)                      /* bad field value or truncated arguments (502) */        \
    X(E_UNKNOWN_METHOD, -3)              /* unknown class or method id (540 not-implemented) */    \
    X(E_NOMEM, -4)                       /* an allocation or a fixed buffer ran out */             \
    X(E_LIMIT, -5)                       /* a configured limit was reached */                      \
    X(E_IO, -6)                          /* an operating-system call failed */                     \
    /* ---- cluster/consensus.h: -20..-31, Raft (consensus_strerror words them) ---- */            \
    X(CONSENSUS_E_NOT_LEADER, -20)       /* only the leader may do that; ask consensus_leader() */ \
    /* lost leadership before the entry was committed: it may or may not commit later */           \
    X(CONSENSUS_E_LEADERSHIP_LOST, -21)                                                            \
    X(CONSENSUS_E_SHUTDOWN, -22)         /* consensus_stop() was called */                         \
    X(CONSENSUS_E_BUSY, -23)             /* too many requests in flight */                         \
    X(CONSENSUS_E_CONFLICT, -24)         /* member id or address already in use */                 \
    X(CONSENSUS_E_INVALID, -25)          /* bad argument or configuration */                       \
    X(CONSENSUS_E_IO, -26)               /* disk or network failure in the engine */               \
    X(CONSENSUS_E_APPLY, -27)            /* the apply callback returned an error */                \
    X(CONSENSUS_E_NOT_FOUND, -28)        /* no such member */                                      \
    /* ---- cluster/map.h: -32..-39, the cluster map ---- */                                       \
    /* cluster_map_apply refused a well-formed command: the reply code and text */                 \
    /* are in its struct map_change, and the map is unchanged */                                   \
    X(E_MAP_REFUSED, -32)                                                                          \
    /* ---- cluster/node.h: -40..-49, the cluster node ---- */                                     \
    X(CLUSTER_E_UNAVAILABLE, -40)        /* no commit in time: no leader, no quorum */             \
    /* ---- store/journal.h: -1000..-1099, the journal ---- */                                     \
    X(E_JOURNAL_CORRUPT, -1000)          /* a bad record that is not a torn tail; see recovery */  \
    X(E_JOURNAL_NOT_FOUND, -1001)        /* journal_read of a seq the journal does not hold */     \
    X(E_JOURNAL_FENCED, -1002)           /* another broker took over a log we write (fenced) */

#define QUAY_ERROR_ENUM_MEMBER(name, value) name = (value),
enum { QUAY_ERRORS(QUAY_ERROR_ENUM_MEMBER) };

/* The code's name as written here ("E_JOURNAL_FENCED", "OK"), or "unknown
 * error" for a value not listed. A constant string: safe from any thread. */
const char *error_name(int code);

#endif
