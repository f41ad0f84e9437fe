#include "common/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <memory>

namespace tessera::log {

namespace {

const char* Name(Level l) {
  switch (l) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
  }
  return "info";
}

spdlog::level::level_enum ToSpd(Level l) {
  switch (l) {
    case Level::kDebug:
      return spdlog::level::debug;
    case Level::kInfo:
      return spdlog::level::info;
    case Level::kWarn:
      return spdlog::level::warn;
    case Level::kError:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

// Quotes a value when it holds spaces, quotes, '=' or nothing.
void AppendValue(std::string& out, std::string_view v) {
  bool quote = v.empty();
  for (char c : v) quote = quote || c == ' ' || c == '"' || c == '=' || c == '\n' || c == '\t';
  if (!quote) {
    out.append(v);
    return;
  }
  out.push_back('"');
  for (char c : v) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (c == '\n') {
      out.append("\\n");
      continue;
    }
    out.push_back(c);
  }
  out.push_back('"');
}

std::shared_ptr<spdlog::logger>& Logger() {
  static std::shared_ptr<spdlog::logger> logger;
  return logger;
}

void Emit(Level level, std::string_view msg, std::initializer_list<Field> fields) {
  auto& logger = Logger();
  if (!logger) Init("tessera", Level::kWarn);
  if (!logger->should_log(ToSpd(level))) return;
  logger->log(ToSpd(level), "{}", Format(level, msg, fields));
}

}  // namespace

std::string Format(Level level, std::string_view msg, std::initializer_list<Field> fields) {
  std::string out = "level=";
  out.append(Name(level));
  out.append(" msg=");
  AppendValue(out, msg);
  for (const Field& f : fields) {
    out.push_back(' ');
    out.append(f.first);
    out.push_back('=');
    AppendValue(out, f.second);
  }
  return out;
}

void Init(std::string_view program, Level level) {
  if (const char* env = std::getenv("TESSERA_LOG")) {
    std::string_view e(env);
    if (e == "debug") level = Level::kDebug;
    if (e == "info") level = Level::kInfo;
    if (e == "warn") level = Level::kWarn;
    if (e == "error") level = Level::kError;
  }
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>(std::string(program), sink);
  logger->set_pattern("ts=%Y-%m-%dT%H:%M:%S.%eZ %v", spdlog::pattern_time_type::utc);
  logger->set_level(ToSpd(level));
  Logger() = logger;
}

void SetLevel(Level level) {
  if (!Logger()) Init("tessera", level);
  Logger()->set_level(ToSpd(level));
}

bool Enabled(Level level) {
  auto& logger = Logger();
  if (!logger) Init("tessera", Level::kWarn);
  return logger->should_log(ToSpd(level));
}

void Debug(std::string_view msg, std::initializer_list<Field> fields) {
  Emit(Level::kDebug, msg, fields);
}
void Info(std::string_view msg, std::initializer_list<Field> fields) {
  Emit(Level::kInfo, msg, fields);
}
void Warn(std::string_view msg, std::initializer_list<Field> fields) {
  Emit(Level::kWarn, msg, fields);
}
void Error(std::string_view msg, std::initializer_list<Field> fields) {
  Emit(Level::kError, msg, fields);
}

}  // namespace tessera::log
