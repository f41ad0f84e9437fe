// NodeAgent: the tenant registry (records loaded at start, record writes decided under the lock) and the
// registration socket's handlers. docs/node-agent.md, "Registration" and docs/security.md.
#include <algorithm>
#include <filesystem>
#include <optional>

#include "common/log.h"
#include "core/strings.h"
#include "node/agent.h"
#include "node/cgroup.h"

namespace tessera::node {

namespace fs = std::filesystem;

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
    // Not reported yet: whether a swap gave it to its pod before the restart is not known, so its part is
    // told.
    t.untold = !t.record.reported;
    // The limits file stays as it was; make sure it exists (a crash may have cut the first write short).
    if (!fs::exists(fs::path(t.record.dir) / "limits")) {
      if (absl::Status s = WriteLimits(t.record); !s.ok())
        log::Error("cannot rewrite limits", {{"tenant", t.record.key()}, {"error", Message(s)}});
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
      if (!first_gpu.empty() &&
          std::any_of(t->record.vgpus.begin(), t->record.vgpus.end(),
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

std::string NodeAgent::PeerOf(int pid) const {
  // The pod a connecting process is in: the unit the registration socket is fair between. A process in no pod
  // (or already gone) is its own peer; its HELLO will be refused anyway.
  absl::StatusOr<CgroupIdentity> id = IdentifyProcess(config_.proc_root, pid);
  return id.ok() ? StrCat("pod:", id->pod_uid) : StrCat("pid:", pid);
}

void NodeAgent::OnGone(int pid, const std::string& tenant) {
  // Nothing of the agent's to free: what the process held in its region is the container's own business, and
  // its other processes reclaim it (at a charge that finds the limit reached, and about once a second).
  log::Info("process gone", {{"pid", StrCat(pid)}, {"tenant", tenant}});
}

}  // namespace tessera::node
