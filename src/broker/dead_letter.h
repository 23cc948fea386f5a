/*
 * dead_letter.h: RabbitMQ's dead-lettering. A message a queue lets go of
 * (rejected without requeue, expired, or pushed out by a length limit) is
 * republished to the queue's dead-letter exchange with an x-death header
 * that records how it died, as RabbitMQ 3.10 writes it.
 */
#ifndef QUAY_BROKER_DEAD_LETTER_H
#define QUAY_BROKER_DEAD_LETTER_H

struct message;
struct queue;

enum dead_letter_reason {
    DEAD_LETTER_REJECTED,
    DEAD_LETTER_EXPIRED,
    DEAD_LETTER_MAXLEN,
};

/* Takes the message reference. Without a dead-letter exchange (or if it
 * does not exist) the message is dropped. */
void dead_letter(struct queue *queue, struct message *message, enum dead_letter_reason reason);

#endif
