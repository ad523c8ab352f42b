// Reciprocal throughput of the 512-bit operations the 8-row kernels use, on the CPU it runs on
// (BENCHMARKS.md, session 42: the Zen 4 VM). Eight independent chains of one instruction
// (or a mix), timed with rdtsc and scaled to core cycles by a dependent scalar add chain.
// Build and run: gcc -O2 -mavx512f -mavx512bw -mavx512vbmi -mavx512vnni -mavx512bitalg \
//   -mgfni -mavx512bf16 -o /tmp/uops cpu-experts/dev/uops.c && /tmp/uops
#include <stdio.h>
#include <stdint.h>
#include <x86intrin.h>
#define N 10000000L
static double t(void (*f)(long)) { f(1000); uint64_t a=__rdtsc(); f(N); uint64_t b=__rdtsc(); return (double)(b-a)/N; }
// dependent scalar add chain: 8 adds per iter -> 8 cycles
static void chain(long n){ long x=0; for(long i=0;i<n;i++){ __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0":"+r"(x)); } }
#define TP(name, ins) static void name(long n){ for(long i=0;i<n;i++){ __asm__ volatile( \
 ins(0) ins(1) ins(2) ins(3) ins(4) ins(5) ins(6) ins(7) \
 ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","k1","k2","k3","k4","k5","k6","k7"); } }
#define I_DPBUSD(r) "vpdpbusd %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_VPERMB(r) "vpermb %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_VPERMT2B(r) "vpermt2b %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_VPERMI2B(r) "vmovdqa64 %%zmm22,%%zmm" #r "\n\tvpermi2b %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_MOV(r) "vmovdqa64 %%zmm22,%%zmm" #r "\n\t"
#define I_SHUFBIT(r) "vpshufbitqmb %%zmm20,%%zmm21,%%k1\n\t"
#define I_PSHUFB(r) "vpshufb %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_AND(r) "vpandd %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_MULLD(r) "vpmulld %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_GF2P8(r) "vgf2p8affineqb $0,%%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_MSHIFT(r) "vpmultishiftqb %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_BLEND(r) "vpblendmb %%zmm20,%%zmm21,%%zmm" #r "%{%%k2%}\n\t"
#define I_MSUB(r) "vpsubb %%zmm20,%%zmm21,%%zmm" #r "%{%%k2%}\n\t"
#define I_VPERMD(r) "vpermd %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_BCASTQ(r) "vpbroadcastq (%%rsp),%%zmm" #r "\n\t"
#define I_FMA(r) "vfmadd231ps %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_FMAY(r) "vfmadd231ps %%ymm20,%%ymm21,%%ymm" #r "\n\t"
#define I_DPBUSDY(r) "vpdpbusd %%ymm20,%%ymm21,%%ymm" #r "\n\t"
#define I_VPERMT2BY(r) "vpermt2b %%ymm20,%%ymm21,%%ymm" #r "\n\t"
#define I_VPERMBY(r) "vpermb %%ymm20,%%ymm21,%%ymm" #r "\n\t"
#define I_CVTPH(r) "vcvtph2ps %%ymm20,%%zmm" #r "\n\t"
#define I_PMOVZX(r) "vpmovzxwd %%ymm20,%%zmm" #r "\n\t"
#define I_DPWSSD(r) "vpdpwssd %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_MADDUBS(r) "vpmaddubsw %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_DPBF16(r) "vdpbf16ps %%zmm20,%%zmm21,%%zmm" #r "\n\t"
#define I_TESTMB(r) "vptestmb %%zmm20,%%zmm21,%%k1\n\t"
#define I_MOVB2M(r) "vpmovb2m %%zmm20,%%k1\n\t"
TP(dpbusd,I_DPBUSD) TP(vpermb,I_VPERMB) TP(vpermt2b,I_VPERMT2B) TP(vpermi2b,I_VPERMI2B) TP(mov,I_MOV) TP(shufbit,I_SHUFBIT)
TP(pshufb,I_PSHUFB) TP(and_,I_AND) TP(mulld,I_MULLD) TP(gf2p8,I_GF2P8) TP(mshift,I_MSHIFT) TP(blend,I_BLEND) TP(msub,I_MSUB)
TP(vpermd,I_VPERMD) TP(bcastq,I_BCASTQ) TP(fmaz,I_FMA) TP(fmay,I_FMAY) TP(dpbusdy,I_DPBUSDY) TP(vpermt2by,I_VPERMT2BY) TP(vpermby,I_VPERMBY)
TP(cvtph,I_CVTPH) TP(pmovzx,I_PMOVZX) TP(dpwssd,I_DPWSSD) TP(maddubs,I_MADDUBS) TP(dpbf16,I_DPBF16) TP(testmb,I_TESTMB) TP(movb2m,I_MOVB2M)
// gathers of eight qwords (vpgatherdq) from a 16 KiB table in L1/L2, indices in ymm23
static uint64_t table[2048] __attribute__((aligned(64)));
static void gatherq(long n){ for(long i=0;i<n;i++){ __asm__ volatile(
 "kxnorb %%k0,%%k0,%%k1\n\tvpgatherdq (%0,%%ymm23,8),%%zmm0%{%%k1%}\n\t"
 "kxnorb %%k0,%%k0,%%k2\n\tvpgatherdq (%0,%%ymm23,8),%%zmm1%{%%k2%}\n\t"
 "kxnorb %%k0,%%k0,%%k3\n\tvpgatherdq (%0,%%ymm23,8),%%zmm2%{%%k3%}\n\t"
 "kxnorb %%k0,%%k0,%%k4\n\tvpgatherdq (%0,%%ymm23,8),%%zmm3%{%%k4%}\n\t"
 "kxnorb %%k0,%%k0,%%k5\n\tvpgatherdq (%0,%%ymm23,8),%%zmm4%{%%k5%}\n\t"
 "kxnorb %%k0,%%k0,%%k6\n\tvpgatherdq (%0,%%ymm23,8),%%zmm5%{%%k6%}\n\t"
 "kxnorb %%k0,%%k0,%%k7\n\tvpgatherdq (%0,%%ymm23,8),%%zmm6%{%%k7%}\n\t"
 "kxnorb %%k0,%%k0,%%k1\n\tvpgatherdq (%0,%%ymm23,8),%%zmm7%{%%k1%}\n\t"
 ::"r"(table): "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","k1","k2","k3","k4","k5","k6","k7"); } }
// eight scalar loads and inserts into one zmm (what ggml's IQ1 kernels do per eight points)
static void loadins(long n){ const uint64_t *t = table; for(long i=0;i<n;i++){ __asm__ volatile(
 "vmovq 8(%0),%%xmm0\n\tvpinsrq $1,72(%0),%%xmm0,%%xmm0\n\tvmovq 136(%0),%%xmm1\n\tvpinsrq $1,200(%0),%%xmm1,%%xmm1\n\t"
 "vinserti128 $1,%%xmm1,%%ymm0,%%ymm0\n\t"
 "vmovq 264(%0),%%xmm2\n\tvpinsrq $1,328(%0),%%xmm2,%%xmm2\n\tvmovq 392(%0),%%xmm3\n\tvpinsrq $1,456(%0),%%xmm3,%%xmm3\n\t"
 "vinserti128 $1,%%xmm3,%%ymm2,%%ymm2\n\tvinserti64x4 $1,%%ymm2,%%zmm0,%%zmm0\n\t"
 ::"r"(t): "xmm0","xmm1","xmm2","xmm3"); } }
// mixes
static void mix_dp_and(long n){ for(long i=0;i<n;i++){ __asm__ volatile( I_DPBUSD(0) I_AND(1) I_DPBUSD(2) I_AND(3) I_DPBUSD(4) I_AND(5) I_DPBUSD(6) I_AND(7) :::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7"); } }
static void mix_dp_perm(long n){ for(long i=0;i<n;i++){ __asm__ volatile( I_DPBUSD(0) I_VPERMB(1) I_DPBUSD(2) I_VPERMB(3) I_DPBUSD(4) I_VPERMB(5) I_DPBUSD(6) I_VPERMB(7) :::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7"); } }
static void mix_dp_pshufb(long n){ for(long i=0;i<n;i++){ __asm__ volatile( I_DPBUSD(0) I_PSHUFB(1) I_DPBUSD(2) I_PSHUFB(3) I_DPBUSD(4) I_PSHUFB(5) I_DPBUSD(6) I_PSHUFB(7) :::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7"); } }
static void mix_dp_bcast(long n){ for(long i=0;i<n;i++){ __asm__ volatile( I_DPBUSD(0) I_BCASTQ(1) I_DPBUSD(2) I_BCASTQ(3) I_DPBUSD(4) I_BCASTQ(5) I_DPBUSD(6) I_BCASTQ(7) :::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7"); } }
static void mix_fma_pmovzx(long n){ for(long i=0;i<n;i++){ __asm__ volatile( I_FMA(0) I_PMOVZX(1) I_FMA(2) I_PMOVZX(3) I_FMA(4) I_PMOVZX(5) I_FMA(6) I_PMOVZX(7) :::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7"); } }
int main(){
  double c = t(chain)/8; printf("TSC ticks per core cycle: %.3f\n", c);
  struct { const char*n; void(*f)(long); } T[] = {
   {"vpdpbusd zmm",dpbusd},{"vpdpbusd ymm",dpbusdy},{"vpdpwssd zmm",dpwssd},{"vpmaddubsw zmm",maddubs},{"vdpbf16ps zmm",dpbf16},{"vfmadd231ps zmm",fmaz},{"vfmadd231ps ymm",fmay},
   {"vpermb zmm",vpermb},{"vpermb ymm",vpermby},{"vpermt2b zmm",vpermt2b},{"vpermt2b ymm",vpermt2by},{"mov+vpermi2b zmm",vpermi2b},{"vmovdqa64 zmm",mov},
   {"vpshufbitqmb zmm",shufbit},{"vpshufb zmm",pshufb},{"vpandd zmm",and_},{"vpmulld zmm",mulld},{"vgf2p8affineqb zmm",gf2p8},{"vpmultishiftqb zmm",mshift},
   {"vpblendmb zmm",blend},{"vpsubb{k} zmm",msub},{"vpermd zmm",vpermd},{"vpbroadcastq m64 zmm",bcastq},{"vcvtph2ps zmm",cvtph},{"vpmovzxwd zmm",pmovzx},
   {"vptestmb",testmb},{"vpmovb2m",movb2m},
   {"vpgatherdq zmm (8 qwords)",gatherq},
   {"mix dpbusd+and",mix_dp_and},{"mix dpbusd+vpermb",mix_dp_perm},{"mix dpbusd+pshufb",mix_dp_pshufb},{"mix dpbusd+bcastq",mix_dp_bcast},{"mix fma+pmovzx",mix_fma_pmovzx}};
  __asm__ volatile("vpxord %%zmm23,%%zmm23,%%zmm23" ::: "xmm23");
  { double x=t(loadins)/c; printf("%-24s %.3f cycles per 8 qwords (8 loads, inserts)\n","vmovq/vpinsrq/vinserti",x); }
  for (unsigned i=0;i<sizeof T/sizeof T[0];i++){ double x=t(T[i].f)/c/8; printf("%-24s %.3f cycles/instr (recip tput)\n",T[i].n,x);} }
