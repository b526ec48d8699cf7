/*
 * measure: run a command and report what it cost.
 *
 *     measure OUTFILE CMD [ARG]...
 *
 * Writes one line to OUTFILE:
 *     <wall ns> <peak RSS KiB> <exit code> <user+sys CPU ns> <busy CPU ns of the machine>
 * wall: CLOCK_MONOTONIC from just before fork to the end of wait4.
 * peak RSS: ru_maxrss of the child as wait4 reports it, the figure that
 *   `/usr/bin/time -f %M` prints: the largest of the process and the
 *   descendants it waited for. This program is small, so its fork adds next
 *   to nothing to that figure (a child forked from a large process inherits
 *   the parent's high-water mark).
 * user+sys: CPU time of the command and its waited-for descendants.
 * busy: CPU time the whole machine spent out of idle and iowait over the
 *   same span (from /proc/stat), so the caller can tell how much of the
 *   machine other processes took while the command ran.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long busy_ns(void)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return -1;
    unsigned long long v[10] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1],
                   &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]);
    fclose(f);
    if (n < 8)
        return -1;
    /* user nice system idle iowait irq softirq steal: all but idle, iowait */
    unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    return (long long)(busy * (1000000000ULL / (unsigned long long)sysconf(_SC_CLK_TCK)));
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: measure OUTFILE CMD [ARG]...\n");
        return 2;
    }
    long long b0 = busy_ns();
    long long t0 = now_ns();
    pid_t pid = fork();
    if (pid < 0) {
        perror("measure: fork");
        return 1;
    }
    if (pid == 0) {
        execvp(argv[2], argv + 2);
        perror("measure: exec");
        _exit(127);
    }
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) {
        perror("measure: wait4");
        return 1;
    }
    long long t1 = now_ns();
    long long b1 = busy_ns();
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    long long cpu = (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000LL
                  + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000LL;
    FILE *out = fopen(argv[1], "w");
    if (!out) {
        perror("measure: output file");
        return 1;
    }
    fprintf(out, "%lld %ld %d %lld %lld\n", t1 - t0, ru.ru_maxrss, code, cpu,
            (b0 < 0 || b1 < 0) ? -1 : b1 - b0);
    fclose(out);
    return 0;
}
