#include "selectors.h"

#include "core/strings.h"

namespace tessera::fake {

namespace {

// Splits at commas that are not inside parentheses.
std::vector<std::string_view> SplitTopLevel(std::string_view text) {
  std::vector<std::string_view> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '(') ++depth;
    if (text[i] == ')') --depth;
    if (text[i] == ',' && depth == 0) {
      out.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(text.substr(start));
  return out;
}

bool ValidKey(std::string_view k) {
  if (k.empty() || k.size() > 317) return false;
  for (char c : k) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
              c == '_' || c == '.' || c == '/';
    if (!ok) return false;
  }
  return true;
}

// A label value: empty, or at most 63 characters of [A-Za-z0-9_.-] starting and ending with a letter or
// digit.
bool ValidValue(std::string_view v) {
  if (v.empty()) return true;
  if (v.size() > 63) return false;
  auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  if (!alnum(v.front()) || !alnum(v.back())) return false;
  for (char c : v) {
    if (!alnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<LabelSelector> LabelSelector::Parse(std::string_view text) {
  LabelSelector sel;
  if (StripWhitespace(text).empty()) return sel;
  for (std::string_view part : SplitTopLevel(text)) {
    std::string_view p = StripWhitespace(part);
    if (p.empty())
      return absl::InvalidArgumentError(
          StrCat("unable to parse requirement: empty requirement in '", text, "'"));
    Requirement r;
    size_t neq = p.find("!=");
    size_t eq = p.find('=');
    size_t in = p.find(" in ");
    size_t notin = p.find(" notin ");
    auto values = [&](size_t at) -> absl::Status {
      std::string_view rest = StripWhitespace(p.substr(at));
      if (rest.size() < 2 || rest.front() != '(' || rest.back() != ')') {
        return absl::InvalidArgumentError(
            StrCat("unable to parse requirement: '", p, "': expected (v1,v2,...)"));
      }
      for (std::string_view v : StrSplit(rest.substr(1, rest.size() - 2), ',')) {
        r.values.push_back(std::string(StripWhitespace(v)));
      }
      return absl::OkStatus();
    };
    if (notin != std::string_view::npos) {
      r.key = std::string(StripWhitespace(p.substr(0, notin)));
      r.op = Op::kNotIn;
      if (absl::Status s = values(notin + 7); !s.ok()) return s;
    } else if (in != std::string_view::npos) {
      r.key = std::string(StripWhitespace(p.substr(0, in)));
      r.op = Op::kIn;
      if (absl::Status s = values(in + 4); !s.ok()) return s;
    } else if (neq != std::string_view::npos) {
      r.key = std::string(StripWhitespace(p.substr(0, neq)));
      r.op = Op::kNotEquals;
      r.values.push_back(std::string(StripWhitespace(p.substr(neq + 2))));
    } else if (eq != std::string_view::npos) {
      r.key = std::string(StripWhitespace(p.substr(0, eq)));
      size_t vstart = eq + 1;
      if (vstart < p.size() && p[vstart] == '=') ++vstart;
      r.op = Op::kEquals;
      r.values.push_back(std::string(StripWhitespace(p.substr(vstart))));
    } else if (p.front() == '!') {
      r.key = std::string(StripWhitespace(p.substr(1)));
      r.op = Op::kNotExists;
    } else {
      r.key = std::string(p);
      r.op = Op::kExists;
    }
    if (!ValidKey(r.key)) {
      return absl::InvalidArgumentError(
          StrCat("unable to parse requirement: invalid label key \"", r.key, "\""));
    }
    for (const std::string& v : r.values) {
      if (!ValidValue(v)) {
        return absl::InvalidArgumentError(StrCat("unable to parse requirement: invalid label value \"", v,
                                                 "\": at most 63 characters of letters, digits, '-', '_' and "
                                                 "'.', starting and ending with a letter or "
                                                 "digit"));
      }
    }
    sel.requirements_.push_back(std::move(r));
  }
  return sel;
}

bool LabelSelector::Matches(const nlohmann::json& labels) const {
  for (const Requirement& r : requirements_) {
    const std::string* value = nullptr;
    if (labels.is_object()) {
      auto it = labels.find(r.key);
      if (it != labels.end() && it->is_string()) value = &it->get_ref<const std::string&>();
    }
    switch (r.op) {
      case Op::kEquals:
        if (value == nullptr || *value != r.values[0]) return false;
        break;
      case Op::kNotEquals:
        if (value != nullptr && *value == r.values[0]) return false;
        break;
      case Op::kIn: {
        if (value == nullptr) return false;
        bool found = false;
        for (const std::string& v : r.values) found = found || v == *value;
        if (!found) return false;
        break;
      }
      case Op::kNotIn:
        if (value != nullptr) {
          for (const std::string& v : r.values) {
            if (v == *value) return false;
          }
        }
        break;
      case Op::kExists:
        if (value == nullptr) return false;
        break;
      case Op::kNotExists:
        if (value != nullptr) return false;
        break;
    }
  }
  return true;
}

absl::StatusOr<FieldSelector> FieldSelector::Parse(std::string_view text) {
  FieldSelector sel;
  if (StripWhitespace(text).empty()) return sel;
  for (std::string_view part : StrSplit(text, ',')) {
    std::string_view p = StripWhitespace(part);
    Requirement r;
    size_t neq = p.find("!=");
    size_t eq = p.find('=');
    if (neq != std::string_view::npos) {
      r.field = std::string(p.substr(0, neq));
      r.equals = false;
      r.value = std::string(p.substr(neq + 2));
    } else if (eq != std::string_view::npos) {
      r.field = std::string(p.substr(0, eq));
      size_t vstart = eq + 1;
      if (vstart < p.size() && p[vstart] == '=') ++vstart;
      r.equals = true;
      r.value = std::string(p.substr(vstart));
    } else {
      return absl::InvalidArgumentError(StrCat(
          "invalid selector: '", p, "'; a field selector is field=value, field==value or field!=value"));
    }
    if (r.field.empty()) return absl::InvalidArgumentError(StrCat("invalid selector: '", p, "': no field"));
    sel.requirements_.push_back(std::move(r));
  }
  return sel;
}

std::string FieldSelector::FieldValue(const nlohmann::json& object, std::string_view field) {
  const nlohmann::json* cur = &object;
  for (std::string_view part : StrSplit(field, '.')) {
    if (!cur->is_object()) return "";
    auto it = cur->find(std::string(part));
    if (it == cur->end()) return "";
    cur = &*it;
  }
  if (cur->is_string()) return cur->get<std::string>();
  if (cur->is_boolean()) return cur->get<bool>() ? "true" : "false";
  if (cur->is_number()) return cur->dump();
  return "";
}

bool FieldSelector::Matches(const nlohmann::json& object) const {
  for (const Requirement& r : requirements_) {
    bool same = FieldValue(object, r.field) == r.value;
    if (same != r.equals) return false;
  }
  return true;
}

std::vector<std::string> FieldSelector::Fields() const {
  std::vector<std::string> out;
  for (const Requirement& r : requirements_) out.push_back(r.field);
  return out;
}

std::optional<std::string> FieldSelector::EqualityValue(std::string_view field) const {
  for (const Requirement& r : requirements_) {
    if (r.equals && r.field == field) return r.value;
  }
  return std::nullopt;
}

}  // namespace tessera::fake
