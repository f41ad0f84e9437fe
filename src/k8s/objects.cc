#include "k8s/objects.h"

#include <ctime>

#include "core/strings.h"

namespace tessera::k8s {

namespace {

std::string MetaString(const Json& object, const char* field) {
  if (!object.is_object()) return "";
  auto m = object.find("metadata");
  if (m == object.end() || !m->is_object()) return "";
  auto f = m->find(field);
  if (f == m->end() || !f->is_string()) return "";
  return f->get<std::string>();
}

std::optional<std::string> MetaMapValue(const Json& object, const char* map, std::string_view key) {
  if (!object.is_object()) return std::nullopt;
  auto m = object.find("metadata");
  if (m == object.end() || !m->is_object()) return std::nullopt;
  auto a = m->find(map);
  if (a == m->end() || !a->is_object()) return std::nullopt;
  auto v = a->find(std::string(key));
  if (v == a->end() || !v->is_string()) return std::nullopt;
  return v->get<std::string>();
}

}  // namespace

std::string Name(const Json& object) {
  return MetaString(object, "name");
}
std::string Namespace(const Json& object) {
  return MetaString(object, "namespace");
}
std::string Uid(const Json& object) {
  return MetaString(object, "uid");
}
std::string ResourceVersion(const Json& object) {
  return MetaString(object, "resourceVersion");
}

std::string ObjectKey(std::string_view ns, std::string_view name) {
  if (ns.empty()) return std::string(name);
  return StrCat(ns, "/", name);
}

std::string ObjectKey(const Json& object) {
  return ObjectKey(Namespace(object), Name(object));
}

std::optional<std::string> Annotation(const Json& object, std::string_view key) {
  return MetaMapValue(object, "annotations", key);
}
std::optional<std::string> Label(const Json& object, std::string_view key) {
  return MetaMapValue(object, "labels", key);
}

std::string NodeName(const Json& pod) {
  if (!pod.is_object()) return "";
  auto s = pod.find("spec");
  if (s == pod.end() || !s->is_object()) return "";
  auto n = s->find("nodeName");
  if (n == s->end() || !n->is_string()) return "";
  return n->get<std::string>();
}

Json ObjectReference::ToJson() const {
  Json j = Json::object();
  if (!kind.empty()) j["kind"] = kind;
  if (!api_version.empty()) j["apiVersion"] = api_version;
  if (!ns.empty()) j["namespace"] = ns;
  if (!name.empty()) j["name"] = name;
  if (!uid.empty()) j["uid"] = uid;
  if (!resource_version.empty()) j["resourceVersion"] = resource_version;
  return j;
}

ObjectReference ReferenceTo(const Json& object, const ResourceType& type) {
  ObjectReference r;
  r.kind = type.kind;
  r.api_version = type.ApiVersion();
  r.ns = Namespace(object);
  r.name = Name(object);
  r.uid = Uid(object);
  r.resource_version = ResourceVersion(object);
  return r;
}

std::string FormatTime(std::chrono::system_clock::time_point t, TimeFormat format) {
  using namespace std::chrono;
  auto us = duration_cast<microseconds>(t.time_since_epoch()).count();
  int64_t secs = us / 1000000;
  int64_t frac = us % 1000000;
  if (frac < 0) {
    frac += 1000000;
    --secs;
  }
  std::time_t tt = static_cast<std::time_t>(secs);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[96];
  if (format == TimeFormat::kMicro) {
    std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                  tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(frac));
  } else {
    std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                  tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
  }
  return buf;
}

absl::StatusOr<std::chrono::system_clock::time_point> ParseTime(std::string_view text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        StrCat("'", text, "' is not an RFC 3339 time (expected e.g. 2024-01-01T00:00:00Z)"));
  };
  // YYYY-MM-DDTHH:MM:SS
  if (text.size() < 20 || text[4] != '-' || text[7] != '-' || (text[10] != 'T' && text[10] != 't') ||
      text[13] != ':' || text[16] != ':') {
    return bad();
  }
  int year, mon, day, hour, min, sec;
  if (!ParseInt(text.substr(0, 4), &year) || !ParseInt(text.substr(5, 2), &mon) ||
      !ParseInt(text.substr(8, 2), &day) || !ParseInt(text.substr(11, 2), &hour) ||
      !ParseInt(text.substr(14, 2), &min) || !ParseInt(text.substr(17, 2), &sec)) {
    return bad();
  }
  if (mon < 1 || mon > 12 || day < 1 || day > 31 || hour > 23 || min > 59 || sec > 60) return bad();
  // A system_clock time point counts nanoseconds in 64 bits: 1677-09-21 to 2262-04-11. Outside those years the
  // conversion below would overflow (a forged annotation such as 0001-01-01T00:00:00Z).
  if (year < 1678 || year > 2261) {
    return absl::InvalidArgumentError(
        StrCat("'", text, "': the year is outside 1678-2261, which a timestamp here can hold"));
  }
  size_t i = 19;
  int64_t micros = 0;
  if (i < text.size() && text[i] == '.') {
    ++i;
    int digits = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      if (digits < 6) micros = micros * 10 + (text[i] - '0');
      ++digits;
      ++i;
    }
    if (digits == 0) return bad();
    for (int d = digits; d < 6; ++d) micros *= 10;
  }
  int64_t offset_seconds = 0;
  if (i < text.size() && (text[i] == 'Z' || text[i] == 'z')) {
    ++i;
  } else if (i + 6 == text.size() && (text[i] == '+' || text[i] == '-') && text[i + 3] == ':') {
    int oh, om;
    if (!ParseInt(text.substr(i + 1, 2), &oh) || !ParseInt(text.substr(i + 4, 2), &om)) return bad();
    offset_seconds = (oh * 3600 + om * 60) * (text[i] == '+' ? 1 : -1);
    i += 6;
  } else {
    return bad();
  }
  if (i != text.size()) return bad();
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = mon - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = min;
  tm.tm_sec = sec;
  int64_t secs = static_cast<int64_t>(timegm(&tm)) - offset_seconds;
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::seconds(secs) +
                                                                      std::chrono::microseconds(micros)));
}

std::string UrlEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
        c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

}  // namespace tessera::k8s
