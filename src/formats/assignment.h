// The pod annotations through which the scheduler tells the node agent what a pod was given
// (docs/protocols.md), and from which the scheduler rebuilds its state after a restart:
//
//   tessera.dev/assignment   {"version":1,"node":"gpu-1","containers":[{"name":"main","vgpus":
//                             [{"uuid":"GPU-0a..","index":0,"cores":30,"milliCores":300,"memoryMiB":4096}]}]}
//   tessera.dev/assigned-at  RFC 3339 time of the decision
//   tessera.dev/phase        bound (the scheduler bound it) -> allocated (the agent gave it its devices)
//
// `milliCores` is the compute share in thousandths of one GPU (1000 = the whole GPU), the unit the
// scheduler's ledger commits in, carried unchanged to the limits file (`cores-milli`). `cores` is the same
// share in percent with up to one decimal, for readers that predate `milliCores`; a reader takes either, and
// refuses the two when they disagree. A vGPU whose share a high-priority pod compressed (SharedGPU) also
// carries "requestedCores" and "requestedMilliCores", the share it gets back when that pod leaves. Documented
// in docs/protocols.md.
//
//   std::string text = FormatAssignment(placement);
//   absl::StatusOr<Assignment> a = ParseAssignment(pod.annotations["tessera.dev/assignment"]);
//
// Thread-safety: pure functions.
#ifndef TESSERA_FORMATS_ASSIGNMENT_H_
#define TESSERA_FORMATS_ASSIGNMENT_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/request.h"

namespace tessera::formats {

inline constexpr char kAnnotationAssignment[] = "tessera.dev/assignment";
inline constexpr char kAnnotationAssignedAt[] = "tessera.dev/assigned-at";
inline constexpr char kAnnotationPhase[] = "tessera.dev/phase";
// With leader election, every bind carries the tessera-scheduler replica that made it and the Lease's term it
// led in, and so does every ResourceClaim before tessera-scheduler writes its status; the API server refuses the
// bind, or the claim's status write, when the Lease has moved past that term (deploy/scheduler/70-leader-fence.yaml,
// docs/faults.md). The object keeps them: who bound or allocated it, in which term.
inline constexpr char kAnnotationLeader[] = "tessera.dev/leader";
inline constexpr char kAnnotationLeaderTerm[] = "tessera.dev/leader-term";
inline constexpr char kPhaseBound[] = "bound";
inline constexpr char kPhaseAllocated[] = "allocated";
inline constexpr int kAssignmentVersion = 1;

struct Assignment {
  core::NodeName node;
  std::vector<core::ContainerAssignment> containers;
};

std::string FormatAssignment(const core::Placement& placement);
// Strict: unknown versions, missing fields, shares outside 0-100% (1-1000 thousandths), two values of one
// share that disagree, negative memory and duplicate containers are refused with a message that names the
// field.
absl::StatusOr<Assignment> ParseAssignment(std::string_view text);

// The placement an assignment describes (the scores and compressions of the original decision are not kept).
core::Placement ToPlacement(const Assignment& assignment);

}  // namespace tessera::formats

#endif  // TESSERA_FORMATS_ASSIGNMENT_H_
