// hostile_tenant: what a tenant that attacks Tessera does from inside its container, one attack per run, for
// the hostile-tenant tier (tests/hostile/hostile_tenants.py, docs/security.md "What a tenant can do"). It uses
// only what a process in a GPU container has: its region file and directory (read-write), its limits file
// (read-only), the agent's registration socket, and its own processes.
//
//   hostile_tenant plant REGION            every lock word of the region planted (a robust-list entry aimed at
//                                          an address of the tenant's choosing), every process slot owned by a
//                                          dead pid, use and utilization at their maximum
//   hostile_tenant hold REGION             a valid region, every lock of it taken and never let go (until stdin
//                                          closes)
//   hostile_tenant truncate REGION         the region cut to 0 bytes
//   hostile_tenant swap REGION KIND [ARG]  the region replaced by a fifo, a link to ARG, a directory, or a
//                                          sparse file of ARG bytes
//   hostile_tenant lying REGION            valid magic with lying sizes, GPU count and UUIDs
//   hostile_tenant hangup SOCKET N         N registrations, each hung up at once
//   hostile_tenant hello SOCKET KIND       one connection: "others GPU-..." claims a GPU not given, "garbage",
//                                          "long" (a line past the limit), "silent" (sends nothing; held
//                                          until stdin closes)
//   hostile_tenant forkbomb SOCKET N       N processes registering at once, held until stdin closes
//   hostile_tenant write LIMITS            tries to rewrite its own limits file
//
// Each prints one line "<attack> <result...>" on stdout and exits 0 when the attack was carried out (whether
// or not it achieved anything: the harness judges the agent, not this program), 2 when it could not be.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "hook/common/region.h"
#include "hook/common/registration.h"

namespace {

namespace hook = tessera::hook;

[[noreturn]] void Die(const std::string& what) {
  fprintf(stderr, "hostile_tenant: %s (errno %d: %s)\n", what.c_str(), errno, strerror(errno));
  exit(2);
}

void WaitForStdinToClose() {
  char buf[64];
  while (read(0, buf, sizeof(buf)) > 0) {
  }
}

// A valid region at `path` (made as the hook makes it), mapped read-write.
unsigned char* MapRegion(const std::string& path) {
  {
    hook::SharedRegion r;
    hook::Error e;
    if (!r.Open(path.c_str(), &e)) Die(std::string("cannot open the region: ") + e.text);
    r.Close();
  }
  const int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) Die("cannot open the region");
  void* p = mmap(nullptr, hook::kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) Die("cannot map the region");
  return static_cast<unsigned char*>(p);
}

template <typename T>
void Put(unsigned char* base, size_t offset, T v) {
  memcpy(base + offset, &v, sizeof(v));
}

unsigned char* DeviceAt(unsigned char* base, int d) {
  return base + hook::kRegionDevicesOffset + static_cast<size_t>(d) * hook::kRegionDeviceBytes;
}

int Plant(const std::string& path) {
  unsigned char* base = MapRegion(path);
  // glibc's robust mutex: the owner's tid with FUTEX_OWNER_DIED, then the robust list's links; a locker would
  // link the mutex into its own list through them, and an unlock writes through them.
  auto plant = [](unsigned char* lock) {
    Put<uint32_t>(lock, 0, 0x40000000u | 1u);
    Put<uint64_t>(lock, 16, 0x4141414141414141ull);
    Put<uint64_t>(lock, 24, 0x4242424242424242ull);
  };
  plant(base + 64);
  Put<uint32_t>(base, 136, 1);  // one GPU entry, named as the first GPU the container was given
  const char* uuid = getenv("HOSTILE_GPU");
  memset(DeviceAt(base, 0) + 64, 0, hook::kUuidSize);
  memcpy(DeviceAt(base, 0) + 64, uuid != nullptr ? uuid : "GPU-0", strnlen(uuid != nullptr ? uuid : "GPU-0", 63));
  for (int d = 0; d < hook::kMaxDevices; ++d) {
    plant(DeviceAt(base, d));
    Put<uint64_t>(DeviceAt(base, d), 136, UINT64_MAX);  // used
    Put<uint32_t>(DeviceAt(base, d), 320 + 48, 0xffffffffu);  // own utilization
  }
  for (uint32_t i = 0; i < hook::kRegionSlots; ++i) {
    Put<uint64_t>(base + hook::kRegionSlotsOffset + i * hook::kRegionSlotBytes, 0, 0x7ffffff0ull - i);
  }
  msync(base, hook::kRegionBytes, MS_SYNC);
  printf("plant done\n");
  return 0;
}

int Hold(const std::string& path) {
  unsigned char* base = MapRegion(path);
  int held = pthread_mutex_lock(reinterpret_cast<pthread_mutex_t*>(base + 64)) == 0 ? 1 : 0;
  for (int d = 0; d < hook::kMaxDevices; ++d)
    held += pthread_mutex_lock(reinterpret_cast<pthread_mutex_t*>(DeviceAt(base, d))) == 0 ? 1 : 0;
  printf("hold %d\n", held);
  fflush(stdout);
  WaitForStdinToClose();
  return 0;
}

int Truncate(const std::string& path) {
  MapRegion(path);
  if (truncate(path.c_str(), 0) != 0) Die("truncate");
  printf("truncate done\n");
  return 0;
}

int Swap(const std::string& path, const std::string& kind, const std::string& arg) {
  unlink(path.c_str());
  rmdir(path.c_str());
  if (kind == "fifo") {
    if (mkfifo(path.c_str(), 0666) != 0) Die("mkfifo");
  } else if (kind == "link") {
    if (symlink(arg.c_str(), path.c_str()) != 0) Die("symlink");
  } else if (kind == "dir") {
    if (mkdir(path.c_str(), 0777) != 0) Die("mkdir");
  } else if (kind == "sparse") {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT, 0666);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(strtoull(arg.c_str(), nullptr, 10))) != 0) Die("ftruncate");
    close(fd);
  } else {
    Die("unknown swap kind " + kind);
  }
  printf("swap %s done\n", kind.c_str());
  return 0;
}

int Lying(const std::string& path) {
  unsigned char* base = MapRegion(path);
  Put<uint32_t>(base, 136, 0x7fffffffu);           // GPU entries
  Put<uint64_t>(base, 48, 1ull << 40);             // region bytes
  Put<uint64_t>(base, 32, 0xfffffffffffff000ull);  // devices offset
  memset(DeviceAt(base, 0) + 64, 'A', hook::kUuidSize);  // an unterminated UUID
  msync(base, hook::kRegionBytes, MS_SYNC);
  printf("lying done\n");
  return 0;
}

int Connect(const std::string& socket_path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path.c_str());
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

// One line back from the agent (or what there is within 10 s).
std::string ReadLine(int fd) {
  std::string out;
  char c;
  pollfd p{fd, POLLIN, 0};
  while (out.size() < hook::kMaxLine && poll(&p, 1, 10000) == 1 && read(fd, &c, 1) == 1 && c != '\n') out += c;
  return out;
}

bool RegisterOnce(const std::string& socket_path, hook::AgentConnection* conn, std::string* why) {
  hook::Hello h;
  hook::CopyString(h.lib, sizeof(h.lib), "cuda");
  h.pid = static_cast<int>(getpid());
  hook::AgentMessage reply;
  hook::Error e;
  const bool ok = conn->Register(socket_path.c_str(), h, 10000, &reply, &e);
  if (!ok && why != nullptr) *why = e.text;
  return ok;
}

int Hangup(const std::string& socket_path, int n) {
  int ok = 0;
  for (int i = 0; i < n; ++i) {
    hook::AgentConnection conn;
    ok += RegisterOnce(socket_path, &conn, nullptr) ? 1 : 0;
    conn.Close();
  }
  printf("hangup %d of %d registered\n", ok, n);
  return 0;
}

int Hello(const std::string& socket_path, const std::string& kind, const std::string& arg) {
  const int fd = Connect(socket_path);
  if (fd < 0) Die("connect");
  std::string line;
  if (kind == "others") {
    line = "TESSERA 1 HELLO lib=cuda version=0.1.0 pid=1 generation=1 gpus=" + arg + "\n";
  } else if (kind == "garbage") {
    line = std::string("\x01\xff TESSERA \0 1 HELLO\n", 20);
  } else if (kind == "long") {
    line = "TESSERA 1 HELLO lib=cuda gpus=" + std::string(1 << 20, 'G') + "\n";
  } else if (kind == "silent") {
    printf("hello silent connected\n");
    fflush(stdout);
    WaitForStdinToClose();
    close(fd);
    return 0;
  } else {
    Die("unknown hello kind " + kind);
  }
  size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = send(fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the agent hung up on it: that is an answer too
    sent += static_cast<size_t>(n);
  }
  const std::string reply = ReadLine(fd);
  close(fd);
  printf("hello %s answered: %s\n", kind.c_str(), reply.empty() ? "(closed)" : reply.c_str());
  return 0;
}

int ForkBomb(const std::string& socket_path, int n) {
  int results[2];
  if (pipe(results) != 0) Die("pipe");
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid < 0) break;  // the container's pid limit: as far as it goes
    if (pid == 0) {
      close(0);  // the children wait on the parent's pipe below, not on stdin
      hook::AgentConnection conn;
      const char r = RegisterOnce(socket_path, &conn, nullptr) ? 'y' : 'n';
      if (write(results[1], &r, 1) != 1) _exit(1);
      pause();  // held until the parent kills the group
      _exit(0);
    }
    kids.push_back(pid);
  }
  close(results[1]);
  int yes = 0, no = 0;
  for (size_t i = 0; i < kids.size(); ++i) {
    char r;
    if (read(results[0], &r, 1) != 1) break;
    (r == 'y' ? yes : no) += 1;
  }
  printf("forkbomb %zu processes: %d registered, %d refused\n", kids.size(), yes, no);
  fflush(stdout);
  WaitForStdinToClose();
  for (pid_t k : kids) kill(k, SIGKILL);
  for (pid_t k : kids) waitpid(k, nullptr, 0);
  return 0;
}

int WriteLimits(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_TRUNC);
  const int err = errno;
  if (fd >= 0) {
    const char forged[] = "tessera-limits 1\ngeneration 999\ngpu index=* memory=unlimited cores=100 policy=hard\n";
    const bool wrote = write(fd, forged, sizeof(forged) - 1) == static_cast<ssize_t>(sizeof(forged) - 1);
    close(fd);
    printf("write %s\n", wrote ? "WROTE" : "opened");
    return 0;
  }
  printf("write refused %s\n", strerror(err));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::vector<std::string> a(argv + 1, argv + argc);
  if (a.size() >= 2 && a[0] == "plant") return Plant(a[1]);
  if (a.size() >= 2 && a[0] == "hold") return Hold(a[1]);
  if (a.size() >= 2 && a[0] == "truncate") return Truncate(a[1]);
  if (a.size() >= 3 && a[0] == "swap") return Swap(a[1], a[2], a.size() > 3 ? a[3] : "");
  if (a.size() >= 2 && a[0] == "lying") return Lying(a[1]);
  if (a.size() >= 3 && a[0] == "hangup") return Hangup(a[1], atoi(a[2].c_str()));
  if (a.size() >= 3 && a[0] == "hello") return Hello(a[1], a[2], a.size() > 3 ? a[3] : "");
  if (a.size() >= 3 && a[0] == "forkbomb") return ForkBomb(a[1], atoi(a[2].c_str()));
  if (a.size() >= 2 && a[0] == "write") return WriteLimits(a[1]);
  fprintf(stderr, "usage: see the comment at the top of tests/hostile/hostile_tenant.cc\n");
  return 2;
}
