/*
 * log.h: leveled logging to stderr with context in the message
 * ("conn=42 ch=3 vhost=/ queue=orders ..."). Cheap when the level is off.
 */
#ifndef QUAY_LIB_LOG_H
#define QUAY_LIB_LOG_H

enum log_level { LOG_LEVEL_ERROR, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

extern enum log_level log_level_current;

int log_level_parse(const char *name, enum log_level *out);
void log_write(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_AT(level, ...) \
    do { if ((level) <= log_level_current) log_write((level), __VA_ARGS__); } while (0)
#define LOG_ERROR(...) LOG_AT(LOG_LEVEL_ERROR, __VA_ARGS__)
#define LOG_WARN(...) LOG_AT(LOG_LEVEL_WARN, __VA_ARGS__)
#define LOG_INFO(...) LOG_AT(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) LOG_AT(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
