// The process-local allocation records (hook/common/record_table.h: an open-addressing table in mmapped
// memory, one mutex). Only memory calls use it, never the launch path.
#include "hook/common/record_table.h"
#include "hook/cuda/hook.h"

namespace tessera::cuda_hook {

namespace {

hook::RecordTable<AllocRecord> g_table;

uint32_t K(AllocKind kind) {
  return static_cast<uint32_t>(kind);
}

}  // namespace

void RecordAlloc(AllocKind kind, uint64_t key, const AllocRecord& record) {
  if (!g_table.Put(K(kind), key, record)) {
    hook::LogLine(hook::LogLevel::kError, "out of memory for allocation records; a charge will not be released");
  }
}

bool TakeAlloc(AllocKind kind, uint64_t key, AllocRecord* out) {
  return g_table.Take(K(kind), key, out);
}

bool FindAlloc(AllocKind kind, uint64_t key, AllocRecord* out) {
  return g_table.Find(K(kind), key, out);
}

bool UpdateAlloc(AllocKind kind, uint64_t key, const AllocRecord& record) {
  return g_table.Update(K(kind), key, [&](AllocRecord* r) {
    *r = record;
    return true;
  });
}

void ReleaseOwned(AllocKind kind, uint64_t owner) {
  // Collect under the table's lock, uncharge outside it (the region lock is never taken inside the table lock).
  for (;;) {
    AllocRecord records[64];
    const int n = g_table.Collect(
        K(kind), [owner](uint64_t, const AllocRecord& r) { return r.owner == owner; }, nullptr, records, 64,
        /*remove=*/true);
    for (int i = 0; i < n; ++i) Uncharge(records[i].ordinal, records[i].bytes);
    if (n < 64) return;
  }
}

int CollectInRange(AllocKind kind, uint64_t begin, uint64_t end, uint64_t* keys, AllocRecord* records, int max) {
  return g_table.Collect(
      K(kind), [begin, end](uint64_t key, const AllocRecord&) { return key >= begin && key < end; }, keys, records,
      max, /*remove=*/false);
}

void ResetAllocTableInChild() {
  g_table.ResetInChild();
}

}  // namespace tessera::cuda_hook
