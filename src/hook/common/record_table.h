// The hook libraries' process-local records of what they charged: an open-addressing hash table in mmapped
// memory (no operator new, no C++ library), keyed by a kind and a 64-bit handle, guarded by one mutex. Used by
// memory calls only, never by the launch path.
//
//   tessera::hook::RecordTable<MyRecord> table;       // a global: zero-initialized, usable at once
//   table.Put(kind, handle, record);
//   MyRecord r;
//   if (table.Take(kind, handle, &r)) Uncharge(r.bytes);
//   table.Update(kind, handle, [](MyRecord* r) { ++r->refs; return true; });
//   table.ResetInChild();                             // after fork(), in the child
//
// Thread-safety: every method takes the table's mutex; callbacks run under it and must not call back into the
// table or take region locks. `Record` must be trivially copyable.
#ifndef TESSERA_HOOK_COMMON_RECORD_TABLE_H_
#define TESSERA_HOOK_COMMON_RECORD_TABLE_H_

#include <pthread.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace tessera::hook {

template <typename Record>
class RecordTable {
 public:
  // Kind 0 and kDeletedKind are reserved.
  static constexpr uint32_t kDeletedKind = 0xffffffffu;

  // Inserts or overwrites. False when the table cannot grow (out of memory): the record is lost.
  bool Put(uint32_t kind, uint64_t key, const Record& record) {
    Lock lock(this);
    if (Cell* c = FindLocked(kind, key)) {
      c->record = record;
      return true;
    }
    if ((used_ + 1) * 2 > capacity_ && !Grow()) return false;
    size_t j = Hash(kind, key) & (capacity_ - 1);
    while (cells_[j].kind != 0 && cells_[j].kind != kDeletedKind) j = (j + 1) & (capacity_ - 1);
    if (cells_[j].kind == 0) ++used_;
    cells_[j].key = key;
    cells_[j].kind = kind;
    cells_[j].record = record;
    return true;
  }
  bool Find(uint32_t kind, uint64_t key, Record* out) {
    Lock lock(this);
    Cell* c = FindLocked(kind, key);
    if (c == nullptr) return false;
    *out = c->record;
    return true;
  }
  // Removes the record and returns it.
  bool Take(uint32_t kind, uint64_t key, Record* out) {
    Lock lock(this);
    Cell* c = FindLocked(kind, key);
    if (c == nullptr) return false;
    *out = c->record;
    c->kind = kDeletedKind;
    return true;
  }
  // Calls `fn(Record*)` on the record; when it returns false the record is removed (after `fn` copied what it
  // needs). False when there is no such record.
  template <typename Fn>
  bool Update(uint32_t kind, uint64_t key, Fn fn) {
    Lock lock(this);
    Cell* c = FindLocked(kind, key);
    if (c == nullptr) return false;
    if (!fn(&c->record)) c->kind = kDeletedKind;
    return true;
  }
  // Copies up to `max` records of `kind` for which `pred(key, record)` holds into keys/records, removing them
  // when `remove`. Returns how many.
  template <typename Pred>
  int Collect(uint32_t kind, Pred pred, uint64_t* keys, Record* records, int max, bool remove) {
    Lock lock(this);
    int n = 0;
    for (size_t i = 0; i < capacity_ && n < max; ++i) {
      Cell& c = cells_[i];
      if (c.kind != kind || !pred(c.key, c.record)) continue;
      if (keys != nullptr) keys[n] = c.key;
      records[n] = c.record;
      ++n;
      if (remove) c.kind = kDeletedKind;
    }
    return n;
  }
  // After fork(), in the child: the parent's records are not the child's.
  void ResetInChild() {
    pthread_mutex_init(&mutex_, nullptr);
    for (size_t i = 0; i < capacity_; ++i) cells_[i] = Cell{};
    used_ = 0;
  }

 private:
  struct Cell {
    uint64_t key;
    uint32_t kind;  // 0 empty, kDeletedKind deleted
    uint32_t pad;
    Record record;
  };
  struct Lock {
    explicit Lock(RecordTable* t) : table(t) { pthread_mutex_lock(&table->mutex_); }
    ~Lock() { pthread_mutex_unlock(&table->mutex_); }
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;
    RecordTable* table;
  };

  static size_t Hash(uint32_t kind, uint64_t key) {
    uint64_t h = key ^ (static_cast<uint64_t>(kind) * 0x9e3779b97f4a7c15ull);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return static_cast<size_t>(h);
  }
  bool Grow() {
    const size_t next = capacity_ == 0 ? 1024 : capacity_ * 2;
    void* p = mmap(nullptr, next * sizeof(Cell), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    Cell* cells = static_cast<Cell*>(p);
    size_t used = 0;
    for (size_t i = 0; i < capacity_; ++i) {
      const Cell& c = cells_[i];
      if (c.kind == 0 || c.kind == kDeletedKind) continue;
      size_t j = Hash(c.kind, c.key) & (next - 1);
      while (cells[j].kind != 0) j = (j + 1) & (next - 1);
      cells[j] = c;
      ++used;
    }
    if (cells_ != nullptr) munmap(cells_, capacity_ * sizeof(Cell));
    cells_ = cells;
    capacity_ = next;
    used_ = used;
    return true;
  }
  Cell* FindLocked(uint32_t kind, uint64_t key) {
    if (capacity_ == 0) return nullptr;
    size_t j = Hash(kind, key) & (capacity_ - 1);
    for (size_t n = 0; n < capacity_; ++n) {
      Cell& c = cells_[j];
      if (c.kind == 0) return nullptr;
      if (c.kind == kind && c.key == key) return &c;
      j = (j + 1) & (capacity_ - 1);
    }
    return nullptr;
  }

  pthread_mutex_t mutex_ = PTHREAD_MUTEX_INITIALIZER;
  Cell* cells_ = nullptr;
  size_t capacity_ = 0;  // power of two
  size_t used_ = 0;      // live + deleted
};

}  // namespace tessera::hook

#endif  // TESSERA_HOOK_COMMON_RECORD_TABLE_H_
