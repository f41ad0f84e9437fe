#include "formats/bounded_json.h"

#include "core/strings.h"

namespace tessera::formats {

bool BoundedDomBuilder::parse_error(std::size_t position, const std::string& token,
                                    const nlohmann::detail::exception& e) {
  if (error_.empty()) error_ = e.what();
  return dom_.parse_error(position, token, e);
}

std::string DumpJson(const nlohmann::json& v, int indent) {
  return v.dump(indent, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

namespace {

// The parser's message quotes the input it stopped at: keep it printable ASCII.
std::string Printable(std::string_view text) {
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    out.push_back(u >= 0x20 && u < 0x7f ? c : '?');
  }
  return out;
}

}  // namespace

absl::Status BoundedJsonError(const BoundedDomBuilder& builder, std::string_view what) {
  if (builder.too_deep()) {
    return absl::InvalidArgumentError(StrCat(what, " is nested deeper than ", builder.max_depth(),
                                             " levels of objects and arrays; no valid document is"));
  }
  if (builder.too_big()) {
    return absl::InvalidArgumentError(
        StrCat(what, " would take more than ", builder.max_bytes() >> 20,
               " MiB parsed: too many values for its size (at most about 6 bytes of memory per byte sent)"));
  }
  if (builder.error().find("number overflow") != std::string::npos) {
    return absl::InvalidArgumentError(
        StrCat(what, " holds a number outside the range of a double: ", Printable(builder.error())));
  }
  if (!builder.error().empty()) {
    return absl::InvalidArgumentError(StrCat(what, " is not valid JSON: ", Printable(builder.error())));
  }
  return absl::InvalidArgumentError(StrCat(what, " is not valid JSON"));
}

std::optional<int64_t> JsonIntIn(const nlohmann::json& v, int64_t min, int64_t max) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (max < 0 || u > static_cast<uint64_t>(max)) return std::nullopt;
    const auto i = static_cast<int64_t>(u);
    if (i < min) return std::nullopt;
    return i;
  }
  if (!v.is_number_integer()) return std::nullopt;
  const int64_t i = v.get<int64_t>();
  if (i < min || i > max) return std::nullopt;
  return i;
}

absl::StatusOr<nlohmann::json> ParseBoundedJson(std::string_view text, std::string_view what, int max_depth,
                                                size_t max_bytes) {
  nlohmann::json root;
  BoundedDomBuilder builder(root, max_depth, max_bytes);
  const bool ok = nlohmann::json::sax_parse(text.begin(), text.end(), &builder,
                                            nlohmann::detail::input_format_t::json, /*strict=*/true,
                                            /*ignore_comments=*/false);
  if (!ok || builder.too_deep() || builder.too_big() || !builder.error().empty() || root.is_discarded()) {
    return BoundedJsonError(builder, what);
  }
  return root;
}

}  // namespace tessera::formats
