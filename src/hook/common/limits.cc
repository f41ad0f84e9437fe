#include "hook/common/limits.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tessera::hook {

const char* ComputePolicyName(ComputePolicy policy) {
  return policy == ComputePolicy::kElastic ? "elastic" : "hard";
}

const char* PriorityName(Priority priority) {
  return priority == Priority::kHigh ? "high" : "low";
}

uint32_t SharePpm(const DeviceLimits& d) {
  if (d.cores_milli >= 1 && d.cores_milli <= kMilliPerGpu) return d.cores_milli * (kPpmPerGpu / kMilliPerGpu);
  return d.cores_percent >= 100 ? kPpmPerGpu : d.cores_percent * (kPpmPerGpu / 100);
}

uint32_t CeilingPpm(const DeviceLimits& d) {
  const uint32_t ceiling = d.ceiling_percent >= 100 ? kPpmPerGpu : d.ceiling_percent * (kPpmPerGpu / 100);
  const uint32_t share = SharePpm(d);
  return ceiling < share ? share : ceiling;
}

uint32_t PercentForMilli(uint32_t milli) {
  const uint32_t percent = milli / 10;
  return percent < 1 ? 1 : percent > 100 ? 100 : percent;
}

namespace {

struct Token {
  const char* p = nullptr;
  size_t n = 0;
  bool Is(const char* s) const { return strlen(s) == n && memcmp(p, s, n) == 0; }
};

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\r';
}

// Splits one line into at most `max` tokens separated by blanks. Returns the count, or max+1 when there are
// more.
int Tokenize(const char* line, size_t len, Token* tokens, int max) {
  int count = 0;
  size_t i = 0;
  while (i < len) {
    while (i < len && IsSpace(line[i])) ++i;
    if (i >= len) break;
    const size_t start = i;
    while (i < len && !IsSpace(line[i])) ++i;
    if (count == max) return max + 1;
    tokens[count].p = line + start;
    tokens[count].n = i - start;
    ++count;
  }
  return count;
}

bool ParsePercent(const Token& t, uint32_t* out) {
  uint64_t v = 0;
  if (!ParseU64(t.p, t.n, &v) || v < 1 || v > 100) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

bool ParseGpuLine(const Token* tokens, int count, int line_no, DeviceLimits* d, Error* error) {
  bool have_memory = false;
  bool have_cores = false;
  bool have_ceiling = false;
  for (int i = 1; i < count; ++i) {
    const Token& t = tokens[i];
    const char* eq = static_cast<const char*>(memchr(t.p, '=', t.n));
    if (eq == nullptr) {
      error->Set("limits file line %d: expected key=value, found '%.*s'", line_no, static_cast<int>(t.n),
                 t.p);
      return false;
    }
    Token key{t.p, static_cast<size_t>(eq - t.p)};
    Token value{eq + 1, t.n - key.n - 1};
    // A key given twice is an error, never "the last one wins" (a trailing memory=0 must not unlimit).
    for (int j = 1; j < i; ++j) {
      const char* other_eq = static_cast<const char*>(memchr(tokens[j].p, '=', tokens[j].n));
      if (other_eq != nullptr && static_cast<size_t>(other_eq - tokens[j].p) == key.n &&
          memcmp(tokens[j].p, key.p, key.n) == 0) {
        error->Set("limits file line %d: %.*s= is given twice; give each key once", line_no,
                   static_cast<int>(key.n), key.p);
        return false;
      }
    }
    if (key.Is("uuid")) {
      if (value.n == 0 || value.n >= kUuidSize) {
        error->Set("limits file line %d: uuid must be 1..%zu characters", line_no, kUuidSize - 1);
        return false;
      }
      CopyString(d->uuid, sizeof(d->uuid), value.p, value.n);
    } else if (key.Is("index")) {
      uint64_t v = 0;
      if (value.Is("*")) {
        d->index = kAnyDevice;
      } else if (ParseU64(value.p, value.n, &v) && v < kMaxDevices) {
        d->index = static_cast<int>(v);
      } else {
        error->Set("limits file line %d: index must be 0..%d or *", line_no, kMaxDevices - 1);
        return false;
      }
    } else if (key.Is("memory")) {
      if (value.Is("unlimited")) {
        d->memory_bytes = 0;
      } else if (!ParseU64(value.p, value.n, &d->memory_bytes) || d->memory_bytes == 0) {
        error->Set("limits file line %d: memory must be a positive number of bytes, or 'unlimited' for no "
                   "limit, found '%.*s' (0 is refused: it would mean no limit by accident)",
                   line_no, static_cast<int>(value.n), value.p);
        return false;
      }
      have_memory = true;
    } else if (key.Is("cores")) {
      if (!ParsePercent(value, &d->cores_percent)) {
        error->Set("limits file line %d: cores must be 1..100 (percent of the GPU), found '%.*s'", line_no,
                   static_cast<int>(value.n), value.p);
        return false;
      }
      have_cores = true;
    } else if (key.Is("cores-milli")) {
      uint64_t v = 0;
      if (!ParseU64(value.p, value.n, &v) || v < 1 || v > kMilliPerGpu) {
        error->Set("limits file line %d: cores-milli must be 1..%u (thousandths of the GPU), found '%.*s'",
                   line_no, kMilliPerGpu, static_cast<int>(value.n), value.p);
        return false;
      }
      d->cores_milli = static_cast<uint32_t>(v);
    } else if (key.Is("ceiling")) {
      if (!ParsePercent(value, &d->ceiling_percent)) {
        error->Set("limits file line %d: ceiling must be 1..100, found '%.*s'", line_no,
                   static_cast<int>(value.n), value.p);
        return false;
      }
      have_ceiling = true;
    } else if (key.Is("policy")) {
      if (value.Is("hard")) {
        d->policy = ComputePolicy::kHard;
      } else if (value.Is("elastic")) {
        d->policy = ComputePolicy::kElastic;
      } else {
        error->Set("limits file line %d: policy must be hard or elastic, found '%.*s'", line_no,
                   static_cast<int>(value.n), value.p);
        return false;
      }
    } else if (key.Is("tenants")) {
      uint64_t v = 0;
      if (!ParseU64(value.p, value.n, &v) || v < 1 || v > kMaxTenants) {
        error->Set("limits file line %d: tenants must be 1..%u (the containers on this GPU), found '%.*s'",
                   line_no, kMaxTenants, static_cast<int>(value.n), value.p);
        return false;
      }
      d->tenants = static_cast<uint32_t>(v);
    } else if (key.Is("priority")) {
      if (value.Is("high")) {
        d->priority = Priority::kHigh;
      } else if (value.Is("low")) {
        d->priority = Priority::kLow;
      } else {
        error->Set("limits file line %d: priority must be high or low, found '%.*s'", line_no,
                   static_cast<int>(value.n), value.p);
        return false;
      }
    }
    // Other keys: written by a newer agent of the same major version; ignored on purpose.
  }
  if (d->uuid[0] == 0 && d->index == kByUuid) {
    error->Set("limits file line %d: a gpu line needs uuid=<GPU-...> or index=<i>", line_no);
    return false;
  }
  if (!have_memory || (!have_cores && d->cores_milli == 0)) {
    error->Set("limits file line %d: a gpu line needs memory=<bytes> and cores=<1..100>", line_no);
    return false;
  }
  // The share is cores-milli when given; cores= beside it is what readers of percent only get, and must be
  // that (a line whose two shares disagree is not one the agent wrote).
  if (d->cores_milli != 0) {
    if (have_cores && d->cores_percent != PercentForMilli(d->cores_milli)) {
      error->Set("limits file line %d: cores=%u does not match cores-milli=%u (it must be %u)", line_no,
                 d->cores_percent, d->cores_milli, PercentForMilli(d->cores_milli));
      return false;
    }
    d->cores_percent = PercentForMilli(d->cores_milli);
  }
  if (!have_ceiling && d->ceiling_percent < d->cores_percent) d->ceiling_percent = d->cores_percent;
  return true;
}

}  // namespace

bool ValidateLimits(const Limits& limits, Error* error) {
  if (limits.device_count < 0 || limits.device_count > kMaxDevices) {
    error->Set("limits: %d GPUs; at most %d are supported", limits.device_count, kMaxDevices);
    return false;
  }
  int any = 0;
  for (int i = 0; i < limits.device_count; ++i) {
    const DeviceLimits& d = limits.devices[i];
    if (d.cores_percent < 1 || d.cores_percent > 100) {
      error->Set("limits: GPU entry %d: cores %u is outside 1..100", i, d.cores_percent);
      return false;
    }
    if (d.cores_milli > kMilliPerGpu ||
        (d.cores_milli != 0 && d.cores_percent != PercentForMilli(d.cores_milli))) {
      error->Set(
          "limits: GPU entry %d: cores-milli %u must be 0 or 1..%u, with cores %u its percent rounded down",
          i, d.cores_milli, kMilliPerGpu, d.cores_percent);
      return false;
    }
    // The ceiling matters only to the elastic policy; elsewhere a ceiling below the share means "the share".
    const bool bad_ceiling = d.policy == ComputePolicy::kElastic && d.ceiling_percent < d.cores_percent;
    if (bad_ceiling || d.ceiling_percent < 1 || d.ceiling_percent > 100) {
      error->Set("limits: GPU entry %d: ceiling %u must be between cores (%u) and 100", i, d.ceiling_percent,
                 d.cores_percent);
      return false;
    }
    if (d.uuid[0] == 0 && d.index == kByUuid) {
      error->Set("limits: GPU entry %d has neither a UUID nor an index", i);
      return false;
    }
    if (d.index == kAnyDevice) ++any;
    for (int j = 0; j < i; ++j) {
      const DeviceLimits& e = limits.devices[j];
      if ((d.uuid[0] != 0 && strcmp(d.uuid, e.uuid) == 0) || (d.index >= 0 && d.index == e.index)) {
        error->Set("limits: GPU entries %d and %d name the same GPU; give each GPU one line", j, i);
        return false;
      }
    }
  }
  if (any > 1) {
    error->Set("limits: more than one entry applies to every GPU (index=*); keep one");
    return false;
  }
  return true;
}

bool ParseLimits(const char* text, size_t size, Limits* out, Error* error) {
  *out = Limits{};
  bool have_header = false;
  bool have_generation = false;
  int line_no = 0;
  size_t pos = 0;
  while (pos < size) {
    const char* nl = static_cast<const char*>(memchr(text + pos, '\n', size - pos));
    const size_t end = nl != nullptr ? static_cast<size_t>(nl - text) : size;
    const char* line = text + pos;
    size_t len = end - pos;
    pos = end + 1;
    ++line_no;
    const char* hash = static_cast<const char*>(memchr(line, '#', len));
    if (hash != nullptr) len = static_cast<size_t>(hash - line);
    Token tokens[12];
    const int count = Tokenize(line, len, tokens, 11);
    if (count == 0) continue;
    if (count > 11) {
      error->Set("limits file line %d: too many fields", line_no);
      return false;
    }
    if (!have_header) {
      uint64_t v = 0;
      if (!tokens[0].Is("tessera-limits") || count != 2 || !ParseU64(tokens[1].p, tokens[1].n, &v)) {
        error->Set(
            "limits file line %d: the file must start with 'tessera-limits <version>'; is this a "
            "Tessera limits file?",
            line_no);
        return false;
      }
      if (v != kLimitsVersion) {
        error->Set(
            "limits file is version %llu; this library reads version %u: update the hook library "
            "to match the node agent",
            static_cast<unsigned long long>(v), kLimitsVersion);
        return false;
      }
      out->version = static_cast<uint32_t>(v);
      have_header = true;
      continue;
    }
    if (tokens[0].Is("generation")) {
      if (count != 2 || !ParseU64(tokens[1].p, tokens[1].n, &out->generation)) {
        error->Set("limits file line %d: expected 'generation <number>'", line_no);
        return false;
      }
      have_generation = true;
    } else if (tokens[0].Is("region")) {
      if (count != 2 || tokens[1].n >= kPathSize || tokens[1].p[0] != '/') {
        error->Set("limits file line %d: expected 'region <absolute path>' (at most %zu characters)", line_no,
                   kPathSize - 1);
        return false;
      }
      CopyString(out->region_path, sizeof(out->region_path), tokens[1].p, tokens[1].n);
    } else if (tokens[0].Is("gpu")) {
      if (out->device_count == kMaxDevices) {
        error->Set("limits file line %d: more than %d GPUs", line_no, kMaxDevices);
        return false;
      }
      DeviceLimits d;
      if (!ParseGpuLine(tokens, count, line_no, &d, error)) return false;
      out->devices[out->device_count++] = d;
    }
    // Other directives: from a newer agent of the same major version; ignored on purpose.
  }
  if (!have_header) {
    error->Set("limits file is empty: expected 'tessera-limits 1' and gpu lines");
    return false;
  }
  if (!have_generation) {
    error->Set("limits file has no 'generation <number>' line");
    return false;
  }
  if (out->device_count == 0) {
    error->Set("limits file names no GPU: expected at least one 'gpu uuid=... memory=... cores=...' line");
    return false;
  }
  return ValidateLimits(*out, error);
}

namespace {

bool Appendf(char* buf, size_t cap, size_t* used, const char* format, ...)
    __attribute__((format(printf, 4, 5)));
bool Appendf(char* buf, size_t cap, size_t* used, const char* format, ...) {
  if (*used >= cap) return false;
  va_list args;
  va_start(args, format);
  const int n = vsnprintf(buf + *used, cap - *used, format, args);
  va_end(args);
  if (n < 0 || static_cast<size_t>(n) >= cap - *used) {
    *used = cap;
    return false;
  }
  *used += static_cast<size_t>(n);
  return true;
}

}  // namespace

size_t FormatLimits(const Limits& limits, char* buf, size_t cap) {
  size_t used = 0;
  bool ok = Appendf(buf, cap, &used, "tessera-limits %u\n", kLimitsVersion) &&
            Appendf(buf, cap, &used, "generation %llu\n", static_cast<unsigned long long>(limits.generation));
  if (ok && limits.region_path[0] != 0) ok = Appendf(buf, cap, &used, "region %s\n", limits.region_path);
  for (int i = 0; ok && i < limits.device_count; ++i) {
    const DeviceLimits& d = limits.devices[i];
    ok = Appendf(buf, cap, &used, "gpu");
    if (ok && d.uuid[0] != 0) ok = Appendf(buf, cap, &used, " uuid=%s", d.uuid);
    if (ok && d.index == kAnyDevice) ok = Appendf(buf, cap, &used, " index=*");
    if (ok && d.index >= 0) ok = Appendf(buf, cap, &used, " index=%d", d.index);
    if (ok) {
      char memory[32];
      if (d.memory_bytes == 0) {
        CopyString(memory, sizeof(memory), "unlimited");
      } else {
        snprintf(memory, sizeof(memory), "%llu", static_cast<unsigned long long>(d.memory_bytes));
      }
      ok = Appendf(buf, cap, &used, " memory=%s cores=%u policy=%s ceiling=%u priority=%s", memory,
                   d.cores_percent,
                   ComputePolicyName(d.policy),
                   d.ceiling_percent < d.cores_percent ? d.cores_percent : d.ceiling_percent,
                   PriorityName(d.priority));
      if (ok && d.cores_milli != 0) ok = Appendf(buf, cap, &used, " cores-milli=%u", d.cores_milli);
      if (ok && d.tenants != 0) ok = Appendf(buf, cap, &used, " tenants=%u", d.tenants);
      if (ok) ok = Appendf(buf, cap, &used, "\n");
    }
  }
  if (!ok) {
    if (cap > 0) buf[0] = 0;
    return 0;
  }
  return used;
}

bool ReadLimitsFile(const char* path, Limits* out, Error* error) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    error->Set("cannot open limits file %s: %s", path, strerror(errno));
    return false;
  }
  static constexpr size_t kMax = 64 * 1024;
  char buf[kMax];
  size_t total = 0;
  while (total < kMax) {
    const ssize_t n = read(fd, buf + total, kMax - total);
    if (n < 0) {
      if (errno == EINTR) continue;
      error->Set("cannot read limits file %s: %s", path, strerror(errno));
      close(fd);
      return false;
    }
    if (n == 0) break;
    total += static_cast<size_t>(n);
  }
  close(fd);
  if (total == kMax) {
    error->Set("limits file %s is larger than 64 KiB; is it the right file?", path);
    return false;
  }
  Error inner;
  if (!ParseLimits(buf, total, out, &inner)) {
    error->Set("%s: %s", path, inner.text);
    return false;
  }
  return true;
}

bool WriteLimitsFile(const char* path, const Limits& limits, Error* error, bool durable) {
  if (!ValidateLimits(limits, error)) return false;
  char text[16 * 1024];
  const size_t len = FormatLimits(limits, text, sizeof(text));
  if (len == 0) {
    error->Set("limits do not fit in a limits file");
    return false;
  }
  char tmp[kPathSize + 32];
  const int n = snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, static_cast<int>(getpid()));
  if (n < 0 || static_cast<size_t>(n) >= sizeof(tmp)) {
    error->Set("limits file path is too long: %s", path);
    return false;
  }
  const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    error->Set("cannot create %s: %s", tmp, strerror(errno));
    return false;
  }
  size_t done = 0;
  while (done < len) {
    const ssize_t w = write(fd, text + done, len - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      error->Set("cannot write %s: %s", tmp, strerror(errno));
      close(fd);
      unlink(tmp);
      return false;
    }
    done += static_cast<size_t>(w);
  }
  if (fchmod(fd, 0644) != 0 || (durable && fsync(fd) != 0)) {
    error->Set("cannot sync %s: %s", tmp, strerror(errno));
    close(fd);
    unlink(tmp);
    return false;
  }
  close(fd);
  if (rename(tmp, path) != 0) {
    error->Set("cannot rename %s to %s: %s", tmp, path, strerror(errno));
    unlink(tmp);
    return false;
  }
  if (!durable) return true;
  // Make the rename durable: fsync the directory.
  char dir[kPathSize + 32];
  CopyString(dir, sizeof(dir), path);
  char* slash = strrchr(dir, '/');
  if (slash == dir) {
    dir[1] = 0;
  } else if (slash != nullptr) {
    *slash = 0;
  } else {
    CopyString(dir, sizeof(dir), ".");
  }
  const int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return true;
}

const DeviceLimits* FindDeviceLimits(const Limits& limits, const char* uuid, int index) {
  if (uuid != nullptr && uuid[0] != 0) {
    for (int i = 0; i < limits.device_count; ++i) {
      if (strcmp(limits.devices[i].uuid, uuid) == 0) return &limits.devices[i];
    }
  }
  if (index >= 0) {
    // A line naming a UUID applies by its index only to a device that has no UUID to match (an OpenCL device
    // without cl_khr_device_uuid): a device with another UUID is another GPU.
    const bool device_has_uuid = uuid != nullptr && uuid[0] != 0;
    for (int i = 0; i < limits.device_count; ++i) {
      const DeviceLimits& d = limits.devices[i];
      if (d.index == index && (d.uuid[0] == 0 || !device_has_uuid)) return &d;
    }
  }
  for (int i = 0; i < limits.device_count; ++i) {
    if (limits.devices[i].index == kAnyDevice) return &limits.devices[i];
  }
  return nullptr;
}

namespace {

// Looks up NAME_<index> (index >= 0) or NAME.
const char* LookupIndexed(EnvLookup lookup, const char* name, int index) {
  if (index < 0) return lookup(name);
  char full[96];
  snprintf(full, sizeof(full), "%s_%d", name, index);
  return lookup(full);
}

// Applies the variables for one GPU (index -1: the plain names) onto `d`. `any` says whether one was found.
bool ApplyEnvironment(EnvLookup lookup, int index, DeviceLimits* d, bool* any, bool* limit_vars,
                      Error* error) {
  char suffix[16] = "";
  if (index >= 0) snprintf(suffix, sizeof(suffix), "_%d", index);
  if (const char* v = LookupIndexed(lookup, "TESSERA_GPU_MEMORY_LIMIT", index)) {
    if (strcmp(v, "unlimited") == 0) {
      d->memory_bytes = 0;
    } else if (!ParseByteSize(v, &d->memory_bytes)) {
      error->Set("TESSERA_GPU_MEMORY_LIMIT%s='%s' is not a size: write bytes or a unit, as in 512MiB or 4GiB",
                 suffix, v);
      return false;
    } else if (d->memory_bytes == 0) {
      error->Set("TESSERA_GPU_MEMORY_LIMIT%s='%s' is zero bytes: refused, since it would mean no limit by "
                 "accident; give a size, or 'unlimited' for no memory limit",
                 suffix, v);
      return false;
    }
    *any = true;
    *limit_vars = true;
  }
  if (const char* v = LookupIndexed(lookup, "TESSERA_GPU_CORES", index)) {
    uint64_t c = 0;
    if (!ParseU64(v, &c) || c < 1 || c > 100) {
      error->Set("TESSERA_GPU_CORES%s='%s' must be a whole percent of the GPU, 1..100", suffix, v);
      return false;
    }
    d->cores_percent = static_cast<uint32_t>(c);
    *any = true;
    *limit_vars = true;
  }
  if (const char* v = LookupIndexed(lookup, "TESSERA_COMPUTE_POLICY", index)) {
    if (strcmp(v, "hard") == 0) {
      d->policy = ComputePolicy::kHard;
    } else if (strcmp(v, "elastic") == 0) {
      d->policy = ComputePolicy::kElastic;
    } else {
      error->Set("TESSERA_COMPUTE_POLICY%s='%s' must be hard or elastic", suffix, v);
      return false;
    }
    *any = true;
  }
  if (const char* v = LookupIndexed(lookup, "TESSERA_COMPUTE_CEILING", index)) {
    uint64_t c = 0;
    if (!ParseU64(v, &c) || c < 1 || c > 100) {
      error->Set("TESSERA_COMPUTE_CEILING%s='%s' must be 1..100", suffix, v);
      return false;
    }
    d->ceiling_percent = static_cast<uint32_t>(c);
    *any = true;
  }
  if (const char* v = LookupIndexed(lookup, "TESSERA_PRIORITY", index)) {
    if (strcmp(v, "high") == 0) {
      d->priority = Priority::kHigh;
    } else if (strcmp(v, "low") == 0) {
      d->priority = Priority::kLow;
    } else {
      error->Set("TESSERA_PRIORITY%s='%s' must be high or low", suffix, v);
      return false;
    }
    *any = true;
  }
  return true;
}

}  // namespace

bool LimitsFromEnvironment(EnvLookup lookup, Limits* out, bool* configured, Error* error) {
  *out = Limits{};
  *configured = false;
  DeviceLimits base;
  base.index = kAnyDevice;
  bool any = false;
  bool limit_vars = false;
  if (!ApplyEnvironment(lookup, -1, &base, &any, &limit_vars, error)) return false;
  bool explicit_ceiling = lookup("TESSERA_COMPUTE_CEILING") != nullptr;
  if (!explicit_ceiling && base.ceiling_percent < base.cores_percent)
    base.ceiling_percent = base.cores_percent;
  out->devices[out->device_count++] = base;
  for (int i = 0; i < kMaxDevices; ++i) {
    DeviceLimits d = base;
    d.index = i;
    bool found = false;
    if (!ApplyEnvironment(lookup, i, &d, &found, &limit_vars, error)) return false;
    if (!found) continue;
    const bool ceiling_given =
        explicit_ceiling || LookupIndexed(lookup, "TESSERA_COMPUTE_CEILING", i) != nullptr;
    if (!ceiling_given && d.ceiling_percent < d.cores_percent) d.ceiling_percent = d.cores_percent;
    out->devices[out->device_count++] = d;
  }
  if (const char* region = lookup("TESSERA_REGION")) {
    if (region[0] != '/' || !CopyString(out->region_path, sizeof(out->region_path), region)) {
      error->Set("TESSERA_REGION='%s' must be an absolute path shorter than %zu characters", region,
                 kPathSize);
      return false;
    }
  }
  *configured = limit_vars;
  if (!limit_vars) return true;
  return ValidateLimits(*out, error);
}

}  // namespace tessera::hook
