/* gemm_tmpl.c -- the GEMM's packed loop nest and its small-problem path, written once for both
 * element types (the portable packing, the macro-kernel and its threads, the unpacked "direct"
 * loops; layouts in gemm_internal.h).
 *
 * gemm.c includes this file twice, with LM_GEMM_TEMPLATE defined and
 *   T              the element type (float, double)
 *   GEMM_IS_FLOAT  1 for float
 *   GEMM_P         the names' prefix (sgemm_, dgemm_; GNAME(x) pastes it)
 *   GEMM_CFG, GEMM_CONFIG  the blocking type and the function that gives it for an ISA
 * after the helpers it uses (imin, the work queue, ...). Compiled on its own (the Makefile
 * compiles every C file under kernels/cpu) it is empty.
 */
#ifdef LM_GEMM_TEMPLATE

/* micro-panels [q0, q1) of the kc x nc block of op(B) (element (p,j) at b[p*rsb + j*csb]):
 * panel q holds columns q*NR .. q*NR+NR-1 as dst[q][p][j], columns past nc zeroed */
__attribute__((noinline)) static void GNAME(pack_b)(int64_t kc, int64_t nc, const T *b, int64_t rsb, int64_t csb, int NR,
                          int64_t q0, int64_t q1, T *dst) {
   for (int64_t q = q0; q < q1; q++) {
      int64_t j0 = q * NR;
      int nr = (int)imin(NR, nc - j0);
      const T *bp = b + j0 * csb;
      T *d = dst + q * NR * kc;
      if (csb == 1) { /* rows of op(B) are contiguous */
         for (int64_t p = 0; p < kc; p++) {
            const T *row = bp + p * rsb;
            T *dp = d + p * NR;
            int j = 0;
            for (; j < nr; j++) dp[j] = row[j];
            for (; j < NR; j++) dp[j] = (T)0;
         }
      } else {
         for (int j = 0; j < nr; j++) {
            const T *col = bp + j * csb;
            if (rsb == 1) {
               for (int64_t p = 0; p < kc; p++) d[p * NR + j] = col[p];
            } else {
               for (int64_t p = 0; p < kc; p++) d[p * NR + j] = col[p * rsb];
            }
         }
         for (int j = nr; j < NR; j++)
            for (int64_t p = 0; p < kc; p++) d[p * NR + j] = (T)0;
      }
   }
}

/* row micro-panels of the mc x kc block of op(A) (element (i,p) at a[i*rsa + p*csa]): panel r
 * holds rows r*MR .. r*MR+MR-1 as dst[r][p][i], rows past mc zeroed. That is exactly pack_b of
 * the transposed block (rows and columns swapped), so it reuses that loop. */
static void GNAME(pack_a)(int64_t mc, int64_t kc, const T *a, int64_t rsa, int64_t csa, int MR,
                          T *dst) {
   GNAME(pack_b)(kc, mc, a, csa, rsa, MR, 0, (mc + MR - 1) / MR, dst);
}


/* Unpacked loops for rows [i0, i1): per row, blocks of up to JB columns accumulated in a stack
 * buffer, as dot products when A's rows and B's columns are contiguous, else as axpys over the
 * rows of B. Reads C only when beta != 0. */
static void GNAME(direct_rows)(int64_t i0, int64_t i1, int64_t n, int64_t k, T alpha, const T *a,
                               int64_t rsa, int64_t csa, const T *b, int64_t rsb, int64_t csb,
                               T beta, T *c, int64_t rsc, int64_t csc) {
   enum { JB = 256 };
   T acc[JB];
   for (int64_t i = i0; i < i1; i++) {
      const T *ai = a + i * rsa;
      T *ci = c + i * rsc;
      for (int64_t j0 = 0; j0 < n; j0 += JB) {
         int nb = (int)imin(JB, n - j0);
         if (csa == 1 && rsb == 1 && csb != 1) {
            for (int j = 0; j < nb; j++) {
               const T *bj = b + (j0 + j) * csb;
               T s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
               int64_t p = 0;
               for (; p + 8 <= k; p += 8) {
                  s0 += ai[p] * bj[p];
                  s1 += ai[p + 1] * bj[p + 1];
                  s2 += ai[p + 2] * bj[p + 2];
                  s3 += ai[p + 3] * bj[p + 3];
                  s4 += ai[p + 4] * bj[p + 4];
                  s5 += ai[p + 5] * bj[p + 5];
                  s6 += ai[p + 6] * bj[p + 6];
                  s7 += ai[p + 7] * bj[p + 7];
               }
               for (; p < k; p++) s0 += ai[p] * bj[p];
               acc[j] = ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7));
            }
         } else {
            for (int j = 0; j < nb; j++) acc[j] = 0;
            for (int64_t p = 0; p < k; p++) {
               T av = ai[p * csa];
               const T *bp = b + p * rsb + j0 * csb;
               if (csb == 1) {
                  for (int j = 0; j < nb; j++) acc[j] += av * bp[j];
               } else {
                  for (int j = 0; j < nb; j++) acc[j] += av * bp[j * csb];
               }
            }
         }
         T *cj = ci + j0 * csc;
         if (beta == 0) {
            for (int j = 0; j < nb; j++) cj[j * csc] = alpha * acc[j];
         } else {
            for (int j = 0; j < nb; j++) cj[j * csc] = alpha * acc[j] + beta * cj[j * csc];
         }
      }
   }
}

/* one block of the unpacked path on the calling thread: the ISA's own loops when it has them */
static void GNAME(direct_block)(int isa, int64_t m, int64_t n, int64_t k, T alpha, const T *a,
                                int64_t rsa, int64_t csa, const T *b, int64_t rsb, int64_t csb,
                                T beta, T *c, int64_t rsc, int64_t csc) {
#if GEMM_IS_FLOAT
   if (isa >= LM_ISA_AVX512 &&
       lm_sgemm_direct_avx512(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc))
      return;
#else
   (void)isa;
#endif
   GNAME(direct_rows)(0, m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc);
}

/* the unpacked path on nt threads: rows split, or columns when there are fewer rows than threads */
static void GNAME(direct)(int isa, int64_t m, int64_t n, int64_t k, T alpha, const T *a,
                          int64_t rsa, int64_t csa, const T *b, int64_t rsb, int64_t csb, T beta,
                          T *c, int64_t rsc, int64_t csc, int nt) {
   if (nt > 1 && m >= 4 * nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int t = 0; t < nt; t++) {
         int64_t i0 = m * t / nt, i1 = m * (t + 1) / nt;
         GNAME(direct_block)(isa, i1 - i0, n, k, alpha, a + i0 * rsa, rsa, csa, b, rsb, csb,
                             beta, c + i0 * rsc, rsc, csc);
      }
   } else if (nt > 1 && n >= nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int t = 0; t < nt; t++) {
         int64_t j0 = n * t / nt, j1 = n * (t + 1) / nt;
         GNAME(direct_block)(isa, m, j1 - j0, k, alpha, a, rsa, csa, b + j0 * csb, rsb, csb,
                             beta, c + j0 * csc, rsc, csc);
      }
   } else {
      GNAME(direct_block)(isa, m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc);
   }
}

/* the macro-kernel: every NR x MR tile of one packed A block times one B panel. B packed: its
   micro-panel jr at bp + jr * kc. B read in place (float only, lm_sgemm_ukr_s_fn): sb != 0 is
   its row stride, micro-panel jr at bp + jr, and a partial last micro-panel, which the tile would
   read past, packed at btail. */
/* epi (float only, C dense by rows): the epilogue on each tile after its ukr call, C's first
   column being col0 (the caller passes epi with the last k block only) */
static void GNAME(pack_a_any)(const GEMM_CFG *cf, int64_t mc, int64_t kc, const T *a,
                              int64_t rsa, int64_t csa, T *dst);
static void GNAME(macro)(const GEMM_CFG *cf, int64_t mc, int64_t nc, int64_t kc, T alpha,
                         const T *ap, int64_t sa, const T *bp, int64_t sb, const T *btail, T beta,
                         T *c, int64_t rsc, int64_t csc, const lm_gemm_epi *epi, int64_t col0,
                         T *atail) {
   const int MR = cf->mr, NR = cf->nr;
   /* A read in place (sa != 0: A's column of MR values a step at ap + ir + p * sa): a partial
      last row panel, which the tile would read past, packed at atail first */
   if (sa != 0 && mc % MR)
      GNAME(pack_a_any)(cf, mc % MR, kc, ap + mc / MR * MR, 1, sa, atail);
   for (int64_t jr = 0; jr < nc; jr += NR) {
      const int nr = (int)imin(NR, nc - jr);
      const T *pb = sb == 0 ? bp + jr * kc : nr < NR ? btail : bp + jr;
      const int64_t sbj = sb == 0 || nr < NR ? NR : sb;
      T *cc = c + jr * csc;
      for (int64_t ir = 0; ir < mc; ir += MR) {
         const int mr = (int)imin(MR, mc - ir);
#if GEMM_IS_FLOAT
         if (sa != 0)
            cf->ukr_s(kc, mr < MR ? atail : ap + ir, mr < MR ? MR : sa, pb, sbj, cc + ir * rsc,
                      rsc, csc, alpha, beta, mr, nr);
         else if (sb != 0)
            cf->ukr_s(kc, ap + ir * kc, MR, pb, sbj, cc + ir * rsc, rsc, csc, alpha, beta, mr,
                      nr);
         else
#else
         (void)sbj, (void)sa, (void)atail;
#endif
            cf->ukr(kc, ap + ir * kc, pb, cc + ir * rsc, rsc, csc, alpha, beta, mr, nr);
#if GEMM_IS_FLOAT
         if (epi) {
            if (lm_cpu_isa() >= LM_ISA_AVX512)
               lm_gemm_epi_tile_avx512(epi, cc + ir * rsc, mr, nr, rsc, col0 + jr);
            else if (lm_cpu_isa() == LM_ISA_AVX2)
               lm_gemm_epi_tile_avx2(epi, cc + ir * rsc, mr, nr, rsc, col0 + jr);
            else
               lm_gemm_epi_tile_c(epi, cc + ir * rsc, mr, nr, rsc, col0 + jr);
         }
#else
         (void)epi, (void)col0;
#endif
      }
   }
}

static void GNAME(pack_a_any)(const GEMM_CFG *cf, int64_t mc, int64_t kc, const T *a,
                              int64_t rsa, int64_t csa, T *dst) {
   if (cf->pack_a)
      cf->pack_a(mc, kc, a, rsa, csa, dst);
   else
      GNAME(pack_a)(mc, kc, a, rsa, csa, cf->mr, dst);
}

static void GNAME(pack_b_any)(const GEMM_CFG *cf, int64_t kc, int64_t nc, const T *b,
                              int64_t rsb, int64_t csb, int64_t q0, int64_t q1, T *dst) {
   if (cf->pack_b)
      cf->pack_b(kc, nc, b, rsb, csb, q0, q1, dst);
   else
      GNAME(pack_b)(kc, nc, b, rsb, csb, cf->nr, q0, q1, dst);
}

#if GEMM_IS_FLOAT
/* Whether the nest reads B in place rather than packing it. Packing B costs a pass over it (a read
   from memory, a write to L3 or L2, and the team's barrier) and pays back through its reuse: each
   element of B serves the m rows of A. Where m is small that pass is a large share of the
   product. B stored by rows is read in place by the tile's own loads instead (unaligned,
   prefetched ahead), overlapped with its FMAs. Measured on the Intel Xeon of session 25 (2
   threads, the packed and in-place libraries alternated in one process; GFLOP/s): the weight
   gradients 384 x 25088 x 96 (A transposed) 146 -> 190, 192 x 6272 x 768 165 -> 190,
   384 x 1568 x 1536 165 -> 175, 768 x 6272 x 192 192 -> 200, 256 x 4096 x 256 200 -> 250; but
   768 x 392 x 3072 224 -> 184 and 1024^3 240 -> 170: with many rows, the packed panel, shared
   by both threads and contiguous, wins. Reading A in place (stored by columns, the 14 values a
   step from 1.5 KiB-apart lines) was measured too and lost everywhere (384 x 25088 x 96: 146 ->
   140; 768 x 6272 x 192: 191 -> 152). Not for a row stride equal to NR (the tile takes that
   stride as packed, with aligned loads). LUMEN_GEMM_INPLACE=0 / 1 forces it off / on where the
   layout allows (measurement only). */
static int GNAME(inplace_forced)(void) {
   static int forced_env = -2; /* read once; GEMMs may run on several threads at once */
   int forced = __atomic_load_n(&forced_env, __ATOMIC_RELAXED);
   if (forced == -2) {
      const char *e = getenv("LUMEN_GEMM_INPLACE");
      forced = e && *e ? atoi(e) : -1;
      __atomic_store_n(&forced_env, forced, __ATOMIC_RELAXED);
   }
   return forced;
}

static int GNAME(b_inplace)(int64_t m, int64_t rsb, int64_t csb, int NR) {
   const int forced = GNAME(inplace_forced)();
   if (!(csb == 1 && rsb != NR && rsb >= NR)) return 0;
   return forced >= 0 ? forced != 0 : m <= LM_GEMM_INPLACE_MAX_ROWS;
}

/* Whether the nest reads A in place (stored by columns: op(A)(i, p) at a[i + p * csa], the
   transposed operand of a weight gradient) rather than packing it. Each packed element of A
   serves the n columns of B; with few columns the packing pass is a large share. Only where the
   ISA's tile gains from it (cf->a_ip_n: the most columns; 0: never). Measured on a Zen 3 with
   the AVX2 tile (2 threads, packed against in place in one process; GFLOP/s): 144 x 25088 x 24
   20 -> 38, 24 x 25088 x 144 43 -> 60, 384 x 25088 x 96 70 -> 100, 96 x 100352 x 16 18 -> 33,
   192 x 6272 x 768 72 -> 82; with more rows or columns it lost (768 x 6272 x 192 94 -> 86,
   384 x 1568 x 1536 63 -> 57, 1024^3 110 -> 76). On AVX-512 it lost everywhere (b_inplace).
   LUMEN_GEMM_INPLACE=0 / 1 forces it off / on as for B. */
static int GNAME(a_inplace)(const GEMM_CFG *cf, int64_t m, int64_t n, int64_t rsa, int64_t csa) {
   const int forced = GNAME(inplace_forced)();
   if (!cf->ukr_s || !(rsa == 1 && csa >= cf->mr)) return 0;
   if (forced >= 0) return forced != 0 && cf->a_ip_n > 0;
   return m <= LM_GEMM_INPLACE_MAX_ROWS && n <= cf->a_ip_n;
}
#endif

/* The packed BLIS loop nest on nt threads.
 * Row split (the usual case): each thread owns a balanced share of the rows, in MC-row blocks; the
 * team packs each KC x NC panel of B together, then every thread packs its own blocks of A and runs
 * the macro-kernel on them, and takes blocks from the others' ends when it runs out (gemm_queue). Column split (few rows, many columns): each thread owns a range of
 * columns and runs the whole nest alone with its own B. */
static void GNAME(packed)(const GEMM_CFG *cf, int64_t m, int64_t n, int64_t k, T alpha,
                          const T *a, int64_t rsa, int64_t csa, const T *b, int64_t rsb,
                          int64_t csb, T beta, T *c, int64_t rsc, int64_t csc, int nt,
                          const lm_gemm_epi *epi) {
   const int MR = cf->mr, NR = cf->nr;
   const int64_t panels_m = (m + MR - 1) / MR, panels_n = (n + NR - 1) / NR;
   if (nt > LM_GEMM_MAX_THREADS) nt = LM_GEMM_MAX_THREADS;
   int split_m = 1;
   if (nt > 1 && panels_m < 4 * nt && panels_n > panels_m) split_m = 0;
   if (split_m && panels_m < nt) nt = (int)imax(1, panels_m);
   if (!split_m && panels_n < nt) nt = (int)imax(1, panels_n);
   if (nt == 1) split_m = 1;
   /* k blocks of near-equal depth (no short tail block) */
   const int64_t kc_max = (k + (k + cf->kc - 1) / cf->kc - 1) / ((k + cf->kc - 1) / cf->kc);
   /* extent of the split dimension one thread gets (upper bound), in elements */
   const int64_t m_t = split_m ? imin(m, (panels_m + nt - 1) / nt * MR) : m;
   const int64_t n_t = split_m ? n : imin(n, (panels_n + nt - 1) / nt * NR);
   const int64_t mc_blk = even_block(m_t, cf->mc, MR);
   const int64_t nc_blk = even_block(n_t, cf->nc, NR);
   /* workspace: one A block per thread, one B panel (shared) or one per thread; each a multiple
      of 64 elements so every piece stays 64-byte aligned */
   const int64_t a_elems = round_up(round_up(mc_blk, MR) * kc_max, 64);
   const int64_t b_elems = round_up(round_up(nc_blk, NR) * kc_max, 64);
   const int nbuf_b = split_m ? 1 : nt;
   const size_t bytes = (size_t)(a_elems * nt + b_elems * nbuf_b) * sizeof(T);
   T *buf = (T *)lm_alloc(bytes);
   if (!buf) { /* no memory for the workspace: the unpacked loops need none */
      lm_clear_error();
      GNAME(direct)(LM_ISA_C, m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, nt);
#if GEMM_IS_FLOAT
      if (epi) lm_gemm_epi_tile_c(epi, c, m, n, rsc, 0);
#endif
      return;
   }
   const GEMM_CFG cfg = *cf;
   /* B read in place instead of packed (float, where the ISA has the kernel for it), see
      GNAME(b_inplace) */
   int b_ip = 0;
#if GEMM_IS_FLOAT
   if (cf->ukr_s) b_ip = GNAME(b_inplace)(m, rsb, csb, NR);
#endif
   int a_ip = 0; /* A read in place, see GNAME(a_inplace) */
#if GEMM_IS_FLOAT
   a_ip = GNAME(a_inplace)(cf, m, n, rsa, csa);
#endif

   if (split_m) {
      gemm_queue queues[LM_GEMM_MAX_THREADS];
#pragma omp parallel num_threads(nt)
      {
         int tid = 0, ntt = 1;
#ifdef _OPENMP
         tid = omp_get_thread_num();
         ntt = omp_get_num_threads();
#endif
         T *ap = buf + tid * a_elems, *bp = buf + nt * a_elems;
         for (int64_t jc = 0; jc < n; jc += nc_blk) {
            const int64_t nc = imin(nc_blk, n - jc);
            const int64_t npan = (nc + NR - 1) / NR;
            for (int64_t pc = 0; pc < k; pc += kc_max) {
               const int64_t kc = imin(kc_max, k - pc);
               const T beta_eff = pc == 0 ? beta : (T)1;
               const T *bsrc = b + pc * rsb + jc * csb;
               /* this thread's rows (a balanced share of the MR-row micro-panels) in blocks */
               {
                  const int64_t m0 = imin(m, panels_m * tid / ntt * MR);
                  const int64_t m1 = imin(m, panels_m * (tid + 1) / ntt * MR);
                  queue_reset(&queues[tid], (m1 - m0 + mc_blk - 1) / mc_blk);
               }
               /* the B panel, packed by the whole team (the loop ends with a barrier, after which
                  every queue is set) */
               /* (B read in place: only a partial last micro-panel is packed) */
               const int64_t q_first = !b_ip ? 0 : nc % NR ? npan - 1 : npan;
#pragma omp for schedule(dynamic, 1)
               for (int64_t q = q_first; q < npan; q += 4)
                  GNAME(pack_b_any)(&cfg, kc, nc, bsrc, rsb, csb, q, imin(q + 4, npan), bp);
               for (int o = 0; o < ntt; o++) { /* own blocks first, then steal */
                  const int v = (tid + o) % ntt;
                  const int64_t m0 = imin(m, panels_m * v / ntt * MR);
                  const int64_t m1 = imin(m, panels_m * (v + 1) / ntt * MR);
                  int64_t blk;
                  while (queue_take(&queues[v], o != 0, &blk)) {
                     const int64_t ic = m0 + blk * mc_blk, mc = imin(mc_blk, m1 - ic);
                     if (!a_ip)
                        GNAME(pack_a_any)(&cfg, mc, kc, a + ic * rsa + pc * csa, rsa, csa, ap);
                     GNAME(macro)(&cfg, mc, nc, kc, alpha,
                                  a_ip ? a + ic * rsa + pc * csa : ap, a_ip ? csa : 0,
                                  b_ip ? bsrc : bp, b_ip ? rsb : 0, bp + (npan - 1) * NR * kc,
                                  beta_eff, c + ic * rsc + jc * csc, rsc, csc,
                                  pc + kc >= k ? epi : NULL, jc, ap);
                  }
               }
               /* nobody repacks B or resets a queue while another thread still works */
#pragma omp barrier
            }
         }
      }
   } else {
#pragma omp parallel num_threads(nt)
      {
         int tid = 0, ntt = 1;
#ifdef _OPENMP
         tid = omp_get_thread_num();
         ntt = omp_get_num_threads();
#endif
         const int64_t n0 = imin(n, panels_n * tid / ntt * NR);
         const int64_t n1 = imin(n, panels_n * (tid + 1) / ntt * NR);
         T *ap = buf + tid * a_elems, *bp = buf + nt * a_elems + tid * b_elems;
         for (int64_t jc = n0; jc < n1; jc += nc_blk) {
            const int64_t nc = imin(nc_blk, n1 - jc);
            for (int64_t pc = 0; pc < k; pc += kc_max) {
               const int64_t kc = imin(kc_max, k - pc);
               const T beta_eff = pc == 0 ? beta : (T)1;
               const T *bsrc = b + pc * rsb + jc * csb;
               const int64_t npan = (nc + NR - 1) / NR;
               if (!b_ip)
                  GNAME(pack_b_any)(&cfg, kc, nc, bsrc, rsb, csb, 0, npan, bp);
               else if (nc % NR)
                  GNAME(pack_b_any)(&cfg, kc, nc, bsrc, rsb, csb, npan - 1, npan, bp);
               for (int64_t ic = 0; ic < m; ic += mc_blk) {
                  const int64_t mc = imin(mc_blk, m - ic);
                  if (!a_ip)
                     GNAME(pack_a_any)(&cfg, mc, kc, a + ic * rsa + pc * csa, rsa, csa, ap);
                  GNAME(macro)(&cfg, mc, nc, kc, alpha, a_ip ? a + ic * rsa + pc * csa : ap,
                               a_ip ? csa : 0, b_ip ? bsrc : bp, b_ip ? rsb : 0,
                               bp + (npan - 1) * NR * kc, beta_eff, c + ic * rsc + jc * csc,
                               rsc, csc, pc + kc >= k ? epi : NULL, jc, ap);
               }
            }
         }
      }
   }
   lm_free(buf, bytes);
}

/* epi: NULL, or (float, alpha 1, beta 0, csc 1) the epilogue, fused into the packed nest or run
   over C after the unpacked paths */
static void GNAME(strided_impl)(int64_t m, int64_t n, int64_t k, T alpha, const T *a,
                                int64_t rsa, int64_t csa, const T *b, int64_t rsb, int64_t csb,
                                T beta, T *c, int64_t rsc, int64_t csc, const lm_gemm_epi *epi) {
   if (m <= 0 || n <= 0) return;
#if GEMM_IS_FLOAT
   if (epi && (k <= 0 || (n == 1 && m > 1 && rsa == 1 && csa != 1) ||
               (double)m * (double)n * (double)k <= LM_GEMM_SMALL_WORK_AVX512 || m == 1)) {
      /* paths that swap the operands or skip the packed nest: the epilogue after */
      GNAME(strided_impl)(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, NULL);
      lm_gemm_epi_tile_c(epi, c, m, n, rsc, 0);
      return;
   }
#endif
   if (k <= 0 || alpha == 0) { /* C = beta * C; beta == 0 writes zeros without reading C */
      for (int64_t i = 0; i < m; i++)
         for (int64_t j = 0; j < n; j++) {
            T *cij = c + i * rsc + j * csc;
            *cij = beta == 0 ? (T)0 : beta * *cij;
         }
      return;
   }
   /* column-major C, or a matrix-vector product with op(A) stored by columns: compute
      C^T = op(B)^T op(A)^T instead (rows of C^T contiguous; the vector becomes the 1-row side) */
   if ((csc != 1 && rsc == 1) || (n == 1 && m > 1 && rsa == 1 && csa != 1)) {
      int64_t t;
      const T *tp = a;
      a = b;
      b = tp;
      t = m; m = n; n = t;
      t = rsa; rsa = csb; csb = t;
      t = csa; csa = rsb; rsb = t;
      t = rsc; rsc = csc; csc = t;
   }
   const double work = (double)m * (double)n * (double)k;
   int nt = gemm_threads();
   if (nt > 1 && work < LM_GEMM_WORK_PER_THREAD * nt) {
      nt = (int)(work / LM_GEMM_WORK_PER_THREAD);
      if (nt < 1) nt = 1;
   }
   int isa = lm_cpu_isa();
   /* the implementations switched off by name (src/impl.h): the next ISA down */
   if (isa >= LM_ISA_AVX512 && !lm_impl_on(LM_IMPL_MM_AVX512)) isa = LM_ISA_AVX2;
   if (isa == LM_ISA_AVX2 && !lm_impl_on(LM_IMPL_MM_AVX2)) isa = LM_ISA_C;
   lm_impl_ran(isa >= LM_ISA_AVX512 ? LM_IMPL_MM_AVX512
               : isa == LM_ISA_AVX2 ? LM_IMPL_MM_AVX2
                                    : LM_IMPL_MM_PORTABLE);
   const double small = (GEMM_IS_FLOAT && isa >= LM_ISA_AVX512) ? LM_GEMM_SMALL_WORK_AVX512
                                                                   : LM_GEMM_SMALL_WORK;
   if (work <= small || m == 1 || n == 1) {
      GNAME(direct)(isa, m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, nt);
#if GEMM_IS_FLOAT
      if (epi) lm_gemm_epi_tile_c(epi, c, m, n, rsc, 0);
#endif
      return;
   }
   const GEMM_CFG cf = GEMM_CONFIG(isa);
   GNAME(packed)(&cf, m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, nt, epi);
}

void GCAT(lm_, GNAME(strided))(int64_t m, int64_t n, int64_t k, T alpha, const T *a, int64_t rsa,
                               int64_t csa, const T *b, int64_t rsb, int64_t csb, T beta, T *c,
                               int64_t rsc, int64_t csc) {
   GNAME(strided_impl)(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc, NULL);
}

#if GEMM_IS_FLOAT
void lm_sgemm_strided_epi(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa,
                          int64_t csa, const float *b, int64_t rsb, int64_t csb, float *c,
                          int64_t rsc, const lm_gemm_epi *epi) {
   GNAME(strided_impl)(m, n, k, 1.0f, a, rsa, csa, b, rsb, csb, 0.0f, c, rsc, 1, epi);
}
#endif

#else
/* compiled on its own: nothing (gemm.c instantiates the template) */
typedef int lm_gemm_tmpl_empty_unit;
#endif
