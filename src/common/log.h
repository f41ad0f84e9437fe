// Structured, quiet-by-default logging for the apps (the core never logs: it returns explanations).
//
// Lines are logfmt: `ts=2026-11-22T08:14:03.120Z level=info msg="placed pod" pod=default/a node=gpu-1`.
// The default level is warn; --verbose (or TESSERA_LOG=debug|info|warn|error) raises or lowers it.
//
//   tessera::log::Init("tessera", tessera::log::Level::kWarn);
//   tessera::log::Info("placed pod", {{"pod", name}, {"node", node}});
//
// Thread-safety: thread-safe (spdlog's synchronized sink).
#ifndef TESSERA_COMMON_LOG_H_
#define TESSERA_COMMON_LOG_H_

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace tessera::log {

enum class Level { kDebug, kInfo, kWarn, kError };

using Field = std::pair<std::string_view, std::string>;

// Sets up stderr logging for one program. TESSERA_LOG, when set, overrides `level`.
void Init(std::string_view program, Level level);
void SetLevel(Level level);
// Whether a line of `level` is written: for a caller whose fields cost something to build.
bool Enabled(Level level);

void Debug(std::string_view msg, std::initializer_list<Field> fields = {});
void Info(std::string_view msg, std::initializer_list<Field> fields = {});
void Warn(std::string_view msg, std::initializer_list<Field> fields = {});
void Error(std::string_view msg, std::initializer_list<Field> fields = {});

// Formats one logfmt line without the timestamp (exposed for tests).
std::string Format(Level level, std::string_view msg, std::initializer_list<Field> fields);

}  // namespace tessera::log

#endif  // TESSERA_COMMON_LOG_H_
