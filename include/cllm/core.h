/*
 * cllm core: status codes and the last-error message, logging, aligned
 * allocation, overflow-checked sizes, dtype conversion and a seeded RNG.
 *
 * Every action in libcllm returns a cllm_status. On failure the failing
 * function records a message (prefixed with its own name, naming the file,
 * key or value that was wrong) which the caller reads with cllm_last_error().
 * The message is thread-local: each thread sees its own last error.
 */
#ifndef CLLM_CORE_H
#define CLLM_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CLLM_OK = 0,
    CLLM_ERR_ARG,         /* bad argument, flag or config value */
    CLLM_ERR_IO,          /* open/read/write/rename failed */
    CLLM_ERR_FORMAT,      /* malformed file contents */
    CLLM_ERR_NOMEM,       /* allocation failed or size overflow */
    CLLM_ERR_UNSUPPORTED, /* valid but not implemented (dtype, model_type...) */
    CLLM_ERR_INTERNAL     /* a bug in cllm or a library it calls */
} cllm_status;

/* Returns a static, human-readable name for a status ("ok", "io error"...). */
const char *cllm_status_str(cllm_status st);

/* The message left by the last failing call on this thread ("" if none).
 * Borrowed: valid until the next failing call on this thread. */
const char *cllm_last_error(void);

/* Records "func: <formatted message>" as this thread's last error and
 * returns st, so a failure site reads `return cllm_fail(st, __func__, ...)`.
 * Use the CLLM_FAIL macro, which fills in the function name. */
cllm_status cllm_fail(cllm_status st, const char *func, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
#define CLLM_FAIL(st, ...) cllm_fail((st), __func__, __VA_ARGS__)

/* Prefixes the current last error with "context: " (for callers that add
 * which file or tensor they were working on). Returns st. */
cllm_status cllm_fail_context(cllm_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

void cllm_error_clear(void);

/* ---- logging (stderr) ---- */
typedef enum { CLLM_LOG_DEBUG = 0, CLLM_LOG_INFO, CLLM_LOG_WARN, CLLM_LOG_ERROR } cllm_log_level;
void cllm_log_set_level(cllm_log_level level);
void cllm_log(cllm_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- memory ---- */
/* 64-byte aligned allocation; returns NULL and records an error naming
 * `what` on failure. cllm_free(NULL) is a no-op. calloc variant zeroes. */
void *cllm_alloc(size_t bytes, const char *what);
void *cllm_calloc(size_t n, size_t size, const char *what);
/* cllm_alloc for a large buffer that is read over and over once written
 * (a model's weights when it only runs forwards, the key/value pool of
 * cllm_kv_cache_init_paged): from CLLM_HUGE_MIN bytes it is
 * 2 MiB aligned and asks the kernel for transparent huge pages
 * (madvise MADV_HUGEPAGE; only an advice, where the kernel has THP in
 * `madvise` or `always` mode). A decode step reads every weight once: with
 * 4 KiB pages each page of a stream costs a TLB miss, a nested page walk
 * in a virtual machine. Memory is taken in 2 MiB steps as it is touched.
 * Freed with free() / cllm_free() as any other. */
enum { CLLM_HUGE_MIN = 8 << 20 };
void *cllm_alloc_huge(size_t bytes, const char *what);
/* cllm_calloc on cllm_alloc_huge's pages: n x size zeroed bytes. */
void *cllm_calloc_huge(size_t n, size_t size, const char *what);
void cllm_free(void *p);
/* Gives the whole pages inside [p, p + bytes) of a cllm_alloc'd buffer back
 * to the system: they read as zero afterwards and take no memory until they
 * are written again. For parts of a buffer whose contents are not needed
 * (another pipeline stage's parameters). */
void cllm_mem_release(void *p, size_t bytes);
/* Bytes of memory the system can give without swapping (Linux:
 * MemAvailable of /proc/meminfo; elsewhere the free physical pages), or 0
 * when it cannot tell. A reading, not a reservation: for refusing, at
 * start-up, a buffer that cannot fit. */
size_t cllm_mem_available(void);

/* Overflow-checked size arithmetic: return false on overflow. */
bool cllm_size_mul(size_t a, size_t b, size_t *out);
bool cllm_size_add(size_t a, size_t b, size_t *out);

/* ---- numbers from text ---- */
/* Parse a whole string as an integer/float (strtoll/strtod with an
 * end-pointer check, no silent clamping). Return false if the string is not
 * exactly one number in range. */
bool cllm_parse_i64(const char *s, int64_t *out);
bool cllm_parse_int(const char *s, int *out);
bool cllm_parse_f64(const char *s, double *out);

/* ---- dtype conversion ---- */
typedef enum { CLLM_F32 = 0, CLLM_F16, CLLM_BF16, CLLM_I32, CLLM_I64, CLLM_U8, CLLM_DTYPE_COUNT } cllm_dtype;
size_t cllm_dtype_size(cllm_dtype dt);
const char *cllm_dtype_name(cllm_dtype dt); /* safetensors spelling: "F32", "BF16"... */

float cllm_bf16_to_f32(uint16_t h);
uint16_t cllm_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
float cllm_f16_to_f32(uint16_t h);
uint16_t cllm_f32_to_f16(float f); /* round to nearest even, overflow -> inf */

/* ---- random numbers ---- */
/* A small, fully specified generator (xoshiro256** seeded by splitmix64) so
 * that streams are identical on every machine and can be saved/restored as
 * four 64-bit words. */
typedef struct {
    uint64_t s[4];
} cllm_rng;
void cllm_rng_seed(cllm_rng *r, uint64_t seed);
uint64_t cllm_rng_u64(cllm_rng *r);
double cllm_rng_uniform(cllm_rng *r); /* [0, 1) with 53 random bits */
float cllm_rng_normal(cllm_rng *r);   /* standard normal (Box-Muller) */
uint64_t cllm_rng_below(cllm_rng *r, uint64_t n); /* uniform in [0, n), n > 0, unbiased */

/* ---- time ---- */
double cllm_time_sec(void); /* monotonic seconds */

#ifdef __cplusplus
}
#endif
#endif
