#include "ir/extent_expr.h"

#include <algorithm>
#include <cctype>

#include "ir/fusion.h"
#include "support/error.h"

namespace mf {
namespace {

using Bindings = std::unordered_map<std::string, int64_t>;

bool isName(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
}

bool isNumber(const std::string& s) {
  auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  return !s.empty() && std::all_of(s.begin(), s.end(), digit);
}

// Recursive descent over the grammar of extent_expr.h. A failed lookup makes the result nullopt.
class Evaluator {
 public:
  Evaluator(const Fusion& f, const Bindings& b, const std::string& text, int depth)
      : f_(f), b_(b), s_(text), depth_(depth) {}

  std::optional<int64_t> run() {
    std::optional<int64_t> v = sum();
    if (pos_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void skip() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
  }
  bool eat(char c) {
    skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  std::optional<int64_t> sum() {
    std::optional<int64_t> v = product();
    while (v) {
      if (eat('+')) {
        auto r = product();
        v = r ? std::optional<int64_t>(*v + *r) : std::nullopt;
      } else if (eat('-')) {
        auto r = product();
        v = r ? std::optional<int64_t>(*v - *r) : std::nullopt;
      } else {
        break;
      }
    }
    return v;
  }

  std::optional<int64_t> product() {
    std::optional<int64_t> v = atom();
    while (v) {
      if (eat('*')) {
        auto r = atom();
        v = r ? std::optional<int64_t>(*v * *r) : std::nullopt;
      } else if (eat('/')) {
        auto r = atom();
        v = r && *r != 0 ? std::optional<int64_t>(*v / *r) : std::nullopt;
      } else {
        break;
      }
    }
    return v;
  }

  std::optional<int64_t> atom() {
    skip();
    if (pos_ >= s_.size()) return std::nullopt;
    if (eat('(')) {
      auto v = sum();
      return eat(')') ? v : std::nullopt;
    }
    size_t start = pos_;
    if (std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      return std::stoll(s_.substr(start, pos_ - start));
    }
    while (pos_ < s_.size() && std::isalnum(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    std::string name = s_.substr(start, pos_ - start);
    if (name.empty()) return std::nullopt;
    if (eat('(')) {
      auto a = sum();
      if (!eat(',')) return std::nullopt;
      auto b = sum();
      if (!eat(')') || !a || !b) return std::nullopt;
      if (name == "ceilDiv") return *b > 0 ? std::optional<int64_t>((*a + *b - 1) / *b) : std::nullopt;
      if (name == "min") return std::min(*a, *b);
      if (name == "max") return std::max(*a, *b);
      if (name == "sliceIndex") return std::clamp<int64_t>(*a < 0 ? *a + *b : *a, 0, *b);
      return std::nullopt;
    }
    Extent e;
    e.symbol = name;
    return lookup(f_, e, b_, depth_ + 1);
  }

 public:
  static std::optional<int64_t> lookup(const Fusion& f, const Extent& e, const Bindings& b, int depth) {
    if (e.isConst()) return e.value;
    if (depth > 64) return std::nullopt;  // a cycle through unified symbols
    auto it = b.find(e.symbol);
    if (it != b.end()) return it->second;
    std::string canonical = f.canonicalSymbol(e.symbol);
    it = b.find(canonical);
    if (it != b.end()) return it->second;
    if (e.symbol.empty() || !isName(e.symbol)) {
      auto v = Evaluator(f, b, e.symbol, depth).run();
      if (v) return v;
    }
    if (canonical != e.symbol) return Evaluator(f, b, canonical, depth).run();
    return std::nullopt;
  }

 private:
  const Fusion& f_;
  const Bindings& b_;
  std::string s_;
  size_t pos_ = 0;
  int depth_;
};

// Splits `s` at top-level occurrences of any char in `seps` (outside parentheses).
std::vector<std::string> splitTop(const std::string& s, const std::string& seps, std::string* found = nullptr) {
  std::vector<std::string> parts;
  int depth = 0;
  std::string cur;
  for (char c : s) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && seps.find(c) != std::string::npos) {
      parts.push_back(cur);
      if (found) *found += c;
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

// Operand text for a bigger expression: parenthesized unless it is a single name or number.
std::string operand(const Extent& e) {
  if (e.isConst()) return std::to_string(e.value);
  return isName(e.symbol) ? e.symbol : "(" + e.symbol + ")";
}

Extent symbolic(std::string text) {
  Extent e;
  e.symbol = std::move(text);
  return e;
}

}  // namespace

std::optional<int64_t> evaluateExtent(const Fusion& f, const Extent& extent, const Bindings& bindings) {
  return Evaluator::lookup(f, extent, bindings, 0);
}

Extent extentConst(int64_t v) {
  MF_CHECK(v >= 0, "a constant extent must be non-negative; got ", v);
  return Extent{v, ""};
}

Extent extentAdd(const Extent& a, const Extent& b) {
  if (a.isConst() && b.isConst()) return extentConst(a.value + b.value);
  if (b.isConst() && b.value == 0) return a;
  if (a.isConst() && a.value == 0) return b;
  if (a.isConst()) return symbolic(operand(b) + "+" + operand(a));  // "s0+4": symbolic text first
  return symbolic(operand(a) + "+" + operand(b));
}

Extent extentSub(const Extent& a, const Extent& b) {
  if (a.isConst() && b.isConst()) return extentConst(std::max<int64_t>(a.value - b.value, 0));
  if (b.isConst() && b.value == 0) return a;
  if (a == b) return extentConst(0);
  return symbolic(operand(a) + "-" + operand(b));
}

Extent extentMul(const Extent& a, const Extent& b) {
  if (a.isConst() && b.isConst()) return extentConst(a.value * b.value);
  if (b.isConst() && b.value == 1) return a;
  if (a.isConst() && a.value == 1) return b;
  return symbolic(operand(a) + "*" + operand(b));
}

Extent extentCeilDiv(const Extent& a, int64_t b) {
  MF_CHECK(b > 0, "ceilDiv by ", b);
  if (a.isConst()) return extentConst((a.value + b - 1) / b);
  if (b == 1) return a;
  return symbolic("ceilDiv(" + a.symbol + ", " + std::to_string(b) + ")");
}

Extent extentMin(const Extent& a, const Extent& b) {
  if (a.isConst() && b.isConst()) return extentConst(std::min(a.value, b.value));
  if (a == b) return a;
  return symbolic("min(" + operand(a) + ", " + operand(b) + ")");
}

Extent extentMax(const Extent& a, const Extent& b) {
  if (a.isConst() && b.isConst()) return extentConst(std::max(a.value, b.value));
  if (a == b) return a;
  return symbolic("max(" + operand(a) + ", " + operand(b) + ")");
}

Extent extentSliceIndex(const Extent& index, const Extent& extent) {
  return symbolic("sliceIndex(" + operand(index) + ", " + operand(extent) + ")");
}

bool ExtentFactors::divides(const ExtentFactors& o) const {
  if (constant == 0 || o.constant % constant != 0) return false;
  std::vector<std::string> rest = o.atoms;
  for (const std::string& a : atoms) {
    auto it = std::find(rest.begin(), rest.end(), a);
    if (it == rest.end()) return false;
    rest.erase(it);
  }
  return true;
}

namespace {

// The factors of `text`; with `whole_canonical`, a text that was unified as a whole with another
// ("s3*s4=s0*s1") is read as its representative first.
ExtentFactors factorsOfText(const Fusion& f, const std::string& symbol, bool whole_canonical) {
  ExtentFactors r;
  std::string text = whole_canonical ? f.canonicalSymbol(symbol) : symbol;
  std::string ops;
  std::vector<std::string> sums = splitTop(text, "+-", &ops);
  std::vector<std::string> parts = sums.size() == 1 ? splitTop(text, "*/", &ops) : std::vector<std::string>{text};
  if (ops.find('/') != std::string::npos) parts = {text};  // a quotient is one atom
  for (std::string p : parts) {
    // "(s0)" is s0; "(s0+4)" stays one atom.
    while (p.size() > 2 && p.front() == '(' && p.back() == ')' &&
           splitTop(p.substr(1, p.size() - 2), "+-*/").size() == 1) {
      p = p.substr(1, p.size() - 2);
    }
    // "(s0*s1)" (a merge inside a larger product, or the quotient a reshape's -1 left) is the
    // product s0 * s1, so that it divides and equals what the same symbols make elsewhere.
    bool one_group = p.size() > 2 && p.front() == '(' && p.back() == ')' && splitTop(p, "+-*/").size() == 1;
    std::string inside = one_group ? p.substr(1, p.size() - 2) : "", inner_ops;
    bool product_inside = one_group && splitTop(inside, "+-").size() == 1 &&
                          splitTop(inside, "*/", &inner_ops).size() > 1 && inner_ops.find('/') == std::string::npos;
    if (product_inside) {
      ExtentFactors inner = factorsOfText(f, inside, whole_canonical);
      r.constant *= inner.constant;
      r.atoms.insert(r.atoms.end(), inner.atoms.begin(), inner.atoms.end());
    } else if (isNumber(p)) {
      r.constant *= std::stoll(p);
    } else {
      r.atoms.push_back(f.canonicalSymbol(p));
    }
  }
  std::sort(r.atoms.begin(), r.atoms.end());
  return r;
}

}  // namespace

ExtentFactors factorsOf(const Fusion& f, const Extent& extent) {
  if (extent.isConst()) return ExtentFactors{extent.value, {}};
  return factorsOfText(f, extent.symbol, /*whole_canonical=*/true);
}

ExtentFactors factorsAsWritten(const Fusion& f, const Extent& extent) {
  if (extent.isConst()) return ExtentFactors{extent.value, {}};
  return factorsOfText(f, extent.symbol, /*whole_canonical=*/false);
}

Extent extentQuotient(const Fusion& f, const Extent& total, const Extent& part) {
  if (total.isConst() && part.isConst() && part.value != 0 && total.value % part.value == 0) {
    return extentConst(total.value / part.value);
  }
  ExtentFactors t = factorsOf(f, total), p = factorsOf(f, part);
  if (!p.divides(t)) return symbolic(operand(total) + "/" + operand(part));
  Extent r = extentConst(t.constant / p.constant);
  std::vector<std::string> rest = t.atoms;
  for (const std::string& a : p.atoms) rest.erase(std::find(rest.begin(), rest.end(), a));
  for (const std::string& a : rest) r = extentMul(r, symbolic(a));
  return r;
}

}  // namespace mf
