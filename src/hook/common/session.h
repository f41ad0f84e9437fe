// A hook library's session in its process, API-neutral: how libtessera-cuda.so and libtessera-opencl.so start
// (find the limits: the limits file, else environment variables, else none: pass through; open and attach the
// container's shared region; register with the node agent when one is mounted), follow fork(), charge memory
// to the region, run the limiter thread and pick up rewritten limits (file change or the agent's RELOAD).
// Each library has one Session (in its HookState) and says what it adds through a Library table; everything
// API-specific (the real entry points, devices, launches) stays in the library.
//
//   constexpr hook::Library kLibrary = {"opencl", TESSERA_VERSION, "OpenCL device use refused", &LoadRuntime,
//                                       &SetUpDevices, &ForgetInChild, nullptr, &EveryMs, &ApplyLimits,
//                                       nullptr, /*retry_limiter_start=*/false};
//   HookState g_state;                                  // holds `hook::Session session{&kLibrary}`
//   TESSERA_HOOK_SESSION_LIFETIME(g_state.session)      // fork handlers at load, Unload() at unload
//   ...
//   if (g_state.session.EnsureInit() != hook::Mode::kLimited) return real(...);  // in every hook
//
// Sources, in order: TESSERA_LIMITS_FILE, else /etc/tessera/limits when it exists, else the TESSERA_GPU_*
// variables (LimitsFromEnvironment). Region: TESSERA_REGION, else the limits file's region=, else
// DefaultRegionPath() (a directory only this user can have made, checked). Lock waits on the region give up
// after TESSERA_REGION_LOCK_TIMEOUT_MS (default 2000). Agent socket: TESSERA_AGENT_SOCKET, else
// /var/run/tessera/agent.sock when the limits come from a file and the socket exists.
//
// The hot path (mode(), EnsureInit() and EnsureAttached() once done) is inline: one atomic load, no call
// through the Library table. The table's functions run only at start-up, in the fork child and in the limiter
// thread. Nothing here allocates or takes a lock the fork child could inherit held: the init lock is taken
// around fork() (pthread_atfork) and both locks are made anew in the child.
//
// Thread-safety: EnsureInit() and EnsureAttached() from any thread (once, under the init lock); the limits
// and the device tables the library keeps are changed under devices_mutex(); the limiter thread alone polls
// the agent and the limits file. One Session per library per process (the fork handlers and the limiter
// thread find it through InstallForkHandlers and StartLimiterThread).
#ifndef TESSERA_HOOK_COMMON_SESSION_H_
#define TESSERA_HOOK_COMMON_SESSION_H_

#include <pthread.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdint>

#include "hook/common/base.h"
#include "hook/common/limits.h"
#include "hook/common/region.h"
#include "hook/common/registration.h"

namespace tessera::hook {

inline constexpr const char* kDefaultLimitsFile = "/etc/tessera/limits";
inline constexpr const char* kDefaultAgentSocket = "/var/run/tessera/agent.sock";

// What the hook does in this process.
enum class Mode : int {
  kUninitialized = 0,
  kPassThrough = 1,  // no limits configured: every call goes straight to the runtime
  kLimited = 2,      // limits apply; the region is open and attached
  kFailClosed = 3,   // limits were configured but cannot be used: device use is refused
};

// What one library adds to the session. Every function runs off the hot path.
struct Library {
  const char* name;     // "cuda" or "opencl": the hello to the agent
  const char* version;  // the library's version, for the agent
  const char* refused;  // the stderr line when the limits cannot be used: "<refused>: <why>"
  // Under the init lock, first: resolve the real entry points (a runtime that is missing is said at debug
  // level; the library's calls then fail as without one).
  void (*load_runtime)();
  // Under the init lock, once the session is limited: what the library sets up with the limits (optional).
  void (*start_limited)();
  // In the fork child, after the session forgot the parent's slot: the library's process-local records.
  void (*forget_in_child)();
  // The limiter thread: `in_limiter_thread` first (optional); then every millisecond `each_ms` (every 10 ms
  // while it returns false: no compute limit and nothing being measured, as in a memory-only container);
  // about four times a second the agent's messages and the limits file (`limits_changed` applies new ones,
  // under devices_mutex()) and then `each_quarter` (optional); every second the dead processes' charges are
  // reclaimed.
  void (*in_limiter_thread)();
  bool (*each_ms)(uint64_t now_ns);
  void (*limits_changed)();
  void (*each_quarter)(uint64_t now_ns);
  // True: a limiter thread that could not be created is tried again at the next StartLimiterThread().
  bool retry_limiter_start;
};

class Session {
 public:
  explicit constexpr Session(const Library* library) : library_(library) {}
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Mode mode() const { return static_cast<Mode>(mode_.load(std::memory_order_acquire)); }

  // Decides the mode once (the first call, under the init lock; a call the initialization itself makes
  // passes through) and returns it. When limited, the region is open and attached and the agent told.
  Mode EnsureInit() {
    const Mode m = mode();
    return m != Mode::kUninitialized ? m : InitOnce();
  }

  // After fork(), the child claims a slot of its own before its first charge. False when the region refuses
  // (one stderr line). True at once in a process that never forked.
  bool EnsureAttached() { return !need_attach_.load(std::memory_order_acquire) || AttachAgain(); }
  // A forked child that has not attached again holds nothing: nothing to give back.
  bool forked_unattached() const { return need_attach_.load(std::memory_order_relaxed); }

  // Charges `bytes` on the region's device `index` (`device` names it in messages). Over the limit, the
  // charges of this container's dead processes are reclaimed and the charge tried again; a refusal counts in
  // the device's oom_count and says at info level what the container holds; a lock that never came is a
  // stderr line. kDetached: the process is exiting.
  ChargeResult Charge(int index, uint64_t bytes, const char* device);
  // Gives `bytes` back (nothing in a forked child that has not attached again). A lock that never came keeps
  // the charge (one stderr line); the agent reclaims it when the process ends.
  void Uncharge(int index, uint64_t bytes, const char* device);

  // Starts the limiter thread (Library::each_ms...) unless it runs. Never blocks on it.
  void StartLimiterThread();
  bool limiter_started() const { return thread_started_.load(std::memory_order_relaxed); }

  // The lock over the limits and the library's device table (the limiter thread applies new limits under it).
  pthread_mutex_t* devices_mutex() { return &devices_mutex_; }

  // From the library's constructor: the fork handlers (lock around fork(); in the child, forget the parent's
  // slot, agent connection and limiter thread, and call Library::forget_in_child). Nothing heavy: the library
  // may be preloaded into every process of a machine.
  void InstallForkHandlers();
  // From the library's destructor: settles what the exiting thread launched and detaches from the region.
  void Unload();

  // The session's state. Written under the init lock at start-up; `limits` also by the limiter thread, under
  // devices_mutex().
  Limits limits;
  bool limits_from_file = false;
  char limits_path[kPathSize] = {0};
  char region_path[kPathSize] = {0};
  SharedRegion region;
  AgentConnection agent;
  uint32_t host_pid = 0;  // this process's pid on the host: the agent's answer, else getpid()
  bool host_pid_from_agent = false;

 private:
  Mode InitOnce();
  Mode Start(Error* error);  // the limits, the region and the agent: kLimited, kPassThrough or kFailClosed
  // Registers with the agent; a missing or refusing agent is a warning: the limits file is the authority.
  void Register(const char* socket_path);
  bool AttachAgain();
  void ForgetInChild();
  // Reads the agent's messages and the limits file; true when limits of a higher generation were read into
  // `limits`. A malformed rewrite keeps the current limits (one stderr line). Limiter thread only.
  bool PollLimits();
  void Remember(const struct stat& st);
  bool Changed(const struct stat& st) const;
  [[noreturn]] void RunLimiterLoop();
  static void* LimiterThread(void*);
  static void AtForkPrepare();
  static void AtForkParent();
  static void AtForkChild();

  const Library* library_;
  std::atomic<int> mode_{0};
  std::atomic<bool> need_attach_{false};  // after fork(): claim a new slot before the next charge
  std::atomic<bool> thread_started_{false};
  pthread_mutex_t init_mutex_ = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_t devices_mutex_ = PTHREAD_MUTEX_INITIALIZER;
  // The limits file as last read (inode, mtime, size), to notice a rewrite cheaply.
  uint64_t file_ino_ = 0;
  int64_t file_mtime_sec_ = 0;
  int64_t file_mtime_nsec_ = 0;
  int64_t file_size_ = 0;
};

// One device's millisecond in the limiter thread (Library::each_ms): refills its bucket and sets `*paced`
// when compute is limited on it (never clears it: one flag serves every device); true when its controller is
// due a step (ElasticController::kStepNs since the last), which the library then makes with what it measured
// (ElasticController::Step).
bool RefillDevice(RegionDevice* shared, uint64_t now_ns, bool* paced);

// A library's session lives as long as the library, in its entry.cc (inside an unnamed namespace):
//   TESSERA_HOOK_SESSION_LIFETIME(g_state.session)
// installs the fork handlers when the library is loaded (nothing heavy: it may be preloaded into every
// process of a machine) and calls Unload() when it is unloaded.
#define TESSERA_HOOK_SESSION_LIFETIME(session)         \
  __attribute__((constructor)) void SessionOnLoad() {  \
    (session).InstallForkHandlers();                   \
  }                                                    \
  __attribute__((destructor)) void SessionOnUnload() { \
    (session).Unload();                                \
  }

// The default region when neither TESSERA_REGION nor the limits file names one:
// $XDG_RUNTIME_DIR/tessera/region when XDG_RUNTIME_DIR is set, else /tmp/tessera-<uid>/region. The
// directory is created mode 0700 when missing; an existing one must be a real directory (no symlink) owned
// by this user and writable by no one else, else false with `error` saying what to do (another local user
// could otherwise plant a region, or a lock that never comes, for this user's processes).
bool DefaultRegionPath(EnvLookup lookup, char* out, size_t cap, Error* error);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi and the limits file write a 16-byte UUID.
void FormatGpuUuid(const unsigned char* bytes, char* out, size_t cap);

}  // namespace tessera::hook

#endif  // TESSERA_HOOK_COMMON_SESSION_H_
