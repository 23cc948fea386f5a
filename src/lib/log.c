/*
 * log.c: one line per event on stderr, prefixed with a UTC timestamp and
 * the level, or (--log-format json) one JSON object per line whose leading
 * key=value words ("conn=42 peer=1.2.3.4:5 ...") become members. Never
 * allocates; a message longer than 1 KiB is truncated.
 */
#include "lib/log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lib/utf8.h"

enum log_level log_level_current = LOG_LEVEL_INFO;
static enum log_format format_current = LOG_FORMAT_TEXT;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int log_level_parse(const char *name, enum log_level *out)
{
    for (int i = 0; i <= LOG_LEVEL_DEBUG; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    return -1;
}

int log_format_parse(const char *name, enum log_format *out)
{
    if (strcmp(name, "text") != 0 && strcmp(name, "json") != 0)
        return -1;
    *out = name[0] == 't' ? LOG_FORMAT_TEXT : LOG_FORMAT_JSON;
    return 0;
}

void log_set_format(enum log_format format)
{
    format_current = format;
}

/* Appends text[0..len) as the inside of a JSON string: quotes, backslashes
 * and control characters escaped, a byte that is not UTF-8 as U+FFFD (a
 * queue's name may hold any bytes). */
static size_t put_escaped(char *out, size_t n, size_t cap, const char *text, size_t len)
{
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0; i < len && n + 7 < cap;) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            out[n++] = '\\';
            out[n++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
        } else if (c >= 0x80) {
            size_t k = utf8_sequence_size(p + i, len - i);
            if (k == 0) {
                n += (size_t)snprintf(out + n, cap - n, "\\ufffd");
                i++;
                continue;
            }
            memcpy(out + n, p + i, k);
            n += k;
            i += k;
            continue;
        } else {
            out[n++] = (char)c;
        }
        i++;
    }
    return n;
}

/* A leading word "key=value": a key of [a-z_], a value without spaces. */
static bool field_word(const char *p, size_t *key_len, size_t *word_len)
{
    size_t k = 0;
    while ((p[k] >= 'a' && p[k] <= 'z') || p[k] == '_')
        k++;
    if (k == 0 || p[k] != '=')
        return false;
    size_t w = k + 1;
    while (p[w] != '\0' && p[w] != ' ')
        w++;
    *key_len = k;
    *word_len = w;
    return true;
}

size_t log_format_line(char *out, size_t cap, enum log_format format, enum log_level level,
                       const char *stamp, const char *message)
{
    if (format == LOG_FORMAT_TEXT)
        return (size_t)snprintf(out, cap, "%s %-5s %s", stamp, level_names[level], message);
    size_t n = (size_t)snprintf(out, cap, "{\"time\":\"%s\",\"level\":\"%s\"", stamp,
                                level_names[level]);
    const char *p = message;
    size_t key_len, word_len;
    while (n + 16 < cap && field_word(p, &key_len, &word_len)) {
        out[n++] = ',';
        out[n++] = '"';
        n = put_escaped(out, n, cap, p, key_len);
        n += (size_t)snprintf(out + n, cap - n, "\":\"");
        n = put_escaped(out, n, cap, p + key_len + 1, word_len - key_len - 1);
        out[n++] = '"';
        p += word_len;
        while (*p == ' ')
            p++;
    }
    n += (size_t)snprintf(out + n, cap - n, ",\"message\":\"");
    n = put_escaped(out, n, cap, p, strlen(p));
    n += (size_t)snprintf(out + n, cap - n, "\"}");
    return n < cap ? n : cap - 1;
}

void log_write(enum log_level level, const char *fmt, ...)
{
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char stamp[64];
    snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             ts.tv_nsec / 1000000);
    char line[7 * sizeof message + 128]; /* every byte escaped, at worst */
    log_format_line(line, sizeof line, format_current, level, stamp, message);
    fprintf(stderr, "%s\n", line);
}
