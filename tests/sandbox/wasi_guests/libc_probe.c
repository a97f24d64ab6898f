/* wasi-libc's view of our WASI: each line is "step result errno", compared with wasmtime's WASI. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void step(const char *name, long r) { printf("%s %ld %d\n", name, r < 0 ? -1L : r, r < 0 ? errno : 0); }
#define T(name, expr) do { errno = 0; step(name, (long)(expr)); } while (0)

static long count_entries(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    long n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static long file_size(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    return (long)st.st_size;
}

int main(int argc, char **argv) {
    const char *in = argc > 1 ? argv[1] : "/input";   /* a directory holding a.txt (5 bytes) and d/ */
    const char *out = argc > 2 ? argv[2] : "/output"; /* a writable directory */
    char p[256], q[256];
    char buf[64];
    int fd;

    snprintf(p, sizeof p, "%s/a.txt", in);
    T("open_read", fd = open(p, O_RDONLY));
    T("read", read(fd, buf, sizeof buf));
    T("lseek_negative", lseek(fd, -10, SEEK_SET));
    T("lseek_end", lseek(fd, 0, SEEK_END));
    T("ftruncate_read_only", ftruncate(fd, 0));
    T("write_read_only", write(fd, "x", 1));
    T("close", close(fd));
    T("close_again", close(fd));
    T("size", file_size(p));
    snprintf(q, sizeof q, "%s/d", in);
    T("entries", count_entries(in));
    T("entries_d", count_entries(q));
    snprintf(q, sizeof q, "%s/d/../a.txt", in);
    T("dotdot_inside", fd = open(q, O_RDONLY));
    close(fd);
    T("missing", open("/nonexistent/x", O_RDONLY));
    if (argc > 3) { /* `in` is read-only */
        snprintf(p, sizeof p, "%s/a.txt", in);
        T("ro_open_rdwr", open(p, O_RDWR));
        T("ro_truncate", truncate(p, 0));
        T("ro_unlink", unlink(p));
        T("ro_utimensat", utimensat(AT_FDCWD, p, 0, 0));
        snprintf(q, sizeof q, "%s/x", out);
        T("ro_rename_out", rename(p, q));
        snprintf(q, sizeof q, "%s/new", in);
        T("ro_creat", open(q, O_WRONLY | O_CREAT, 0644));
        T("ro_mkdir", mkdir(q, 0755));
    }

    snprintf(p, sizeof p, "%s/made", out);
    T("mkdir", mkdir(p, 0755));
    T("mkdir_again", mkdir(p, 0755));
    snprintf(q, sizeof q, "%s/made/f.txt", out);
    FILE *f = fopen(q, "w");
    T("fopen_write", f ? 0 : -1);
    T("fputs", fputs("hello world\n", f));
    T("fclose", fclose(f));
    T("size_written", file_size(q));
    T("truncate", truncate(q, 5));
    T("size_truncated", file_size(q));
    T("open_append", fd = open(q, O_WRONLY | O_APPEND));
    T("write_append", write(fd, "!!", 2));
    T("fsync", fsync(fd));
    T("close_append", close(fd));
    T("size_appended", file_size(q));
    T("open_excl", open(q, O_WRONLY | O_CREAT | O_EXCL, 0644));
    T("open_dir_for_write", open(p, O_WRONLY));
    T("rmdir_not_empty", rmdir(p));
    T("unlink_dir", unlink(p));
    struct timespec times[2] = {{5, 0}, {7, 0}};
    T("utimensat", utimensat(AT_FDCWD, q, times, 0));
    struct stat st;
    T("stat", stat(q, &st));
    T("atime", (long)st.st_atim.tv_sec);
    T("mtime", (long)st.st_mtim.tv_sec);
    snprintf(p, sizeof p, "%s/g.txt", out);
    T("rename", rename(q, p));
    T("rename_missing", rename(q, p));
    T("unlink", unlink(p));
    T("unlink_again", unlink(p));
    snprintf(p, sizeof p, "%s/made", out);
    T("rmdir", rmdir(p));
    T("entries_out", count_entries(out));
    return 0;
}
