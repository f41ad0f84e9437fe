#include "tenant_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace tessera::cltest {

std::string TenantPath() {
  return std::string(TESSERA_BINARY_DIR) + "/tests/cl_tenant";
}
std::string HookPath() {
  return std::string(TESSERA_BINARY_DIR) + "/lib/libtessera-opencl.so";
}
std::string PoclCacheDir() {
  return std::string(TESSERA_BINARY_DIR) + "/tests/pocl-cache";
}

std::string Report::Get(const std::string& key) const {
  for (auto it = kv.rbegin(); it != kv.rend(); ++it) {
    if (it->first == key) return it->second;
  }
  return "";
}

double Report::Number(const std::string& key) const {
  const std::string v = Get(key);
  if (v.empty()) return std::nan("");
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  return end == v.c_str() ? std::nan("") : d;
}

std::vector<std::pair<double, double>> Report::Windows() const {
  std::vector<std::pair<double, double>> out;
  size_t pos = 0;
  while (pos < output.size()) {
    size_t eol = output.find('\n', pos);
    if (eol == std::string::npos) eol = output.size();
    const std::string line = output.substr(pos, eol - pos);
    pos = eol + 1;
    double ms = 0;
    double share = 0;
    if (std::sscanf(line.c_str(), "window=%lf share=%lf", &ms, &share) == 2) out.emplace_back(ms, share);
  }
  return out;
}

Report ParseReport(const std::string& output, int exit_code) {
  Report r;
  r.exit_code = exit_code;
  r.output = output;
  size_t pos = 0;
  while (pos < output.size()) {
    size_t eol = output.find('\n', pos);
    if (eol == std::string::npos) eol = output.size();
    const std::string line = output.substr(pos, eol - pos);
    pos = eol + 1;
    const size_t eq = line.find('=');
    if (eq == std::string::npos || line.find(' ') < eq) continue;
    r.kv.emplace_back(line.substr(0, eq), line.substr(eq + 1));
  }
  return r;
}

Tenant::~Tenant() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (in_fd_ >= 0) close(in_fd_);
}

bool Tenant::Start(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                   bool preload) {
  // Close-on-exec: a tenant started later must not hold this one's stdin open (closing it would then not stop
  // this one) nor its stdout; dup2 gives the child its own ends without the flag.
  int out[2];
  int in[2];
  if (pipe2(out, O_CLOEXEC) != 0) return false;
  if (pipe2(in, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return false;
  }
  // Everything the child needs is built before fork(): no allocation in the child.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "TESSERA_", 8) == 0 || std::strncmp(*e, "LD_PRELOAD=", 11) == 0 ||
        std::strncmp(*e, "POCL_CACHE_DIR=", 15) == 0) {
      continue;
    }
    env_strings.emplace_back(*e);
  }
  env_strings.push_back("POCL_CACHE_DIR=" + PoclCacheDir());
  if (preload) env_strings.push_back("LD_PRELOAD=" + HookPath());
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings{TenantPath()};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);  // the hook's lines too (ReadLineContaining)
    dup2(in[0], 0);
    close(out[0]);
    close(out[1]);
    close(in[0]);
    close(in[1]);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(out[1]);
  close(in[0]);
  out_fd_ = out[0];
  in_fd_ = in[1];
  pid_ = pid;
  return true;
}

std::string Tenant::ReadLineStartingWith(const std::string& prefix) { return ReadLine(prefix, false); }

std::string Tenant::ReadLineContaining(const std::string& text) { return ReadLine(text, true); }

std::string Tenant::ReadLine(const std::string& prefix, bool contains) {
  for (;;) {
    size_t eol;
    while ((eol = buffer_.find('\n')) != std::string::npos) {
      std::string line = buffer_.substr(0, eol);
      consumed_ += buffer_.substr(0, eol + 1);
      buffer_.erase(0, eol + 1);
      if (contains ? line.find(prefix) != std::string::npos : line.rfind(prefix, 0) == 0) return line;
    }
    char chunk[4096];
    const ssize_t n = read(out_fd_, chunk, sizeof(chunk));
    if (n <= 0) return "";
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

void Tenant::CloseStdin() {
  if (in_fd_ >= 0) close(in_fd_);
  in_fd_ = -1;
}

Report Tenant::Wait() {
  CloseStdin();
  std::string output = consumed_ + buffer_;
  char chunk[4096];
  ssize_t n;
  while ((n = read(out_fd_, chunk, sizeof(chunk))) > 0) output.append(chunk, static_cast<size_t>(n));
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return ParseReport(output, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

}  // namespace tessera::cltest
