/* conv_pointwise_f32_avx512.c -- pointwise float32 NHWC convolutions for AVX-512 (1x1, stride 1,
 * no padding, groups 1; forward and backward data; strided 1x1 forward by a gather): the whole
 * reduction of a tile in registers, no accumulator buffer, the input read in place as a pixels x
 * channels matrix.
 */
#include "impl.h"
#include "conv_f32_avx512.h"

/* ---------------------------------------------------------------------------------------------
 * pointwise convolutions (1x1, stride 1, no padding, groups 1): the input is a P x C matrix of
 * P = N*H*W pixels, read in place, the output a P x O matrix. The weights are packed once per
 * call (lm_conv_f32_pack_fwd: wp[ob][c][OB]); a work unit is a run of consecutive pixels (any
 * number of rows and images) whose input stays in L2 while every block of OB output channels
 * passes over it, the block's weights (C x OB) staying in L1. The micro-kernel keeps PB pixels x
 * NV vectors in registers for the whole reduction over C and writes them once, with the epilogue;
 * the plain case (no bias, residual or activation, full vectors) has its own instances with a
 * bare store loop.
 * Outputs that do not fit in the last-level cache together with the input are written with
 * streaming stores (no read for ownership of lines that would be evicted before their consumer
 * reads them anyway).
 * Backward data of a pointwise convolution is the same product with the roles of C and O swapped
 * (grad_x = grad_out x W), packed by lm_conv_f32_pack_bwd.
 */
/* PW_MAX_CIN: the most reduction channels taken (measured faster than the direct kernels up to
   2048: a block of weights, C x 64 floats, in L1 up to 128 channels, else in L2) */
enum { PW_UNIT_BYTES = 96 * 1024, PW_MAX_CIN = 2048 };

/* PB pixels (pixel k at xp + k*C) x NV vectors over C channels. MODE 0: plain stores of full
   vectors; 1: streaming stores of full vectors; 2: the general epilogue (bias, residual,
   activation, masked lanes, streaming when ep->stream). */
AI void pw_body(const float *xp, int64_t C, const float *wt, int64_t OB, const pw_epi *ep,
                const int PB, const int NV, const int MODE) {
   __m512 a[PW_MAXPB][4];
   acc_zero(a, PB, NV);
   for (int64_t c = 0; c < C; c++) {
      /* the residual the epilogue adds, a line per channel step while the reduction runs:
         without it every tile waited on them at the end (resnet50's folded bottlenecks, whose
         last 1x1 convolution adds the shortcut; one burst at the start was slower; numbers:
         docs/performance.md, "Measurements behind kernel choices") */
      if (MODE == 2 && ep->res && c < PB * NV)
         _mm_prefetch((const char *)(ep->res + (c / NV) * ep->ostride + 16 * (c % NV)),
                      _MM_HINT_T0);
      if ((c & 15) == 0) {
         /* the next tile's pixels, a line of each per 16 channels: without this the kernel waited
            on them (bench/ops.lua conv1x1; docs/performance.md). The address is computed as an
            integer: past the last tile it points beyond x, which a prefetch may do but C pointer
            arithmetic may not. */
#pragma GCC unroll 14
         for (int k = 0; k < PB; k++)
            _mm_prefetch((const char *)((uintptr_t)xp + (uintptr_t)((PB + k) * C + c) * 4),
                         _MM_HINT_T0);
      }
      bcast_step(a, xp + c, C, wt, PB, NV);
      wt += OB;
   }
   float *const o = ep->out;
   const int64_t os = ep->ostride;
   if (MODE == 0) {
#pragma GCC unroll 14
      for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) _mm512_storeu_ps(o + k * os + 16 * v, a[k][v]);
      return;
   }
   if (MODE == 1) {
#pragma GCC unroll 14
      for (int k = 0; k < PB; k++)
#pragma GCC unroll 4
         for (int v = 0; v < NV; v++) _mm512_stream_ps(o + k * os + 16 * v, a[k][v]);
      return;
   }
   pw_epilogue(a, ep, PB, NV);
}

/* n bfloat16 values widened to float32 (exact) */
static void bf16_widen_run(const uint16_t *src, float *dst, int64_t n) {
   int64_t i = 0;
   for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(dst + i, bf16_widen16(_mm256_loadu_si256((const __m256i *)(src + i))));
   if (i < n) {
      const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
      _mm512_mask_storeu_ps(dst + i, m, bf16_widen16(_mm256_maskz_loadu_epi16(m, src + i)));
   }
}

typedef void (*pw_fn)(const float *, int64_t, const float *, int64_t, const pw_epi *);

#define PW_INST(MODE, PB, NV)                                                                   \
   static void pw_##MODE##_##PB##_##NV(const float *xp, int64_t C, const float *wt, int64_t OB, \
                                       const pw_epi *ep) {                                      \
      pw_body(xp, C, wt, OB, ep, PB, NV, MODE);                                                 \
   }
PW_INST(0, 14, 1) PW_INST(0, 12, 2) PW_INST(0, 8, 3) PW_INST(0, 6, 4)
PW_INST(1, 14, 1) PW_INST(1, 12, 2) PW_INST(1, 8, 3) PW_INST(1, 6, 4)
PW_INST(2, 1, 1) PW_INST(2, 2, 1) PW_INST(2, 3, 1) PW_INST(2, 4, 1) PW_INST(2, 5, 1)
PW_INST(2, 6, 1) PW_INST(2, 7, 1) PW_INST(2, 8, 1) PW_INST(2, 9, 1) PW_INST(2, 10, 1)
PW_INST(2, 11, 1) PW_INST(2, 12, 1) PW_INST(2, 13, 1) PW_INST(2, 14, 1)
PW_INST(2, 1, 2) PW_INST(2, 2, 2) PW_INST(2, 3, 2) PW_INST(2, 4, 2) PW_INST(2, 5, 2)
PW_INST(2, 6, 2) PW_INST(2, 7, 2) PW_INST(2, 8, 2) PW_INST(2, 9, 2) PW_INST(2, 10, 2)
PW_INST(2, 11, 2) PW_INST(2, 12, 2)
PW_INST(2, 1, 3) PW_INST(2, 2, 3) PW_INST(2, 3, 3) PW_INST(2, 4, 3) PW_INST(2, 5, 3)
PW_INST(2, 6, 3) PW_INST(2, 7, 3) PW_INST(2, 8, 3)
PW_INST(2, 1, 4) PW_INST(2, 2, 4) PW_INST(2, 3, 4) PW_INST(2, 4, 4) PW_INST(2, 5, 4)
PW_INST(2, 6, 4)

/* pixels per tile for NV vectors (PB*NV accumulators + NV weights + a broadcast <= 32 zmm) */
static const pw_fn pw_plain[2][5] = {{0, pw_0_14_1, pw_0_12_2, pw_0_8_3, pw_0_6_4},
                                     {0, pw_1_14_1, pw_1_12_2, pw_1_8_3, pw_1_6_4}};
static const pw_fn pw_gen[5][PW_MAXPB + 1] = {
   {0},
   {0, pw_2_1_1, pw_2_2_1, pw_2_3_1, pw_2_4_1, pw_2_5_1, pw_2_6_1, pw_2_7_1, pw_2_8_1, pw_2_9_1,
    pw_2_10_1, pw_2_11_1, pw_2_12_1, pw_2_13_1, pw_2_14_1},
   {0, pw_2_1_2, pw_2_2_2, pw_2_3_2, pw_2_4_2, pw_2_5_2, pw_2_6_2, pw_2_7_2, pw_2_8_2, pw_2_9_2,
    pw_2_10_2, pw_2_11_2, pw_2_12_2, 0, 0},
   {0, pw_2_1_3, pw_2_2_3, pw_2_3_3, pw_2_4_3, pw_2_5_3, pw_2_6_3, pw_2_7_3, pw_2_8_3, 0, 0, 0,
    0, 0, 0},
   {0, pw_2_1_4, pw_2_2_4, pw_2_3_4, pw_2_4_4, pw_2_5_4, pw_2_6_4, 0, 0, 0, 0, 0, 0, 0, 0},
};

typedef struct {
   const float *x;          /* P x C */
   const uint16_t *x16;     /* or, where non-NULL, P x C bfloat16, widened a unit at a time */
   float *out;              /* P x O */
   uint16_t *out16;         /* NULL, or P x O bfloat16 written instead of out */
   const float *res, *bias; /* res: P x O, or NULL; bias: O, or NULL */
   const uint16_t *res16;   /* NULL, or a P x O bfloat16 residual (then res is NULL) */
   const float *wp;         /* wp[ob][c][OB] */
   int64_t P, C, O, OB, nob;
   int act, stream;
} pw_prob;

/* pixels [p0, p0 + np): every block of output channels over the whole run; x: the run's input
   (P->x + p0 * C, or its widened copy) */
static void pw_unit(const pw_prob *P, const float *x, int64_t p0, int64_t np) {
   const int64_t C = P->C, O = P->O, OB = P->OB;
   for (int64_t ob = 0; ob < P->nob; ob++) {
      const int64_t oc0 = ob * OB, nvalid = O - oc0 < OB ? O - oc0 : OB;
      const int nv = (int)((nvalid + 15) / 16), pb = pw_pb[nv];
      const float *wt = P->wp + ob * C * OB;
      pw_epi ep;
      ep.out16 = NULL;
      ep.res16 = NULL;
      ep.ostride = O;
      ep.bias = P->bias ? P->bias + oc0 : NULL;
      ep.act = P->act;
      for (int v = 0; v < 4; v++) {
         const int64_t left = nvalid - 16 * v;
         ep.m[v] = left >= 16 ? (__mmask16)0xFFFF
                              : (left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1));
      }
      const int full = nvalid % 16 == 0;
      ep.stream = P->stream && full;
      const pw_fn fast = (full && !P->bias && !P->res && !P->res16 && !P->act && !P->out16)
                            ? pw_plain[ep.stream][nv]
                            : pw_gen[nv][pb];
      float *o = P->out ? P->out + p0 * O + oc0 : NULL; /* NULL: out16 written */
      uint16_t *o16 = P->out16 ? P->out16 + p0 * O + oc0 : NULL;
      const float *r = P->res ? P->res + p0 * O + oc0 : NULL;
      const uint16_t *r16 = P->res16 ? P->res16 + p0 * O + oc0 : NULL;
      int64_t q = 0;
      for (; q + pb <= np; q += pb) {
         ep.out = o ? o + q * O : NULL;
         ep.out16 = o16 ? o16 + q * O : NULL;
         ep.res = r ? r + q * O : NULL;
         ep.res16 = r16 ? r16 + q * O : NULL;
         fast(x + q * C, C, wt, OB, &ep);
      }
      if (q < np) {
         ep.out = o ? o + q * O : NULL;
         ep.out16 = o16 ? o16 + q * O : NULL;
         ep.res = r ? r + q * O : NULL;
         ep.res16 = r16 ? r16 + q * O : NULL;
         pw_gen[nv][np - q](x + q * C, C, wt, OB, &ep);
      }
   }
}

/* streaming stores: LUMEN_CONV_STREAM=0 / 1 forces them off / on (specs, benchmarks); by default
   when the output block is cold (its old lines have left the caches: no read for ownership, and
   the input stays cached), or when the output alone exceeds half the cache share
   (lm_mem_cache_share): a result that large does not stay cached for its reader, and writing it
   through the cache evicts the input and the packed weights
   (numbers: docs/performance.md, "Measurements behind kernel choices"). */
int lm_conv_pw_stream(double out_bytes, int cold) {
   const char *e = getenv("LUMEN_CONV_STREAM");
   if (e && (e[0] == '0' || e[0] == '1') && e[1] == 0) return e[0] == '1';
   return cold || out_bytes > 0.5 * (double)lm_mem_cache_share();
}

static lm_status pw_run(const pw_prob *P0, int *stream) {
   pw_prob PP = *P0;
   const pw_prob *P = &PP;
   const int64_t Pn = P->P;
   const int cold = stream && *stream;
   if (stream) *stream = 0;
   if (Pn <= 0 || P->O <= 0) return LM_OK;
   PP.stream = !P->out16 && ((uintptr_t)P->out & 63) == 0 && P->O % 16 == 0 &&
               lm_conv_pw_stream((double)Pn * P->O * sizeof(float), cold);
   if (stream) *stream = PP.stream;
   const int nthr = conv_threads((double)Pn * P->O * (P->C > 0 ? P->C : 1));
   /* pixels per unit: the unit's input in L2 (a multiple of every tile height but 14), and
      enough units for the threads to share */
   int64_t U = PW_UNIT_BYTES / (P->C * (int64_t)sizeof(float));
   U = U / 24 * 24;
   if (U < 24) U = 24;
   if (U > 1008) U = 1008;
   while (U > 24 && ceil_div(Pn, U) < 4 * nthr) U = (U / 2 + 23) / 24 * 24;
   const int64_t units = ceil_div(Pn, U);
   /* a bfloat16 input: each thread widens a unit's pixels into its own buffer (L2) just before
      the unit's products read them, instead of a float32 copy of the whole input written to and
      read back from memory first (the float32 route's widening pass) */
   const size_t wbytes = P->x16 ? (size_t)(U * P->C) * sizeof(float) : 0;
   float *wbuf = NULL;
   if (P->x16) {
      wbuf = lm_alloc(wbytes * (size_t)nthr);
      if (!wbuf) return LM_ERR_OOM;
   }
#pragma omp parallel num_threads(nthr) if (nthr > 1)
   {
      float *xw = wbuf ? wbuf + (size_t)omp_get_thread_num() * (wbytes / sizeof(float)) : NULL;
#pragma omp for schedule(dynamic, 1)
      for (int64_t u = 0; u < units; u++) {
         const int64_t p0 = u * U, np = Pn - p0 < U ? Pn - p0 : U;
         if (xw) {
            bf16_widen_run(P->x16 + p0 * P->C, xw, np * P->C);
            pw_unit(P, xw, p0, np);
         } else {
            pw_unit(P, P->x + p0 * P->C, p0, np);
         }
      }
      if (P->stream) _mm_sfence(); /* order the streaming stores before the region ends */
   }
   if (wbuf) lm_free(wbuf, wbytes * (size_t)nthr);
   return LM_OK;
}

/* a strided, unpadded 1x1 layer (a ResNet stage's downsample) reads every sh-th row and sw-th
   column: forward gathers those pixels (N*Ho*Wo x C) and runs the pointwise kernel on them */
static int pw_strided(const conv_geom *g) {
   return g->kh == 1 && g->kw == 1 && g->ph == 0 && g->pw == 0 && (g->sh != 1 || g->sw != 1) &&
          lm_impl_on(LM_IMPL_CONV_PW_STRIDED);
}

int lm_conv_pw_usable(const conv_geom *g, int backward_data) {
   /* strided forward only: their grad_x through this kernel and a scatter was slower than the
      direct kernel or the product (256->512: 4.3 against 4.2 ms; 1024->2048: 4.1 against 3.9) */
   if (!backward_data && pw_strided(g) && g->G == 1 && g->C > 0 && g->O > 0)
      return g->C <= PW_MAX_CIN;
   if (!conv_is_pointwise(g) || g->G != 1 || g->C <= 0 || g->O <= 0) return 0;
   if (backward_data) return g->O <= PW_MAX_CIN;
   return g->C <= PW_MAX_CIN;
}

lm_status lm_conv_pw_fwd_nhwc_avx512(const conv_geom *g, const float *x, const uint16_t *x16,
                                     const float *w, const float *bias, const float *res,
                                     const uint16_t *res16, int act, float *out, uint16_t *out16,
                                     int *stream) {
   if (x16 && (g->sh != 1 || g->sw != 1)) return LM_ERR_INTERNAL; /* the caller widens first */
   if (g->sh != 1 || g->sw != 1) lm_impl_ran(LM_IMPL_CONV_PW_STRIDED); /* gathered pixels */
   const int64_t OB = block_width(g->O), nob = ceil_div(g->O, OB);
   const size_t bytes = (size_t)(nob * g->C * OB) * sizeof(float);
   float *wp = lm_alloc(bytes);
   if (!wp) return LM_ERR_OOM;
   lm_conv_f32_pack_fwd(g, w, OB, nob, wp, conv_threads((double)g->O * g->C));
   const int64_t P = g->N * g->Ho * g->Wo;
   float *gath = NULL;
   size_t gbytes = 0;
   if (g->sh != 1 || g->sw != 1) {
      /* the gather costs a pass over P x C floats; the direct kernel's strided rows cost more
         (bench/conv.lua r50_1x1_*_s2; numbers: docs/performance.md, "Measurements behind
         kernel choices") */
      gbytes = (size_t)(P * g->C) * sizeof(float);
      gath = lm_alloc(gbytes);
      if (!gath) {
         lm_free(wp, bytes);
         return LM_ERR_OOM;
      }
      lm_conv_pw_gather(g, (float *)x, gath, 0);
      x = gath;
   }
   const pw_prob Pr = {x, x16, out, out16, res, bias, res16, wp, P, g->C, g->O, OB, nob, act, 0};
   lm_status st = pw_run(&Pr, stream);
   if (gath) lm_free(gath, gbytes);
   lm_free(wp, bytes);
   return st;
}

lm_status lm_conv_pw_bwdd_nhwc_avx512(const conv_geom *g, const float *gout,
                                      const uint16_t *gout16, const float *w, float *gx,
                                      uint16_t *gx16, int *stream) {
   const int64_t OB = block_width(g->C), ncb = ceil_div(g->C, OB);
   const size_t bytes = (size_t)(ncb * g->O * OB) * sizeof(float);
   float *wp = lm_alloc(bytes);
   if (!wp) return LM_ERR_OOM;
   lm_conv_f32_pack_bwd(g, w, OB, ncb, wp, conv_threads((double)g->O * g->C));
   const pw_prob P = {gout, gout16, gx, gx16, NULL, NULL, NULL, wp, g->N * g->H * g->W, g->O,
                      g->C, OB, ncb, 0, 0};
   lm_status st = pw_run(&P, stream);
   lm_free(wp, bytes);
   return st;
}

/* x (N, H, W, C) -> the pixels a strided 1x1 layer reads, (N*Ho*Wo, C) (unstride = 0), or back:
   those rows of buf into gx, whose other pixels are zeroed (unstride = 1) */
void lm_conv_pw_gather(const conv_geom *g, float *x, float *buf, int unstride) {
   const int64_t Ho = g->Ho, Wo = g->Wo, C = g->C, rows = g->N * Ho;
   if (unstride) memset(x, 0, (size_t)(g->N * g->H * g->W * C) * sizeof(float));
#pragma omp parallel for schedule(static) num_threads(conv_threads((double)rows * Wo * C * 64)) \
   if (rows * Wo * C >= 65536)
   for (int64_t r = 0; r < rows; r++) {
      const int64_t n = r / Ho, i = r % Ho;
      float *img = x + (n * g->H + i * g->sh) * g->W * C;
      for (int64_t j = 0; j < Wo; j++) {
         float *px = img + j * g->sw * C, *pb = buf + (r * Wo + j) * C;
         if (unstride)
            memcpy(px, pb, (size_t)C * sizeof(float));
         else
            memcpy(pb, px, (size_t)C * sizeof(float));
      }
   }
}
