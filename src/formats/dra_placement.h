// The marks on a pod whose ResourceClaims tessera-scheduler places (docs/dra.md, "Placement by Tessera"),
// shared by the webhook that sets them, tessera-scheduler that places the claims and lifts them, and
// tessera-node that lifts them when tessera-scheduler stays unavailable (the fallback to kube-scheduler's own
// allocator).
//
// - spec.schedulingGates gets {name: kDraPlacementGate}: kube-scheduler leaves the pod alone while it is
// there.
// - label kDraPlacementLabel = "gated": so that the fallback watches the gated pods only (a label selector).
// - annotation kDraGatedAtAnnotation: when the webhook gated it (RFC 3339, UTC, as formats::FormatHeartbeat
//   writes it: "2026-11-22T08:14:03.120Z").
// - annotation kDraWaitingAnnotation: set by tessera-scheduler while no node fits, saying why; gone once
// placed.
//
// When the gate is lifted the label's value becomes "placed" (tessera-scheduler allocated the claims) or
// "fallback" (tessera-node handed the pod to kube-scheduler), in the same write.
#ifndef TESSERA_FORMATS_DRA_PLACEMENT_H_
#define TESSERA_FORMATS_DRA_PLACEMENT_H_

namespace tessera::formats {

inline constexpr char kDraPlacementGate[] = "tessera.dev/dra-placement";
inline constexpr char kDraPlacementLabel[] = "tessera.dev/dra-placement";
inline constexpr char kDraGated[] = "gated";
inline constexpr char kDraPlaced[] = "placed";
inline constexpr char kDraFallback[] = "fallback";
inline constexpr char kDraGatedAtAnnotation[] = "tessera.dev/dra-gated-at";
inline constexpr char kDraWaitingAnnotation[] = "tessera.dev/dra-waiting";
// The driver whose devices tessera-scheduler places, and its device classes (deploy/dra/deviceclasses.yaml).
inline constexpr char kDraDriver[] = "gpu.tessera.dev";

}  // namespace tessera::formats

#endif  // TESSERA_FORMATS_DRA_PLACEMENT_H_
