/*
 * The int8 / q4 integer-dot kernels of matvec.c for one instruction set,
 * included once per integer dot: QD_SUF names the copies, QD_ATTR is their
 * function attribute (the target of the instructions), QD_DOTU(acc, u, s)
 * adds to the 8 int32 lanes of acc the products of the unsigned bytes u and
 * the signed bytes s, lane i taking bytes 4i .. 4i + 3 (AVX2's maddubs and
 * madd, or AVX512-VNNI's vpdpbusd: both exact).
 *
 * Block b of a weight row against block b of a token gives 8 integer lanes
 * p (lane i: codes 4i .. 4i + 3) and adds cvt(p) * (d_w * d_x) to one of two
 * 8-lane fp32 accumulators, the even blocks' or the odd blocks' (in block
 * order); the output is the fixed horizontal sum of their sum. rowdot runs
 * one output; tile runs TR rows by TT tokens, each weight block loaded and
 * unpacked once for TT tokens and each token block once for TR rows, and
 * gives every output the same operations in the same order, so an output
 * is the same bits from either (and from any batch or tile).
 *
 * int8 codes are signed: |w| times x with w's sign. q4 codes are the
 * unsigned nibbles n = q + 8 times x, plus the token block's lanes of
 * -8 * (sum of 4 codes) (xc, computed once per token by quantize_x): the
 * same integers as (n - 8) * x, without the subtraction and sign steps.
 */
#define QD_CAT_(a, b) a##_##b
#define QD_CAT(a, b) QD_CAT_(a, b)
#define QD(name) QD_CAT(name, QD_SUF)
/* every function below is inlined into QD(range), which each format calls
 * with a constant f: one copy of the loops per format */
#define QD_INLINE __attribute__((always_inline))
/* token block i's lanes in xc (q4 only: xc is NULL for int8) */
#define QD_XC(i) (f == CLLM_WFMT_Q4 ? xc + 8 * (size_t)(i) : NULL)

/* The integer lanes of one weight block (unpacked as wu, with the signed
 * int8 codes ws) against one token block. */
QD_ATTR QD_INLINE static inline __m256i QD(pair)(cllm_wfmt f, __m256i wu, __m256i ws, __m256i x, const int32_t *xc) {
    if (f == CLLM_WFMT_Q4) return QD_DOTU(_mm256_loadu_si256((const __m256i *)(const void *)xc), wu, x);
    return QD_DOTU(_mm256_setzero_si256(), wu, _mm256_sign_epi8(x, ws));
}

/* Loads weight block blk: wu the unsigned factor, ws the signed int8 codes. */
QD_ATTR QD_INLINE static inline void QD(wload)(cllm_wfmt f, const unsigned char *blk, __m256i *wu, __m256i *ws) {
    if (f == CLLM_WFMT_Q4) {
        /* the 16 bytes in both halves (a load, no shuffle), the upper half
         * shifted right by 4: the low nibbles then the high ones */
        const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(blk + 2)));
        *wu = _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(15));
        *ws = *wu;
    } else {
        *ws = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
        *wu = _mm256_sign_epi8(*ws, *ws);
    }
}

QD_ATTR QD_INLINE static inline __m256 QD(step)(cllm_wfmt f, const unsigned char *blk, const xblock *xb, const int32_t *xc,
                                      __m256 acc) {
    __m256i wu, ws;
    QD(wload)(f, blk, &wu, &ws);
    const __m256i p = QD(pair)(f, wu, ws, _mm256_loadu_si256((const __m256i *)(const void *)xb->q), xc);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale_of(blk) * xb->d), acc);
}

/* One output: a row of nb blocks of format f against one token's blocks. */
QD_ATTR QD_INLINE static inline float QD(rowdot)(cllm_wfmt f, const unsigned char *row, const xblock *xq, const int32_t *xc,
                                       int nb) {
    const size_t bb = f == CLLM_WFMT_Q4 ? CLLM_Q4_BLOCK_BYTES : CLLM_Q8_BLOCK_BYTES;
    __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        even = QD(step)(f, row + (size_t)b * bb, xq + b, QD_XC(b), even);
        odd = QD(step)(f, row + (size_t)(b + 1) * bb, xq + b + 1, QD_XC(b + 1), odd);
    }
    if (b < nb) even = QD(step)(f, row + (size_t)b * bb, xq + b, QD_XC(b), even);
    return hsum8(_mm256_add_ps(even, odd));
}

/* TR rows (row, row + rb, ...) by TT tokens (blocks xq, xq + nb, ...; xc
 * likewise, 8 lanes a block): out[t * ostride + r]. The even blocks run
 * first, then the odd ones, so one accumulator per output is live at a
 * time; the even sums wait in `part`. */
QD_ATTR QD_INLINE static inline void QD(tile)(cllm_wfmt f, const unsigned char *row, size_t rb, const xblock *xq,
                                    const int32_t *xc, int nb, float *out, size_t ostride) {
    const size_t bb = f == CLLM_WFMT_Q4 ? CLLM_Q4_BLOCK_BYTES : CLLM_Q8_BLOCK_BYTES;
    __m256 part[TR][TT];
    for (int par = 0; par < 2; par++) {
        __m256 acc[TR][TT];
#pragma GCC unroll 8
        for (int i = 0; i < TR * TT; i++) acc[i / TT][i % TT] = _mm256_setzero_ps();
        for (int b = par; b < nb; b += 2) {
            __m256i wu[TR], ws[TR];
            __m256 dw[TR];
#pragma GCC unroll 4
            for (int r = 0; r < TR; r++) {
                const unsigned char *blk = row + (size_t)r * rb + (size_t)b * bb;
                QD(wload)(f, blk, &wu[r], &ws[r]);
                dw[r] = _mm256_set1_ps(scale_of(blk));
            }
#pragma GCC unroll 4
            for (int t = 0; t < TT; t++) {
                const xblock *xb = xq + (size_t)t * nb + b;
                const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)xb->q);
                const __m256 dx = _mm256_set1_ps(xb->d);
#pragma GCC unroll 4
                for (int r = 0; r < TR; r++) {
                    const __m256i p = QD(pair)(f, wu[r], ws[r], x, QD_XC((size_t)t * nb + b));
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw[r], dx), acc[r][t]);
                }
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < TR * TT; i++) {
            const int r = i / TT, t = i % TT;
            if (par == 0)
                part[r][t] = acc[r][t];
            else
                out[(size_t)t * ostride + r] = hsum8(_mm256_add_ps(part[r][t], acc[r][t]));
        }
    }
}

/* QD_RN = 4 rows (row, row + rb, ...) against one token, for the q4 rows
 * of a decode step: each token block (codes, scale, xc lanes) loaded once
 * for the 4 weight rows, whose fp16 scales are gathered in one 64-bit
 * register and converted and multiplied by d_x together (the same products
 * as rowdot's scalar ones); every output gets rowdot's operations in
 * rowdot's order. (With the q4 load above, 16% less time than rowdot at one
 * thread, docs/inference.md; int8, whose sign step is per row, timed
 * slower, and 2 rows less fast than 4.) */
#define QD_RN 4
_Static_assert(QD_RN == 4, "rowsdot packs 4 fp16 scales in 64 bits");
QD_ATTR QD_INLINE static inline void QD(rowsdot)(const unsigned char *row, size_t rb, const xblock *xq, const int32_t *xc,
                                       int nb, float *out) {
    const cllm_wfmt f = CLLM_WFMT_Q4;
    const size_t bb = CLLM_Q4_BLOCK_BYTES;
    __m256 acc[QD_RN][2];
#pragma GCC unroll 8
    for (int i = 0; i < 2 * QD_RN; i++) acc[i / 2][i % 2] = _mm256_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += 2) {
#pragma GCC unroll 2
        for (int par = 0; par < 2; par++) {
            const int b = b0 + par;
            if (b >= nb) break;
            const xblock *xb = xq + b;
            const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)xb->q);
            /* the QD_RN weight scales times d_x, converted together: the
             * fp16 codes gathered in a general register */
            uint64_t h = 0;
#pragma GCC unroll 4
            for (int r = 0; r < QD_RN; r++) {
                const unsigned char *blk = row + (size_t)r * rb + (size_t)b * bb;
                h |= (uint64_t)(blk[0] | blk[1] << 8) << (16 * r);
            }
            float sc[QD_RN];
            _mm_storeu_ps(sc, _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)h)), _mm_set1_ps(xb->d)));
#pragma GCC unroll 4
            for (int r = 0; r < QD_RN; r++) {
                const unsigned char *blk = row + (size_t)r * rb + (size_t)b * bb;
                __m256i wu, ws;
                QD(wload)(f, blk, &wu, &ws);
                const __m256i p = QD(pair)(f, wu, ws, x, QD_XC(b));
                acc[r][par] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(sc[r]), acc[r][par]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < QD_RN; r++) out[r] = hsum8(_mm256_add_ps(acc[r][0], acc[r][1]));
}

#ifdef QD_512
/* rowsdot on 512-bit registers (AVX512-VNNI): two blocks a step, block b
 * (even) in the low 8 lanes and block b + 1 (odd) in the high 8, so the
 * halves of one accumulator are rowsdot's even and odd accumulators and
 * every lane gets the same operations in the same order: the same bits as
 * rowsdot and rowdot, in about half the instructions. A row's two blocks
 * come in one masked load (their 36 bytes; nothing past them is touched),
 * its nibbles are spread by one word permute, the 8 fp16 scales of the 4
 * rows gathered by unpacks of those same registers and converted together,
 * and each row's pair of scales spread by one float permute. */
QD_ATTR QD_INLINE static inline void QD(rowsdot512)(const unsigned char *row, size_t rb, const xblock *xq,
                                          const int32_t *xc, int nb, float *out) {
    const size_t bb = CLLM_Q4_BLOCK_BYTES;
    const __m512i shift = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
    const __m512i nib = _mm512_set1_epi8(15);
    const __mmask64 pair_mask = (1ULL << (2 * CLLM_Q4_BLOCK_BYTES)) - 1;
    /* words 1-8 (block b's nibbles) into 128-bit lanes 0 and 1, words
     * 10-17 (block b + 1's) into lanes 2 and 3 */
    static const uint16_t spread_idx[32] = {1,  2,  3,  4,  5,  6,  7,  8,  1,  2,  3,  4,  5,  6,  7,  8,
                                            10, 11, 12, 13, 14, 15, 16, 17, 10, 11, 12, 13, 14, 15, 16, 17};
    const __m512i spread = _mm512_loadu_si512((const void *)spread_idx);
    __m512 acc[QD_RN];
#pragma GCC unroll 4
    for (int r = 0; r < QD_RN; r++) acc[r] = _mm512_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        const xblock *x0 = xq + b, *x1 = xq + b + 1;
        const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)x0->q)),
                                             _mm256_loadu_si256((const __m256i *)(const void *)x1->q), 1);
        const __m512i c = _mm512_loadu_si512((const void *)(xc + 8 * (size_t)b));
        /* each row's two blocks (36 bytes) in one masked load: word 0 the
         * scale of block b, words 1-8 its nibbles, word 9 the scale of
         * block b + 1, words 10-17 its nibbles */
        __m512i z[QD_RN];
#pragma GCC unroll 4
        for (int r = 0; r < QD_RN; r++)
            z[r] = _mm512_maskz_loadu_epi8(pair_mask, (const void *)(row + (size_t)r * rb + (size_t)b * bb));
        /* the 8 scales: unpacking rows 0/1 and 2/3, then the pairs, puts
         * block b's in words 0-3 and block b + 1's in words 12-15 (rows in
         * order); converted and times d_x, lanes 0-3 and 12-15 */
        const __m512i u = _mm512_unpacklo_epi32(_mm512_unpacklo_epi16(z[0], z[1]), _mm512_unpacklo_epi16(z[2], z[3]));
        const __m512 dx = _mm512_insertf32x8(_mm512_set1_ps(x0->d), _mm256_set1_ps(x1->d), 1);
        const __m512 sc = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(u)), dx);
#pragma GCC unroll 4
        for (int r = 0; r < QD_RN; r++) {
            const __m512i q = _mm512_permutexvar_epi16(spread, z[r]);
            const __m512i wu = _mm512_and_si512(_mm512_srlv_epi32(q, shift), nib);
            const __m512i p = _mm512_dpbusd_epi32(c, wu, x);
            const __m512 s = _mm512_permutexvar_ps(_mm512_setr_epi32(r, r, r, r, r, r, r, r, 12 + r, 12 + r, 12 + r,
                                                                     12 + r, 12 + r, 12 + r, 12 + r, 12 + r), sc);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r]);
        }
    }
    const cllm_wfmt f = CLLM_WFMT_Q4; /* for QD_XC */
#pragma GCC unroll 4
    for (int r = 0; r < QD_RN; r++) {
        __m256 even = _mm512_castps512_ps256(acc[r]);
        const __m256 odd = _mm512_extractf32x8_ps(acc[r], 1);
        if (b < nb) /* an odd block count: the last block, even, as rowdot adds it */
            even = QD(step)(f, row + (size_t)r * rb + (size_t)b * bb, xq + b, QD_XC(b), even);
        out[r] = hsum8(_mm256_add_ps(even, odd));
    }
}
#define QD_ROWS4 QD(rowsdot512)

/* QD(tile) on 512-bit registers (the VNNI build), int8 and q4, as
 * rowsdot512 runs rowsdot: two blocks a step, block b in the low 8 lanes
 * and b + 1 in the high 8, so the low half of an accumulator is tile's even
 * accumulator and the high half its odd one, every lane the same operations
 * in the same order (the weight and token scales multiplied as two vectors,
 * as tile does); an odd last block goes to the low half through QD(step),
 * which gives rowdot's and tile's operations. 4 weight rows by TT tokens (16
 * accumulators), for the rows of a batched decode step and short prompts
 * (4 to 63 tokens): gpt2-124M's 16-row step matrices at one thread, q4
 * 39-45 -> 25 ms and int8 45-50 -> 28-30 against tile (2 rows, 256 bits);
 * 2 rows by 4 tokens here gave q4 30-35 ms. int8 has no 512-bit sign step:
 * |w| by abs, and x negated under the mask of w's negative codes (where w is
 * 0 tile zeroes x, here |w| is 0: the same integer dot). */
enum { QD_T5R = 4 }; /* weight rows per tile512 */
QD_ATTR QD_INLINE static inline void QD(tile512)(cllm_wfmt f, const unsigned char *row, size_t rb, const xblock *xq,
                                       const int32_t *xc, int nb, float *out, size_t ostride) {
    const size_t bb = f == CLLM_WFMT_Q4 ? CLLM_Q4_BLOCK_BYTES : CLLM_Q8_BLOCK_BYTES;
    const __m512i shift = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
    const __m512i nib = _mm512_set1_epi8(15);
    const __mmask64 pair_mask = (1ULL << (2 * CLLM_Q4_BLOCK_BYTES)) - 1;
    static const uint16_t spread_idx[32] = {1,  2,  3,  4,  5,  6,  7,  8,  1,  2,  3,  4,  5,  6,  7,  8,
                                            10, 11, 12, 13, 14, 15, 16, 17, 10, 11, 12, 13, 14, 15, 16, 17};
    const __m512i spread = _mm512_loadu_si512((const void *)spread_idx);
    __m512 acc[QD_T5R][TT];
#pragma GCC unroll 16
    for (int i = 0; i < QD_T5R * TT; i++) acc[i / TT][i % TT] = _mm512_setzero_ps();
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i wu[QD_T5R];
        __m512 dw[QD_T5R];
        __mmask64 neg[QD_T5R]; /* int8: the codes below zero */
#pragma GCC unroll 4
        for (int r = 0; r < QD_T5R; r++) {
            const unsigned char *blk = row + (size_t)r * rb + (size_t)b * bb;
            if (f == CLLM_WFMT_Q4) {
                const __m512i q = _mm512_permutexvar_epi16(spread, _mm512_maskz_loadu_epi8(pair_mask, (const void *)blk));
                wu[r] = _mm512_and_si512(_mm512_srlv_epi32(q, shift), nib);
            } else {
                /* |w| times x with w's sign, as tile's sign steps give it
                 * (where w is 0 the product is 0 either way) */
                const __m512i ws = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(blk + 2))),
                    _mm256_loadu_si256((const __m256i *)(const void *)(blk + bb + 2)), 1);
                wu[r] = _mm512_abs_epi8(ws);
                neg[r] = _mm512_movepi8_mask(ws);
            }
            dw[r] = _mm512_insertf32x8(_mm512_set1_ps(scale_of(blk)), _mm256_set1_ps(scale_of(blk + bb)), 1);
        }
#pragma GCC unroll 4
        for (int t = 0; t < TT; t++) {
            const xblock *x0 = xq + (size_t)t * nb + b;
            const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)x0->q)),
                                                 _mm256_loadu_si256((const __m256i *)(const void *)x0[1].q), 1);
            const __m512i c = f == CLLM_WFMT_Q4 ? _mm512_loadu_si512((const void *)QD_XC((size_t)t * nb + b))
                                                : _mm512_setzero_si512();
            const __m512 dx = _mm512_insertf32x8(_mm512_set1_ps(x0->d), _mm256_set1_ps(x0[1].d), 1);
#pragma GCC unroll 4
            for (int r = 0; r < QD_T5R; r++) {
                const __m512i xs = f == CLLM_WFMT_Q4 ? x : _mm512_mask_sub_epi8(x, neg[r], _mm512_setzero_si512(), x);
                const __m512i p = _mm512_dpbusd_epi32(c, wu[r], xs);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[r], dx), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < QD_T5R * TT; i++) {
        const int r = i / TT, t = i % TT;
        __m256 even = _mm512_castps512_ps256(acc[r][t]);
        const __m256 odd = _mm512_extractf32x8_ps(acc[r][t], 1);
        if (b < nb)
            even = QD(step)(f, row + (size_t)r * rb + (size_t)b * bb, xq + (size_t)t * nb + b, QD_XC((size_t)t * nb + b),
                            even);
        out[(size_t)t * ostride + r] = hsum8(_mm256_add_ps(even, odd));
    }
}
#else
#define QD_ROWS4 QD(rowsdot)
#endif

/* Rows [r, r + NR) for tokens [t0, t1): tiles of TT tokens (tile512 where
 * wide), the tokens left over one output at a time. */
QD_ATTR QD_INLINE static inline void QD(tiles)(cllm_wfmt f, const mm_job *j, int r, int t0, int t1, const int NR,
                                     const bool wide) {
    const int R = j->w->rows, nb = (j->w->cols + QB - 1) / QB;
    const size_t rb = cllm_wfmt_row_bytes(f, j->w->cols);
    const unsigned char *W = j->w->data;
    const int32_t *xc = j->xc;
    (void)wide; /* no tile512 without QD_512 */
    int t = t0;
    for (; t + TT <= t1; t += TT) {
#ifdef QD_512
        if (wide) {
            QD(tile512)(f, W + (size_t)r * rb, rb, j->xq + (size_t)t * nb, QD_XC((size_t)t * nb), nb,
                        j->out + (size_t)t * R + r, (size_t)R);
            continue;
        }
#endif
        QD(tile)(f, W + (size_t)r * rb, rb, j->xq + (size_t)t * nb, QD_XC((size_t)t * nb), nb, j->out + (size_t)t * R + r,
                 (size_t)R);
    }
    for (; t < t1; t++)
        for (int i = r; i < r + NR; i++)
            j->out[(size_t)t * R + i] = QD(rowdot)(f, W + (size_t)i * rb, j->xq + (size_t)t * nb, QD_XC((size_t)t * nb), nb);
}

/* The outputs of rows [r0, r1) for tokens [t0, t1): QD(tiles) of QD_T5R
 * rows on 512-bit registers (the VNNI build), then of TR rows, the rows
 * left over one output at a time. */
QD_ATTR QD_INLINE static inline void QD(range)(cllm_wfmt f, const mm_job *j, int r0, int r1, int t0, int t1) {
    const int R = j->w->rows, nb = (j->w->cols + QB - 1) / QB;
    const size_t rb = cllm_wfmt_row_bytes(f, j->w->cols);
    const unsigned char *W = j->w->data;
    const int32_t *xc = j->xc;
    int r = r0;
    /* a decode step (fewer tokens than a tile) streams its rows through pf */
    pf_stream pf = pf_open(W + (size_t)r0 * rb, W + (size_t)r1 * rb);
    const bool stream = t1 - t0 < TT;
#ifdef QD_512
    for (; r + QD_T5R <= r1 && !stream; r += QD_T5R) QD(tiles)(f, j, r, t0, t1, QD_T5R, true);
#endif
    for (; r + TR <= r1 && !stream; r += TR) QD(tiles)(f, j, r, t0, t1, TR, false);
    if (f == CLLM_WFMT_Q4 && t1 - t0 < TT) /* int8 timed slower this way */
        for (; r + QD_RN <= r1; r += QD_RN) {
            pf_ahead(&pf, W + (size_t)r * rb, PF_INT);
            for (int t = t0; t < t1; t++)
                QD_ROWS4(W + (size_t)r * rb, rb, j->xq + (size_t)t * nb, QD_XC((size_t)t * nb), nb, j->out + (size_t)t * R + r);
        }
    for (; r < r1; r++) {
        if (stream) pf_ahead(&pf, W + (size_t)r * rb, PF_INT);
        for (int t = t0; t < t1; t++)
            j->out[(size_t)t * R + r] = QD(rowdot)(f, W + (size_t)r * rb, j->xq + (size_t)t * nb, QD_XC((size_t)t * nb), nb);
    }
}

QD_ATTR static void QD(rows)(const mm_job *j, int r0, int r1, int t0, int t1) {
    if (j->w->fmt == CLLM_WFMT_Q4)
        QD(range)(CLLM_WFMT_Q4, j, r0, r1, t0, t1);
    else
        QD(range)(CLLM_WFMT_INT8, j, r0, r1, t0, t1);
}

#undef QD
#undef QD_XC
#undef QD_INLINE
#undef QD_RN
#undef QD_ROWS4
#undef QD_CAT
#undef QD_CAT_
