/*
 * statwalk: the least work a no-op re-sync has to do.
 *
 *     statwalk TREE...
 *
 * One thread walks each TREE depth-first with openat/getdents (readdir) and
 * lstats every entry (fstatat with AT_SYMLINK_NOFOLLOW); it reads no file,
 * link target or manifest, compares nothing and sorts nothing. Given the
 * source and the live tree, it is the floor for deciding that a mirror is
 * up to date, as bench/floor.c is for a full copy. Prints the entries seen.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static unsigned long long seen;

static int walk(int dfd, const char *where)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        perror(where);
        close(dfd);
        return 1;
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            perror(e->d_name);
            rc = 1;
            continue;
        }
        seen++;
        if (S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
                perror(e->d_name);
                rc = 1;
                continue;
            }
            rc |= walk(sub, e->d_name);
        }
    }
    closedir(d);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: statwalk TREE...\n");
        return 2;
    }
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        int fd = open(argv[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) {
            perror(argv[i]);
            return 1;
        }
        struct stat st;
        fstat(fd, &st);
        seen++;
        rc |= walk(fd, argv[i]);
    }
    printf("%llu entries\n", seen);
    return rc;
}
