#include "core/quantity.h"

#include <gtest/gtest.h>

namespace tessera::core {
namespace {

// Values as Kubernetes' resource.Quantity reads them (k8s.io/apimachinery/pkg/api/resource).
TEST(QuantityTest, PlainAndDecimal) {
  EXPECT_EQ(ParseQuantity("2")->milli, 2000);
  EXPECT_EQ(ParseQuantity("500m")->milli, 500);
  EXPECT_EQ(ParseQuantity("1.5")->milli, 1500);
  EXPECT_EQ(ParseQuantity("2k")->milli, 2000000);
  EXPECT_EQ(ParseQuantity("1e3")->milli, 1000000);
  EXPECT_EQ(ParseQuantity("+7")->milli, 7000);
  EXPECT_EQ(ParseQuantity("-1")->milli, -1000);
}

TEST(QuantityTest, BinarySuffixes) {
  EXPECT_EQ(ParseQuantity("4Gi")->milli, (int64_t{4} << 30) * 1000);
  EXPECT_EQ(ParseQuantity("1.5Ki")->milli, 1536000);
  EXPECT_EQ(ParseQuantity("8Mi")->suffix, "Mi");
}

TEST(QuantityTest, SubMilliRoundsUp) {
  EXPECT_EQ(ParseQuantity("1u")->milli, 1);  // Kubernetes rounds up what milli cannot hold
  EXPECT_EQ(ParseQuantity("0.0001")->milli, 1);
}

TEST(QuantityTest, IntegerAndCeil) {
  EXPECT_TRUE(ParseQuantity("3")->IsInteger());
  EXPECT_FALSE(ParseQuantity("2500m")->IsInteger());
  EXPECT_EQ(ParseQuantity("2500m")->Ceil(), 3);
}

TEST(QuantityTest, RejectsGarbageWithAHint) {
  for (const char* bad : {"", "abc", "1.2.3", "4GB", "10x", "1e99", "99999999999999999999"}) {
    absl::StatusOr<K8sQuantity> q = ParseQuantity(bad);
    ASSERT_FALSE(q.ok()) << bad;
    EXPECT_NE(std::string(q.status().message()).find("write a number"), std::string::npos) << q.status();
  }
}

}  // namespace
}  // namespace tessera::core
