// Strong string identifiers: a GPU UUID is not a node name is not a pod UID.
//
//   GpuUuid uuid{"GPU-5a1b..."};
//   NodeName node{"gpu-node-17"};
//   if (uuid.value().starts_with("GPU-")) ...
//
// Thread-safety: plain values.
#ifndef TESSERA_CORE_IDS_H_
#define TESSERA_CORE_IDS_H_

#include <compare>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace tessera::core {

template <typename Tag>
class StrongId {
 public:
  StrongId() = default;
  explicit StrongId(std::string value) : value_(std::move(value)) {}
  explicit StrongId(std::string_view value) : value_(value) {}
  explicit StrongId(const char* value) : value_(value) {}

  const std::string& value() const { return value_; }
  bool empty() const { return value_.empty(); }

  auto operator<=>(const StrongId&) const = default;

 private:
  std::string value_;
};

template <typename Tag>
std::ostream& operator<<(std::ostream& os, const StrongId<Tag>& id) {
  return os << id.value();
}

using GpuUuid = StrongId<struct GpuUuidTag>;
using NodeName = StrongId<struct NodeNameTag>;
using PodUid = StrongId<struct PodUidTag>;
using Namespace = StrongId<struct NamespaceTag>;

// One container of one pod: the unit that holds a share of a GPU (a tenant).
struct TenantId {
  PodUid pod;
  std::string container;

  auto operator<=>(const TenantId&) const = default;
};

inline std::ostream& operator<<(std::ostream& os, const TenantId& t) {
  return os << t.pod << "/" << t.container;
}

}  // namespace tessera::core

template <typename Tag>
struct std::hash<tessera::core::StrongId<Tag>> {
  size_t operator()(const tessera::core::StrongId<Tag>& id) const noexcept {
    return std::hash<std::string>{}(id.value());
  }
};

#endif  // TESSERA_CORE_IDS_H_
