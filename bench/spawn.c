/* Tiny spawner for the benchmark: runs argv[2..] as its child and writes
 * "wall_ns utime_us stime_us maxrss_kib wait_status" to fd argv[1].
 *
 * Why C: ru_maxrss of a child counts the peak RSS of the process it was
 * forked (or vforked) from, so a Python parent would report its own ~60 MiB
 * for a 4 MiB Go plugin. Forked from this small process, the child's peak is
 * the plugin's own. Stdin, stdout and stderr pass straight through. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    struct timespec t0, t1;
    struct rusage ru;
    int status = 0;
    pid_t pid;
    int fd;
    if (argc < 3) return 127;
    fd = atoi(argv[1]);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid = fork();
    if (pid < 0) return 126;
    if (pid == 0) {
        close(fd);
        execv(argv[2], argv + 2);
        _exit(127);
    }
    if (wait4(pid, &status, 0, &ru) < 0) return 125;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long long wall = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    dprintf(fd, "%lld %ld %ld %ld %d\n", wall,
            ru.ru_utime.tv_sec * 1000000L + ru.ru_utime.tv_usec,
            ru.ru_stime.tv_sec * 1000000L + ru.ru_stime.tv_usec,
            ru.ru_maxrss, status);
    return 0;
}
