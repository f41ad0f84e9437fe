// The admission webhook (admission.k8s.io/v1 AdmissionReview), served by tessera-scheduler over HTTPS.
//
// Mutating (/mutate): for a pod that asks for GPUs in any supported system's names, rewrites the resources
// into Tessera's (docs/requests.md: HAMi, gpu-manager, gpushare, Volcano), adds tessera.dev/gpu (the number
// of vGPUs) to a container that asks for a share without it, so that the kubelet calls the device plugin's
// Allocate for it (annotation tessera.dev/gpu-added names those containers), and sets spec.schedulerName, so
// that the pod reaches the extender. A pod whose schedulerName names another scheduler (Volcano's, HAMi's) is
// left untouched by both webhooks: its own scheduler reads its own names. Both refuse a pod whose request is
// impossible (cores 0 or above 100 per vGPU, malformed annotations, a privileged container asking for a
// share...) with the parser's message, which says what to change: /mutate judges the pod as its patch leaves
// it, which is what /validate saw after it, so registering /mutate alone (deploy/) refuses the same pods with
// the same messages in one call. /validate stays for clusters that registered it.
//
//   Admission admission({.scheduler_name = "tessera-scheduler"});
//   Response r = admission.Mutate(body);
//
// Extended resources on DRA GPUs (SetDraConversion, docs/dra.md): when the pod's GPUs come from DRA, /mutate
// removes the GPU resources from the containers instead, gives each GPU-using container a claim made from a
// ResourceClaimTemplate of the same meaning (dra_conversion.h; the template is created here, never on a dry
// run), and gates the pod for Tessera's DRA placement in the same patch.
//
// Every answer is counted by verb (mutate, validate) and decision (allowed, patched, denied, error), for
// /metrics (tessera_scheduler_webhook_decisions_total).
//
// Thread-safety: immutable but for the counters (atomic); methods may run concurrently.
#ifndef TESSERA_SCHEDULER_ADMISSION_H_
#define TESSERA_SCHEDULER_ADMISSION_H_

#include <array>
#include <atomic>
#include <functional>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "core/request_parser.h"
#include "formats/pod_object.h"
#include "nlohmann/json.hpp"
#include "scheduler/dra_conversion.h"
#include "scheduler/extender.h"

namespace tessera::scheduler {

struct AdmissionOptions {
  // Set on GPU pods whose schedulerName is empty or "default-scheduler"; empty: leave schedulerName alone.
  std::string scheduler_name = "tessera-scheduler";
  core::ParseOptions parse;
  // Time (the gated-at annotation /mutate-dra writes); never null (common/clock.h). Must outlive the webhook.
  const Clock* clock = &RealClock();
};

class Admission {
 public:
  explicit Admission(AdmissionOptions options) : options_(std::move(options)) {}

  Response Mutate(std::string_view body) const;
  Response Validate(std::string_view body) const;
  // /mutate-dra: gates a pod whose ResourceClaims tessera-scheduler places (formats/dra_placement.h): the
  // scheduling gate, the label and the gated-at annotation. Never refuses a pod; counted as mutate.
  Response MutateDra(std::string_view body) const;
  // DRA placement by Tessera: whether a pod's claims are Tessera's to place (DraController::ShouldGate).
  // Unset, /mutate-dra allows every pod unchanged. Set before serving.
  void SetDraGate(std::function<bool(const nlohmann::json& pod)> gate) { dra_gate_ = std::move(gate); }
  // Extended resources turned into ResourceClaims (tessera-scheduler --extended-resources-to-dra). `offer`
  // says what the cluster offers now (called once per GPU pod); `ensure` makes a template exist
  // (ClaimTemplateMaker). Unset, or mode kNever: /mutate never converts. Set before serving.
  struct DraConversion {
    ExtendedToDra mode = ExtendedToDra::kNever;
    std::function<DraOffer()> offer;
    std::function<absl::Status(std::string_view ns, const ClaimTemplate& t)> ensure;
  };
  void SetDraConversion(DraConversion conversion) { conversion_ = std::move(conversion); }

  // What the webhook answered: allowed as is, allowed with a patch (mutate only), denied (allowed: false), or
  // an error (HTTP 400: the body was no AdmissionReview).
  enum class Decision { kAllowed, kPatched, kDenied, kError };
  enum class Verb { kMutate, kValidate };
  static constexpr std::array<const char*, 4> kDecisionNames = {"allowed", "patched", "denied", "error"};
  static constexpr std::array<const char*, 2> kVerbNames = {"mutate", "validate"};
  // Answers so far, by verb and decision.
  uint64_t decisions(Verb verb, Decision decision) const {
    return counts_[static_cast<size_t>(verb)][static_cast<size_t>(decision)].load(std::memory_order_relaxed);
  }

 private:
  Response DoMutate(std::string_view body, Decision* decision) const;
  Response DoValidate(std::string_view body, Decision* decision) const;
  // The pod is scheduled by kube-scheduler's default profile or by ours (not by another scheduler).
  bool ForUs(const formats::PodObject& pod) const;

  AdmissionOptions options_;
  std::function<bool(const nlohmann::json& pod)> dra_gate_;
  DraConversion conversion_;
  mutable std::array<std::array<std::atomic<uint64_t>, 4>, 2> counts_{};
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_ADMISSION_H_
