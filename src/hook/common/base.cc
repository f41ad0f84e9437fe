#include "hook/common/base.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

namespace tessera::hook {

void Error::Set(const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(text, sizeof(text), format, args);
  va_end(args);
}

bool CopyString(char* dst, size_t cap, const char* src, size_t len) {
  if (cap == 0) return false;
  const bool fits = len < cap;
  const size_t n = fits ? len : cap - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
  return fits;
}

bool CopyString(char* dst, size_t cap, const char* src) {
  return CopyString(dst, cap, src, strlen(src));
}

bool ParseU64(const char* text, size_t len, uint64_t* out) {
  if (len == 0) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < len; ++i) {
    const char c = text[i];
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool ParseU64(const char* text, uint64_t* out) {
  return ParseU64(text, strlen(text), out);
}

namespace {

bool EqualsIgnoreCase(const char* a, size_t alen, const char* b) {
  const size_t blen = strlen(b);
  if (alen != blen) return false;
  for (size_t i = 0; i < alen; ++i) {
    char x = a[i];
    char y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

}  // namespace

bool ParseByteSize(const char* text, uint64_t* out) {
  const size_t len = strlen(text);
  size_t i = 0;
  while (i < len && text[i] >= '0' && text[i] <= '9') ++i;
  const size_t int_end = i;
  size_t frac_begin = 0;
  size_t frac_end = 0;
  if (i < len && text[i] == '.') {
    ++i;
    frac_begin = i;
    while (i < len && text[i] >= '0' && text[i] <= '9') ++i;
    frac_end = i;
    if (frac_end == frac_begin) return false;
  }
  uint64_t whole = 0;
  if (int_end == 0) {
    if (frac_end == 0) return false;
  } else if (!ParseU64(text, int_end, &whole)) {
    return false;
  }
  const char* unit = text + i;
  const size_t unit_len = len - i;
  struct Unit {
    const char* name;
    uint64_t factor;
  };
  static const Unit kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", 1ull << 10},
      {"ki", 1ull << 10},
      {"kib", 1ull << 10},
      {"m", 1ull << 20},
      {"mi", 1ull << 20},
      {"mib", 1ull << 20},
      {"g", 1ull << 30},
      {"gi", 1ull << 30},
      {"gib", 1ull << 30},
      {"t", 1ull << 40},
      {"ti", 1ull << 40},
      {"tib", 1ull << 40},
      {"kb", 1000ull},
      {"mb", 1000ull * 1000},
      {"gb", 1000ull * 1000 * 1000},
      {"tb", 1000ull * 1000 * 1000 * 1000},
  };
  uint64_t factor = 0;
  for (const Unit& u : kUnits) {
    if (EqualsIgnoreCase(unit, unit_len, u.name)) {
      factor = u.factor;
      break;
    }
  }
  if (factor == 0) return false;
  if (frac_end != 0 && factor == 1) return false;  // "1.5" bytes makes no sense
  if (whole != 0 && whole > UINT64_MAX / factor) return false;
  uint64_t value = whole * factor;
  if (frac_end != 0) {
    // Fraction digits, at most 9 of them, exactly: value += factor * frac / 10^digits (rounded down).
    uint64_t frac = 0;
    uint64_t scale = 1;
    for (size_t k = frac_begin; k < frac_end && k < frac_begin + 9; ++k) {
      frac = frac * 10 + static_cast<uint64_t>(text[k] - '0');
      scale *= 10;
    }
    const Uint128 part = static_cast<Uint128>(factor) * frac / scale;
    if (part > UINT64_MAX - value) return false;
    value += static_cast<uint64_t>(part);
  }
  *out = value;
  return true;
}

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void SleepNs(uint64_t ns) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(ns / 1000000000ull);
  ts.tv_nsec = static_cast<long>(ns % 1000000000ull);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

bool ProcessAlive(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) == 0) return true;
  return errno != ESRCH;
}

uint64_t ProcessStartTime(int pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  // The command name (field 2) is in parentheses and may hold spaces: count fields after the last ')'.
  const char* p = strrchr(buf, ')');
  if (p == nullptr) return 0;
  ++p;
  int field = 2;
  while (*p != 0 && field < 22) {
    if (*p == ' ') {
      ++field;
      while (*p == ' ') ++p;
      continue;
    }
    ++p;
  }
  if (field != 22) return 0;
  uint64_t v = 0;
  const char* end = p;
  while (*end >= '0' && *end <= '9') ++end;
  if (!ParseU64(p, static_cast<size_t>(end - p), &v)) return 0;
  return v;
}

void WriteStderrLine(const char* format, ...) {
  char line[512];
  int n = snprintf(line, sizeof(line), "tessera: ");
  va_list args;
  va_start(args, format);
  int m = vsnprintf(line + n, sizeof(line) - static_cast<size_t>(n) - 1, format, args);
  va_end(args);
  if (m < 0) m = 0;
  size_t len = static_cast<size_t>(n) + static_cast<size_t>(m);
  if (len > sizeof(line) - 2) len = sizeof(line) - 2;
  line[len++] = '\n';
  ssize_t w = write(2, line, len);
  (void)w;
}

namespace {
std::atomic<int> g_log_level{static_cast<int>(LogLevel::kWarn)};
}

void SetLogLevelFromEnvironment() {
  const char* v = getenv("TESSERA_HOOK_LOG");
  if (v == nullptr) return;
  LogLevel level = LogLevel::kWarn;
  if (strcmp(v, "debug") == 0)
    level = LogLevel::kDebug;
  else if (strcmp(v, "info") == 0)
    level = LogLevel::kInfo;
  else if (strcmp(v, "error") == 0)
    level = LogLevel::kError;
  else if (strcmp(v, "off") == 0)
    level = LogLevel::kOff;
  g_log_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_log_level.load(std::memory_order_relaxed);
}

void LogLine(LogLevel level, const char* format, ...) {
  if (!LogEnabled(level)) return;
  static const char* const kNames[] = {"debug", "info", "warn", "error", "off"};
  char msg[400];
  va_list args;
  va_start(args, format);
  vsnprintf(msg, sizeof(msg), format, args);
  va_end(args);
  WriteStderrLine("level=%s pid=%d %s", kNames[static_cast<int>(level)], static_cast<int>(getpid()), msg);
}

bool StartBackgroundThread(void* (*fn)(void*), const char* name) {
  sigset_t all;
  sigset_t old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);  // the thread inherits a mask with every signal blocked
  pthread_t thread;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  const bool started = pthread_create(&thread, &attr, fn, nullptr) == 0;
  if (started) pthread_setname_np(thread, name);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return started;
}

}  // namespace tessera::hook
