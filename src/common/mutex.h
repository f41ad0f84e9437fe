// The apps' mutex: std::mutex with clang's thread-safety annotations, so that `-Wthread-safety` (the "tsa"
// preset) checks every ABSL_GUARDED_BY member and ABSL_EXCLUSIVE_LOCKS_REQUIRED function.
//
//   mutable Mutex mu_;                                  // says in a comment what it guards
//   std::map<std::string, Tenant> tenants_ ABSL_GUARDED_BY(mu_);
//   void RebuildLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
//   { MutexLock lock(&mu_); tenants_.erase(key); }
//   cv_.WaitFor(&mu_, std::chrono::seconds(1));          // a CondVar, signalled by whoever changes the state
//   if (!SleepFor(backoff, stop)) return;                // a std::jthread's pause that its stop ends at once
//
// Why not absl::Mutex: Debian's abseil is built without ThreadSanitizer, so TSan (the "tsan" preset) cannot
// see its synchronization and reports races on everything it guards. std::mutex is pthread's, which TSan
// intercepts. Thread-safety: these are the synchronization primitives.
#ifndef TESSERA_COMMON_MUTEX_H_
#define TESSERA_COMMON_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stop_token>
#include <thread>

#include "absl/base/thread_annotations.h"

namespace tessera {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Tells the analysis that the calling thread holds the lock (for code it cannot follow).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope; Release() lets go early.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (mu_ != nullptr) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Release() ABSL_UNLOCK_FUNCTION() {
    mu_->Unlock();
    mu_ = nullptr;
  }

 private:
  Mutex* mu_;
};

// A condition variable for Mutex. Waits may wake spuriously: wait in a loop on the state.
class CondVar {
 public:
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // False when `timeout` passed.
  bool WaitFor(Mutex* mu, std::chrono::milliseconds timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool signalled = cv_.wait_for(lock, timeout) == std::cv_status::no_timeout;
    lock.release();
    return signalled;
  }
  // False when `until` passed. A wait on a condition with a deadline:
  //   while (!done_) if (!cv_.WaitUntil(&mu_, deadline)) break;
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool signalled = cv_.wait_until(lock, until) == std::cv_status::no_timeout;
    lock.release();
    return signalled;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// Sleeps for `d`, or less when `stop` is requested (at once, even if it was before the call). False when
// stopped. Guards nothing: the lock inside is the condition variable's own, private to the call.
inline bool SleepFor(std::chrono::milliseconds d, const std::stop_token& stop) {
  if (!stop.stop_possible()) {
    std::this_thread::sleep_for(d);
    return true;
  }
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock<std::mutex> lock(mu);
  cv.wait_for(lock, stop, d, [] { return false; });
  return !stop.stop_requested();
}

}  // namespace tessera

#endif  // TESSERA_COMMON_MUTEX_H_
