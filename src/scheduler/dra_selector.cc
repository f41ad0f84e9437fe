#include "scheduler/dra_selector.h"

#include <cctype>
#include <optional>

#include "core/strings.h"

namespace tessera::scheduler::dra {

// The Kubernetes API caps a selector's expression at 10 Ki characters (resource.k8s.io/v1
// CELSelectorExpressionMaxLength); nesting is capped here so that a hostile expression cannot exhaust the
// stack.
constexpr size_t kMaxExpressionLength = 10 * 1024;
constexpr int kMaxDepth = 32;
constexpr int kMaxOperators = 256;

struct Selector::Node {
  enum class Op { kLiteral, kDriver, kAttribute, kNot, kAnd, kOr, kEq, kNe, kLt, kLe, kGt, kGe };
  Op op = Op::kLiteral;
  AttributeValue literal;  // kLiteral
  std::string attribute;   // kAttribute: "DOMAIN/NAME"
  std::shared_ptr<const Node> a, b;
};

namespace {

using Node = Selector::Node;
using Op = Node::Op;

// A value during evaluation: an attribute value, or an error (CEL's runtime error).
struct Value {
  bool error = false;
  AttributeValue v;
};

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  absl::StatusOr<std::shared_ptr<const Node>> Parse() {
    std::shared_ptr<const Node> n = Or(0);
    if (!error_.empty()) return absl::InvalidArgumentError(error_);
    Skip();
    if (pos_ != text_.size()) return Fail("an operator or the end");
    return n;
  }

 private:
  absl::Status Fail(std::string_view expected) {
    if (error_.empty()) {
      error_ =
          StrCat("expected ", expected, " at character ", pos_ + 1, " (\"", text_.substr(pos_, 20),
                 "\"); tessera-scheduler reads device.driver, device.attributes[\"DOMAIN\"].NAME, literals, ",
                 "comparisons, && || ! and parentheses");
    }
    return absl::InvalidArgumentError(error_);
  }
  void Skip() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Eat(std::string_view token) {
    Skip();
    if (text_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    return true;
  }
  std::shared_ptr<const Node> Make(Op op, std::shared_ptr<const Node> a, std::shared_ptr<const Node> b) {
    // A chain of && or || is a tree as deep as it is long: capped, so that evaluating it stays shallow.
    if (++operators_ > kMaxOperators) (void)Fail("fewer operators");
    auto n = std::make_shared<Node>();
    n->op = op;
    n->a = std::move(a);
    n->b = std::move(b);
    return n;
  }

  std::shared_ptr<const Node> Or(int depth) {
    std::shared_ptr<const Node> n = And(depth);
    while (error_.empty() && Eat("||")) n = Make(Op::kOr, n, And(depth));
    return n;
  }
  std::shared_ptr<const Node> And(int depth) {
    std::shared_ptr<const Node> n = Unary(depth);
    while (error_.empty() && Eat("&&")) n = Make(Op::kAnd, n, Unary(depth));
    return n;
  }
  std::shared_ptr<const Node> Unary(int depth) {
    if (depth > kMaxDepth) {
      (void)Fail("less nesting");
      return nullptr;
    }
    Skip();
    if (pos_ < text_.size() && text_[pos_] == '!' && text_.substr(pos_, 2) != "!=") {
      ++pos_;
      return Make(Op::kNot, Unary(depth + 1), nullptr);
    }
    std::shared_ptr<const Node> left = Term(depth);
    static constexpr std::pair<std::string_view, Op> kComparisons[] = {
        {"==", Op::kEq}, {"!=", Op::kNe}, {"<=", Op::kLe}, {">=", Op::kGe}, {"<", Op::kLt}, {">", Op::kGt}};
    for (const auto& [token, op] : kComparisons) {
      if (error_.empty() && Eat(token)) return Make(op, left, Term(depth));
    }
    return left;
  }
  std::shared_ptr<const Node> Term(int depth) {
    Skip();
    if (!error_.empty()) return nullptr;
    if (Eat("(")) {
      std::shared_ptr<const Node> n = Or(depth + 1);
      if (error_.empty() && !Eat(")")) (void)Fail("\")\"");
      return n;
    }
    auto n = std::make_shared<Node>();
    if (std::optional<std::string> s = String()) {
      n->literal = AttributeValue::String(*std::move(s));
      return n;
    }
    if (!error_.empty()) return nullptr;  // a string not closed
    if (pos_ < text_.size() &&
        (std::isdigit(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '-')) {
      size_t end = pos_ + 1;
      while (end < text_.size() && std::isdigit(static_cast<unsigned char>(text_[end]))) ++end;
      int64_t value = 0;
      if (!ParseInt(text_.substr(pos_, end - pos_), &value)) {
        (void)Fail("an integer");
        return nullptr;
      }
      pos_ = end;
      n->literal = AttributeValue::Int(value);
      return n;
    }
    const std::string word = Identifier();
    if (word == "true" || word == "false") {
      n->literal = AttributeValue::Bool(word == "true");
      return n;
    }
    if (word != "device" || !Eat(".")) {
      (void)Fail("a literal, device.driver or device.attributes");
      return nullptr;
    }
    const std::string field = Identifier();
    if (field == "driver") {
      n->op = Op::kDriver;
      return n;
    }
    if (field != "attributes" || !Eat("[")) {
      (void)Fail("driver or attributes[\"DOMAIN\"] after device.");
      return nullptr;
    }
    Skip();
    std::optional<std::string> domain = String();
    if (!domain || !Eat("]")) {
      (void)Fail("a quoted domain and \"]\"");
      return nullptr;
    }
    std::string name;
    if (Eat(".")) {
      name = Identifier();
    } else if (Eat("[")) {
      Skip();
      std::optional<std::string> quoted = String();
      if (!quoted || !Eat("]")) {
        (void)Fail("a quoted attribute name and \"]\"");
        return nullptr;
      }
      name = *quoted;
    }
    if (name.empty()) {
      (void)Fail("an attribute name");
      return nullptr;
    }
    // A function called on the attribute (.compareTo, .isGreaterThan, ...) is outside the subset.
    Skip();
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == '(')) {
      (void)Fail("an operator (functions are not evaluated here)");
      return nullptr;
    }
    n->op = Op::kAttribute;
    n->attribute = StrCat(*domain, "/", name);
    return n;
  }
  std::string Identifier() {
    Skip();
    size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) {
      ++pos_;
    }
    return std::string(text_.substr(start, pos_ - start));
  }
  // A quoted string at pos_. Nothing, and no error, when no quote is there (the end of the text included):
  // the caller says what it expected.
  std::optional<std::string> String() {
    if (pos_ >= text_.size() || (text_[pos_] != '"' && text_[pos_] != '\'')) return std::nullopt;
    const char quote = text_[pos_];
    std::string out;
    for (size_t i = pos_ + 1; i < text_.size(); ++i) {
      char ch = text_[i];
      if (ch == quote) {
        pos_ = i + 1;
        return out;
      }
      if (ch == '\\') {
        // Only the escapes a name or model needs; others (\u, \x, octal) are outside the subset.
        if (i + 1 >= text_.size() || (text_[i + 1] != '\\' && text_[i + 1] != '"' && text_[i + 1] != '\''))
          break;
        ch = text_[++i];
      }
      out.push_back(ch);
    }
    (void)Fail("a closed string with only \\\\, \\\" or \\' escapes");
    return std::nullopt;
  }

  std::string_view text_;
  size_t pos_ = 0;
  int operators_ = 0;
  std::string error_;
};

Value Eval(const Node& n, const DeviceView& d) {
  auto error = [] { return Value{true, {}}; };
  auto boolean = [](bool b) { return Value{false, AttributeValue::Bool(b)}; };
  auto is_bool = [](const Value& v) { return !v.error && v.v.kind == AttributeValue::Kind::kBool; };
  switch (n.op) {
    case Op::kLiteral:
      return Value{false, n.literal};
    case Op::kDriver:
      return Value{false, AttributeValue::String(d.driver)};
    case Op::kAttribute: {
      if (d.attributes == nullptr) return error();
      auto it = d.attributes->find(n.attribute);
      if (it == d.attributes->end()) return error();  // CEL: no such key
      return Value{false, it->second};
    }
    case Op::kNot: {
      Value a = Eval(*n.a, d);
      return is_bool(a) ? boolean(!a.v.b) : error();
    }
    case Op::kAnd:
    case Op::kOr: {
      // CEL's commutative logic: a decided side wins over an error on the other.
      const bool decisive = n.op == Op::kOr;
      Value a = Eval(*n.a, d), b = Eval(*n.b, d);
      if ((is_bool(a) && a.v.b == decisive) || (is_bool(b) && b.v.b == decisive)) return boolean(decisive);
      if (!is_bool(a) || !is_bool(b)) return error();
      return boolean(!decisive);
    }
    default: {
      Value a = Eval(*n.a, d), b = Eval(*n.b, d);
      // No overload between types (and versions are compared only through semver functions).
      if (a.error || b.error || a.v.kind != b.v.kind || a.v.kind == AttributeValue::Kind::kVersion) {
        return error();
      }
      int cmp = 0;
      switch (a.v.kind) {
        case AttributeValue::Kind::kInt:
          cmp = a.v.i < b.v.i ? -1 : a.v.i > b.v.i ? 1 : 0;
          break;
        case AttributeValue::Kind::kBool:
          cmp = a.v.b == b.v.b ? 0 : a.v.b ? 1 : -1;
          break;
        default:
          cmp = a.v.s.compare(b.v.s);
          cmp = cmp < 0 ? -1 : cmp > 0 ? 1 : 0;
      }
      switch (n.op) {
        case Op::kEq:
          return boolean(cmp == 0);
        case Op::kNe:
          return boolean(cmp != 0);
        case Op::kLt:
          return boolean(cmp < 0);
        case Op::kLe:
          return boolean(cmp <= 0);
        case Op::kGt:
          return boolean(cmp > 0);
        default:
          return boolean(cmp >= 0);
      }
    }
  }
}

}  // namespace

absl::StatusOr<Selector> Selector::Compile(std::string_view expression) {
  if (expression.size() > kMaxExpressionLength) {
    return absl::InvalidArgumentError(StrCat("the expression is ", expression.size(),
                                             " characters; the API allows ", kMaxExpressionLength));
  }
  Parser parser(expression);
  absl::StatusOr<std::shared_ptr<const Node>> root = parser.Parse();
  if (!root.ok()) return root.status();
  Selector s;
  s.root_ = *std::move(root);
  return s;
}

Verdict Selector::Evaluate(const DeviceView& device) const {
  Value v = Eval(*root_, device);
  if (v.error || v.v.kind != AttributeValue::Kind::kBool) return Verdict::kError;
  return v.v.b ? Verdict::kMatch : Verdict::kNoMatch;
}

}  // namespace tessera::scheduler::dra
