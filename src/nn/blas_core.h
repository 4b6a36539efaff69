// blas_core.h: which kernels OpenBLAS runs on this CPU, and better ones when it fell back.
//
// Debian's OpenBLAS is built for every x86-64 CPU it knows (DYNAMIC_ARCH) and picks its kernels by
// the CPU's family and model when it is loaded. A model newer than its table gets the generic
// Prescott (SSE3) kernels: Debian 12's OpenBLAS 0.3.21 does this on Intel's Emerald Rapids (family
// 6, model 207), where sgemm then runs at a fifth of what the same library reaches with its SkylakeX
// kernels, and every matmul of the engine with it. OpenBLAS reads OPENBLAS_CORETYPE only while it
// is loaded, before any code of ours runs, so the one cure from inside a program is to run it again
// with the variable set (blas_core_reexec). docs/training.md, "BLAS kernels".
#ifndef BYTESCALE_NN_BLAS_CORE_H
#define BYTESCALE_NN_BLAS_CORE_H

#include <stddef.h>

typedef struct {
    int avx2_fma;  // AVX2 and FMA, with the OS saving their registers: OpenBLAS's Haswell kernels
    int avx512;    // AVX-512 F, CD, BW, DQ and VL: what its SkylakeX kernels use
} BlasCpu;

// The OPENBLAS_CORETYPE a CPU with `cpu` should run when OpenBLAS chose the kernels named `core`
// (openblas_get_corename()) in a build described by `config` (openblas_get_config()): "SkylakeX"
// or "Haswell" when `core` is a kernel set older than AVX2 that the CPU has outgrown and the build
// can switch (DYNAMIC_ARCH); NULL when OpenBLAS's own choice stands. Never overrides a choice of
// AVX2 kernels or newer, nor a name it does not know.
const char *blas_core_pick(const char *core, const char *config, BlasCpu cpu);

// This CPU's features (zeros off x86).
BlasCpu blas_core_cpu(void);

// blas_core_pick for this process: the loaded OpenBLAS and this CPU.
const char *blas_core_better(void);

// "OpenBLAS 0.3.21, SkylakeX kernels (OPENBLAS_CORETYPE), 1 thread" into buf: what runs the matmuls.
void blas_core_describe(char *buf, size_t n);

// When OpenBLAS fell back (blas_core_better) and OPENBLAS_CORETYPE is not set: set it, say so on
// stderr (once per job: with no MPI launcher, or as its rank 0; not with BS_QUIET=1, which scripts
// that start many runs set, as for the progress line), and exec this program again with
// argv, before anything else has happened. Returns only when nothing needed doing, or when the exec
// failed (then the program goes on with OpenBLAS's own kernels). `who` starts the message.
void blas_core_reexec(const char *who, char **argv);

#endif
