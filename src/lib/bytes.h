/*
 * bytes.h: owned copies of byte strings. A struct bytes from the codec
 * borrows from a frame; whatever must outlive the frame (a queue's name,
 * its arguments) is copied with bytes_dup, owned by the copier, and freed
 * with bytes_free.
 */
#ifndef QUAY_LIB_BYTES_H
#define QUAY_LIB_BYTES_H

#include "lib/types.h"

/* Never NULL, even for an empty string; aborts on OOM. */
struct bytes bytes_dup(struct bytes b);
void bytes_free(struct bytes *b);

#endif
