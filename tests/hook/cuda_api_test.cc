// Tessera's own CUDA driver API declarations (src/hook/cuda/cuda_api.h) against the toolkit's cuda.h: every
// structure size and member offset, enum value and entry-point type the hook and the fake driver rely on.
// Skipped where no toolkit is installed (CI): the declarations are then checked only by the build.
#include <gtest/gtest.h>

#include "hook/cuda_api_facts.h"

namespace tessera::testing {
namespace {

TEST(CudaApiTest, DeclarationsMatchTheToolkit) {
  const auto toolkit = ToolkitCudaFacts();
  if (toolkit.empty()) {
    GTEST_SKIP()
        << "no CUDA toolkit cuda.h found at build time (TESSERA_CUDA_TOOLKIT_INCLUDE); the project's "
           "declarations are used alone";
  }
  const auto ours = OurCudaFacts();
  ASSERT_EQ(ours.size(), toolkit.size());
  for (const auto& [name, value] : ours) {
    auto it = toolkit.find(name);
    ASSERT_NE(it, toolkit.end()) << name;
    EXPECT_EQ(value, it->second) << name << " differs from the toolkit's";
  }
}

TEST(CudaApiTest, OurFactsAreComplete) {
  const auto ours = OurCudaFacts();
  EXPECT_GT(ours.size(), 150u);
  EXPECT_EQ(ours.at("CUDA_ERROR_OUT_OF_MEMORY"), "2");
  EXPECT_EQ(ours.at("sizeof(CUmemPoolProps)"), "88");
}

}  // namespace
}  // namespace tessera::testing
