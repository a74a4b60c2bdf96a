// RA_HD marks the small functions of the vocabulary layer (mask.hpp, state.hpp) that host C++ and
// CUDA device code both call: __host__ __device__ when nvcc reads them, plain inline otherwise.
#pragma once

#if defined(__CUDACC__)
#define RA_HD __host__ __device__ __forceinline__
#else
#define RA_HD inline
#endif
