/*
 * xoshiro256** seeded with splitmix64: a small generator with a published,
 * fixed algorithm, so a seed means the same stream everywhere and the whole
 * state is four words a checkpoint can store.
 */
#include "cllm/core.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void cllm_rng_seed(cllm_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

uint64_t cllm_rng_u64(cllm_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double cllm_rng_uniform(cllm_rng *r) { return (double)(cllm_rng_u64(r) >> 11) * 0x1.0p-53; }

float cllm_rng_normal(cllm_rng *r) {
    double u1 = cllm_rng_uniform(r), u2 = cllm_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t cllm_rng_below(cllm_rng *r, uint64_t n) {
    /* rejection sampling removes modulo bias */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = cllm_rng_u64(r);
    while (x >= limit);
    return x % n;
}
