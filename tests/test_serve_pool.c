/*
 * The server's key/value pool against the memory available
 * (cllm_server_fit_pool): a default pool is cut to half of what is free in
 * whole blocks, and refused when one request no longer fits; a pool asked
 * for that does not fit is refused naming --kv-cache-tokens; an unknown
 * amount of free memory checks nothing.
 */
#include <string.h>

#include "check.h"
#include "cllm/server.h"

static cllm_server_params params(int kv, int total, int block) {
    cllm_server_params q;
    memset(&q, 0, sizeof q);
    q.kv_cache_tokens = kv;
    q.max_total_tokens = total;
    q.block_size = block;
    return q;
}

int main(void) {
    const size_t mib = (size_t)1 << 20, per = 73728; /* gpt2-124M fp32: 2 x 12 layers x 768 x 4 bytes */
    /* a default pool that fits in half: unchanged */
    cllm_server_params q = params(16384, 1024, 16);
    CHECK(cllm_server_fit_pool(&q, per, 4096 * mib, true) == CLLM_OK && q.kv_cache_tokens == 16384,
          "default pool within half of 4 GiB: %d", q.kv_cache_tokens);
    /* a default pool larger than half: cut to half, whole blocks */
    q = params(16384, 1024, 16);
    const size_t avail = 1000 * mib;
    CHECK(cllm_server_fit_pool(&q, per, avail, true) == CLLM_OK, "cut: %s", cllm_last_error());
    const size_t want = avail / 2 / per / 16 * 16;
    CHECK((size_t)q.kv_cache_tokens == want && q.kv_cache_tokens % 16 == 0 &&
              (size_t)q.kv_cache_tokens * per <= avail / 2 && (size_t)(q.kv_cache_tokens + 16) * per > avail / 2,
          "default pool cut to %d positions, expected %zu", q.kv_cache_tokens, want);
    /* cut below one request of max_total_tokens: refused, naming that flag */
    q = params(16384, 1024, 16);
    cllm_status st = cllm_server_fit_pool(&q, per, 100 * mib, true);
    CHECK(st == CLLM_ERR_NOMEM && strstr(cllm_last_error(), "--max-total-tokens 1024"),
          "one request does not fit: %d %s", (int)st, cllm_last_error());
    /* asked for, fits: unchanged, even above half */
    q = params(10000, 1024, 16);
    CHECK(cllm_server_fit_pool(&q, per, 1000 * mib, false) == CLLM_OK && q.kv_cache_tokens == 10000,
          "explicit pool of 703 MiB in 1000: %d", q.kv_cache_tokens);
    /* asked for, larger than what is free: refused, naming the flag and the bytes */
    q = params(20000, 1024, 16);
    st = cllm_server_fit_pool(&q, per, 1000 * mib, false);
    CHECK(st == CLLM_ERR_NOMEM && strstr(cllm_last_error(), "--kv-cache-tokens 20000 needs 1406 MiB") &&
              q.kv_cache_tokens == 20000,
          "explicit pool too large: %d %s", (int)st, cllm_last_error());
    /* free memory unknown: nothing checked */
    q = params(1 << 30, 1024, 16);
    CHECK(cllm_server_fit_pool(&q, per, 0, false) == CLLM_OK && q.kv_cache_tokens == 1 << 30, "unknown memory");
    return check_summary();
}
