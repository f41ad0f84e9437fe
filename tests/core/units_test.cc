#include "core/units.h"

#include <gtest/gtest.h>

namespace tessera::core {
namespace {

TEST(UnitsTest, BytesAndMiB) {
  EXPECT_EQ(ToBytes(MiB(4096)).value(), int64_t{4096} << 20);
  EXPECT_EQ(ToMiBFloor(Bytes((int64_t{3} << 20) + 5)).value(), 3);
}

TEST(UnitsTest, PercentToMilliGpu) {
  EXPECT_EQ(ToMilliGpu(Percent(30)).value(), 300);
  EXPECT_TRUE(IsWholeGpu(ToMilliGpu(Percent(100))));
  EXPECT_EQ(ToPercentFloor(MilliGpu(305)).value(), 30);
}

TEST(UnitsTest, ProportionalMemoryRoundsDown) {
  // Three thirds of a 16000 MiB GPU must not add up past 16000.
  MiB third = ProportionalMemory(MilliGpu(333), MiB(16000));
  EXPECT_EQ(third.value(), 5328);
  EXPECT_LE(third.value() * 3, 16000);
}

TEST(UnitsTest, ProportionalShareRoundsUpAndCaps) {
  // gpushare's example GPU: 16276 MiB; a quarter of it is exactly 25%.
  EXPECT_EQ(ProportionalShare(MiB(4069), MiB(16276)).value(), 250);
  EXPECT_EQ(ProportionalShare(MiB(8138), MiB(16276)).value(), 500);
  // Any memory at all accounts some compute.
  EXPECT_EQ(ProportionalShare(MiB(1), MiB(81920)).value(), 1);
  EXPECT_EQ(ProportionalShare(MiB(100000), MiB(81920)).value(), 1000);
}

TEST(UnitsTest, ArithmeticKeepsUnits) {
  MiB a(100);
  a += MiB(50);
  EXPECT_EQ((a - MiB(30)).value(), 120);
  EXPECT_LT(MilliGpu(10), MilliGpu(20));
}

}  // namespace
}  // namespace tessera::core
