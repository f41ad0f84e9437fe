// The object store's fault injection: watches dropped, expired or fed raw data, history compacted.
#include <algorithm>
#include <mutex>

#include "store.h"
#include "store_internal.h"

namespace tessera::fake {

void ObjectStore::DropWatches() {
  ++drop_epoch_;
  NotifyAll();
}

void ObjectStore::ExpireWatches() {
  ++expire_epoch_;
  NotifyAll();
}

void ObjectStore::CompactHistory() {
  {
    std::lock_guard<std::mutex> lock(registry_mu_);
    for (auto& [k, r] : resources_) {
      std::lock_guard<std::mutex> rl(r->mu);
      // Watchers that had not seen every event will get 410; those that had go on.
      if (!r->history.empty()) r->floor = std::max(r->floor, r->history.back()->rv);
      r->history.clear();
    }
  }
  {
    std::lock_guard<std::mutex> lock(snap_mu_);
    snapshots_.clear();
  }
  NotifyAll();
}

void ObjectStore::InjectWatchData(std::string data, bool then_drop) {
  {
    std::lock_guard<std::mutex> lock(inject_mu_);
    ++inject_seq_;
    inject_data_ = std::move(data);
    inject_drop_ = then_drop;
    inject_seq_published_.store(inject_seq_);
  }
  NotifyAll();
}

}  // namespace tessera::fake
