#include "scheduler/quota_file.h"

#include <sys/stat.h>

#include <tuple>
#include <vector>

#include "common/files.h"
#include "common/log.h"
#include "core/strings.h"
#include "formats/cluster_file.h"

namespace tessera::scheduler {

QuotaFile::~QuotaFile() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

std::string QuotaFile::Stamp() const {
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) return "";
  return StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

absl::Status QuotaFile::Load() {
  const std::string stamp = Stamp();
  absl::StatusOr<std::string> text = ReadTextFile(path_);
  absl::StatusOr<std::vector<formats::QuotaEntry>> quotas =
      text.ok() ? formats::ParseQuotaFile(*text, path_) : absl::StatusOr<std::vector<formats::QuotaEntry>>(text.status());
  MutexLock lock(&mu_);
  stamp_ = stamp;  // a bad file is reported once, not every poll
  if (!quotas.ok()) {
    ++refusals_;
    return quotas.status();
  }
  std::vector<std::tuple<core::Namespace, std::string, core::MilliGpu>> entries;
  for (const formats::QuotaEntry& q : *quotas) entries.emplace_back(q.ns, q.model, q.limit);
  cache_->ReplaceQuotas(entries);
  ++loads_;
  log::Info("GPU quotas in force", {{"file", path_}, {"quotas", StrCat(entries.size())}});
  return absl::OkStatus();
}

void QuotaFile::Start() {
  thread_ = std::thread([this] { Run(); });
}

void QuotaFile::Run() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      cv_.WaitFor(&mu_, poll_);
      if (stopping_) return;
    }
    const std::string stamp = Stamp();
    {
      MutexLock lock(&mu_);
      if (stamp == stamp_) continue;
    }
    if (absl::Status s = Load(); !s.ok()) {
      log::Error("the quota file changed and cannot be read; the quotas in force stay",
                 {{"file", path_}, {"error", Message(s)}});
    }
  }
}

int QuotaFile::loads() const {
  MutexLock lock(&mu_);
  return loads_;
}

int QuotaFile::refusals() const {
  MutexLock lock(&mu_);
  return refusals_;
}

}  // namespace tessera::scheduler
