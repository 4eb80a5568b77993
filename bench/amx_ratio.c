/* bench/amx_ratio.c -- the AMX GEMM as a share of the TDPBF16PS peak, measured in alternation:
 * each round times the peak loop, the product (best of 5 calls) and the peak again, and takes
 * the product over the mean of the two peaks; prints the median share over the rounds (the
 * host's AMX rate drifts by 2x within minutes, so a peak from another minute misleads).
 *   cc -O2 -fopenmp -Isrc -mamx-tile -mamx-bf16 bench/amx_ratio.c -Lbuild -llumen \
 *      -Wl,-rpath,$PWD/build -o /tmp/amx_ratio
 *   /tmp/amx_ratio M N K ROUNDS THREADS     e.g. /tmp/amx_ratio 1024 1024 1024 9 2 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <omp.h>
#include <immintrin.h>
#include "lumen.h"

void lm_bgemm_strided(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a, int64_t rsa, int64_t csa, const uint16_t *b, int64_t rsb, int64_t csb, float beta, float *c, int64_t rsc, int64_t csc);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
typedef struct { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static const cfg_t cfg __attribute__((aligned(64))) = {1,0,{0},{64,64,64,64,64,64,64,64},{16,16,16,16,16,16,16,16}};
static double peak(int nt){ long steps=200000; double t0=now();
#pragma omp parallel num_threads(nt)
 { _tile_loadconfig(&cfg); uint16_t buf[512] __attribute__((aligned(64))); for(int i=0;i<512;i++) buf[i]=0x3f80^(rand()&0x807f);
   _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);_tile_loadd(4,buf,64);_tile_loadd(5,buf,64);_tile_loadd(6,buf,64);_tile_loadd(7,buf,64);
   for(long i=0;i<steps;i++){_tile_dpbf16ps(0,4,6);_tile_dpbf16ps(1,4,7);_tile_dpbf16ps(2,5,6);_tile_dpbf16ps(3,5,7);}
   _tile_stored(0,buf,64); _tile_release(); }
 return (double)steps*4*16384*nt/(now()-t0)*1e-9; }
static int cmpd(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){ int64_t m=atoi(argv[1]),n=atoi(argv[2]),k=atoi(argv[3]); int rounds=atoi(argv[4]); int nt=argc>5?atoi(argv[5]):1;
 omp_set_num_threads(nt); lm_cpu_amx_available();
 uint16_t*a=malloc(m*k*2),*b=malloc(k*n*2); float*c=malloc(m*n*4);
 for(int64_t i=0;i<m*k;i++)a[i]=0x3f80^(rand()&0x807f); for(int64_t i=0;i<k*n;i++)b[i]=0x3f80^(rand()&0x807f);
 lm_cpu_set_isa(5); double r[64], g[64], p[64];
 for(int q=0;q<rounds;q++){ double pk=peak(nt); double best=1e9; for(int j=0;j<5;j++){double t0=now(); lm_bgemm_strided(m,n,k,1,a,k,1,b,n,1,0,c,n,1); double t=now()-t0; if(t<best)best=t;}
   double pk2=peak(nt); g[q]=2.0*m*n*k/best*1e-9; p[q]=(pk+pk2)/2; r[q]=g[q]/p[q]; }
 qsort(r,rounds,8,cmpd); qsort(g,rounds,8,cmpd); qsort(p,rounds,8,cmpd);
 printf("%ldx%ldx%ld nt %d: ratio median %.1f%% (min %.1f max %.1f); gemm median %.0f, peak median %.0f\n",m,n,k,nt,100*r[rounds/2],100*r[0],100*r[rounds-1],g[rounds/2],p[rounds/2]);}
