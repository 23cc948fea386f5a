/*
 * prom.c: see prom.h. Numbers are formatted by hand (no snprintf): a
 * scrape of 50,000 queues writes about half a million of them, and this
 * runs on the loop thread, where every microsecond is one the message
 * path waits.
 */
#include "mgmt/prom.h"

#include <stdio.h>
#include <string.h>

#include "lib/assert.h"
#include "lib/utf8.h"
#include "lib/json.h"

void prom_init(struct prom *prom, struct json *out)
{
    ASSERT(out != NULL);
    memset(prom, 0, sizeof *prom);
    prom->out = out;
}

static void put(struct prom *prom, const void *data, size_t size)
{
    json_raw(prom->out, data, size);
}

static void put_str(struct prom *prom, const char *s)
{
    put(prom, s, strlen(s));
}

/* [a-zA-Z_:][a-zA-Z0-9_:]* for metric names; no ':' in label names. */
static bool valid_name(const char *name, bool colon_allowed)
{
    if (name[0] == '\0' || (name[0] >= '0' && name[0] <= '9'))
        return false;
    for (const char *p = name; *p != '\0'; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || (c == ':' && colon_allowed);
        if (!ok)
            return false;
    }
    return true;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

void prom_family(struct prom *prom, const char *name, enum prom_type type, const char *help)
{
    ASSERT(!prom->in_sample);
    ASSERT(valid_name(name, true));
    ASSERT(type != PROM_TYPE_COUNTER || ends_with(name, "_total"));
    /* HELP text would need escaping for these; ours is static and has none. */
    ASSERT(strchr(help, '\n') == NULL && strchr(help, '\\') == NULL);
    prom->family = name;
    prom->family_size = strlen(name);
    put_str(prom, "# HELP ");
    put_str(prom, name);
    put(prom, " ", 1);
    put_str(prom, help);
    put_str(prom, "\n# TYPE ");
    put_str(prom, name);
    put_str(prom, type == PROM_TYPE_COUNTER ? " counter\n" : " gauge\n");
}

void prom_sample_begin(struct prom *prom)
{
    ASSERT(prom->family != NULL);
    ASSERT(!prom->in_sample);
    prom->in_sample = true;
    prom->has_labels = false;
    put(prom, prom->family, prom->family_size);
}

/* The label value's bytes, escaped, as valid UTF-8, written at out (room
 * for 3 bytes per input byte: U+FFFD replaces one). Returns the bytes
 * written. Runs that need no escaping (nearly every name) are copied in
 * one go. */
static size_t escape_label_value(char *out, struct bytes value)
{
    const uint8_t *p = value.ptr;
    size_t len = value.len, i = 0, at = 0;
    while (i < len) {
        size_t run = i;
        while (run < len && p[run] < 0x80 && p[run] != '"' && p[run] != '\\' && p[run] != '\n')
            run++;
        memcpy(out + at, p + i, run - i);
        at += run - i;
        i = run;
        if (i == len)
            break;
        if (p[i] >= 0x80) {
            size_t n = utf8_sequence_size(p + i, len - i);
            if (n == 0) {
                memcpy(out + at, "\xEF\xBF\xBD", 3); /* U+FFFD for one bad byte */
                at += 3;
                n = 1;
            } else {
                memcpy(out + at, p + i, n);
                at += n;
            }
            i += n;
            continue;
        }
        out[at++] = '\\';
        out[at++] = p[i] == '\n' ? 'n' : (char)p[i];
        i++;
    }
    return at;
}

void prom_label(struct prom *prom, const char *name, struct bytes value)
{
    ASSERT(prom->in_sample);
    ASSERT(valid_name(name, false));
    size_t name_size = strlen(name);
    /* ,name="value" with every byte of value escaped at its longest. */
    size_t room = 1 + name_size + 2 + 3 * (size_t)value.len + 1;
    char *out = json_raw_space(prom->out, room);
    size_t at = 0;
    out[at++] = prom->has_labels ? ',' : '{';
    memcpy(out + at, name, name_size);
    at += name_size;
    out[at++] = '=';
    out[at++] = '"';
    at += escape_label_value(out + at, value);
    out[at++] = '"';
    ASSERT(at <= room);
    json_raw_advance(prom->out, at);
    prom->has_labels = true;
}

void prom_label_str(struct prom *prom, const char *name, const char *value)
{
    prom_label(prom, name, bytes_of_cstr(value));
}

/* " VALUE\n" (after "}" if closing is set) at the end of text[24];
 * returns where it starts. */
static size_t format_value(char text[24], uint64_t value, bool closing)
{
    size_t at = 24;
    text[--at] = '\n';
    do {
        text[--at] = (char)('0' + value % 10);
        value /= 10;
    } while (value != 0);
    text[--at] = ' ';
    if (closing)
        text[--at] = '}';
    return at;
}

void prom_sample_end(struct prom *prom, uint64_t value)
{
    ASSERT(prom->in_sample);
    char text[24];
    size_t at = format_value(text, value, prom->has_labels);
    put(prom, text + at, sizeof text - at);
    prom->in_sample = false;
    prom->samples_count++;
}

void prom_sample_end_ns_as_seconds(struct prom *prom, uint64_t ns)
{
    ASSERT(prom->in_sample);
    char text[48];
    int n = snprintf(text, sizeof text, "%s %llu.%09llu\n", prom->has_labels ? "}" : "",
                     (unsigned long long)(ns / 1000000000u),
                     (unsigned long long)(ns % 1000000000u));
    ASSERT(n > 0 && (size_t)n < sizeof text);
    put(prom, text, (size_t)n);
    prom->in_sample = false;
    prom->samples_count++;
}

void prom_gauge_seconds(struct prom *prom, const char *name, const char *help, uint64_t ns)
{
    prom_family(prom, name, PROM_TYPE_GAUGE, help);
    prom_sample_begin(prom);
    prom_sample_end_ns_as_seconds(prom, ns);
}

void prom_counter_seconds(struct prom *prom, const char *name, const char *help, uint64_t ns)
{
    prom_family(prom, name, PROM_TYPE_COUNTER, help);
    prom_sample_begin(prom);
    prom_sample_end_ns_as_seconds(prom, ns);
}

void prom_labels_begin(struct prom *prom)
{
    ASSERT(!prom->in_sample);
    prom->in_sample = true;
    prom->has_labels = false;
}

void prom_labels_end(struct prom *prom)
{
    ASSERT(prom->in_sample);
    if (prom->has_labels)
        put(prom, "}", 1);
    prom->in_sample = false;
}

void prom_sample_rendered(struct prom *prom, const char *labels, size_t size, uint64_t value)
{
    ASSERT(prom->family != NULL);
    ASSERT(!prom->in_sample);
    char text[24];
    size_t at = format_value(text, value, false);
    size_t value_size = sizeof text - at;
    /* One reservation for the sample's three parts. */
    char *out = json_raw_space(prom->out, prom->family_size + size + value_size);
    memcpy(out, prom->family, prom->family_size);
    memcpy(out + prom->family_size, labels, size);
    memcpy(out + prom->family_size + size, text + at, value_size);
    json_raw_advance(prom->out, prom->family_size + size + value_size);
    prom->samples_count++;
}

void prom_sample_rendered_with(struct prom *prom, const char *labels, size_t size,
                               const char *more, uint64_t value)
{
    ASSERT(prom->family != NULL);
    ASSERT(!prom->in_sample);
    ASSERT(size >= 2 && labels[0] == '{' && labels[size - 1] == '}');
    char text[24];
    size_t at = format_value(text, value, true); /* the '}' after more */
    size_t value_size = sizeof text - at;
    size_t more_size = strlen(more);
    size_t total = prom->family_size + (size - 1) + more_size + value_size;
    char *out = json_raw_space(prom->out, total);
    memcpy(out, prom->family, prom->family_size);
    memcpy(out + prom->family_size, labels, size - 1);
    memcpy(out + prom->family_size + size - 1, more, more_size);
    memcpy(out + total - value_size, text + at, value_size);
    json_raw_advance(prom->out, total);
    prom->samples_count++;
}

void prom_gauge(struct prom *prom, const char *name, const char *help, uint64_t value)
{
    prom_family(prom, name, PROM_TYPE_GAUGE, help);
    prom_sample_begin(prom);
    prom_sample_end(prom, value);
}

void prom_counter(struct prom *prom, const char *name, const char *help, uint64_t value)
{
    prom_family(prom, name, PROM_TYPE_COUNTER, help);
    prom_sample_begin(prom);
    prom_sample_end(prom, value);
}
