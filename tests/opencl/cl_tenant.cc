// cl_tenant: a small, real OpenCL program used by the tests and the benchmark of libtessera-opencl.so. It
// knows nothing about Tessera: it is run with and without LD_PRELOAD and reports what the OpenCL runtime told
// it, one `key=value` line per fact, so that a test can compare.
//
//   cl_tenant info                       device memory as clGetDeviceInfo reports it
//   cl_tenant fill <MiB>                 buffers of <MiB> until one fails; release all; fill again
//   cl_tenant lifecycle <MiB>            the reference-count, sub-buffer, image, SVM and pipe rules (needs a
//                                        limit of 4 x <MiB>); prints `ok=1` or the first broken rule
//   cl_tenant hold <MiB>                 a buffer of <MiB>, held until stdin closes (two processes,
//                                        one quota)
//   cl_tenant try <MiB>                  one buffer of <MiB>: prints its error code
//   cl_tenant spin <seconds> [--kernel-ms K] [--cpu N] [--window-ms W] [--ext]
//                                        keeps the device busy with kernels of about K ms for <seconds>;
//                                        prints the device time its kernels took (their own profiling events)
//                                        per window of W ms on CLOCK_MONOTONIC: `window=<start_ms>
//                                        share=<0..1>`, `begin_ms=`, and `share=` over the whole run after
//                                        the first 0.5 s.
//                                        --until-stdin-closes stops early when stdin closes.
//                                        --live also prints each window as it ends: `live window=<start_ms>
//                                        share=<0..1> mem=<CL_DEVICE_GLOBAL_MEM_SIZE now>`.
//                                        --ext fetches clEnqueueNDRangeKernel through
//                                        clGetExtensionFunctionAddressForPlatform.
//
// Exit status: 0 on success, 1 on a broken rule or an OpenCL error, 2 on bad arguments.
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <poll.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

namespace {

constexpr size_t kMiB = 1024 * 1024;

struct Cl {
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;
};

[[noreturn]] void Die(const char* what, cl_int err) {
  std::printf("error=%s code=%d\n", what, err);
  std::fflush(stdout);
  std::exit(1);
}

Cl Open() {
  Cl cl;
  cl_uint n = 0;
  cl_int err = clGetPlatformIDs(1, &cl.platform, &n);
  if (err != CL_SUCCESS || n == 0) Die("no OpenCL platform (install pocl-opencl-icd)", err);
  err = clGetDeviceIDs(cl.platform, CL_DEVICE_TYPE_ALL, 1, &cl.device, nullptr);
  if (err != CL_SUCCESS) Die("clGetDeviceIDs", err);
  cl.context = clCreateContext(nullptr, 1, &cl.device, nullptr, nullptr, &err);
  if (cl.context == nullptr) Die("clCreateContext", err);
  const cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
  cl.queue = clCreateCommandQueueWithProperties(cl.context, cl.device, props, &err);
  if (cl.queue == nullptr) Die("clCreateCommandQueueWithProperties", err);
  return cl;
}

cl_ulong DeviceUlong(cl_device_id d, cl_device_info what) {
  cl_ulong v = 0;
  const cl_int err = clGetDeviceInfo(d, what, sizeof(v), &v, nullptr);
  if (err != CL_SUCCESS) Die("clGetDeviceInfo", err);
  return v;
}

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

int Info() {
  Cl cl = Open();
  std::printf("global_mem_size=%llu\n",
              static_cast<unsigned long long>(DeviceUlong(cl.device, CL_DEVICE_GLOBAL_MEM_SIZE)));
  std::printf("max_mem_alloc_size=%llu\n",
              static_cast<unsigned long long>(DeviceUlong(cl.device, CL_DEVICE_MAX_MEM_ALLOC_SIZE)));
  return 0;
}

// Buffers of `mib` until one fails; returns how many were made and the failing error.
std::vector<cl_mem> FillOnce(const Cl& cl, size_t mib, cl_int* failure) {
  std::vector<cl_mem> held;
  *failure = CL_SUCCESS;
  for (int i = 0; i < 4096; ++i) {
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(cl.context, CL_MEM_READ_WRITE, mib * kMiB, nullptr, &err);
    if (m == nullptr) {
      *failure = err;
      break;
    }
    held.push_back(m);
  }
  return held;
}

int Fill(size_t mib) {
  Cl cl = Open();
  cl_int failure = CL_SUCCESS;
  std::vector<cl_mem> held = FillOnce(cl, mib, &failure);
  std::printf("allocated=%zu\nerror=%d\n", held.size(), failure);
  for (cl_mem m : held) clReleaseMemObject(m);
  held = FillOnce(cl, mib, &failure);
  std::printf("allocated_again=%zu\nerror_again=%d\n", held.size(), failure);
  for (cl_mem m : held) clReleaseMemObject(m);
  return 0;
}

int Lifecycle(size_t mib) {
  Cl cl = Open();
  const size_t unit = mib * kMiB;  // the limit is 4 units
  int failures = 0;
  auto check = [&](bool ok, const char* rule) {
    std::printf("%s=%d\n", rule, ok ? 1 : 0);
    if (!ok) ++failures;
  };
  auto buffer = [&](size_t bytes, cl_int* err) {
    return clCreateBuffer(cl.context, CL_MEM_READ_WRITE, bytes, nullptr, err);
  };
  cl_int err = CL_SUCCESS;
  // A single buffer larger than the limit: the size error clCreateBuffer names (it exceeds the
  // CL_DEVICE_MAX_MEM_ALLOC_SIZE the device reports).
  cl_mem huge = buffer(5 * unit, &err);
  check(huge == nullptr && err == CL_INVALID_BUFFER_SIZE, "larger_than_limit_is_invalid_buffer_size");
  // Three units in use; a retained buffer stays charged until its last release.
  cl_mem a = buffer(3 * unit, &err);
  check(a != nullptr, "three_units_fit");
  clRetainMemObject(a);
  clReleaseMemObject(a);
  cl_mem b = buffer(2 * unit, &err);
  check(b == nullptr && err == CL_MEM_OBJECT_ALLOCATION_FAILURE, "retained_buffer_still_charged");
  // Sub-buffers take no new memory: they are not charged.
  cl_buffer_region region{0, unit};
  cl_mem sub1 = clCreateSubBuffer(a, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
  region.origin = unit;
  cl_mem sub2 = clCreateSubBuffer(a, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
  check(sub1 != nullptr && sub2 != nullptr, "sub_buffers_created");
  cl_mem c = buffer(unit, &err);
  check(c != nullptr, "sub_buffers_not_charged");
  if (sub1 != nullptr) clReleaseMemObject(sub1);
  if (sub2 != nullptr) clReleaseMemObject(sub2);
  if (c != nullptr) clReleaseMemObject(c);
  // The last release gives the memory back.
  clReleaseMemObject(a);
  b = buffer(2 * unit, &err);
  check(b != nullptr, "last_release_frees");
  // Images are charged by their pixels: RGBA8, 4 bytes a pixel; two units do not fit beside b's two... plus.
  const cl_image_format rgba{CL_RGBA, CL_UNORM_INT8};
  cl_image_desc desc;
  std::memset(&desc, 0, sizeof(desc));
  desc.image_type = CL_MEM_OBJECT_IMAGE2D;
  desc.image_width = 1024;
  desc.image_height = unit / 4096 * 3;  // three units of pixels
  cl_mem image = clCreateImage(cl.context, CL_MEM_READ_ONLY, &rgba, &desc, nullptr, &err);
  check(image == nullptr && err == CL_MEM_OBJECT_ALLOCATION_FAILURE, "image_over_limit_refused");
  desc.image_height = unit / 4096;  // one unit
  image = clCreateImage(cl.context, CL_MEM_READ_ONLY, &rgba, &desc, nullptr, &err);
  check(image != nullptr, "image_within_limit");
  // SVM: three units in use (b + image); two more do not fit, one does.
  cl_device_svm_capabilities svm = 0;
  clGetDeviceInfo(cl.device, CL_DEVICE_SVM_CAPABILITIES, sizeof(svm), &svm, nullptr);
  if (svm != 0) {
    void* p = clSVMAlloc(cl.context, CL_MEM_READ_WRITE, 2 * unit, 0);
    check(p == nullptr, "svm_over_limit_is_null");
    if (p != nullptr) clSVMFree(cl.context, p);
    p = clSVMAlloc(cl.context, CL_MEM_READ_WRITE, unit, 0);
    check(p != nullptr, "svm_within_limit");
    clSVMFree(cl.context, p);
    p = clSVMAlloc(cl.context, CL_MEM_READ_WRITE, unit, 0);
    check(p != nullptr, "svm_free_gives_back");
    clSVMFree(cl.context, p);
  }
  if (image != nullptr) clReleaseMemObject(image);
  if (b != nullptr) clReleaseMemObject(b);
  // Everything released: the whole limit is free again.
  cl_mem all = buffer(4 * unit, &err);
  check(all != nullptr, "nothing_leaked");
  if (all != nullptr) clReleaseMemObject(all);
  std::printf("ok=%d\n", failures == 0 ? 1 : 0);
  return failures == 0 ? 0 : 1;
}

int Hold(size_t mib) {
  Cl cl = Open();
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(cl.context, CL_MEM_READ_WRITE, mib * kMiB, nullptr, &err);
  std::printf("held=%d\nerror=%d\n", m != nullptr ? 1 : 0, err);
  std::fflush(stdout);
  char buf[64];
  while (read(0, buf, sizeof(buf)) > 0) {
  }
  if (m != nullptr) clReleaseMemObject(m);
  return 0;
}

int Try(size_t mib) {
  Cl cl = Open();
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(cl.context, CL_MEM_READ_WRITE, mib * kMiB, nullptr, &err);
  std::printf("created=%d\nerror=%d\n", m != nullptr ? 1 : 0, err);
  if (m != nullptr) clReleaseMemObject(m);
  return 0;
}

const char* kSpinSource = R"CLC(
__kernel void spin(__global float* out, uint iters) {
  float x = (float)get_global_id(0) + 1.0f;
  for (uint i = 0; i < iters; ++i) x = x * 1.0000001f + 0.5f;
  out[get_global_id(0)] = x;
}
)CLC";

using EnqueueFn = cl_int(CL_API_CALL*)(cl_command_queue, cl_kernel, cl_uint, const size_t*, const size_t*,
                                       const size_t*, cl_uint, const cl_event*, cl_event*);

struct Spinner {
  Cl cl;
  cl_kernel kernel = nullptr;
  cl_mem out = nullptr;
  EnqueueFn enqueue = &clEnqueueNDRangeKernel;

  cl_event Launch(cl_uint iters) {
    clSetKernelArg(kernel, 1, sizeof(iters), &iters);
    const size_t global = 1;
    cl_event ev = nullptr;
    const cl_int err = enqueue(cl.queue, kernel, 1, nullptr, &global, nullptr, 0, nullptr, &ev);
    if (err != CL_SUCCESS) Die("clEnqueueNDRangeKernel", err);
    clFlush(cl.queue);
    return ev;
  }
  // [start, end] of a finished launch, in device nanoseconds.
  static void Times(cl_event ev, cl_ulong* start, cl_ulong* end) {
    clWaitForEvents(1, &ev);
    clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof(*start), start, nullptr);
    clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof(*end), end, nullptr);
  }
};

// True once stdin is closed (or at EOF), without blocking.
bool StdinClosed() {
  pollfd p{0, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  char buf[64];
  return read(0, buf, sizeof(buf)) <= 0;
}

int Spin(double seconds, double kernel_ms, int cpu, double window_ms, bool ext, bool until_stdin, bool live) {
  if (cpu >= 0) {
    // Every tenant on one CPU: PoCL's CPU device is then one device that the tenants contend for.
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) std::printf("warning=cannot pin to cpu %d\n", cpu);
  }
  Spinner s;
  s.cl = Open();
  if (ext) {
    void* p = clGetExtensionFunctionAddressForPlatform(s.cl.platform, "clEnqueueNDRangeKernel");
    if (p == nullptr) Die("clGetExtensionFunctionAddressForPlatform(clEnqueueNDRangeKernel) is NULL", 0);
    s.enqueue = reinterpret_cast<EnqueueFn>(p);
  }
  cl_int err = CL_SUCCESS;
  cl_program program = clCreateProgramWithSource(s.cl.context, 1, &kSpinSource, nullptr, &err);
  if (program == nullptr) Die("clCreateProgramWithSource", err);
  err = clBuildProgram(program, 1, &s.cl.device, "", nullptr, nullptr);
  if (err != CL_SUCCESS) Die("clBuildProgram", err);
  s.kernel = clCreateKernel(program, "spin", &err);
  if (s.kernel == nullptr) Die("clCreateKernel", err);
  s.out = clCreateBuffer(s.cl.context, CL_MEM_READ_WRITE, 64, nullptr, &err);
  if (s.out == nullptr) Die("clCreateBuffer", err);
  clSetKernelArg(s.kernel, 0, sizeof(s.out), &s.out);
  // Calibrate: the iterations that take about kernel_ms alone (best of three).
  cl_uint iters = 200000;
  double best_ns = 1e18;
  for (int i = 0; i < 3; ++i) {
    cl_event ev = s.Launch(iters);
    cl_ulong a = 0;
    cl_ulong b = 0;
    Spinner::Times(ev, &a, &b);
    clReleaseEvent(ev);
    best_ns = std::min(best_ns, static_cast<double>(b - a));
  }
  const double per_iter = std::max(best_ns, 1000.0) / iters;
  iters = static_cast<cl_uint>(std::clamp(kernel_ms * 1e6 / per_iter, 1000.0, 4e9));
  std::printf("iters=%u\n", iters);
  std::fflush(stdout);
  // The device clock against CLOCK_MONOTONIC: a marker's end is about now once waited for.
  cl_event marker = nullptr;
  clEnqueueMarkerWithWaitList(s.cl.queue, 0, nullptr, &marker);
  clWaitForEvents(1, &marker);
  const uint64_t host_now = MonotonicNs();
  cl_ulong m_end = 0;
  clGetEventProfilingInfo(marker, CL_PROFILING_COMMAND_END, sizeof(m_end), &m_end, nullptr);
  clReleaseEvent(marker);
  const int64_t offset = static_cast<int64_t>(host_now) - static_cast<int64_t>(m_end);

  const uint64_t begin = MonotonicNs();
  uint64_t stop = begin + static_cast<uint64_t>(seconds * 1e9);
  const uint64_t steady = begin + 500000000ull;
  const uint64_t window = static_cast<uint64_t>(window_ms * 1e6);
  std::vector<uint64_t> busy((stop - begin) / window + 2, 0);
  uint64_t steady_busy = 0;
  uint64_t last_end = begin;
  std::deque<cl_event> inflight;
  auto account = [&](cl_event ev) {
    cl_ulong a = 0;
    cl_ulong b = 0;
    Spinner::Times(ev, &a, &b);
    clReleaseEvent(ev);
    uint64_t ha = static_cast<uint64_t>(static_cast<int64_t>(a) + offset);
    uint64_t hb = static_cast<uint64_t>(static_cast<int64_t>(b) + offset);
    ha = std::max(ha, begin);
    hb = std::min(std::max(hb, ha), stop);
    last_end = std::max(last_end, hb);
    // Split [ha, hb) over the windows it covers.
    for (uint64_t t = ha; t < hb;) {
      const uint64_t w = (t - begin) / window;
      const uint64_t w_end = begin + (w + 1) * window;
      const uint64_t piece = std::min(hb, w_end) - t;
      if (w < busy.size()) busy[w] += piece;
      const uint64_t sa = std::max(t, steady);
      const uint64_t sb = t + piece;
      if (sb > sa) steady_busy += sb - sa;
      t += piece;
    }
  };
  uint64_t polled = 0;
  uint64_t printed = 0;  // --live: windows printed so far
  while (MonotonicNs() < stop) {
    if (until_stdin && ++polled % 8 == 0 && StdinClosed()) {
      stop = MonotonicNs();
      break;
    }
    inflight.push_back(s.Launch(iters));
    if (inflight.size() >= 3) {
      account(inflight.front());
      inflight.pop_front();
    }
    // --live: a window is printed once the kernels accounted end a whole window after it (the ones in flight
    // then start after it), with the device memory the runtime reports now.
    while (live && printed < busy.size() && begin + (printed + 2) * window <= last_end) {
      cl_ulong mem = 0;
      clGetDeviceInfo(s.cl.device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(mem), &mem, nullptr);
      std::printf("live window=%llu share=%.4f mem=%llu\n",
                  static_cast<unsigned long long>((begin + printed * window) / 1000000),
                  static_cast<double>(busy[printed]) / static_cast<double>(window),
                  static_cast<unsigned long long>(mem));
      std::fflush(stdout);
      ++printed;
    }
  }
  while (!inflight.empty()) {
    account(inflight.front());
    inflight.pop_front();
  }
  const uint64_t windows = (stop - begin) / window;
  for (uint64_t w = 0; w < windows; ++w) {
    std::printf("window=%llu share=%.4f\n", static_cast<unsigned long long>((begin + w * window) / 1000000),
                static_cast<double>(busy[w]) / static_cast<double>(window));
  }
  std::printf("begin_ms=%llu\n", static_cast<unsigned long long>(begin / 1000000));
  std::printf("share=%.4f\n",
              stop > steady ? static_cast<double>(steady_busy) / static_cast<double>(stop - steady) : 0.0);
  clReleaseMemObject(s.out);
  clReleaseKernel(s.kernel);
  clReleaseProgram(program);
  clReleaseCommandQueue(s.cl.queue);
  clReleaseContext(s.cl.context);
  return 0;
}

int Usage() {
  std::fprintf(stderr,
               "usage: cl_tenant info | fill <MiB> | lifecycle <MiB> | hold <MiB> | try <MiB> |\n"
               "       spin <seconds> [--kernel-ms K] [--cpu N] [--window-ms W] [--ext] "
               "[--until-stdin-closes] [--live]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h") {
    Usage();
    return 0;
  }
  if (cmd == "info") return Info();
  if (argc < 3) return Usage();
  const double arg = std::atof(argv[2]);
  if (arg <= 0) return Usage();
  if (cmd == "fill") return Fill(static_cast<size_t>(arg));
  if (cmd == "lifecycle") return Lifecycle(static_cast<size_t>(arg));
  if (cmd == "hold") return Hold(static_cast<size_t>(arg));
  if (cmd == "try") return Try(static_cast<size_t>(arg));
  if (cmd == "spin") {
    double kernel_ms = 4;
    int cpu = -1;
    double window_ms = 250;
    bool ext = false;
    bool until_stdin = false;
    bool live = false;
    for (int i = 3; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--kernel-ms" && i + 1 < argc) {
        kernel_ms = std::atof(argv[++i]);
      } else if (a == "--cpu" && i + 1 < argc) {
        cpu = std::atoi(argv[++i]);
      } else if (a == "--window-ms" && i + 1 < argc) {
        window_ms = std::atof(argv[++i]);
      } else if (a == "--ext") {
        ext = true;
      } else if (a == "--until-stdin-closes") {
        until_stdin = true;
      } else if (a == "--live") {
        live = true;
      } else {
        return Usage();
      }
    }
    if (kernel_ms <= 0 || window_ms <= 0) return Usage();
    return Spin(arg, kernel_ms, cpu, window_ms, ext, until_stdin, live);
  }
  return Usage();
}
