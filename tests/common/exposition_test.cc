// Families (src/common/exposition.h): metric families named once, written in the order they were added.
#include "common/exposition.h"

#include <gtest/gtest.h>

#include <string>

namespace tessera::exposition {
namespace {

TEST(FamiliesTest, EachFamilyKeepsItsOwnSamplesInTheOrderAdded) {
  Families families;
  Family& used = families.Add("tessera_gpu_memory_used_bytes", "GPU memory held.", "gauge");
  Family& tenants = families.Add("tessera_gpu_tenants", "Containers sharing the GPU.", "gauge");
  families.Add("tessera_empty", "A family with no series.", "gauge");
  // Samples added out of the families' order land in their own family.
  tenants.Add({{"gpu", "0"}}, 2);
  used.Add(LabelSet({{"gpu", "0"}}), FormatValue(uint64_t{1} << 30));
  tenants.Add({{"gpu", "1"}}, 0);
  std::string out;
  families.AppendTo(&out);
  EXPECT_EQ(out,
            "# HELP tessera_gpu_memory_used_bytes GPU memory held.\n"
            "# TYPE tessera_gpu_memory_used_bytes gauge\n"
            "tessera_gpu_memory_used_bytes{gpu=\"0\"} 1073741824\n"
            "# HELP tessera_gpu_tenants Containers sharing the GPU.\n"
            "# TYPE tessera_gpu_tenants gauge\n"
            "tessera_gpu_tenants{gpu=\"0\"} 2\n"
            "tessera_gpu_tenants{gpu=\"1\"} 0\n"
            "# HELP tessera_empty A family with no series.\n"
            "# TYPE tessera_empty gauge\n");
}

}  // namespace
}  // namespace tessera::exposition
