// The LD_PRELOAD choice `tessera run` makes (cmd/tessera/hook_preload.h), and an OpenCL program run the way
// `tessera run --api opencl` runs it: with that LD_PRELOAD and the TESSERA_* limit variables.
#include "cmd/tessera/hook_preload.h"

#include <gtest/gtest.h>

#include "tenant_runner.h"

namespace tessera::cli {
namespace {

const std::string kLibDir = std::string(TESSERA_BINARY_DIR) + "/lib";

TEST(HookPreloadTest, OpenClOnly) {
  PreloadChoice c = ChooseHookPreload("opencl", kLibDir, nullptr);
  ASSERT_EQ(c.error, "");
  EXPECT_EQ(c.ld_preload, kLibDir + "/libtessera-opencl.so");
}

TEST(HookPreloadTest, AutoTakesEveryBuiltLibraryAndKeepsAnExistingPreload) {
  PreloadChoice c = ChooseHookPreload("auto", kLibDir, "/x/libother.so");
  ASSERT_EQ(c.error, "");
  EXPECT_NE(c.ld_preload.find(kLibDir + "/libtessera-opencl.so"), std::string::npos);
  EXPECT_EQ(c.ld_preload.substr(c.ld_preload.size() - 15), ":/x/libother.so");
}

TEST(HookPreloadTest, UnknownApiAndMissingLibrarySayWhatToDo) {
  EXPECT_NE(ChooseHookPreload("vulkan", kLibDir, nullptr).error.find("use auto, cuda or opencl"),
            std::string::npos);
  EXPECT_NE(ChooseHookPreload("opencl", "/nonexistent", nullptr).error.find("scripts/build"),
            std::string::npos);
  EXPECT_NE(ChooseHookPreload("auto", "/nonexistent", nullptr).error.find("--lib-dir"), std::string::npos);
}

TEST(HookPreloadTest, AnOpenClProgramRunsUnderTheChosenPreload) {
  PreloadChoice c = ChooseHookPreload("opencl", kLibDir, nullptr);
  ASSERT_EQ(c.error, "");
  cltest::Tenant t;
  ASSERT_TRUE(t.Start({"info"},
                      {{"LD_PRELOAD", c.ld_preload},
                       {"TESSERA_GPU_MEMORY_LIMIT", "1GiB"},
                       {"TESSERA_REGION", "/tmp/tessera-preload-test-" + std::to_string(getpid())}},
                      false));
  cltest::Report r = t.Wait();
  unlink(("/tmp/tessera-preload-test-" + std::to_string(getpid())).c_str());
  EXPECT_EQ(r.Get("global_mem_size"), std::to_string(1ull << 30)) << r.output;
}

}  // namespace
}  // namespace tessera::cli
