/*
 * fsync_latency -- this disk's floor for a persistent, confirmed publish: the latency of one
 * fdatasync after a 4 KiB append to a file (what a journal's group commit pays at the very
 * least before a publisher confirm can go out).
 *
 * Usage: fsync_latency DIR [rounds=1000] [block=4096]
 *   Creates DIR/fsync-probe.<pid>, appends `block` bytes and calls fdatasync `rounds` times
 *   (each timed alone, CLOCK_MONOTONIC), removes the file, and prints one line:
 *   RESULT fsync_p50_us= fsync_p90_us= fsync_p99_us= fsync_max_us= fsync_mean_us= rounds= block=
 * Run it on the file system the brokers' data directories are on. Exit 2 on an I/O error.
 * Build: cc -O2 -std=c17 -Wall -Wextra fsync_latency.c -o fsync_latency
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, int n, double q)
{
    int i = (int)(q * (n - 1) + 0.5);
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: fsync_latency DIR [rounds=1000] [block=4096]\n");
        return 2;
    }
    int rounds = argc > 2 ? atoi(argv[2]) : 1000;
    long block = argc > 3 ? atol(argv[3]) : 4096;
    if (rounds < 1 || block < 1 || block > (64L << 20)) {
        fprintf(stderr, "fsync_latency: bad rounds or block size\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/fsync-probe.%d", argv[1], (int)getpid());
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(path);
        return 2;
    }
    char *buf = malloc((size_t)block);
    double *lat = malloc(sizeof(double) * (size_t)rounds);
    if (!buf || !lat) {
        fprintf(stderr, "fsync_latency: out of memory\n");
        return 2;
    }
    memset(buf, 'q', (size_t)block);
    double sum = 0;
    for (int i = 0; i < rounds; i++) {
        double t0 = now_us();
        if (write(fd, buf, (size_t)block) != (ssize_t)block || fdatasync(fd) != 0) {
            perror("write/fdatasync");
            close(fd);
            unlink(path);
            return 2;
        }
        lat[i] = now_us() - t0;
        sum += lat[i];
    }
    close(fd);
    unlink(path);
    qsort(lat, (size_t)rounds, sizeof *lat, cmp);
    printf("RESULT fsync_p50_us=%.0f fsync_p90_us=%.0f fsync_p99_us=%.0f fsync_max_us=%.0f fsync_mean_us=%.0f rounds=%d block=%ld\n",
           pct(lat, rounds, 0.50), pct(lat, rounds, 0.90), pct(lat, rounds, 0.99), lat[rounds - 1], sum / rounds,
           rounds, block);
    return 0;
}
