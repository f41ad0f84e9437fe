#include "hook/common/region.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

namespace tessera::hook {

namespace {

uint32_t OwnerPid(uint64_t owner) {
  return static_cast<uint32_t>(owner & 0xffffffffu);
}
uint32_t ReclaimerPid(uint64_t owner) {
  return static_cast<uint32_t>(owner >> 32);
}
uint64_t MakeOwner(uint32_t pid, uint32_t reclaimer) {
  return static_cast<uint64_t>(pid) | (static_cast<uint64_t>(reclaimer) << 32);
}

bool InitRobustMutex(pthread_mutex_t* m) {
  pthread_mutexattr_t attr;
  if (pthread_mutexattr_init(&attr) != 0) return false;
  bool ok = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) == 0 &&
            pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST) == 0 && pthread_mutex_init(m, &attr) == 0;
  pthread_mutexattr_destroy(&attr);
  return ok;
}

// Whether the process recorded in a slot is gone: no such pid, or the pid now belongs to a process that
// started at another time (pid reuse).
bool OwnerGone(uint32_t pid, uint64_t recorded_start) {
  if (!ProcessAlive(static_cast<int>(pid))) return true;
  if (recorded_start == 0) return false;
  const uint64_t now_start = ProcessStartTime(static_cast<int>(pid));
  return now_start != 0 && now_start != recorded_start;
}

}  // namespace

void SharedRegion::Close() {
  if (base_ != nullptr) {
    munmap(base_, kRegionBytes);
    base_ = nullptr;
  }
  slot_ = -1;
}

bool SharedRegion::Map(int fd, Error* error) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    error->Set("cannot stat region file %s: %s", path_, strerror(errno));
    return false;
  }
  if (static_cast<size_t>(st.st_size) < sizeof(RegionHeader)) {
    error->Set("region file %s is %lld bytes, too small to be a Tessera region: remove it (no process of the "
               "container may be using the GPU) and start again",
               path_, static_cast<long long>(st.st_size));
    return false;
  }
  RegionHeader probe;
  if (pread(fd, &probe, sizeof(probe), 0) != static_cast<ssize_t>(sizeof(probe))) {
    error->Set("cannot read region file %s: %s", path_, strerror(errno));
    return false;
  }
  if (probe.magic != kRegionMagic) {
    error->Set("%s is not a Tessera shared region (bad magic): point TESSERA_REGION at another path", path_);
    return false;
  }
  if (probe.version != kRegionVersion) {
    error->Set("region file %s has layout version %u; this library uses version %u: processes built with "
               "different Tessera versions cannot share a region; restart the container",
               path_, probe.version, kRegionVersion);
    return false;
  }
  if (probe.region_bytes != kRegionBytes || static_cast<uint64_t>(st.st_size) < kRegionBytes ||
      probe.slot_count != kRegionSlots || probe.slots_offset != kRegionSlotsOffset ||
      probe.devices_offset != kRegionDevicesOffset) {
    error->Set("region file %s has an unexpected layout (size %lld): remove it and restart the container", path_,
               static_cast<long long>(st.st_size));
    return false;
  }
  void* p = mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    error->Set("cannot map region file %s: %s", path_, strerror(errno));
    return false;
  }
  base_ = p;
  return true;
}

bool SharedRegion::Create(const char* path, Error* error) {
  char tmp[kPathSize + 48];
  snprintf(tmp, sizeof(tmp), "%s.%d.%llu.tmp", path, static_cast<int>(getpid()),
           static_cast<unsigned long long>(MonotonicNs()));
  const int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    error->Set("cannot create the shared region %s: %s (the directory must be writable by the container)", tmp,
               strerror(errno));
    return false;
  }
  fchmod(fd, 0666);  // every user of the container shares its one quota
  if (ftruncate(fd, static_cast<off_t>(kRegionBytes)) != 0) {
    error->Set("cannot size the shared region %s: %s", tmp, strerror(errno));
    close(fd);
    unlink(tmp);
    return false;
  }
  void* p = mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    error->Set("cannot map the shared region %s: %s", tmp, strerror(errno));
    close(fd);
    unlink(tmp);
    return false;
  }
  auto* h = static_cast<RegionHeader*>(p);
  h->version = kRegionVersion;
  h->header_bytes = kRegionHeaderBytes;
  h->device_bytes = kRegionDeviceBytes;
  h->device_count_max = kMaxDevices;
  h->slot_bytes = kRegionSlotBytes;
  h->slot_count = kRegionSlots;
  h->devices_offset = kRegionDevicesOffset;
  h->slots_offset = kRegionSlotsOffset;
  h->region_bytes = kRegionBytes;
  h->creator_pid = static_cast<uint32_t>(getpid());
  bool ok = InitRobustMutex(&h->table_lock);
  for (int i = 0; ok && i < kMaxDevices; ++i) {
    auto* d = reinterpret_cast<RegionDevice*>(static_cast<char*>(p) + kRegionDevicesOffset +
                                              static_cast<size_t>(i) * kRegionDeviceBytes);
    ok = InitRobustMutex(&d->lock);
  }
  h->magic = kRegionMagic;
  munmap(p, kRegionBytes);
  if (!ok) {
    error->Set("cannot initialize the shared region's process-shared robust mutexes");
    close(fd);
    unlink(tmp);
    return false;
  }
  fsync(fd);
  close(fd);
  // Publish: link(2) fails when another process published first; then use theirs.
  const int rc = link(tmp, path);
  const int link_errno = errno;
  unlink(tmp);
  if (rc != 0 && link_errno != EEXIST) {
    error->Set("cannot publish the shared region at %s: %s", path, strerror(link_errno));
    return false;
  }
  return true;
}

bool SharedRegion::Open(const char* path, Error* error) {
  Close();
  if (!CopyString(path_, sizeof(path_), path)) {
    error->Set("region path is too long: %s", path);
    return false;
  }
  pid_ = static_cast<int>(getpid());
  for (int attempt = 0; attempt < 3; ++attempt) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
      if (!Create(path, error)) return false;
      fd = open(path, O_RDWR | O_CLOEXEC);
    }
    if (fd < 0) {
      if (errno == ENOENT) continue;  // removed between create and open: try again
      error->Set("cannot open the shared region %s: %s", path, strerror(errno));
      return false;
    }
    const bool ok = Map(fd, error);
    close(fd);
    return ok;
  }
  error->Set("the shared region %s keeps disappearing: is something removing it?", path);
  return false;
}

RegionDevice* SharedRegion::device(int index) const {
  return reinterpret_cast<RegionDevice*>(static_cast<char*>(base_) + kRegionDevicesOffset +
                                         static_cast<size_t>(index) * kRegionDeviceBytes);
}

RegionSlot* SharedRegion::slot_at(int index) const {
  return reinterpret_cast<RegionSlot*>(static_cast<char*>(base_) + kRegionSlotsOffset +
                                       static_cast<size_t>(index) * kRegionSlotBytes);
}

int SharedRegion::device_count() const {
  const uint32_t n = header()->device_count.load(std::memory_order_acquire);
  return n > static_cast<uint32_t>(kMaxDevices) ? kMaxDevices : static_cast<int>(n);
}

bool SharedRegion::TimedLock(pthread_mutex_t* m, const char* what, int dev) {
  timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += lock_timeout_ms_ / 1000;
  deadline.tv_nsec += static_cast<long>(lock_timeout_ms_ % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
  int rc;
  do {
    rc = pthread_mutex_timedlock(m, &deadline);
  } while (rc == EINTR || rc == EAGAIN);
  if (rc == 0) return true;
  if (rc == EOWNERDEAD) {
    // The holder died inside its critical section. A device's total is rebuilt from the slots; for the
    // table, adding an entry is: write the UUID, then publish it by raising device_count, so a holder that
    // died before the raise left at most an unpublished entry, which the next add overwrites.
    if (dev >= 0) RepairLocked(dev);
    pthread_mutex_consistent(m);
    return true;
  }
  // The lock word names a thread that does not let go (or is garbage): never wait on a tenant forever.
  int owner = 0;
  memcpy(&owner, m, sizeof(owner));  // glibc: the first word of a robust mutex is the owner's thread id
  lock_error_.Set("the %s lock of the shared region %s%s was held for more than %d ms (by thread %d): a "
                  "process of the container holds it and does not let go, or the file was tampered with; "
                  "stop the container's GPU processes and remove the file",
                  what, path_, dev >= 0 ? " (a GPU entry)" : "", lock_timeout_ms_, owner & 0x3fffffff);
  return false;
}

bool SharedRegion::LockTable() {
  return TimedLock(&header()->table_lock, "table", -1);
}

int SharedRegion::FindDevice(const char* uuid) const {
  const int n = device_count();
  for (int i = 0; i < n; ++i) {
    if (strncmp(device(i)->uuid, uuid, kUuidSize) == 0) return i;
  }
  return -1;
}

int SharedRegion::FindOrAddDevice(const char* uuid, Error* error) {
  int found = FindDevice(uuid);
  if (found >= 0) return found;
  if (!LockTable()) {
    error->Set("%s", lock_error_.text);
    return -1;
  }
  found = FindDevice(uuid);
  if (found < 0) {
    const int n = device_count();
    if (n >= kMaxDevices) {
      pthread_mutex_unlock(&header()->table_lock);
      error->Set("shared region %s already tracks %d GPUs; no room for %s", path_, kMaxDevices, uuid);
      return -1;
    }
    CopyString(device(n)->uuid, kUuidSize, uuid);
    header()->device_count.store(static_cast<uint32_t>(n + 1), std::memory_order_release);
    found = n;
  }
  pthread_mutex_unlock(&header()->table_lock);
  return found;
}

void SharedRegion::RepairLocked(int dev) {
  uint64_t sum = 0;
  for (uint32_t i = 0; i < kRegionSlots; ++i) {
    RegionSlot* s = slot_at(static_cast<int>(i));
    if (s->owner.load(std::memory_order_acquire) == 0) continue;
    sum += s->charged[dev].load(std::memory_order_relaxed);
  }
  device(dev)->used_bytes.store(sum, std::memory_order_relaxed);
}

bool SharedRegion::Lock(int dev) {
  return TimedLock(&device(dev)->lock, "GPU", dev);
}

void SharedRegion::Unlock(int dev) {
  pthread_mutex_unlock(&device(dev)->lock);
}

bool SharedRegion::Attach(Error* error) {
  if (slot_ >= 0) return true;
  pid_ = static_cast<int>(getpid());
  const uint64_t my_start = ProcessStartTime(pid_);
  // A slot with this pid is from this very process before an exec(): its allocations died with the old image.
  for (uint32_t i = 0; i < kRegionSlots; ++i) {
    RegionSlot* s = slot_at(static_cast<int>(i));
    const uint64_t owner = s->owner.load(std::memory_order_acquire);
    if (owner != 0 && OwnerPid(owner) == static_cast<uint32_t>(pid_) && ReclaimerPid(owner) == 0) {
      ReclaimSlot(static_cast<int>(i), owner);
    }
  }
  ReclaimDeadSlots();
  const uint32_t start = static_cast<uint32_t>(pid_) * 2654435761u % kRegionSlots;
  for (uint32_t k = 0; k < kRegionSlots; ++k) {
    const int i = static_cast<int>((start + k) % kRegionSlots);
    RegionSlot* s = slot_at(i);
    uint64_t expected = 0;
    if (s->owner.compare_exchange_strong(expected, MakeOwner(static_cast<uint32_t>(pid_), 0),
                                         std::memory_order_acq_rel)) {
      s->start_time.store(my_start, std::memory_order_relaxed);
      s->attached_ns.store(MonotonicNs(), std::memory_order_relaxed);
      slot_ = i;
      return true;
    }
  }
  error->Set("shared region %s has no free process slot (%u processes of this container use the GPU)", path_,
             kRegionSlots);
  return false;
}

void SharedRegion::Detach() {
  const int me = slot_.exchange(-1);
  if (me < 0) return;
  RegionSlot* s = slot_at(me);
  const int n = device_count();
  for (int d = 0; d < n; ++d) {
    // A lock that does not come: leave this GPU's charge to the next reclaim (the slot is freed below, and
    // a repair rebuilds the total from the slots).
    if (!Lock(d)) continue;
    const uint64_t mine = s->charged[d].load(std::memory_order_relaxed);
    RegionDevice* dev = device(d);
    const uint64_t used = dev->used_bytes.load(std::memory_order_relaxed);
    dev->used_bytes.store(used >= mine ? used - mine : 0, std::memory_order_relaxed);
    s->charged[d].store(0, std::memory_order_relaxed);
    Unlock(d);
  }
  s->start_time.store(0, std::memory_order_relaxed);
  s->host_pid.store(0, std::memory_order_relaxed);
  s->owner.store(0, std::memory_order_release);
}

bool SharedRegion::ReclaimSlot(int index, uint64_t observed_owner) {
  RegionSlot* s = slot_at(index);
  const uint64_t mine = MakeOwner(OwnerPid(observed_owner), static_cast<uint32_t>(pid_));
  // Bind the reclaim to the exact owner we judged dead: a slot freed and claimed again in between differs.
  if (!s->owner.compare_exchange_strong(observed_owner, mine, std::memory_order_acq_rel)) return false;
  const int n = device_count();
  for (int d = 0; d < n; ++d) {
    if (!Lock(d)) {
      // Give the slot back to its dead owner: a later reclaim tries again.
      s->owner.store(observed_owner, std::memory_order_release);
      return false;
    }
    const uint64_t charged = s->charged[d].load(std::memory_order_relaxed);
    RegionDevice* dev = device(d);
    const uint64_t used = dev->used_bytes.load(std::memory_order_relaxed);
    dev->used_bytes.store(used >= charged ? used - charged : 0, std::memory_order_relaxed);
    s->charged[d].store(0, std::memory_order_relaxed);
    Unlock(d);
  }
  s->start_time.store(0, std::memory_order_relaxed);
  s->host_pid.store(0, std::memory_order_relaxed);
  s->owner.store(0, std::memory_order_release);
  return true;
}

int SharedRegion::ReclaimDeadSlots() {
  int freed = 0;
  for (uint32_t i = 0; i < kRegionSlots; ++i) {
    RegionSlot* s = slot_at(static_cast<int>(i));
    const uint64_t owner = s->owner.load(std::memory_order_acquire);
    if (owner == 0) continue;
    const uint32_t pid = OwnerPid(owner);
    const uint32_t reclaimer = ReclaimerPid(owner);
    if (static_cast<int>(i) == slot_) continue;
    if (reclaimer != 0) {
      // Someone is reclaiming it; take over only when that someone died too.
      if (reclaimer == static_cast<uint32_t>(pid_) || ProcessAlive(static_cast<int>(reclaimer))) continue;
      if (ReclaimSlot(static_cast<int>(i), owner)) ++freed;
      continue;
    }
    if (pid == static_cast<uint32_t>(pid_)) continue;
    if (!OwnerGone(pid, s->start_time.load(std::memory_order_relaxed))) continue;
    if (ReclaimSlot(static_cast<int>(i), owner)) ++freed;
  }
  return freed;
}

void SharedRegion::SetDeviceLimits(int dev, const DeviceLimits& limits, uint64_t now_ns) {
  RegionDevice* d = device(dev);
  d->limit_bytes.store(limits.memory_bytes, std::memory_order_relaxed);
  ControllerState* c = &d->controller;
  // The share as the ledger committed it (cores-milli, exact), or the whole percent of an older file.
  const uint32_t share = SharePpm(limits) >= kPpm ? kPpm : SharePpm(limits);
  const uint32_t ceiling = CeilingPpm(limits) >= kPpm ? kPpm : CeilingPpm(limits);
  const bool elastic = limits.policy == ComputePolicy::kElastic && share < kPpm;
  c->share_ppm.store(share, std::memory_order_relaxed);
  c->ceiling_ppm.store(ceiling < share ? share : ceiling, std::memory_order_relaxed);
  c->policy.store(static_cast<uint32_t>(limits.policy), std::memory_order_relaxed);
  c->priority.store(static_cast<uint32_t>(limits.priority), std::memory_order_relaxed);
  // The rate starts at the share. An elastic container that already runs above its share keeps its rate
  // (clamped to the new ceiling) and lets the controller move it.
  uint32_t rate = share;
  if (elastic) {
    const uint32_t current = d->bucket.rate_ppm.load(std::memory_order_relaxed);
    const uint32_t ceil = ceiling < share ? share : ceiling;
    if (d->bucket.limited.load(std::memory_order_relaxed) != 0 && current > share) {
      rate = current > ceil ? ceil : current;
    }
  }
  TokenBucket::Configure(&d->bucket, rate, now_ns);
}

void SharedRegion::AddChargeLocked(int dev, RegionSlot* s, uint64_t bytes) {
  RegionDevice* d = device(dev);
  const uint64_t now_used = d->used_bytes.load(std::memory_order_relaxed) + bytes;
  charged_total_.fetch_add(bytes, std::memory_order_seq_cst);  // before the slot shows it (region.h)
  d->used_bytes.store(now_used, std::memory_order_relaxed);
  s->charged[dev].fetch_add(bytes, std::memory_order_release);
  if (now_used > d->peak_bytes.load(std::memory_order_relaxed)) {
    d->peak_bytes.store(now_used, std::memory_order_relaxed);
  }
}

ChargeResult SharedRegion::TryCharge(int dev, uint64_t bytes) {
  RegionDevice* d = device(dev);
  if (!Lock(dev)) return ChargeResult::kLockTimeout;
  RegionSlot* s = MySlot();
  const uint64_t limit = d->limit_bytes.load(std::memory_order_relaxed);
  const uint64_t used = d->used_bytes.load(std::memory_order_relaxed);
  ChargeResult result = ChargeResult::kOk;
  if (s == nullptr) {
    result = ChargeResult::kDetached;
  } else if (limit != 0 && (bytes > limit || used > limit - bytes)) {
    result = ChargeResult::kOverLimit;
  } else {
    AddChargeLocked(dev, s, bytes);
  }
  Unlock(dev);
  return result;
}

bool SharedRegion::ForceCharge(int dev, uint64_t bytes) {
  if (!Lock(dev)) return false;
  RegionSlot* s = MySlot();
  if (s != nullptr) AddChargeLocked(dev, s, bytes);
  Unlock(dev);
  return s != nullptr;
}

bool SharedRegion::Uncharge(int dev, uint64_t bytes) {
  RegionDevice* d = device(dev);
  if (!Lock(dev)) return false;
  RegionSlot* s = MySlot();
  if (s == nullptr) {
    Unlock(dev);
    return true;  // Detach gave everything back
  }
  const uint64_t mine = s->charged[dev].load(std::memory_order_relaxed);
  const uint64_t take = bytes > mine ? mine : bytes;
  uncharged_total_.fetch_add(take, std::memory_order_seq_cst);
  s->charged[dev].store(mine - take, std::memory_order_release);
  const uint64_t used = d->used_bytes.load(std::memory_order_relaxed);
  d->used_bytes.store(used >= take ? used - take : 0, std::memory_order_relaxed);
  Unlock(dev);
  return true;
}

bool SharedRegion::ContainerPidForHostPid(uint32_t host_pid, uint32_t* local) const {
  if (host_pid == 0) return false;
  for (uint32_t i = 0; i < kRegionSlots; ++i) {
    const RegionSlot* s = slot_at(static_cast<int>(i));
    const uint64_t owner = s->owner.load(std::memory_order_acquire);
    if (owner == 0 || ReclaimerPid(owner) != 0) continue;
    if (s->host_pid.load(std::memory_order_relaxed) != host_pid) continue;
    *local = OwnerPid(owner);
    return true;
  }
  return false;
}

void SharedRegion::SetHostPid(uint32_t host_pid) {
  if (RegionSlot* s = MySlot(); s != nullptr) s->host_pid.store(host_pid, std::memory_order_relaxed);
}

uint64_t SharedRegion::Used(int dev) const {
  return device(dev)->used_bytes.load(std::memory_order_relaxed);
}

uint64_t SharedRegion::Limit(int dev) const {
  return device(dev)->limit_bytes.load(std::memory_order_relaxed);
}

uint64_t SharedRegion::ChargedByMe(int dev) const {
  const RegionSlot* s = MySlot();
  return s != nullptr ? s->charged[dev].load(std::memory_order_acquire) : 0;
}

bool SharedRegion::CheckConsistent(int dev) {
  if (!Lock(dev)) return false;
  uint64_t sum = 0;
  for (uint32_t i = 0; i < kRegionSlots; ++i) {
    RegionSlot* s = slot_at(static_cast<int>(i));
    if (s->owner.load(std::memory_order_acquire) == 0) continue;
    sum += s->charged[dev].load(std::memory_order_relaxed);
  }
  const bool ok = sum == device(dev)->used_bytes.load(std::memory_order_relaxed);
  Unlock(dev);
  return ok;
}

}  // namespace tessera::hook
