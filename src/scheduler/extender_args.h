// Reading the body of the extender's filter, prioritize and preempt verbs (ExtenderArgs) as JSON: the
// document and its NodeNames, the one part of it that is large (5,000 node names in a 60 KB body on a large
// cluster).
//
//   absl::StatusOr<ExtenderArgsDoc> args = ReadExtenderArgs(body);
//   if (!args.ok()) return BadRequest(args.status());   // "the request body is not valid JSON; ..."
//   for (std::string_view node : args->names) ...       // views into `body` (or into args->owned_names)
//   const nlohmann::json& pod = args->doc["Pod"];        // everything but NodeNames
//
// Two paths, one answer. The general path parses the whole body with nlohmann's SAX parser, collecting
// NodeNames into strings and building the rest as a DOM, with the same depth limit as formats/bounded_json.h.
// The fast path (the default) first scans the body's top level by hand: when every NodeNames there is a list
// of plain names (printable ASCII, no escapes: what Kubernetes node names are), it takes them as views into
// the body, cuts those lists out of the text (each replaced by `null`) and gives only what remains (the Pod,
// a few hundred bytes to a few KB) to the general path. Anything the scan does not handle (escapes or other
// bytes in a name, a NodeNames that is not a list of strings, a key written with escapes, a top level it
// cannot follow) sends the whole body to the general path, which gives the errors it always gave. So both
// paths accept the same bodies with the same result and refuse the same bodies with the same message: a list
// of valid strings and `null` are both JSON values, so the body is valid JSON (within the depth limit)
// exactly when what remains is, and the parser meets its errors in the same order. fuzz/extender_args_fuzz.cc
// checks that on every input it runs (ArgsPath::kGeneral against kFast);
// tests/scheduler/extender_args_test.cc on hand-written malformed bodies.
//
// Thread-safety: pure functions.
#ifndef TESSERA_SCHEDULER_EXTENDER_ARGS_H_
#define TESSERA_SCHEDULER_EXTENDER_ARGS_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tessera::scheduler {

struct ExtenderArgsDoc {
  ExtenderArgsDoc() = default;
  // Moved, never copied: `names` may point into `owned_names` (moving a vector keeps its elements in place).
  ExtenderArgsDoc(ExtenderArgsDoc&&) = default;
  ExtenderArgsDoc& operator=(ExtenderArgsDoc&&) = default;
  ExtenderArgsDoc(const ExtenderArgsDoc&) = delete;
  ExtenderArgsDoc& operator=(const ExtenderArgsDoc&) = delete;

  // The body as a JSON object, without its NodeNames (those are in `names`; the key may remain, as null).
  nlohmann::json doc;
  // Whether the body had a NodeNames list (possibly empty); null or absent is none.
  bool has_names = false;
  // The node names, in order (several NodeNames keys, in any case, add up, as they always have). Views into
  // the body read, or into `owned_names`: valid while both live.
  std::vector<std::string_view> names;
  std::vector<std::string> owned_names;
  // Which path read it (for tests and the fuzz target).
  bool fast = false;
};

enum class ArgsPath { kFast, kGeneral };

// Node names read in one request, at most: ten times the largest cluster Kubernetes supports (5,000 nodes).
// The answer names each node with a reason, so 4 million names used to make a 376 MB answer (1.3 GB peak).
inline constexpr size_t kMaxNodeNames = 50000;

// Reads ExtenderArgs. Errors are InvalidArgument with the message the extender answers (after "<verb>: "):
// not valid JSON, nested too deep, a tree above formats::DomBudgetFor(body.size()) (memory in proportion to
// the body: 30 MB of `{}` took 1 GB), not an object, NodeNames not a list of node names, more than `max_names`
// of them, or a top-level field given twice in any case ("Pod" and "pod": Go would keep the last, the DOM kept
// both; refused).
absl::StatusOr<ExtenderArgsDoc> ReadExtenderArgs(std::string_view body, ArgsPath path = ArgsPath::kFast,
                                                 size_t max_names = kMaxNodeNames);

// The fast path's scan alone (exposed for tests): the NodeNames lists as views into `body` and the body
// without them, or nullopt when the body must take the general path.
struct NodeNamesScan {
  std::vector<std::string_view> names;  // the first `max_names`
  size_t names_seen = 0;                // all of them
  bool has_names = false;
  std::string rest;  // `body` with each NodeNames list replaced by null
};
std::optional<NodeNamesScan> ScanNodeNames(std::string_view body, size_t max_names = kMaxNodeNames);

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_EXTENDER_ARGS_H_
