/*
 * floor: the least work any mirror of SRC into DST has to do.
 *
 *     floor SRC DST        (DST must exist and be empty)
 *
 * One thread walks SRC depth-first with openat/getdents (readdir), and for
 * every entry does only what cannot be avoided:
 *   directory  mkdirat
 *   file       openat SRC, openat(O_CREAT|O_EXCL) DST, read every byte into
 *              a 1 MiB buffer and write it out, close both
 *   symlink    readlinkat + symlinkat
 * It does not stat (except where readdir gives no type), set modes, owners
 * or times, fsync, compare, or keep a manifest, so it is a lower bound on
 * the time and the syscalls of a full copy, not a usable mirror.
 * Other entry types (fifos, sockets, devices) are skipped.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BUFSZ (1 << 20)

static char *buf;
static unsigned long long n_entries, n_bytes;

static void die(const char *what, const char *name)
{
    fprintf(stderr, "floor: %s %s: %s\n", what, name, strerror(errno));
    exit(1);
}

static void copy_file(int sdir, int ddir, const char *name)
{
    int in = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0)
        die("open", name);
    int out = openat(ddir, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out < 0)
        die("create", name);
    for (;;) {
        ssize_t n = read(in, buf, BUFSZ);
        if (n < 0)
            die("read", name);
        if (n == 0)
            break;
        for (ssize_t off = 0; off < n;) {
            ssize_t w = write(out, buf + off, (size_t)(n - off));
            if (w < 0)
                die("write", name);
            off += w;
        }
        n_bytes += (unsigned long long)n;
    }
    close(in);
    close(out);
}

static void walk(int sdir, int ddir)
{
    DIR *d = fdopendir(sdir);
    if (!d)
        die("fdopendir", ".");
    struct dirent *e;
    while ((errno = 0, e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0)))
            continue;
        unsigned char type = e->d_type;
        if (type == DT_UNKNOWN) {
            struct stat st;
            if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                die("stat", name);
            type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG
                 : S_ISLNK(st.st_mode) ? DT_LNK : DT_UNKNOWN;
        }
        n_entries++;
        if (type == DT_DIR) {
            if (mkdirat(ddir, name, 0755) < 0)
                die("mkdir", name);
            int s = openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (s < 0)
                die("open dir", name);
            int t = openat(ddir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (t < 0)
                die("open dir", name);
            walk(s, t); /* closes s */
            close(t);
        } else if (type == DT_REG) {
            copy_file(dirfd(d), ddir, name);
        } else if (type == DT_LNK) {
            char target[PATH_MAX + 1];
            ssize_t n = readlinkat(dirfd(d), name, target, PATH_MAX);
            if (n < 0)
                die("readlink", name);
            target[n] = 0;
            if (symlinkat(target, ddir, name) < 0)
                die("symlink", name);
        } else {
            n_entries--;
        }
    }
    if (errno)
        die("readdir", ".");
    closedir(d);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: floor SRC DST\n");
        return 2;
    }
    buf = malloc(BUFSZ);
    if (!buf)
        return 1;
    int s = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s < 0)
        die("open", argv[1]);
    int t = open(argv[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (t < 0)
        die("open", argv[2]);
    walk(s, t);
    close(t);
    if (getenv("FLOOR_VERBOSE"))
        fprintf(stderr, "floor: %llu entries, %llu bytes\n", n_entries, n_bytes);
    return 0;
}
