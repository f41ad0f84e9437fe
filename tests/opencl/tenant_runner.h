// Runs cl_tenant (tests/opencl/cl_tenant.cc) as a child process, with or without libtessera-opencl.so
// preloaded, and reads its `key=value` report. Shared by the OpenCL hook tests and bench/opencl_shares.
//
//   tessera::cltest::Tenant t;
//   t.Start({"spin", "3", "--cpu", "0"}, {{"TESSERA_GPU_CORES", "50"}, {"TESSERA_REGION", region}});
//   tessera::cltest::Report r = t.Wait();
//   double share = r.Number("share");
//
// The child gets this process's environment without any TESSERA_* variable, plus the given ones, and writes its
// stderr into the same pipe as its stdout (the report ignores lines that are not key=value); PoCL's
// kernel cache is shared by every tenant (POCL_CACHE_DIR) so that a kernel is compiled once.
// Thread-safety: a Tenant is used by one thread.
#ifndef TESSERA_TESTS_OPENCL_TENANT_RUNNER_H_
#define TESSERA_TESTS_OPENCL_TENANT_RUNNER_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tessera::cltest {

// The paths the runner uses, from the build tree.
std::string TenantPath();    // build/tests/cl_tenant
std::string HookPath();      // build/lib/libtessera-opencl.so
std::string PoclCacheDir();  // build/tests/pocl-cache

struct Report {
  int exit_code = -1;
  std::string output;                                   // the whole stdout
  std::vector<std::pair<std::string, std::string>> kv;  // every key=value line, in order
  // The last value of `key`; "" when absent.
  std::string Get(const std::string& key) const;
  // The last value of `key` as a number; NaN when absent.
  double Number(const std::string& key) const;
  // Every `window=<ms> share=<x>` line as (ms, share).
  std::vector<std::pair<double, double>> Windows() const;
};

Report ParseReport(const std::string& output, int exit_code);

class Tenant {
 public:
  Tenant() = default;
  Tenant(const Tenant&) = delete;
  Tenant& operator=(const Tenant&) = delete;
  ~Tenant();

  // Starts cl_tenant with `args`; `env` adds variables. `preload` puts the hook in LD_PRELOAD.
  // False when the process cannot be started.
  bool Start(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
             bool preload = true);
  // Reads stdout until a line starting with `prefix` (or EOF); returns that line ("" at EOF).
  std::string ReadLineStartingWith(const std::string& prefix);
  // Reads stdout (where the child's stderr goes too: the hook's lines, with TESSERA_HOOK_LOG=info) until a
  // line containing `text` (or EOF); returns that line ("" at EOF).
  std::string ReadLineContaining(const std::string& text);
  // Closes the child's stdin (a `hold` tenant then releases and exits).
  void CloseStdin();
  // Waits for the child; returns its report (with whatever was read before).
  Report Wait();
  pid_t pid() const { return pid_; }

 private:
  std::string ReadLine(const std::string& prefix, bool contains);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int in_fd_ = -1;
  std::string buffer_;    // read, not yet consumed by ReadLineStartingWith
  std::string consumed_;  // already returned lines
};

}  // namespace tessera::cltest

#endif  // TESSERA_TESTS_OPENCL_TENANT_RUNNER_H_
