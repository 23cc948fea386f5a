/*
 * log.h: leveled logging to stderr with context in the message
 * ("conn=42 ch=3 vhost=/ queue=orders ..."). Cheap when the level is off.
 */
#ifndef QUAY_LIB_LOG_H
#define QUAY_LIB_LOG_H

#include <stddef.h>

enum log_level { LOG_LEVEL_ERROR, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

/* text: "2026-12-02T12:00:00.000Z info  conn=1 peer=... message";
 * json: {"time", "level", "conn": "1", "peer": "...", "message"}: the
 * message's leading key=value words become members (--log-format). */
enum log_format { LOG_FORMAT_TEXT, LOG_FORMAT_JSON };

extern enum log_level log_level_current;

int log_level_parse(const char *name, enum log_level *out);
int log_format_parse(const char *name, enum log_format *out);
void log_set_format(enum log_format format);
/* One line (no newline) into out; returns its length (< cap). Pure, for
 * log_write and its tests. */
size_t log_format_line(char *out, size_t cap, enum log_format format, enum log_level level,
                       const char *stamp, const char *message);
void log_write(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_AT(level, ...) \
    do { if ((level) <= log_level_current) log_write((level), __VA_ARGS__); } while (0)
#define LOG_ERROR(...) LOG_AT(LOG_LEVEL_ERROR, __VA_ARGS__)
#define LOG_WARN(...) LOG_AT(LOG_LEVEL_WARN, __VA_ARGS__)
#define LOG_INFO(...) LOG_AT(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) LOG_AT(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
