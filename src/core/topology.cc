#include "core/topology.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "absl/status/status.h"
#include "core/strings.h"

namespace tessera::core {

int Link::Cost() const {
  switch (kind) {
    case LinkKind::kSelf:
      return 0;
    case LinkKind::kNvLink:
      return 19 - std::clamp(nvlinks, 1, 18);
    case LinkKind::kPix:
      return 20;
    case LinkKind::kPxb:
      return 30;
    case LinkKind::kPhb:
      return 40;
    case LinkKind::kNode:
      return 50;
    case LinkKind::kSys:
      return 60;
  }
  return 60;
}

std::string Link::ToString() const {
  switch (kind) {
    case LinkKind::kSelf:
      return "X";
    case LinkKind::kNvLink:
      return StrCat("NV", nvlinks);
    case LinkKind::kPix:
      return "PIX";
    case LinkKind::kPxb:
      return "PXB";
    case LinkKind::kPhb:
      return "PHB";
    case LinkKind::kNode:
      return "NODE";
    case LinkKind::kSys:
      return "SYS";
  }
  return "SYS";
}

absl::StatusOr<Link> Link::Parse(std::string_view text) {
  std::string t = AsciiUpper(StripWhitespace(text));
  if (t == "X") return Link::Self();
  if (t == "PIX") return Link::Of(LinkKind::kPix);
  if (t == "PXB") return Link::Of(LinkKind::kPxb);
  if (t == "PHB") return Link::Of(LinkKind::kPhb);
  if (t == "NODE") return Link::Of(LinkKind::kNode);
  if (t == "SYS" || t == "SOC") return Link::Of(LinkKind::kSys);
  if (t.size() > 2 && t.starts_with("NV")) {
    int n = 0;
    if (ParseInt(std::string_view(t).substr(2), &n) && n >= 1 && n <= 64) return Link::NvLink(n);
  }
  return absl::InvalidArgumentError(StrCat("unknown link level \"", text,
                                           "\": expected X, NV<links> (e.g. NV12), PIX, PXB, PHB, NODE, ",
                                           "SYS or SOC"));
}

LinkMatrix::LinkMatrix(int n, Link fill) : n_(n), links_(static_cast<size_t>(n * n), fill) {
  for (int i = 0; i < n; ++i) links_[static_cast<size_t>(i * n + i)] = Link::Self();
}

void LinkMatrix::Set(int a, int b, Link link) {
  links_[static_cast<size_t>(a * n_ + b)] = link;
  links_[static_cast<size_t>(b * n_ + a)] = link;
}

absl::StatusOr<LinkMatrix> LinkMatrix::FromRows(const std::vector<std::vector<std::string>>& rows) {
  const int n = static_cast<int>(rows.size());
  LinkMatrix m(n);
  for (int a = 0; a < n; ++a) {
    if (static_cast<int>(rows[static_cast<size_t>(a)].size()) != n) {
      return absl::InvalidArgumentError(StrCat("link matrix row ", a, " has ",
                                               rows[static_cast<size_t>(a)].size(), " entries, expected ", n,
                                               " (one per GPU)"));
    }
    for (int b = 0; b < n; ++b) {
      absl::StatusOr<Link> l = Link::Parse(rows[static_cast<size_t>(a)][static_cast<size_t>(b)]);
      if (!l.ok())
        return absl::InvalidArgumentError(StrCat("link matrix [", a, "][", b, "]: ", l.status().message()));
      if ((a == b) != (l->kind == LinkKind::kSelf)) {
        return absl::InvalidArgumentError(
            StrCat("link matrix [", a, "][", b, "] is ", l->ToString(),
                   a == b ? ": the diagonal must be X" : ": only the diagonal may be X"));
      }
      m.links_[static_cast<size_t>(a * n + b)] = *l;
    }
  }
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      if (!(m.at(a, b) == m.at(b, a))) {
        return absl::InvalidArgumentError(StrCat("link matrix is not symmetric: GPU", a, "-GPU", b, " is ",
                                                 m.at(a, b).ToString(), " but GPU", b, "-GPU", a, " is ",
                                                 m.at(b, a).ToString()));
      }
    }
  }
  return m;
}

std::vector<std::vector<std::string>> LinkMatrix::ToRows() const {
  std::vector<std::vector<std::string>> rows(static_cast<size_t>(n_));
  for (int a = 0; a < n_; ++a) {
    for (int b = 0; b < n_; ++b) rows[static_cast<size_t>(a)].push_back(at(a, b).ToString());
  }
  return rows;
}

absl::StatusOr<std::vector<int>> ParseCpuList(std::string_view text) {
  std::vector<int> cpus;
  std::string_view t = StripWhitespace(text);
  if (t.empty() || t == "N/A") return cpus;
  for (std::string_view part : StrSplit(t, ',')) {
    part = StripWhitespace(part);
    std::vector<std::string_view> ends = StrSplit(part, '-');
    int lo = 0;
    int hi = 0;
    if (ends.size() == 1 && ParseInt(ends[0], &lo)) {
      hi = lo;
    } else if (ends.size() != 2 || !ParseInt(ends[0], &lo) || !ParseInt(ends[1], &hi) || lo < 0 || hi < lo ||
               hi - lo > 65536) {
      return absl::InvalidArgumentError(
          StrCat("bad CPU list \"", text, "\": expected ranges like 0-9,20-29"));
    }
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  return cpus;
}

namespace {

std::vector<std::string_view> Fields(std::string_view line) {
  return SplitAny(line, " \t\r");
}

bool IsGpuName(std::string_view token, int* index) {
  return token.size() > 3 && token.starts_with("GPU") && ParseInt(token.substr(3), index);
}

}  // namespace

absl::StatusOr<TopoReport> ParseNvidiaSmiTopo(std::string_view text) {
  std::vector<std::string_view> lines = StrSplit(text, '\n');
  // The header is the first line whose first field is GPU0.
  size_t header = lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<std::string_view> f = Fields(lines[i]);
    if (!f.empty() && f[0] == "GPU0") {
      header = i;
      break;
    }
  }
  if (header == lines.size()) {
    return absl::InvalidArgumentError(
        "no topology matrix found: expected the output of `nvidia-smi topo -m`, whose header line starts "
        "with "
        "GPU0");
  }
  // Device columns run until "CPU" (of "CPU Affinity"); GPU columns are the GPU<n> among them.
  std::vector<std::string_view> head = Fields(lines[header]);
  size_t device_columns = 0;
  int gpus = 0;
  while (device_columns < head.size() && head[device_columns] != "CPU") {
    int idx = 0;
    if (head[device_columns].starts_with("GPU") && !IsGpuName(head[device_columns], &idx)) {
      // Not a NIC either: dropping it would report fewer GPUs than the machine has.
      return absl::InvalidArgumentError(StrCat("line ", header + 1, ": column \"", head[device_columns],
                                               "\" is neither GPU<n> nor another device; is the output cut or "
                                               "edited?"));
    }
    if (IsGpuName(head[device_columns], &idx)) {
      if (idx != gpus) {
        return absl::InvalidArgumentError(StrCat("line ", header + 1, ": GPU columns out of order: found ",
                                                 head[device_columns], " where GPU", gpus, " was expected"));
      }
      ++gpus;
    }
    ++device_columns;
  }
  const bool has_cpu_affinity = device_columns < head.size();
  const bool has_numa = std::find(head.begin(), head.end(), "NUMA") != head.end();

  std::vector<std::vector<std::string>> rows;
  TopoReport report;
  for (size_t i = header + 1; i < lines.size() && static_cast<int>(rows.size()) < gpus; ++i) {
    std::vector<std::string_view> f = Fields(lines[i]);
    if (f.empty()) continue;
    int idx = 0;
    if (!IsGpuName(f[0], &idx)) {
      if (f[0].starts_with("Legend")) break;
      if (f[0].starts_with("GPU")) {
        return absl::InvalidArgumentError(
            StrCat("line ", i + 1, ": row \"", f[0], "\" is not GPU<n>; is the output cut or edited?"));
      }
      continue;  // NIC rows
    }
    if (idx != static_cast<int>(rows.size())) {
      return absl::InvalidArgumentError(
          StrCat("line ", i + 1, ": found row ", f[0], " where GPU", rows.size(), " was expected"));
    }
    if (f.size() < 1 + device_columns) {
      return absl::InvalidArgumentError(StrCat("line ", i + 1, ": row ", f[0], " has ", f.size() - 1,
                                               " columns, the header has ", device_columns));
    }
    std::vector<std::string> row;
    for (size_t c = 0; c < device_columns; ++c) {
      int col = 0;
      if (IsGpuName(head[c], &col)) row.emplace_back(f[1 + c]);
    }
    rows.push_back(std::move(row));
    std::string cpu;
    int numa = -1;
    if (has_cpu_affinity && f.size() > 1 + device_columns) {
      cpu = std::string(f[1 + device_columns]);
      absl::StatusOr<std::vector<int>> cpus = ParseCpuList(cpu);
      if (!cpus.ok())
        return absl::InvalidArgumentError(StrCat("line ", i + 1, ": ", cpus.status().message()));
      if (has_numa && f.size() > 2 + device_columns && !ParseInt(f[2 + device_columns], &numa)) numa = -1;
    }
    report.cpu_affinity.push_back(cpu == "N/A" ? "" : cpu);
    report.numa_node.push_back(numa);
  }
  if (static_cast<int>(rows.size()) != gpus) {
    return absl::InvalidArgumentError(
        StrCat("the header names ", gpus, " GPUs but ", rows.size(), " GPU rows follow it"));
  }
  absl::StatusOr<LinkMatrix> m = LinkMatrix::FromRows(rows);
  if (!m.ok()) return m.status();
  report.links = *std::move(m);
  return report;
}

}  // namespace tessera::core
