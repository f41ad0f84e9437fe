#include "core/placement/compression.h"

#include <algorithm>
#include <numeric>

namespace tessera::core {

std::optional<std::vector<MilliGpu>> CompressionCuts(std::span<const MilliGpu> shares, MilliGpu deficit,
                                                     MilliGpu min_share) {
  const size_t n = shares.size();
  std::vector<MilliGpu> cuts(n, MilliGpu(0));
  if (deficit.value() <= 0) return cuts;
  if (n == 0) return std::nullopt;
  // Unit: whole percent when everything is in whole percent, else thousandths.
  bool percent = deficit.value() % 10 == 0 && min_share.value() % 10 == 0;
  for (MilliGpu s : shares) percent = percent && s.value() % 10 == 0;
  const int64_t unit = percent ? 10 : 1;

  std::vector<int64_t> room(n);  // what each tenant can give, in units
  int64_t total_room = 0;
  for (size_t i = 0; i < n; ++i) {
    room[i] = std::max<int64_t>(0, (shares[i].value() - min_share.value()) / unit);
    total_room += room[i];
  }
  int64_t remaining = (deficit.value() + unit - 1) / unit;
  if (total_room < remaining) return std::nullopt;

  // Largest share first (the paper's order for who gives the extra unit); stable for equal shares.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return shares[a] > shares[b]; });

  std::vector<int64_t> cut(n, 0);
  std::vector<size_t> active;
  for (size_t i : order) {
    if (room[i] > 0) active.push_back(i);
  }
  while (remaining > 0) {
    const int64_t count = static_cast<int64_t>(active.size());
    const int64_t q = remaining % count;  // equation (1)
    const int64_t r = remaining / count;  // equation (2)
    std::vector<size_t> still;
    int64_t given = 0;
    for (int64_t k = 0; k < count; ++k) {
      const size_t i = active[static_cast<size_t>(k)];
      const int64_t want = r + (k < q ? 1 : 0);
      const int64_t take = std::min(want, room[i] - cut[i]);
      cut[i] += take;
      given += take;
      if (cut[i] < room[i]) still.push_back(i);
    }
    remaining -= given;
    active = std::move(still);
  }
  for (size_t i = 0; i < n; ++i) cuts[i] = MilliGpu(static_cast<int32_t>(cut[i] * unit));
  return cuts;
}

}  // namespace tessera::core
