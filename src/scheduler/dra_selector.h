// The part of DRA's device selectors (CEL, resource.k8s.io/v1 CELDeviceSelector) that tessera-scheduler
// evaluates itself, with kube-scheduler's meaning, and a clear "undecided" for everything else.
//
// What it reads: `device.driver`, `device.attributes["DOMAIN"].NAME` and
// `device.attributes["DOMAIN"]["NAME"]`, string (double or single quotes), integer and boolean literals, `==`
// `!=` `<` `<=` `>` `>=`, `&&` `||` `!` and parentheses. CEL's rules are kept where they matter: `&&` and
// `||` absorb an error on the other side
// (`false && error` is false, `true || error` is true); comparing values of different types, or reading an
// attribute the device does not have, is an error. Anything else (functions, `in`, `has()`, capacity,
// versions) does not compile.
//
// An error or an expression that does not compile is never guessed at: the caller leaves the claim to
// kube-scheduler's own allocator (docs/dra.md, "Which claims Tessera places"), so a claim Tessera allocates
// is always one kube-scheduler would accept.
//
//   absl::StatusOr<Selector> s = Selector::Compile(R"(device.attributes["gpu.tessera.dev"].model == "T4")");
//   Verdict v = s->Evaluate(device);   // kMatch, kNoMatch or kError
//
// Thread-safety: a compiled Selector is immutable.
#ifndef TESSERA_SCHEDULER_DRA_SELECTOR_H_
#define TESSERA_SCHEDULER_DRA_SELECTOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::scheduler::dra {

// A device attribute as a ResourceSlice states it (one of int, bool, string, version).
struct AttributeValue {
  enum class Kind { kInt, kBool, kString, kVersion };
  Kind kind = Kind::kString;
  int64_t i = 0;
  bool b = false;
  std::string s;  // string and version

  static AttributeValue Int(int64_t v) {
    AttributeValue a;
    a.kind = Kind::kInt;
    a.i = v;
    return a;
  }
  static AttributeValue Bool(bool v) {
    AttributeValue a;
    a.kind = Kind::kBool;
    a.b = v;
    return a;
  }
  static AttributeValue String(std::string v, Kind kind = Kind::kString) {
    AttributeValue a;
    a.kind = kind;
    a.s = std::move(v);
    return a;
  }
  bool operator==(const AttributeValue&) const = default;
};

// What a selector sees of a device: its driver and its attributes by qualified name
// ("gpu.tessera.dev/model").
struct DeviceView {
  std::string driver;
  const std::map<std::string, AttributeValue>* attributes = nullptr;
};

enum class Verdict { kMatch, kNoMatch, kError };

class Selector {
 public:
  // Refuses (kInvalidArgument, saying what it stopped at) an expression outside the subset above.
  static absl::StatusOr<Selector> Compile(std::string_view expression);
  Verdict Evaluate(const DeviceView& device) const;

  struct Node;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace tessera::scheduler::dra

#endif  // TESSERA_SCHEDULER_DRA_SELECTOR_H_
