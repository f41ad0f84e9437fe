// NodeAgent: the tenant registry (records loaded at start, record writes decided under the lock), the
// registration socket's handlers and the tenants' shared regions (region jobs, rebuilds, reclaims).
// docs/node-agent.md, "Registration" and docs/security.md.
#include <time.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "common/log.h"
#include "core/strings.h"
#include "node/agent.h"
#include "node/cgroup.h"

namespace tessera::node {

namespace fs = std::filesystem;

namespace {

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Opens (or creates) a region; the returned pointer unmaps it when its last holder (the agent or a region
// job) lets go.
std::shared_ptr<hook::SharedRegion> OpenRegion(const std::string& path, hook::Error* error) {
  auto region = std::make_unique<hook::SharedRegion>();
  if (!region->Open(path.c_str(), error)) return nullptr;
  return std::shared_ptr<hook::SharedRegion>(region.release(), [](hook::SharedRegion* r) {
    r->Close();
    delete r;
  });
}

// A region job: gives the region the record's limits (adding GPU entries takes the region's table lock)
// and/or reclaims dead processes' slots (takes GPU locks). Returns the slots freed.
int RegionWork(hook::SharedRegion& region, const std::optional<hook::Limits>& limits, bool reclaim) {
  if (limits) {
    hook::Error error;
    for (int i = 0; i < limits->device_count; ++i) {
      const int dev = region.FindOrAddDevice(limits->devices[i].uuid, &error);
      if (dev >= 0) region.SetDeviceLimits(dev, limits->devices[i], MonotonicNs());
    }
  }
  return reclaim ? region.ReclaimDeadSlots() : 0;
}

// Reclaims that freed nothing are retried at the next passes (the process may still be a zombie), this many
// times.
constexpr int kReclaimAttempts = 10;

}  // namespace

// --- records ---------------------------------------------------------------------------------------------

bool NodeAgent::IsContainerDirOf(const std::string& dir, const char* top) const {
  const fs::path rel = fs::path(dir).lexically_relative(fs::path(config_.state_dir) / top);
  std::vector<std::string> parts;
  for (const fs::path& part : rel) parts.push_back(part.string());
  return parts.size() == 2 && SafePathName(parts[0]) && SafePathName(parts[1]);
}

void NodeAgent::LoadRecords() {
  // A record's directories are <state_dir>/containers/<uid>/<container> and regions/<uid>/<container> (those
  // of the container it was made for: a swapped record keeps them, since the running container mounts them).
  // A record naming others (an edited file) would make the agent write or remove elsewhere.
  RecordStore::Loaded loaded = records_.LoadAll([this](const ContainerRecord& r) {
    if (IsContainerDirOf(r.dir, "containers") && IsContainerDirOf(r.region_dir, "regions"))
      return absl::OkStatus();
    return absl::InvalidArgumentError(StrCat("it names directories the agent would not have made: dir ",
                                             r.dir, ", regionDir ", r.region_dir));
  });
  for (const std::string& bad : loaded.bad) log::Error("unreadable record; moved aside", {{"error", bad}});
  std::map<std::string, Tenant> tenants;
  for (ContainerRecord& r : loaded.records) {
    Tenant t;
    t.record = std::move(r);
    // The limits file and region stay as they were; make sure they exist (a crash may have cut the first
    // write short).
    if (!fs::exists(fs::path(t.record.dir) / "limits")) {
      if (absl::Status s = WriteLimits(t.record); !s.ok())
        log::Error("cannot rewrite limits", {{"error", Message(s)}});
    }
    hook::Error error;
    t.region = OpenRegion((fs::path(t.record.region_dir) / "region").string(), &error);
    if (!t.region) {
      log::Error("cannot open a tenant's region", {{"tenant", t.record.key()}, {"error", error.text}});
    }
    tenants[t.record.key()] = std::move(t);
  }
  MutexLock lock(&mu_);
  for (auto& [key, t] : tenants) tenants_[key] = std::move(t);
  if (!tenants.empty()) log::Info("records loaded", {{"containers", StrCat(tenants.size())}});
}

void NodeAgent::RunFileOps(const std::vector<FileOp>& ops) {
  int failed = 0;
  for (const FileOp& op : ops) {
    if (!op.remove.empty()) {
      if (absl::Status s = records_.Remove(op.remove); !s.ok()) {
        ++failed;
        log::Error("cannot remove a record", {{"error", Message(s)}});
      }
      continue;
    }
    if (absl::Status s = records_.Save(op.save); !s.ok()) {
      ++failed;
      log::Error("cannot save a record; it is lost if the agent restarts now",
                 {{"tenant", op.save.key()}, {"error", Message(s)}});
    }
  }
  if (failed > 0) {
    MutexLock lock(&mu_);
    stats_.record_errors += static_cast<uint64_t>(failed);
  }
}

// --- registration ----------------------------------------------------------------------------------------

absl::StatusOr<RegistrationServer::Accepted> NodeAgent::OnHello(int pid, const hook::Hello& hello) {
  absl::StatusOr<CgroupIdentity> id = IdentifyProcess(config_.proc_root, pid);
  auto refuse = [&](absl::Status s) {
    MutexLock lock(&mu_);
    ++stats_.registrations_refused;
    return s;
  };
  if (!id.ok()) {
    return refuse(absl::PermissionDeniedError(
        StrCat("host process ", pid, " is not in a Kubernetes pod (", Message(id.status()), ")")));
  }
  std::shared_ptr<const std::vector<NodePod>> pods = Pods();
  auto container_name_of = [&](const std::string& uid) -> std::string {
    for (const NodePod& p : *pods) {
      if (p.uid != uid) continue;
      for (const auto& [name, cid] : p.container_ids) {
        if (!id->container_id.empty() && cid == id->container_id) return name;
      }
    }
    return "";
  };
  std::string name = container_name_of(id->pod_uid);
  MutexLock lock(&mu_);
  std::vector<const Tenant*> mine;
  std::vector<const Tenant*> claims;  // DRA claims the pod reserved: shared by the containers that name them
  for (const auto& [key, t] : tenants_) {
    if (t.record.is_claim()) {
      const std::vector<std::string>& c = t.record.claim->consumers;
      if (std::find(c.begin(), c.end(), id->pod_uid) != c.end()) claims.push_back(&t);
    } else if (t.record.pod_uid == id->pod_uid) {
      mine.push_back(&t);
    }
  }
  // A pod with only claims: a process of any of its containers belongs to the claim whose GPUs it names (the
  // first when it names none). One Tessera claim per container is supported (docs/dra.md).
  if (mine.empty() && !claims.empty()) {
    const std::string_view first_gpu = StrSplit(hello.gpus, ',')[0];  // "" when it names none
    mine.push_back(claims[0]);
    for (const Tenant* t : claims) {
      if (!first_gpu.empty() && std::any_of(t->record.vgpus.begin(), t->record.vgpus.end(),
                                            [&](const core::VGpuAssignment& v) { return v.uuid.value() == first_gpu; })) {
        mine[0] = t;
      }
    }
    name.clear();
  }
  if (mine.empty()) {
    ++stats_.registrations_refused;
    return absl::PermissionDeniedError(
        StrCat("pod ", id->pod_uid, " of host process ", pid, " holds no Tessera GPU on this node"));
  }
  const Tenant* tenant = nullptr;
  if (!name.empty()) {
    for (const Tenant* t : mine) {
      if (t->record.container == name) tenant = t;
    }
  } else if (mine.size() == 1) {
    tenant = mine[0];
  }
  if (tenant == nullptr) {
    ++stats_.registrations_refused;
    return absl::UnavailableError(
        StrCat("cannot tell which container of pod ", id->pod_uid, " host process ", pid,
               " belongs to yet (its container ID is not in the pod's status); retry in a second"));
  }
  // What the process says must agree with what it was given.
  if (hello.gpus[0] != 0) {
    for (std::string_view g : StrSplit(hello.gpus, ',')) {
      if (g.empty()) continue;
      const bool given = std::any_of(tenant->record.vgpus.begin(), tenant->record.vgpus.end(),
                                     [&](const core::VGpuAssignment& v) { return v.uuid.value() == g; });
      if (!given) {
        ++stats_.registrations_refused;
        return absl::PermissionDeniedError(StrCat("host process ", pid, " of ", tenant->record.ns, "/",
                                                  tenant->record.pod_name, " claims GPU ", g,
                                                  ", which was not given to its container"));
      }
    }
  }
  ++stats_.registrations;
  return RegistrationServer::Accepted{tenant->record.key(), tenant->record.generation};
}

void NodeAgent::OnGone(int pid, const std::string& tenant) {
  // The process exited (or was killed): free what it held in the region soon, not at the next charge. The
  // reclaim takes the region's locks, which the tenant's other processes may hold: it runs as a region job.
  // Until its parent reaps it the process is a zombie and still counts as alive; then later passes retry.
  {
    MutexLock lock(&mu_);
    auto it = tenants_.find(tenant);
    if (it == tenants_.end() || !it->second.region) return;
    pending_reclaims_[tenant] = 0;
  }
  KickRegionJobs();
  log::Info("process gone", {{"pid", StrCat(pid)}, {"tenant", tenant}});
}

void NodeAgent::KickRegionJobs() {
  struct Start {
    std::string key;
    std::shared_ptr<hook::SharedRegion> region;
    std::optional<hook::Limits> limits;
    bool reclaim = false;
  };
  std::vector<Start> starts;
  {
    MutexLock lock(&mu_);
    for (auto& [key, t] : tenants_) {
      if (!t.region) continue;
      const bool reclaim = pending_reclaims_.count(key) > 0;
      if (!t.limits_pending && !reclaim) continue;
      if (region_jobs_.Running(key)) continue;
      Start st{key, t.region, std::nullopt, reclaim};
      if (t.limits_pending) st.limits = LimitsFor(t.record);
      t.limits_pending = false;
      if (reclaim) reclaim_jobs_.insert(key);
      starts.push_back(std::move(st));
    }
  }
  for (Start& st : starts) {
    const bool started = region_jobs_.Start(
        st.key, st.region, [limits = st.limits, reclaim = st.reclaim](hook::SharedRegion& r) {
          return RegionWork(r, limits, reclaim);
        });
    if (started) continue;
    // Another thread started one for this tenant meanwhile: ask again next time.
    MutexLock lock(&mu_);
    auto t = tenants_.find(st.key);
    if (t != tenants_.end() && st.limits) t->second.limits_pending = true;
    if (st.reclaim) reclaim_jobs_.erase(st.key);
  }
}

void NodeAgent::SweepRegionJobs() {
  RegionJobs::Swept swept = region_jobs_.Sweep();
  {
    MutexLock lock(&mu_);
    for (const auto& [key, freed] : swept.finished) {
      if (reclaim_jobs_.erase(key) == 0) continue;
      stats_.slots_reclaimed += static_cast<uint64_t>(std::max(freed, 0));
      auto p = pending_reclaims_.find(key);
      if (p == pending_reclaims_.end()) continue;
      if (freed > 0 || ++p->second >= kReclaimAttempts) pending_reclaims_.erase(p);
    }
  }
  for (const std::string& key : swept.stuck) RebuildRegion(key);
}

void NodeAgent::RebuildRegion(const std::string& key) {
  ContainerRecord record;
  {
    MutexLock lock(&mu_);
    auto it = tenants_.find(key);
    reclaim_jobs_.erase(key);
    pending_reclaims_.erase(key);
    if (it == tenants_.end()) return;
    it->second.region.reset();  // the stuck job keeps the old mapping until the tenant lets go
    it->second.record.generation += 1;
    record = it->second.record;
    ++stats_.regions_rebuilt;
  }
  // A new file under the same name: the tenant's processes keep the old one mapped until they reopen it;
  // nothing of the agent's waits on its lock any more.
  const std::string path = (fs::path(record.region_dir) / "region").string();
  std::error_code ec;
  fs::remove(path, ec);
  hook::Error error;
  std::shared_ptr<hook::SharedRegion> region = OpenRegion(path, &error);
  if (!region)
    log::Error("cannot recreate a tenant's shared region", {{"tenant", key}, {"error", error.text}});
  {
    MutexLock lock(&mu_);
    auto it = tenants_.find(key);
    if (it != tenants_.end() && !it->second.region && region) {
      it->second.region = std::move(region);
      it->second.limits_pending = true;
    }
  }
  if (absl::Status s = WriteLimits(record); !s.ok()) {
    log::Error("cannot rewrite a limits file", {{"tenant", key}, {"error", Message(s)}});
  }
  RunFileOps({{record, ""}});
  KickRegionJobs();
  registration_->PushReload(key, record.generation);
  const std::string message =
      StrCat("a process of container ", record.container, " held its shared region's lock for more than ",
             config_.region_lock_timeout.count(),
             " ms; the region was replaced by a new one and its processes told to reload (memory accounting "
             "restarts from the new region)");
  log::Warn(message, {{"tenant", key}});
  if (absl::Status s =
          api_->PostEvent({record.ns, record.pod_name, record.pod_uid, "Warning", "RegionLockHeld", message});
      !s.ok()) {
    MutexLock lock(&mu_);
    ++stats_.api_errors;
  }
}

void NodeAgent::OpenRegions() {
  // Creating a region writes and fsyncs half a MiB: done without the lock.
  std::vector<std::pair<std::string, std::string>> todo;  // key, path
  {
    MutexLock lock(&mu_);
    for (const auto& [key, t] : tenants_) {
      if (!t.region) todo.emplace_back(key, (fs::path(t.record.region_dir) / "region").string());
    }
  }
  for (const auto& [key, path] : todo) {
    hook::Error error;
    std::shared_ptr<hook::SharedRegion> region = OpenRegion(path, &error);
    if (!region) {
      log::Error("cannot create a tenant's shared region", {{"tenant", key}, {"error", error.text}});
      continue;
    }
    MutexLock lock(&mu_);
    auto it = tenants_.find(key);
    if (it == tenants_.end() || it->second.region) continue;
    it->second.region = std::move(region);
    it->second.limits_pending = true;
  }
}

}  // namespace tessera::node
