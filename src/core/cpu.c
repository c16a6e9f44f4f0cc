/*
 * CPU feature detection with CPUID and XGETBV (see cllm/cpu.h).
 *
 * A feature counts only when the CPU reports it AND the operating system
 * saves the register state it needs (XCR0): AVX needs the YMM state,
 * AVX-512 the opmask and ZMM states, AMX the tile states. Levels follow the
 * x86-64 micro-architecture levels where they exist (v3 = AVX2+FMA, v4 =
 * AVX-512 F/BW/VL/DQ).
 *
 * Left out: non-x86 processors report CLLM_ISA_PORTABLE and an empty
 * feature list (the portable paths run there).
 */
#include "cllm/cpu.h"

#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define CLLM_X86 1
#endif

static const char *const isa_names[CLLM_ISA_COUNT] = {"portable", "avx2", "avx512", "avx512_bf16", "amx"};

const char *cllm_isa_name(cllm_isa isa) {
    return (unsigned)isa < CLLM_ISA_COUNT ? isa_names[isa] : "?";
}

bool cllm_isa_parse(const char *s, cllm_isa *isa) {
    if (!s) return false;
    for (int i = 0; i < CLLM_ISA_COUNT; i++)
        if (strcasecmp(s, isa_names[i]) == 0) {
            *isa = (cllm_isa)i;
            return true;
        }
    return false;
}

static cllm_cpu_info g_info;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#ifdef CLLM_X86
static unsigned long long xgetbv0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static void detect_x86(cllm_cpu_info *c) {
    unsigned a, b, cx, d;
    if (!__get_cpuid(0, &a, &b, &cx, &d)) return;
    unsigned max_leaf = a;
    if (!__get_cpuid(1, &a, &b, &cx, &d)) return;
    bool osxsave = cx & (1u << 27), avx = cx & (1u << 28);
    c->fma = cx & (1u << 12);
    c->f16c = cx & (1u << 29);
    unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm_os = (xcr0 & 0x6) == 0x6;          /* SSE + AVX state */
    bool zmm_os = (xcr0 & 0xe6) == 0xe6;        /* + opmask, ZMM_Hi256, Hi16_ZMM */
    bool tile_os = (xcr0 & 0x60000) == 0x60000; /* XTILECFG + XTILEDATA */
    if (!(avx && ymm_os)) {
        c->fma = c->f16c = false;
        return;
    }
    if (max_leaf >= 7 && __get_cpuid_count(7, 0, &a, &b, &cx, &d)) {
        unsigned max_sub = a;
        c->avx2 = b & (1u << 5);
        if (zmm_os) {
            c->avx512f = b & (1u << 16);
            c->avx512dq = b & (1u << 17);
            c->avx512bw = b & (1u << 30);
            c->avx512vl = b & (1u << 31);
            c->avx512_vnni = cx & (1u << 11);
        }
        if (tile_os) {
            c->amx_bf16 = d & (1u << 22);
            c->amx_tile = d & (1u << 24);
        }
        if (zmm_os && max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &cx, &d)) c->avx512_bf16 = a & (1u << 5);
    }
    /* brand string: leaves 0x80000002..4, 16 bytes each */
    if (__get_cpuid(0x80000000, &a, &b, &cx, &d) && a >= 0x80000004) {
        char brand[49] = {0};
        for (unsigned leaf = 0; leaf < 3; leaf++) {
            unsigned r[4];
            __get_cpuid(0x80000002 + leaf, &r[0], &r[1], &r[2], &r[3]);
            memcpy(brand + 16 * leaf, r, 16);
        }
        const char *p = brand;
        while (*p == ' ') p++;
        size_t n = strlen(p);
        while (n && isspace((unsigned char)p[n - 1])) n--;
        if (n >= sizeof c->model) n = sizeof c->model - 1;
        memcpy(c->model, p, n);
        c->model[n] = 0;
    }
}
#endif

static void detect(void) {
    cllm_cpu_info *c = &g_info;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    c->n_cpus = n > 0 ? (int)n : 1;
#ifdef CLLM_X86
    detect_x86(c);
#endif
    cllm_isa lvl = CLLM_ISA_PORTABLE;
    if (c->avx2 && c->fma) lvl = CLLM_ISA_AVX2;
    if (lvl == CLLM_ISA_AVX2 && c->avx512f && c->avx512bw && c->avx512vl && c->avx512dq) lvl = CLLM_ISA_AVX512;
    if (lvl == CLLM_ISA_AVX512 && c->avx512_bf16) lvl = CLLM_ISA_AVX512_BF16;
    if (lvl == CLLM_ISA_AVX512_BF16 && c->amx_bf16 && c->amx_tile) lvl = CLLM_ISA_AMX;
    c->detected = c->isa = lvl;
    cllm_isa cap;
    if (cllm_isa_parse(getenv("CLLM_MAX_ISA"), &cap) && cap < lvl) {
        c->isa = cap;
        c->capped = true;
    }
}

const cllm_cpu_info *cllm_cpu(void) {
    pthread_once(&g_once, detect);
    return &g_info;
}

cllm_status cllm_cpu_check_env(void) {
    const char *v = getenv("CLLM_MAX_ISA");
    cllm_isa isa;
    if (!v || cllm_isa_parse(v, &isa)) return CLLM_OK;
    return CLLM_FAIL(CLLM_ERR_ARG,
                     "environment variable CLLM_MAX_ISA='%s' is not an ISA level (expected portable, avx2, avx512, "
                     "avx512_bf16 or amx)",
                     v);
}
