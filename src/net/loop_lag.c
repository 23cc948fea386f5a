/*
 * loop_lag.c: see loop_lag.h.
 */
#include "net/loop_lag.h"

#include <string.h>

void loop_lag_init(struct loop_lag *lag, uv_loop_t *loop)
{
    memset(lag, 0, sizeof *lag);
    lag->loop = loop;
    /* (Only sets a flag; libuv then times each epoll_wait: two clock
     * reads per poll.) */
    uv_loop_configure(loop, UV_METRICS_IDLE_TIME);
    lag->last_ns = uv_hrtime();
    lag->last_idle_ns = uv_metrics_idle_time(loop);
    lag->window_start_ns = lag->last_ns;
}

void loop_lag_sample(struct loop_lag *lag)
{
    if (lag->loop == NULL)
        return;
    uint64_t now = uv_hrtime();
    uint64_t idle = uv_metrics_idle_time(lag->loop);
    uint64_t wall = now - lag->last_ns;
    uint64_t idled = idle >= lag->last_idle_ns ? idle - lag->last_idle_ns : 0;
    uint64_t busy = wall > idled ? wall - idled : 0;
    lag->last_ns = now;
    lag->last_idle_ns = idle;
    lag->busy_ns_total += busy;
    if (now - lag->window_start_ns >= LOOP_LAG_WINDOW_NS) {
        lag->max_ns[1] = lag->max_ns[0];
        lag->max_ns[0] = 0;
        lag->window_start_ns = now;
    }
    if (busy > lag->max_ns[0])
        lag->max_ns[0] = busy;
}

uint64_t loop_lag_max_ns(const struct loop_lag *lag)
{
    return lag->max_ns[0] > lag->max_ns[1] ? lag->max_ns[0] : lag->max_ns[1];
}
