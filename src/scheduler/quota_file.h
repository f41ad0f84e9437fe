// The GPU quotas of a cluster, from a file (tessera-scheduler --quota-file; Helm mounts scheduler.quotas as a
// ConfigMap there): per namespace and GPU model, how many GPUs' worth of share its pods may hold. The extender
// enforces them (a pod over its quota fits nowhere, and says so). The file is read at start, and again whenever it
// changes (a ConfigMap update reaches the mounted file within a minute or so): a file that no longer parses is
// reported and the quotas in force stay, so a typo never lifts every quota.
//
//   QuotaFile quotas(path, &cache);
//   if (absl::Status s = quotas.Load(); !s.ok()) fail(s);  // at start: a bad file is an error
//   quotas.Start();                                          // then: followed while it changes
//
// Thread-safety: Load and Start from one thread; the watcher thread then owns the re-reads. The destructor stops
// it.
#ifndef TESSERA_SCHEDULER_QUOTA_FILE_H_
#define TESSERA_SCHEDULER_QUOTA_FILE_H_

#include <chrono>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "scheduler/cluster_cache.h"

namespace tessera::scheduler {

class QuotaFile {
 public:
  QuotaFile(std::string path, ClusterCache* cache, std::chrono::milliseconds poll = std::chrono::seconds(2))
      : path_(std::move(path)), cache_(cache), poll_(poll) {}
  ~QuotaFile();
  QuotaFile(const QuotaFile&) = delete;
  QuotaFile& operator=(const QuotaFile&) = delete;

  // Reads the file and puts its quotas in force; an error (unreadable, malformed) changes nothing.
  absl::Status Load();
  // Follows the file: reloads it when its modification time, size or inode changes.
  void Start();

  // How many times a changed file was put in force, and refused (for tests and logs).
  int loads() const;
  int refusals() const;

 private:
  std::string Stamp() const;  // what changes when the file does ("" when it cannot be read)
  void Run();

  const std::string path_;
  ClusterCache* const cache_;
  const std::chrono::milliseconds poll_;
  std::thread thread_;
  mutable Mutex mu_;  // guards the fields below
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string stamp_ ABSL_GUARDED_BY(mu_);
  int loads_ ABSL_GUARDED_BY(mu_) = 0;
  int refusals_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_QUOTA_FILE_H_
