/*
 * errors.h: the one return vocabulary used inside quay.
 *
 * OK (0) means done, AGAIN (positive) means "not finished, call again when
 * more input or space is available", and negative E_* values are errors.
 * The codec maps its errors to the AMQP reply code the spec names, so a
 * caller can turn any decode failure into the right connection.close.
 */
#ifndef QUAY_LIB_ERRORS_H
#define QUAY_LIB_ERRORS_H

enum {
    OK = 0,
    AGAIN = 1,
    E_FRAME = -1,          /* malformed frame (AMQP 501 frame-error) */
    E_SYNTAX = -2,         /* bad field value or truncated arguments (502) */
    E_UNKNOWN_METHOD = -3, /* unknown class or method id (540 not-implemented) */
    E_NOMEM = -4,          /* an allocation or a fixed buffer ran out */
    E_LIMIT = -5,          /* a configured limit was reached */
    E_IO = -6,             /* an operating-system call failed */
};

#endif
