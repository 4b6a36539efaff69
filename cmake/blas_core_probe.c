// blas_core_probe.c: prints the OPENBLAS_CORETYPE this machine should run (nothing when OpenBLAS's
// own choice stands). CMakeLists.txt runs it at configure time and gives the tests that value, as
// `bytescale train` gives it to itself (src/nn/blas_core.h says why).
#include <stdio.h>

#include "nn/blas_core.h"

int main(void) {
    const char *better = blas_core_better();
    if (better) printf("%s", better);
    return 0;
}
