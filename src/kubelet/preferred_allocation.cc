#include "kubelet/preferred_allocation.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace tessera::kubelet {

std::vector<std::string> PreferredSlots(const std::vector<DeviceSlot>& available,
                                        const std::vector<std::string>& must_include, int size,
                                        const core::LinkMatrix* links) {
  std::vector<std::string> chosen;
  std::set<std::string> chosen_ids;
  std::set<int> used_gpus;  // by index
  int anchor_numa = -1;
  std::map<std::string, const DeviceSlot*> by_id;
  for (const DeviceSlot& s : available) by_id.emplace(s.id, &s);

  auto take = [&](const std::string& id) {
    if (!chosen_ids.insert(id).second) return;
    chosen.push_back(id);
    auto it = by_id.find(id);
    if (it == by_id.end()) return;  // a must-include ID the plugin does not know: kept, tells nothing
    used_gpus.insert(it->second->gpu_index);
    if (anchor_numa < 0) anchor_numa = it->second->numa_node;
  };
  for (const std::string& id : must_include) take(id);

  std::map<int, int> free_slots;  // GPU index -> available slots not chosen
  for (const DeviceSlot& s : available) {
    if (!chosen_ids.count(s.id)) ++free_slots[s.gpu_index];
  }
  const bool have_links = links != nullptr && links->size() > 0;
  while (static_cast<int>(chosen.size()) < size) {
    const DeviceSlot* best = nullptr;
    std::tuple<int, int, int, int, int, int, int> best_key{};
    for (const DeviceSlot& s : available) {
      if (chosen_ids.count(s.id)) continue;
      int cost = 0;
      if (have_links && s.gpu_index < links->size()) {
        for (int g : used_gpus) {
          if (g < links->size()) cost = std::max(cost, links->at(s.gpu_index, g).Cost());
        }
      }
      const auto key = std::make_tuple(used_gpus.count(s.gpu_index) ? 1 : 0, s.healthy ? 0 : 1,
                                       anchor_numa >= 0 && s.numa_node != anchor_numa ? 1 : 0, cost,
                                       -free_slots[s.gpu_index], s.gpu_index, s.slot);
      if (best == nullptr || key < best_key) {
        best = &s;
        best_key = key;
      }
    }
    if (best == nullptr) break;
    --free_slots[best->gpu_index];
    take(best->id);
  }
  return chosen;
}

}  // namespace tessera::kubelet
