/* Mandelbrot tile renderer.
 *
 * usage: mandelbrot WIDTH HEIGHT TILE_X TILE_Y TILE_W TILE_H MAX_ITER [OUT]
 *
 * The whole image (WIDTH x HEIGHT pixels) covers re in [-2.5, 1.0] and im in [-1.25, 1.25]; this run
 * renders only the tile whose top-left pixel is (TILE_X, TILE_Y), TILE_W x TILE_H pixels, so a large
 * image can be split into independent jobs and the tiles pasted together. The tile is written as a
 * binary PGM (P5, maxval 255) to OUT, or to stdout when OUT is absent or "-".
 * A pixel inside the set (no escape within MAX_ITER iterations) is 0; an escaping pixel is
 * 1 + 254 * n / MAX_ITER where n is the iteration at which |z| exceeded 2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long parse_arg(const char *name, const char *s, long lo, long hi) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "mandelbrot: %s must be an integer in [%ld, %ld], got '%s'\n", name, lo, hi, s);
        exit(2);
    }
    return v;
}

/* Two iterations per loop pass: wasmtime checks fuel at every loop back-edge, so this halves the
 * metering overhead of the hot loop without changing a single result. */
static unsigned char shade(double cr, double ci, long max_iter) {
    double zr = 0.0, zi = 0.0;
    long n = 0;
    for (;;) {
        double zr2 = zr * zr, zi2 = zi * zi;
        if (zr2 + zi2 > 4.0)
            break;
        if (++n == max_iter)
            return 0;
        zi = 2.0 * zr * zi + ci;
        zr = zr2 - zi2 + cr;
        zr2 = zr * zr;
        zi2 = zi * zi;
        if (zr2 + zi2 > 4.0)
            break;
        if (++n == max_iter)
            return 0;
        zi = 2.0 * zr * zi + ci;
        zr = zr2 - zi2 + cr;
    }
    return (unsigned char)(1 + (254 * n) / max_iter);
}

int main(int argc, char **argv) {
    if (argc != 8 && argc != 9) {
        fprintf(stderr, "usage: mandelbrot WIDTH HEIGHT TILE_X TILE_Y TILE_W TILE_H MAX_ITER [OUT]\n");
        return 2;
    }
    long width = parse_arg("WIDTH", argv[1], 1, 1L << 20);
    long height = parse_arg("HEIGHT", argv[2], 1, 1L << 20);
    long tx = parse_arg("TILE_X", argv[3], 0, width - 1);
    long ty = parse_arg("TILE_Y", argv[4], 0, height - 1);
    long tw = parse_arg("TILE_W", argv[5], 1, width - tx);
    long th = parse_arg("TILE_H", argv[6], 1, height - ty);
    long max_iter = parse_arg("MAX_ITER", argv[7], 1, 1L << 30);
    const char *out_path = argc == 9 ? argv[8] : "-";

    unsigned char *row = malloc((size_t)tw);
    if (row == NULL) {
        fprintf(stderr, "mandelbrot: out of memory for a %ld-pixel row\n", tw);
        return 1;
    }
    FILE *out = strcmp(out_path, "-") == 0 ? stdout : fopen(out_path, "wb");
    if (out == NULL) {
        perror(out_path);
        return 1;
    }
    /* One host call per 64 KiB instead of per BUFSIZ (1 KiB in wasi-libc). */
    setvbuf(out, NULL, _IOFBF, 1 << 16);
    fprintf(out, "P5\n%ld %ld\n255\n", tw, th);
    const double sx = 3.5 / (double)width, sy = 2.5 / (double)height;
    for (long y = ty; y < ty + th; y++) {
        double ci = 1.25 - ((double)y + 0.5) * sy;
        for (long x = tx; x < tx + tw; x++)
            row[x - tx] = shade(-2.5 + ((double)x + 0.5) * sx, ci, max_iter);
        if (fwrite(row, 1, (size_t)tw, out) != (size_t)tw) {
            perror(out_path);
            return 1;
        }
    }
    if (fclose(out) != 0) {
        perror(out_path);
        return 1;
    }
    free(row);
    return 0;
}
