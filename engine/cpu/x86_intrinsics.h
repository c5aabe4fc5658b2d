// <immintrin.h> for the CPU kernels, on x86-64 only. GCC 12's AVX-512
// headers trip -Wmaybe-uninitialized and -Wuninitialized on their own
// placeholder operands (GCC bug 105593); the kernels read nothing
// uninitialised, so an including file has both warnings off.
#pragma once

#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#endif
