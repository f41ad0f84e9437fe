// GPU interconnect topology: the link level of every GPU pair, as NVML and `nvidia-smi topo -m` report it.
//
// From nearest to farthest: NVLink (NV#, more bonded links is nearer), PIX (at most one PCIe bridge), PXB
// (several PCIe bridges, no host bridge), PHB (through a PCIe host bridge), NODE (between host bridges of one
// NUMA node), SYS (across the SMP interconnect between sockets; older tools print SOC).
//
//   absl::StatusOr<TopoReport> r = ParseNvidiaSmiTopo(text);   // the matrix `nvidia-smi topo -m` prints
//   Link l = r->links.at(0, 1);                                // e.g. NV12
//   int c = l.Cost();                                          // lower is nearer
//
// Thread-safety: plain values; the parser is a pure function.
#ifndef TESSERA_CORE_TOPOLOGY_H_
#define TESSERA_CORE_TOPOLOGY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::core {

enum class LinkKind : uint8_t { kSelf, kNvLink, kPix, kPxb, kPhb, kNode, kSys };

// The connection between two GPUs.
struct Link {
  LinkKind kind = LinkKind::kSys;
  int nvlinks = 0;  // bonded NVLinks, only for kNvLink

  static Link Self() { return {LinkKind::kSelf, 0}; }
  static Link NvLink(int n) { return {LinkKind::kNvLink, n}; }
  static Link Of(LinkKind k) { return {k, 0}; }

  // Access cost of the link (Gaia's communication overhead): lower is nearer. NV18 = 1 ... NV1 = 18, then
  // PIX 20, PXB 30, PHB 40, NODE 50, SYS 60. Self is 0.
  int Cost() const;

  // As nvidia-smi prints it: "X", "NV12", "PIX", "PXB", "PHB", "NODE", "SYS".
  std::string ToString() const;

  // Accepts what nvidia-smi prints, case-insensitively, and "SOC" (older drivers) for SYS.
  static absl::StatusOr<Link> Parse(std::string_view text);

  bool operator==(const Link&) const = default;
};

// Pairwise link levels of the GPUs of one node, indexed by GPU index. Symmetric; the diagonal is Self.
class LinkMatrix {
 public:
  LinkMatrix() = default;
  // n GPUs, every pair joined at `fill` (a node without topology information: SYS is the safe assumption).
  explicit LinkMatrix(int n, Link fill = Link::Of(LinkKind::kSys));

  int size() const { return n_; }
  const Link& at(int a, int b) const { return links_[static_cast<size_t>(a * n_ + b)]; }
  // Sets both (a,b) and (b,a).
  void Set(int a, int b, Link link);

  // Rows of link names as nvidia-smi prints them, e.g. {{"X","NV12"},{"NV12","X"}}.
  static absl::StatusOr<LinkMatrix> FromRows(const std::vector<std::vector<std::string>>& rows);
  std::vector<std::vector<std::string>> ToRows() const;

  bool operator==(const LinkMatrix&) const = default;

 private:
  int n_ = 0;
  std::vector<Link> links_;
};

// What `nvidia-smi topo -m` tells about the GPUs of one machine.
struct TopoReport {
  LinkMatrix links;
  std::vector<std::string> cpu_affinity;  // per GPU, e.g. "0-9,20-29"; empty when not printed
  std::vector<int> numa_node;             // per GPU; -1 when not printed or N/A
};

// Parses the text `nvidia-smi topo -m` prints (tab- or space-separated, with or without NIC columns, the
// legend and the NUMA columns of newer drivers). Errors name the line and what was expected.
absl::StatusOr<TopoReport> ParseNvidiaSmiTopo(std::string_view text);

// Parses a Linux CPU list ("0-9,20-29") into CPU numbers.
absl::StatusOr<std::vector<int>> ParseCpuList(std::string_view text);

}  // namespace tessera::core

#endif  // TESSERA_CORE_TOPOLOGY_H_
