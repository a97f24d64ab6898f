/* The smallest useful job: prints its arguments separated by spaces, or copies stdin to stdout when
 * there are none. Used by the jobs-per-second benchmark and the tests.
 */
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            printf(i > 1 ? " %s" : "%s", argv[i]);
        putchar('\n');
        return 0;
    }
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, stdin)) > 0)
        fwrite(buf, 1, n, stdout);
    return ferror(stdin) ? 1 : 0;
}
