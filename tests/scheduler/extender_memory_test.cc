// The extender's and the webhook's memory against hostile bodies, measured: this binary counts every byte
// operator new hands out (live and peak), so each test asserts the most a request made it hold, as a multiple
// of the body. No timing is asserted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

#include "nlohmann/json.hpp"
#include "scheduler/admission.h"
#include "scheduler/extender.h"
#include "scheduler/standalone.h"
#include "test_util.h"

namespace {

std::atomic<size_t> g_live{0};
std::atomic<size_t> g_peak{0};

void* AllocateOrNull(size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) return nullptr;
  const size_t live = g_live.fetch_add(malloc_usable_size(p)) + malloc_usable_size(p);
  size_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
  return p;
}

void* Allocate(size_t n) {
  void* p = AllocateOrNull(n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void Free(void* p) {
  if (p == nullptr) return;
  g_live.fetch_sub(malloc_usable_size(p));
  std::free(p);
}

}  // namespace

void* operator new(size_t n) {
  return Allocate(n);
}
void* operator new[](size_t n) {
  return Allocate(n);
}
void operator delete(void* p) noexcept {
  Free(p);
}
void operator delete[](void* p) noexcept {
  Free(p);
}
void operator delete(void* p, size_t) noexcept {
  Free(p);
}
void operator delete[](void* p, size_t) noexcept {
  Free(p);
}
// The nothrow forms too (std::stable_sort's temporary buffer uses them): every form that can reach the replaced
// operator delete must allocate here, or a sanitizer sees its own new freed by this free.
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  return AllocateOrNull(n);
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  return AllocateOrNull(n);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  Free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  Free(p);
}

namespace tessera::scheduler {
namespace {

using ::nlohmann::json;
using ::testing::AnyOf;
using ::testing::HasSubstr;

const char kPod[] =
    R"({"metadata":{"name":"p","namespace":"default","uid":"u1"},"spec":{"containers":[{"name":"main",)"
    R"("resources":{"limits":{"tessera.dev/gpu-cores":"30","tessera.dev/gpu-memory":"1024"}}}]}})";

// Bytes held at the peak of `run`, above what was held before it.
template <typename F>
size_t PeakOf(F run) {
  const size_t before = g_live.load();
  g_peak.store(before);
  run();
  return g_peak.load() - before;
}

class ExtenderBodyMemoryTest : public ::testing::Test {
 protected:
  ExtenderBodyMemoryTest() : cache_(CacheOptions{}), extender_(cache_, binder_, nullptr) {
    EXPECT_TRUE(cache_.UpsertNode(testing::MakeNode("t4-a", 2, core::MiB(15360), "T4")).ok());
  }
  ClusterCache cache_;
  StandaloneBinder binder_;
  Extender extender_;
};

// 30 MB of `{}` beside the pod: its tree cost 1.06 GB on filter and 1.78 GB on preempt (parsed twice). Now
// the tree is refused past formats::DomBudgetFor (6 bytes per byte sent, estimated): the peak stays under 8
// times the body.
TEST_F(ExtenderBodyMemoryTest, ThirtyMegabytesOfEmptyObjectsAreRefusedInProportion) {
  std::string body = std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":["t4-a"],"Junk":[)";
  body.reserve(30u << 20);
  while (body.size() < (30u << 20)) body += "{},";
  body += "{}]}";
  for (auto verb : {&Extender::Filter, &Extender::Preempt}) {
    Response r;
    const size_t peak = PeakOf([&] { r = (extender_.*verb)(body); });
    EXPECT_EQ(r.status, 400);
    EXPECT_THAT(r.body, HasSubstr("too many values for its size"));
    EXPECT_LT(peak, 8 * body.size()) << "peak " << (peak >> 20) << " MiB for " << (body.size() >> 20)
                                     << " MiB";
  }
}

// The same body inside an AdmissionReview, to the webhook.
TEST_F(ExtenderBodyMemoryTest, TheWebhookRefusesThemInProportionToo) {
  Admission admission({"tessera-scheduler", {}});
  std::string body =
      R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x",)"
      R"("kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","object":{"x":[)";
  body.reserve(30u << 20);
  while (body.size() < (30u << 20)) body += "{},";
  body += "{}]}}}";
  for (int verb = 0; verb < 2; ++verb) {
    Response r;
    const size_t peak = PeakOf([&] { r = verb == 0 ? admission.Mutate(body) : admission.Validate(body); });
    EXPECT_EQ(r.status, 400);
    EXPECT_THAT(r.body, HasSubstr("too many values for its size"));
    EXPECT_LT(peak, 8 * body.size()) << "peak " << (peak >> 20) << " MiB";
  }
}

// 4 million node names: a 376 MB answer and 1.3 GB at the peak. Now refused with a 400 that says the cap, on
// both kube-scheduler's forms of the list.
TEST_F(ExtenderBodyMemoryTest, MillionsOfNodeNamesAreRefused) {
  std::string names;
  names.reserve(4000000 * 12);
  for (int i = 0; i < 4000000; ++i) {
    names += i == 0 ? "\"n" : ",\"n";
    names += std::to_string(i);
    names += '"';
  }
  for (const std::string& body :
       {std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":[)" + names + "]}",
        // Escaped names take the general path.
        std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":["caf\u00e9",)" + names + "]}"}) {
    Response r;
    const size_t peak = PeakOf([&] { r = extender_.Filter(body); });
    EXPECT_EQ(r.status, 400);
    EXPECT_THAT(r.body, HasSubstr("at most 50000 are read"));
    EXPECT_LT(peak, 2 * body.size()) << "peak " << (peak >> 20) << " MiB";
  }
}

// 60 MB of tessera.dev/ annotation keys: each went through an edit-distance check against every known key
// (39 s of CPU). Kubernetes stores at most 256 KiB of annotations; more is refused before any key is read.
TEST_F(ExtenderBodyMemoryTest, SixtyMegabytesOfTesseraKeysAreRefusedByTheSizeCap) {
  json pod = json::parse(kPod);
  std::string annotations;
  const std::string pad(90, 'x');
  for (int i = 0; annotations.size() < (60u << 20); ++i) {
    annotations += (i == 0 ? "\"tessera.dev/" : ",\"tessera.dev/") + pad + std::to_string(i) + "\":\"\"";
  }
  std::string pod_text = pod.dump();
  pod_text.insert(pod_text.find(R"("name":"p")"), R"("annotations":{)" + annotations + "},");
  const std::string body = R"({"Pod":)" + pod_text + R"(,"NodeNames":["t4-a"]})";
  Response r;
  const size_t peak = PeakOf([&] { r = extender_.Filter(body); });
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, AnyOf(HasSubstr("metadata.annotations hold more than 256 KiB"),
                            HasSubstr("too many values for its size")));
  EXPECT_LT(peak, 8 * body.size());
  // Within the cap, many near-miss keys are still each judged ("did you mean").
  json small = json::parse(kPod);
  small["metadata"]["annotations"] = {{"tessera.dev/gpu-modle", "T4"}};
  r = extender_.Filter(json{{"Pod", small}, {"NodeNames", {"t4-a"}}}.dump());
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.body, HasSubstr("did you mean tessera.dev/gpu-model?"));
}

}  // namespace
}  // namespace tessera::scheduler
