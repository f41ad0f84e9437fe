// A small seeded random source for tie-breaking and for the simulator. Same seed, same sequence, on every
// platform and standard library (std::uniform_int_distribution is not portable across libraries).
//
//   Rng rng(42);
//   int i = rng.Uniform(3);          // 0, 1 or 2
//
// Thread-safety: not thread-safe; give each thread its own.
#ifndef TESSERA_CORE_RANDOM_H_
#define TESSERA_CORE_RANDOM_H_

#include <cstdint>

namespace tessera::core {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  // SplitMix64 (Steele, Lea, Flood 2014): passes BigCrush, one add and three multiply-xorshifts.
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Uniform in [0, n), n > 0: the top 32 random bits scaled by n (Lemire's multiply-shift, without the
  // rejection step; the bias is below n / 2^32).
  uint32_t Uniform(uint32_t n) { return static_cast<uint32_t>(((Next() >> 32) * n) >> 32); }

  // Uniform in [0, 1).
  double UniformDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// Picks uniformly among equal-best candidates seen one at a time (reservoir sampling of size one), so that
// ties are broken by the seeded Rng and nothing needs to be collected first.
//
//   TieBreaker<int> best(rng);
//   for (...) best.Offer(cost, gpu);      // lower key wins; equal keys tie
//   if (best.has_value()) use(best.value());
template <typename T, typename Key = int64_t>
class TieBreaker {
 public:
  explicit TieBreaker(Rng& rng) : rng_(rng) {}

  // Returns true when `value` became the current choice.
  bool Offer(const Key& key, const T& value) {
    if (ties_ == 0 || key < key_) {
      key_ = key;
      value_ = value;
      ties_ = 1;
      return true;
    }
    if (key == key_) {
      ++ties_;
      if (rng_.Uniform(ties_) == 0) {
        value_ = value;
        return true;
      }
    }
    return false;
  }

  bool has_value() const { return ties_ > 0; }
  const T& value() const { return value_; }
  const Key& key() const { return key_; }

 private:
  Rng& rng_;
  Key key_{};
  T value_{};
  uint32_t ties_ = 0;
};

}  // namespace tessera::core

#endif  // TESSERA_CORE_RANDOM_H_
