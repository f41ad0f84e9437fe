// The process-local allocation records: an open-addressing hash table in mmapped memory (no operator new, no
// libstdc++), guarded by one mutex. Only memory calls use it, never the launch path.
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#include "hook/cuda/hook.h"

namespace tessera::cuda_hook {

namespace {

struct Cell {
  uint64_t key;
  uint32_t kind;   // 0 empty, 0xffffffff deleted
  uint32_t pad;
  AllocRecord record;
};

constexpr uint32_t kDeleted = 0xffffffffu;

pthread_mutex_t g_table_mutex = PTHREAD_MUTEX_INITIALIZER;
Cell* g_cells = nullptr;
size_t g_capacity = 0;  // power of two
size_t g_used = 0;      // live + deleted

size_t Hash(uint32_t kind, uint64_t key) {
  uint64_t h = key ^ (static_cast<uint64_t>(kind) * 0x9e3779b97f4a7c15ull);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 29;
  return static_cast<size_t>(h);
}

Cell* Allocate(size_t capacity) {
  void* p = mmap(nullptr, capacity * sizeof(Cell), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<Cell*>(p);
}

bool Grow() {
  const size_t next = g_capacity == 0 ? 1024 : g_capacity * 2;
  Cell* cells = Allocate(next);
  if (cells == nullptr) return false;
  size_t used = 0;
  for (size_t i = 0; i < g_capacity; ++i) {
    const Cell& c = g_cells[i];
    if (c.kind == 0 || c.kind == kDeleted) continue;
    size_t j = Hash(c.kind, c.key) & (next - 1);
    while (cells[j].kind != 0) j = (j + 1) & (next - 1);
    cells[j] = c;
    ++used;
  }
  if (g_cells != nullptr) munmap(g_cells, g_capacity * sizeof(Cell));
  g_cells = cells;
  g_capacity = next;
  g_used = used;
  return true;
}

Cell* FindLocked(uint32_t kind, uint64_t key) {
  if (g_capacity == 0) return nullptr;
  size_t j = Hash(kind, key) & (g_capacity - 1);
  for (size_t n = 0; n < g_capacity; ++n) {
    Cell& c = g_cells[j];
    if (c.kind == 0) return nullptr;
    if (c.kind == kind && c.key == key) return &c;
    j = (j + 1) & (g_capacity - 1);
  }
  return nullptr;
}

struct TableLock {
  TableLock() { pthread_mutex_lock(&g_table_mutex); }
  ~TableLock() { pthread_mutex_unlock(&g_table_mutex); }
};

}  // namespace

void RecordAlloc(AllocKind kind, uint64_t key, const AllocRecord& record) {
  TableLock lock;
  const uint32_t k = static_cast<uint32_t>(kind);
  if (Cell* c = FindLocked(k, key)) {
    c->record = record;
    return;
  }
  if ((g_used + 1) * 2 > g_capacity && !Grow()) {
    hook::LogLine(hook::LogLevel::kError, "out of memory for allocation records; a charge will not be released");
    return;
  }
  size_t j = Hash(k, key) & (g_capacity - 1);
  while (g_cells[j].kind != 0 && g_cells[j].kind != kDeleted) j = (j + 1) & (g_capacity - 1);
  if (g_cells[j].kind == 0) ++g_used;
  g_cells[j].key = key;
  g_cells[j].kind = k;
  g_cells[j].record = record;
}

bool TakeAlloc(AllocKind kind, uint64_t key, AllocRecord* out) {
  TableLock lock;
  Cell* c = FindLocked(static_cast<uint32_t>(kind), key);
  if (c == nullptr) return false;
  *out = c->record;
  c->kind = kDeleted;
  return true;
}

bool FindAlloc(AllocKind kind, uint64_t key, AllocRecord* out) {
  TableLock lock;
  Cell* c = FindLocked(static_cast<uint32_t>(kind), key);
  if (c == nullptr) return false;
  *out = c->record;
  return true;
}

bool UpdateAlloc(AllocKind kind, uint64_t key, const AllocRecord& record) {
  TableLock lock;
  Cell* c = FindLocked(static_cast<uint32_t>(kind), key);
  if (c == nullptr) return false;
  c->record = record;
  return true;
}

void ReleaseOwned(AllocKind kind, uint64_t owner) {
  // Collect under the lock, uncharge outside it (the region lock is never taken inside the table lock).
  for (;;) {
    uint64_t bytes[64];
    int ordinals[64];
    int n = 0;
    {
      TableLock lock;
      for (size_t i = 0; i < g_capacity && n < 64; ++i) {
        Cell& c = g_cells[i];
        if (c.kind != static_cast<uint32_t>(kind) || c.record.owner != owner) continue;
        bytes[n] = c.record.bytes;
        ordinals[n] = c.record.ordinal;
        ++n;
        c.kind = kDeleted;
      }
    }
    for (int i = 0; i < n; ++i) Uncharge(ordinals[i], bytes[i]);
    if (n < 64) return;
  }
}

int CollectInRange(AllocKind kind, uint64_t begin, uint64_t end, uint64_t* keys, AllocRecord* records, int max) {
  TableLock lock;
  int n = 0;
  for (size_t i = 0; i < g_capacity && n < max; ++i) {
    const Cell& c = g_cells[i];
    if (c.kind != static_cast<uint32_t>(kind) || c.key < begin || c.key >= end) continue;
    keys[n] = c.key;
    records[n] = c.record;
    ++n;
  }
  return n;
}

// After fork(), in the child: the parent's allocations are not the child's (CUDA state does not survive fork).
void ResetAllocTableInChild() {
  pthread_mutex_init(&g_table_mutex, nullptr);
  for (size_t i = 0; i < g_capacity; ++i) g_cells[i] = Cell{};
  g_used = 0;
}

}  // namespace tessera::cuda_hook
