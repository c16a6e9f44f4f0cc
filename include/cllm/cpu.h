/*
 * cllm cpu: what the processor can do, read once at run time, and the cap a
 * user (or a test) puts on it.
 *
 * Every ISA-dependent choice in cllm (oneDNN's native bf16 GEMM or the
 * widened fp32 path, and any later kernel with ISA variants) asks this
 * module, never the compiler's flags, so one binary picks its kernels on the
 * machine it runs on and a portable path always exists.
 *
 * The environment variable CLLM_MAX_ISA caps the level cllm's own choices
 * may use: `portable`, `avx2`, `avx512`, `avx512_bf16` or `amx` (case
 * insensitive). It lowers, never raises: on an AVX2 CPU, `amx` changes
 * nothing. oneDNN has its own cap, ONEDNN_MAX_CPU_ISA (e.g. AVX2), which
 * oneDNN reads itself; the test suite sets both to prove the fallback paths
 * on machines that have the fast ones.
 *
 * Thread-safe: the information is detected once (pthread_once) and then
 * read-only.
 */
#ifndef CLLM_CPU_H
#define CLLM_CPU_H

#include <stdbool.h>
#include <stddef.h>

#include "cllm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Levels in increasing order; each implies the ones before it. */
typedef enum {
    CLLM_ISA_PORTABLE = 0, /* no assumption beyond the base architecture */
    CLLM_ISA_AVX2,         /* AVX2 + FMA (x86-64-v3) */
    CLLM_ISA_AVX512,       /* AVX-512 F/BW/VL/DQ (x86-64-v4) */
    CLLM_ISA_AVX512_BF16,  /* AVX-512 with the BF16 dot-product instructions */
    CLLM_ISA_AMX,          /* AMX tiles with BF16, usable by this process */
    CLLM_ISA_COUNT
} cllm_isa;

typedef struct {
    char model[64];  /* the CPU's brand string ("" when unknown) */
    int n_cpus;      /* logical CPUs online */
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512_vnni, avx512_bf16;
    bool amx_bf16, amx_tile;
    cllm_isa detected; /* the best level the CPU and the OS support */
    cllm_isa isa;      /* detected, lowered by CLLM_MAX_ISA: what cllm uses */
    bool capped;       /* CLLM_MAX_ISA lowered the level */
} cllm_cpu_info;

/* The processor this process runs on. Borrowed, static, never NULL. An
 * invalid CLLM_MAX_ISA is ignored here (no cap); cllm_cpu_check_env()
 * reports it. */
const cllm_cpu_info *cllm_cpu(void);

/* CLLM_ERR_ARG naming the variable and the accepted values when CLLM_MAX_ISA
 * is set to something other than a level name; CLLM_OK otherwise. Programs
 * call it once at start-up so a typo is not silently ignored. */
cllm_status cllm_cpu_check_env(void);

/* "portable", "avx2", "avx512", "avx512_bf16", "amx". */
const char *cllm_isa_name(cllm_isa isa);

/* Parses a level name (case insensitive) into *isa; false if unknown. */
bool cllm_isa_parse(const char *s, cllm_isa *isa);

#ifdef __cplusplus
}
#endif

#endif
