// Launch cost on a real GPU: an empty kernel launched N times through the CUDA runtime (which reaches the driver
// through cuGetProcAddress, where the hook wraps cuLaunchKernel), then one synchronize. Prints the mean wall
// time per launch in ns. run_all.sh runs it alternately unhooked and under `tessera run --gpu-cores 100` and
// reports the medians: the hook's added cost per launch on the real driver (hook_launch_bench measures it on
// the fake driver in CI).
//   nvcc -O2 -o /tmp/launch_bench tests/gpu/launch_bench.cu && /tmp/launch_bench 200000
#include <chrono>
#include <cstdio>
#include <cstdlib>

__global__ void Empty() {}

int main(int argc, char** argv) {
  const long n = argc > 1 ? atol(argv[1]) : 200000;
  Empty<<<1, 1>>>();  // the context, the module and the first launch outside the timing
  if (cudaDeviceSynchronize() != cudaSuccess) {
    fprintf(stderr, "launch_bench: no CUDA device\n");
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) Empty<<<1, 1>>>();
  cudaDeviceSynchronize();
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  printf("%.1f\n", ns / static_cast<double>(n));
  return 0;
}
