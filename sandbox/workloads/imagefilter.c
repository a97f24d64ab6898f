/* Image filter over a binary PGM (P5, maxval 1..255).
 *
 * usage: imagefilter blur RADIUS IN OUT
 *        imagefilter sobel IN OUT
 *        imagefilter invert IN OUT
 *
 * blur: box blur over a (2*RADIUS+1)^2 window, edges clamped, rounded to nearest.
 * sobel: gradient magnitude sqrt(gx^2 + gy^2) of the 3x3 Sobel operator, edges clamped, capped at maxval.
 * invert: maxval - pixel.
 * Integer arithmetic throughout (sqrt is exact-rounded in IEEE 754), so outputs are bit-reproducible.
 * The output keeps the input's size and maxval.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct image {
    long w, h, maxval;
    unsigned char *px;
};

static void fail(const char *msg, const char *path) {
    fprintf(stderr, "imagefilter: %s: %s\n", path, msg);
    exit(1);
}

/* Reads one header integer, skipping whitespace and '#' comments. */
static long header_int(FILE *f, const char *path) {
    int c;
    for (;;) {
        c = fgetc(f);
        if (c == '#') {
            while (c != '\n' && c != EOF)
                c = fgetc(f);
        } else if (!isspace(c)) {
            break;
        }
    }
    if (c == EOF || !isdigit(c))
        fail("not a binary PGM (bad header)", path);
    long v = 0;
    while (c != EOF && isdigit(c)) {
        if (v > 100000000)
            fail("header number too large", path);
        v = v * 10 + (c - '0');
        c = fgetc(f);
    }
    if (c == EOF || !isspace(c))
        fail("not a binary PGM (bad header)", path);
    return v;
}

static struct image read_pgm(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        exit(1);
    }
    if (fgetc(f) != 'P' || fgetc(f) != '5')
        fail("not a binary PGM (P5)", path);
    struct image im;
    im.w = header_int(f, path);
    im.h = header_int(f, path);
    im.maxval = header_int(f, path);
    if (im.w < 1 || im.h < 1 || im.w > 65536 || im.h > 65536 || im.w * im.h > (1L << 28))
        fail("image size out of range", path);
    if (im.maxval < 1 || im.maxval > 255)
        fail("only 8-bit PGM (maxval 1..255) is supported", path);
    size_t n = (size_t)(im.w * im.h);
    im.px = malloc(n);
    if (im.px == NULL)
        fail("out of memory", path);
    if (fread(im.px, 1, n, f) != n)
        fail("truncated pixel data", path);
    fclose(f);
    return im;
}

static void write_pgm(const char *path, const struct image *im) {
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        perror(path);
        exit(1);
    }
    size_t n = (size_t)(im->w * im->h);
    fprintf(f, "P5\n%ld %ld\n%ld\n", im->w, im->h, im->maxval);
    if (fwrite(im->px, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static long clampl(long v, long lo, long hi) { return v < lo ? lo : v > hi ? hi : v; }

static unsigned char at(const struct image *im, long x, long y) {
    return im->px[clampl(y, 0, im->h - 1) * im->w + clampl(x, 0, im->w - 1)];
}

static void blur(const struct image *in, struct image *out, long r) {
    long window = (2 * r + 1) * (2 * r + 1);
    for (long y = 0; y < in->h; y++)
        for (long x = 0; x < in->w; x++) {
            long sum = 0;
            for (long dy = -r; dy <= r; dy++)
                for (long dx = -r; dx <= r; dx++)
                    sum += at(in, x + dx, y + dy);
            out->px[y * in->w + x] = (unsigned char)((sum + window / 2) / window);
        }
}

static void sobel(const struct image *in, struct image *out) {
    for (long y = 0; y < in->h; y++)
        for (long x = 0; x < in->w; x++) {
            long gx = -at(in, x - 1, y - 1) - 2 * at(in, x - 1, y) - at(in, x - 1, y + 1) +
                      at(in, x + 1, y - 1) + 2 * at(in, x + 1, y) + at(in, x + 1, y + 1);
            long gy = -at(in, x - 1, y - 1) - 2 * at(in, x, y - 1) - at(in, x + 1, y - 1) +
                      at(in, x - 1, y + 1) + 2 * at(in, x, y + 1) + at(in, x + 1, y + 1);
            long mag = (long)sqrt((double)(gx * gx + gy * gy));
            out->px[y * in->w + x] = (unsigned char)clampl(mag, 0, in->maxval);
        }
}

static void invert(const struct image *in, struct image *out) {
    for (long i = 0; i < in->w * in->h; i++)
        out->px[i] = (unsigned char)(in->maxval - clampl(in->px[i], 0, in->maxval));
}

static void usage(void) {
    fprintf(stderr, "usage: imagefilter blur RADIUS IN OUT | imagefilter sobel IN OUT | "
                    "imagefilter invert IN OUT\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2)
        usage();
    const char *op = argv[1];
    long radius = 0;
    int arg = 2;
    if (strcmp(op, "blur") == 0) {
        if (argc != 5)
            usage();
        char *end;
        radius = strtol(argv[2], &end, 10);
        if (*argv[2] == '\0' || *end != '\0' || radius < 1 || radius > 64) {
            fprintf(stderr, "imagefilter: RADIUS must be an integer in [1, 64], got '%s'\n", argv[2]);
            return 2;
        }
        arg = 3;
    } else if (strcmp(op, "sobel") != 0 && strcmp(op, "invert") != 0) {
        usage();
    } else if (argc != 4) {
        usage();
    }
    struct image in = read_pgm(argv[arg]);
    struct image out = in;
    out.px = malloc((size_t)(in.w * in.h));
    if (out.px == NULL)
        fail("out of memory", argv[arg + 1]);
    if (strcmp(op, "blur") == 0)
        blur(&in, &out, radius);
    else if (strcmp(op, "sobel") == 0)
        sobel(&in, &out);
    else
        invert(&in, &out);
    write_pgm(argv[arg + 1], &out);
    return 0;
}
