// A set of GPUs of one node, by index, as a 64-bit mask. Tessera supports up to 64 GPUs per node (the largest
// single machines today have 16).
#ifndef TESSERA_CORE_GPU_MASK_H_
#define TESSERA_CORE_GPU_MASK_H_

#include <bit>
#include <cstdint>

namespace tessera::core {

inline constexpr int kMaxGpusPerNode = 64;

class GpuMask {
 public:
  constexpr GpuMask() = default;
  constexpr explicit GpuMask(uint64_t bits) : bits_(bits) {}
  static constexpr GpuMask All(int n) { return GpuMask(n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1); }
  static constexpr GpuMask Of(int gpu) { return GpuMask(uint64_t{1} << gpu); }

  constexpr bool Has(int gpu) const { return (bits_ >> gpu) & 1U; }
  constexpr void Add(int gpu) { bits_ |= uint64_t{1} << gpu; }
  constexpr void Remove(int gpu) { bits_ &= ~(uint64_t{1} << gpu); }
  constexpr int Count() const { return std::popcount(bits_); }
  constexpr bool Empty() const { return bits_ == 0; }
  constexpr uint64_t bits() const { return bits_; }

  constexpr GpuMask operator&(GpuMask o) const { return GpuMask(bits_ & o.bits_); }
  constexpr GpuMask operator|(GpuMask o) const { return GpuMask(bits_ | o.bits_); }
  constexpr GpuMask operator~() const { return GpuMask(~bits_); }
  constexpr bool operator==(const GpuMask&) const = default;

  // Iterates the GPU indices in the set, lowest first:  for (int g : mask) ...
  class Iterator {
   public:
    constexpr explicit Iterator(uint64_t bits) : bits_(bits) {}
    constexpr int operator*() const { return std::countr_zero(bits_); }
    constexpr Iterator& operator++() {
      bits_ &= bits_ - 1;
      return *this;
    }
    constexpr bool operator!=(const Iterator& o) const { return bits_ != o.bits_; }

   private:
    uint64_t bits_;
  };
  constexpr Iterator begin() const { return Iterator(bits_); }
  constexpr Iterator end() const { return Iterator(0); }

 private:
  uint64_t bits_ = 0;
};

}  // namespace tessera::core

#endif  // TESSERA_CORE_GPU_MASK_H_
