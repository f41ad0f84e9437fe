// The extender's verbs (filter, prioritize, preempt, bind) on arbitrary request bodies: what anyone who can
// reach the unauthenticated extender port sends. Every answer must be JSON; nothing may crash or throw. And
// the two ways of reading ExtenderArgs (scheduler/extender_args.h) must agree: the fast path (NodeNames
// scanned by hand) accepts exactly what the general path (the bounded SAX parser) accepts, with the same
// document and names, and refuses with the same message.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "scheduler/cluster_cache.h"
#include "scheduler/extender.h"
#include "scheduler/extender_args.h"
#include "scheduler/standalone.h"
#include "test_util.h"

namespace {

using tessera::scheduler::CacheOptions;
using tessera::scheduler::ClusterCache;
using tessera::scheduler::Extender;
using tessera::scheduler::Response;
using tessera::scheduler::StandaloneBinder;

struct World {
  World() : cache(Options()), extender(cache, binder, nullptr) {
    (void)cache.UpsertNode(tessera::testing::MakeNode("t4-a", 4, tessera::core::MiB(15360), "T4"));
    (void)cache.UpsertNode(
        tessera::testing::MakeNode("a100", 8, tessera::core::MiB(81920), "A100-SXM4-80GB"));
  }
  static CacheOptions Options() {
    CacheOptions o;
    o.policy = "tessera";
    o.seed = 42;
    return o;
  }
  ClusterCache cache;
  StandaloneBinder binder;
  Extender extender;
};

void CheckJson(const Response& r) {
  if (!nlohmann::json::accept(r.body)) __builtin_trap();
}

void CheckPathsAgree(std::string_view body) {
  using tessera::scheduler::ArgsPath;
  using tessera::scheduler::ReadExtenderArgs;
  const auto fast = ReadExtenderArgs(body, ArgsPath::kFast);
  const auto general = ReadExtenderArgs(body, ArgsPath::kGeneral);
  if (fast.ok() != general.ok()) __builtin_trap();
  if (!fast.ok()) {
    if (fast.status() != general.status()) __builtin_trap();
    return;
  }
  if (fast->has_names != general->has_names || fast->names != general->names) __builtin_trap();
  if (fast->doc != general->doc) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* world = new World();
  const std::string_view body = tessera::fuzz::Text(data, size);
  CheckPathsAgree(body);
  CheckJson(world->extender.Filter(body));
  CheckJson(world->extender.Prioritize(body));
  CheckJson(world->extender.Preempt(body));
  CheckJson(world->extender.Bind(body));
  // Bound pods would pile up across inputs: forget them.
  for (const auto& [key, value] : world->binder.Assignments()) world->binder.Forget(key);
  return 0;
}
