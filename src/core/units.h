// Strong types for the quantities Tessera accounts: memory in MiB and bytes, compute share in percent of a
// GPU (the unit users write) and in thousandths of a GPU (the unit placement accounts in, fine enough for
// every trace Tessera replays: the Alibaba trace's gpu_milli column is in thousandths).
//
// Quantities of different units never mix silently: MiB + Bytes does not compile, and every conversion is a
// named function.
//
//   MiB limit{4096};
//   Bytes b = ToBytes(limit);                    // 4294967296
//   MilliGpu share = ToMilliGpu(Percent{30});   // 300
//
// Thread-safety: plain values.
#ifndef TESSERA_CORE_UNITS_H_
#define TESSERA_CORE_UNITS_H_

#include <compare>
#include <cstdint>
#include <functional>
#include <ostream>

namespace tessera::core {

// A number with a unit. Tag makes each unit a distinct type; Rep is the integer it is stored in.
// Like std::chrono::duration, a default-initialized Quantity holds no value (so that arrays of them cost
// nothing to declare); value-initialize it, `MiB m{};`, for zero.
template <typename Tag, typename Rep>
class Quantity {
 public:
  using rep = Rep;

  Quantity() = default;
  constexpr explicit Quantity(Rep value) : value_(value) {}

  constexpr Rep value() const { return value_; }

  constexpr auto operator<=>(const Quantity&) const = default;

  constexpr Quantity operator+(Quantity other) const { return Quantity(value_ + other.value_); }
  constexpr Quantity operator-(Quantity other) const { return Quantity(value_ - other.value_); }
  constexpr Quantity& operator+=(Quantity other) {
    value_ += other.value_;
    return *this;
  }
  constexpr Quantity& operator-=(Quantity other) {
    value_ -= other.value_;
    return *this;
  }
  constexpr Quantity operator*(Rep factor) const { return Quantity(value_ * factor); }

 private:
  Rep value_;
};

struct MiBTag {};
struct BytesTag {};
struct PercentTag {};
struct MilliGpuTag {};
struct MilliCpuTag {};

// Memory in mebibytes (2^20 bytes): the unit of requests, inventories and the placement ledger.
using MiB = Quantity<MiBTag, int64_t>;
// Memory in bytes: the unit of the limits file and of the hook libraries.
using Bytes = Quantity<BytesTag, int64_t>;
// Compute share as users write it: percent of one GPU, 1..100 per vGPU.
using Percent = Quantity<PercentTag, int32_t>;
// CPU in millicores, as Kubernetes and the trace count it.
using MilliCpu = Quantity<MilliCpuTag, int64_t>;

// Compute share in thousandths of one GPU: the unit placement accounts in. 1000 is a whole GPU.
using MilliGpu = Quantity<MilliGpuTag, int32_t>;

constexpr MilliGpu kWholeGpu{1000};

constexpr MilliGpu ToMilliGpu(Percent p) {
  return MilliGpu(p.value() * 10);
}
constexpr bool IsWholeGpu(MilliGpu m) {
  return m == kWholeGpu;
}

constexpr Bytes ToBytes(MiB m) {
  return Bytes(m.value() * (int64_t{1} << 20));
}
// Rounds down: a limit never grows by conversion.
constexpr MiB ToMiBFloor(Bytes b) {
  return MiB(b.value() >> 20);
}

// Percent of a GPU, rounded down to whole percent (for display).
constexpr Percent ToPercentFloor(MilliGpu m) {
  return Percent(m.value() / 10);
}

// The memory that goes with a compute share when memory is left out (the GPU Sharing design principle:
// compute and memory proportional). Rounds down so that shares of one GPU never add up past its memory.
constexpr MiB ProportionalMemory(MilliGpu share, MiB gpu_memory) {
  return MiB(gpu_memory.value() * share.value() / 1000);
}

// The compute share that goes with a memory amount when cores are left out (gpushare-style requests).
// Rounds up: a container asking for a quarter of the memory accounts at least a quarter of the compute.
constexpr MilliGpu ProportionalShare(MiB memory, MiB gpu_memory) {
  if (gpu_memory.value() <= 0) return MilliGpu(0);
  if (memory >= gpu_memory) return MilliGpu(1000);
  // memory < gpu_memory here, so memory * 1000 cannot overflow for any real GPU size.
  return MilliGpu(
      static_cast<int32_t>((memory.value() * 1000 + gpu_memory.value() - 1) / gpu_memory.value()));
}

template <typename Tag, typename Rep>
std::ostream& operator<<(std::ostream& os, Quantity<Tag, Rep> q) {
  return os << q.value();
}

}  // namespace tessera::core

template <typename Tag, typename Rep>
struct std::hash<tessera::core::Quantity<Tag, Rep>> {
  size_t operator()(tessera::core::Quantity<Tag, Rep> q) const noexcept {
    return std::hash<Rep>{}(q.value());
  }
};

#endif  // TESSERA_CORE_UNITS_H_
