/* Word-frequency counter over every regular file under a directory.
 *
 * usage: wordfreq [TOP_N [DIR]]     (TOP_N default 20, 0 = all; DIR default /input)
 *
 * A word is a maximal run of ASCII letters, digits and apostrophes, lowercased; everything else
 * separates words. Prints "COUNT WORD" lines sorted by count (descending), then word (ascending), so
 * the output does not depend on directory order. A summary goes to stderr.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct entry {
    char *word;
    unsigned long count;
};

static struct entry *table;
static size_t capacity = 1024, used;
static unsigned long total_words, files;

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "wordfreq: out of memory\n");
        exit(1);
    }
    return p;
}

static size_t hash(const char *s, size_t n) {
    size_t h = 1469598103934665603ULL & (size_t)-1;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * (size_t)1099511628211ULL;
    return h;
}

static void grow(void) {
    struct entry *old = table;
    size_t old_cap = capacity;
    capacity *= 2;
    table = xmalloc(capacity * sizeof *table);
    memset(table, 0, capacity * sizeof *table);
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].word == NULL)
            continue;
        size_t j = hash(old[i].word, strlen(old[i].word)) & (capacity - 1);
        while (table[j].word != NULL)
            j = (j + 1) & (capacity - 1);
        table[j] = old[i];
    }
    free(old);
}

static void add_word(const char *w, size_t n) {
    if (2 * (used + 1) > capacity)
        grow();
    size_t j = hash(w, n) & (capacity - 1);
    while (table[j].word != NULL) {
        if (strlen(table[j].word) == n && memcmp(table[j].word, w, n) == 0) {
            table[j].count++;
            total_words++;
            return;
        }
        j = (j + 1) & (capacity - 1);
    }
    table[j].word = xmalloc(n + 1);
    memcpy(table[j].word, w, n);
    table[j].word[n] = '\0';
    table[j].count = 1;
    used++;
    total_words++;
}

static int is_word_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '\'';
}

static void count_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        die(path);
    static char buf[65536];
    char *word = NULL;
    size_t len = 0, cap = 0, got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        for (size_t i = 0; i < got; i++) {
            int c = (unsigned char)buf[i];
            if (is_word_char(c)) {
                if (len == cap) {
                    cap = cap ? cap * 2 : 64;
                    char *bigger = realloc(word, cap);
                    if (bigger == NULL) {
                        fprintf(stderr, "wordfreq: out of memory\n");
                        exit(1);
                    }
                    word = bigger;
                }
                word[len++] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
            } else if (len > 0) {
                add_word(word, len);
                len = 0;
            }
        }
    }
    if (ferror(f))
        die(path);
    if (len > 0)
        add_word(word, len);
    free(word);
    fclose(f);
    files++;
}

static void walk(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL)
        die(dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        size_t n = strlen(dir) + strlen(e->d_name) + 2;
        char *path = xmalloc(n);
        snprintf(path, n, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0)
            die(path);
        if (S_ISDIR(st.st_mode))
            walk(path);
        else if (S_ISREG(st.st_mode))
            count_file(path);
        free(path);
    }
    closedir(d);
}

static int by_count_then_word(const void *a, const void *b) {
    const struct entry *x = a, *y = b;
    if (x->count != y->count)
        return x->count > y->count ? -1 : 1;
    return strcmp(x->word, y->word);
}

int main(int argc, char **argv) {
    long top = 20;
    const char *dir = "/input";
    if (argc > 3) {
        fprintf(stderr, "usage: wordfreq [TOP_N [DIR]]\n");
        return 2;
    }
    if (argc >= 2) {
        char *end;
        top = strtol(argv[1], &end, 10);
        if (*argv[1] == '\0' || *end != '\0' || top < 0) {
            fprintf(stderr, "wordfreq: TOP_N must be a non-negative integer, got '%s'\n", argv[1]);
            return 2;
        }
    }
    if (argc == 3)
        dir = argv[2];
    table = xmalloc(capacity * sizeof *table);
    memset(table, 0, capacity * sizeof *table);
    walk(dir);

    size_t k = 0;
    for (size_t i = 0; i < capacity; i++)
        if (table[i].word != NULL)
            table[k++] = table[i];
    qsort(table, k, sizeof *table, by_count_then_word);
    size_t shown = top == 0 || (size_t)top > k ? k : (size_t)top;
    for (size_t i = 0; i < shown; i++)
        printf("%lu %s\n", table[i].count, table[i].word);
    fprintf(stderr, "files %lu words %lu distinct %zu\n", files, total_words, k);
    return 0;
}
