/*
 * Scalar dtype conversions between f32 and the 16-bit float formats.
 * Rounding is round-to-nearest-even, matching PyTorch's .to(bfloat16) and
 * .to(float16), so tensors converted here compare bit-exactly with torch.
 */
#include "cllm/core.h"

#include <string.h>

size_t cllm_dtype_size(cllm_dtype dt) {
    switch (dt) {
    case CLLM_F32: return 4;
    case CLLM_F16: return 2;
    case CLLM_BF16: return 2;
    case CLLM_I32: return 4;
    case CLLM_I64: return 8;
    case CLLM_U8: return 1;
    default: return 0;
    }
}

const char *cllm_dtype_name(cllm_dtype dt) {
    switch (dt) {
    case CLLM_F32: return "F32";
    case CLLM_F16: return "F16";
    case CLLM_BF16: return "BF16";
    case CLLM_I32: return "I32";
    case CLLM_I64: return "I64";
    case CLLM_U8: return "U8";
    default: return "?";
    }
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float cllm_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t cllm_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float cllm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return u2f(sign | 0x7f800000u | (man << 13)); /* inf / nan */
    if (exp == 0) {
        if (man == 0) return u2f(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t cllm_f32_to_f16(float f) {
    uint32_t u = f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {
        /* result is subnormal or zero: value / 2^-24, round to nearest even */
        if (a < 0x33000000u) return sign; /* < 2^-25: rounds to zero */
        uint32_t exp = a >> 23;
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - exp; /* 14..25 */
        uint32_t q = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias exponent and round mantissa from 23 to 10 bits */
    uint32_t r = a - 0x38000000u; /* exponent -112 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}
