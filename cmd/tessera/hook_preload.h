// Which isolation libraries `tessera run` preloads into the command it runs (docs/opencl.md, "tessera run";
// run_command.cc): `--api auto` (the default) preloads every hook library
// that was built, so a CUDA program and an OpenCL program run under the same flags; `--api cuda` or
// `--api opencl` preloads only that one. The libraries are put in front of an LD_PRELOAD already set.
//
//   tessera::cli::PreloadChoice c = tessera::cli::ChooseHookPreload("opencl", "/opt/tessera/lib",
//                                                                   getenv("LD_PRELOAD"));
//   if (!c.error.empty()) { print c.error; return 2; }
//   setenv("LD_PRELOAD", c.ld_preload.c_str(), 1);
//
// Pure apart from checking that the files exist. Thread-safe.
#ifndef TESSERA_CMD_TESSERA_HOOK_PRELOAD_H_
#define TESSERA_CMD_TESSERA_HOOK_PRELOAD_H_

#include <unistd.h>

#include <string>
#include <vector>

namespace tessera::cli {

struct PreloadChoice {
  std::string ld_preload;  // the value for LD_PRELOAD
  std::string error;       // non-empty: what is wrong and what to do
};

// `api`: "auto", "cuda" or "opencl". `lib_dir`: where libtessera-*.so are (build/lib, or the install's lib/).
// `existing`: the LD_PRELOAD already in the environment (may be null or empty).
inline PreloadChoice ChooseHookPreload(const std::string& api, const std::string& lib_dir,
                                       const char* existing) {
  PreloadChoice out;
  std::vector<std::string> names;
  if (api == "auto" || api.empty()) {
    names = {"cuda", "opencl"};
  } else if (api == "cuda" || api == "opencl") {
    names = {api};
  } else {
    out.error = "--api " + api + " is not known: use auto, cuda or opencl";
    return out;
  }
  std::vector<std::string> found;
  for (const std::string& n : names) {
    const std::string path = lib_dir + "/libtessera-" + n + ".so";
    if (access(path.c_str(), R_OK) == 0) {
      found.push_back(path);
    } else if (api == n) {
      out.error =
          path + " not found: build it (scripts/build) or point --lib-dir at the directory holding it";
      return out;
    }
  }
  if (found.empty()) {
    out.error = "no libtessera-cuda.so or libtessera-opencl.so in " + lib_dir +
                ": build them (scripts/build) or point --lib-dir at the directory holding them";
    return out;
  }
  for (const std::string& f : found) out.ld_preload += (out.ld_preload.empty() ? "" : ":") + f;
  if (existing != nullptr && existing[0] != 0) out.ld_preload += std::string(":") + existing;
  return out;
}

}  // namespace tessera::cli

#endif  // TESSERA_CMD_TESSERA_HOOK_PRELOAD_H_
