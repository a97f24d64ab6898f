/* Seeded Monte Carlo estimate of pi.
 *
 * usage: montecarlo SEED SAMPLES [--entropy]
 *
 * Draws SAMPLES points uniformly in the unit square from a xoshiro256** generator seeded (through
 * splitmix64) from SEED, counts those inside the quarter circle, and prints the estimate 4 * inside /
 * SAMPLES. With --entropy, 32 bytes from WASI random_get (getentropy) are mixed into the state; in the
 * e31 sandbox those bytes come from the job's seed, so the run is still reproducible.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t state[4];

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next(void) {
    uint64_t result = rotl(state[1] * 5, 7) * 9;
    uint64_t t = state[1] << 17;
    state[2] ^= state[0];
    state[3] ^= state[1];
    state[1] ^= state[2];
    state[0] ^= state[3];
    state[2] ^= t;
    state[3] = rotl(state[3], 45);
    return result;
}

/* A double uniform in [0, 1) from the top 53 bits. */
static double uniform(void) { return (double)(next() >> 11) * 0x1.0p-53; }

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    if (*s == '\0' || *s == '-')
        return 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0')
        return 0;
    *out = (uint64_t)v;
    return 1;
}

int main(int argc, char **argv) {
    uint64_t seed, samples;
    int entropy = argc == 4 && strcmp(argv[3], "--entropy") == 0;
    if ((argc != 3 && !entropy) || !parse_u64(argv[1], &seed) || !parse_u64(argv[2], &samples) ||
        samples == 0) {
        fprintf(stderr, "usage: montecarlo SEED SAMPLES [--entropy]  (SAMPLES > 0)\n");
        return 2;
    }
    uint64_t sm = seed;
    for (int i = 0; i < 4; i++)
        state[i] = splitmix64(&sm);
    if (entropy) {
        uint64_t extra[4];
        if (getentropy(extra, sizeof extra) != 0) {
            perror("getentropy");
            return 1;
        }
        for (int i = 0; i < 4; i++)
            state[i] ^= extra[i];
        if ((state[0] | state[1] | state[2] | state[3]) == 0)
            state[0] = 1;
    }
    uint64_t inside = 0;
    for (uint64_t i = 0; i < samples; i++) {
        double x = uniform(), y = uniform();
        inside += x * x + y * y < 1.0;
    }
    printf("samples %" PRIu64 "\ninside %" PRIu64 "\npi %.9f\n", samples, inside,
           4.0 * (double)inside / (double)samples);
    return 0;
}
