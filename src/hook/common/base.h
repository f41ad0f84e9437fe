// Small building blocks for the hook libraries (libtessera-cuda.so, libtessera-opencl.so) and the programs
// that share their files: an error buffer, bounded string copies, integer parsing, monotonic time, and
// one-line stderr messages.
//
// The hook libraries run inside other people's processes and link nothing but libc, libdl and pthread: no C++
// standard library (no std::string, no operator new), no exceptions. Everything here is plain C++ on libc.
//
//   tessera::hook::Error error;
//   uint64_t n = 0;
//   if (!tessera::hook::ParseU64("4096", &n)) error.Set("not a number: %s", "4096");
//
// Thread-safety: all functions are thread-safe; an Error is owned by one caller.
#ifndef TESSERA_HOOK_COMMON_BASE_H_
#define TESSERA_HOOK_COMMON_BASE_H_

#include <cstddef>
#include <cstdint>

namespace tessera::hook {

// 128-bit arithmetic for products of 64-bit times and rates (a GCC/Clang extension, named once here).
__extension__ typedef unsigned __int128 Uint128;

// An error message in a fixed buffer (no allocation). Empty means no error.
struct Error {
  char text[320] = {0};
  // printf-style; the message is cut at the buffer's end.
  void Set(const char* format, ...) __attribute__((format(printf, 2, 3)));
  bool empty() const { return text[0] == 0; }
};

// Copies at most cap-1 bytes of `src` and terminates. Returns false when `src` did not fit.
bool CopyString(char* dst, size_t cap, const char* src);
bool CopyString(char* dst, size_t cap, const char* src, size_t len);

// Parses a whole decimal unsigned integer (digits only; no sign, no space); false on overflow or junk.
bool ParseU64(const char* text, size_t len, uint64_t* out);
bool ParseU64(const char* text, uint64_t* out);

// Parses a byte size: plain bytes ("1073741824") or a number with a binary or decimal unit: KiB, MiB, GiB,
// TiB (powers of 1024), KB, MB, GB, TB (powers of 1000), also K/M/G/T and Ki/Mi/Gi/Ti as binary. Fractions
// are allowed with a unit ("1.5GiB"). Case-insensitive units; no spaces. False on junk or overflow.
bool ParseByteSize(const char* text, uint64_t* out);

// CLOCK_MONOTONIC in nanoseconds.
uint64_t MonotonicNs();
// Sleeps for `ns` nanoseconds (restarts after signals until the time has passed).
void SleepNs(uint64_t ns);

// Starts `fn` on a detached thread named `name`, with a small stack and every signal blocked (signals are
// the host program's business). False when the thread could not be created.
bool StartBackgroundThread(void* (*fn)(void*), const char* name);

// Whether a process exists (kill(pid, 0) does not fail with ESRCH).
bool ProcessAlive(int pid);
// The start time of a process in clock ticks since boot (field 22 of /proc/<pid>/stat); 0 when unknown.
uint64_t ProcessStartTime(int pid);

// Writes one line "tessera: <message>\n" to stderr with a single write(2) (no stdio, no allocation).
void WriteStderrLine(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Hook diagnostics, quiet by default: TESSERA_HOOK_LOG=debug|info|warn|error|off (default warn).
enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };
void SetLogLevelFromEnvironment();
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace tessera::hook

#endif  // TESSERA_HOOK_COMMON_BASE_H_
