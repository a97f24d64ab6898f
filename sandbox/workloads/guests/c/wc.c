/* The guest example in C: counts the lines, words and bytes of /input/input.txt (words: runs of
 * bytes other than space, \t, \n, \v, \f, \r, as wc counts them), writes them to /output/summary.txt
 * and prints one line. The same task in every language of docs/guests.md, with the same output. */
#include <stdio.h>

static int is_space(int c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

int main(void) {
    FILE *in = fopen("/input/input.txt", "rb");
    if (!in) {
        perror("/input/input.txt");
        return 1;
    }
    unsigned long long lines = 0, words = 0, bytes = 0;
    int c, inword = 0;
    while ((c = getc(in)) != EOF) {
        bytes++;
        if (c == '\n') lines++;
        if (is_space(c)) inword = 0;
        else if (!inword) { inword = 1; words++; }
    }
    fclose(in);
    FILE *out = fopen("/output/summary.txt", "w");
    if (!out) {
        perror("/output/summary.txt");
        return 1;
    }
    fprintf(out, "lines %llu\nwords %llu\nbytes %llu\n", lines, words, bytes);
    if (fclose(out) != 0) {
        perror("/output/summary.txt");
        return 1;
    }
    printf("c: %llu lines, %llu words, %llu bytes\n", lines, words, bytes);
    return 0;
}
