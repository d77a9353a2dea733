// Error checking for CUDA runtime and cuBLASLt calls. Usable from .cu and .cpp files (no
// fmt: it does not compile under nvcc -std=c++20). Every failure becomes a moeserve::Error
// naming the call, the file and line, and CUDA's own message.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace moeserve::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw Error(std::string("CUDA error: ") + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ") in " +
              expr + " at " + file + ":" + std::to_string(line));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line) {
  throw Error(std::string("cuBLASLt error ") + std::to_string(int(st)) + " in " + expr + " at " + file + ":" +
              std::to_string(line));
}

}  // namespace moeserve::cuda

#define MOESERVE_CUDA_CHECK(expr)                                                              \
  do {                                                                                         \
    cudaError_t _err = (expr);                                                                 \
    if (_err != cudaSuccess) ::moeserve::cuda::throw_cuda_error(_err, #expr, __FILE__, __LINE__); \
  } while (0)

#define MOESERVE_CUBLAS_CHECK(expr)                                                                     \
  do {                                                                                                  \
    cublasStatus_t _st = (expr);                                                                        \
    if (_st != CUBLAS_STATUS_SUCCESS) ::moeserve::cuda::throw_cublas_error(_st, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: catches bad launch configurations immediately.
#define MOESERVE_CUDA_CHECK_LAUNCH() MOESERVE_CUDA_CHECK(cudaGetLastError())
