#include "ir/attributes.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "support/error.h"
#include "support/text.h"

namespace mf {

AttrType typeOf(const AttrValue& v) { return static_cast<AttrType>(v.index()); }

const char* toString(AttrType t) {
  switch (t) {
    case AttrType::Int: return "int";
    case AttrType::Bool: return "bool";
    case AttrType::Float: return "float";
    case AttrType::OptionalFloat: return "float or none";
    case AttrType::Dtype: return "dtype";
    case AttrType::Ints: return "int list";
    case AttrType::Name: return "name";
  }
  MF_THROW_INTERNAL("bad AttrType");
}

namespace {
template <typename Pred>
bool eachInt(const AttrValue& v, Pred pred) {
  if (const auto* i = std::get_if<int64_t>(&v)) return pred(*i);
  if (const auto* list = std::get_if<Ints>(&v)) {
    for (int64_t x : *list) {
      if (!pred(x)) return false;
    }
    return true;
  }
  return false;
}
}  // namespace

bool nonNegative(const AttrValue& v) { return eachInt(v, [](int64_t x) { return x >= 0; }); }
bool positive(const AttrValue& v) { return eachInt(v, [](int64_t x) { return x >= 1; }); }
bool extentOrSymbolic(const AttrValue& v) { return eachInt(v, [](int64_t x) { return x >= -1; }); }
bool atMostOneEntry(const AttrValue& v) { return std::get<Ints>(v).size() <= 1; }
bool probability(const AttrValue& v) {
  double p = std::get<double>(v);
  return p >= 0.0 && p < 1.0;
}
bool finiteOrNone(const AttrValue& v) {
  const auto& s = std::get<OptionalFloat>(v);
  return !s || std::isfinite(*s);
}
bool floatingDtype(const AttrValue& v) { return isFloatingPoint(std::get<DataType>(v)); }
bool meshAxisName(const AttrValue& v) {
  for (ParallelType pt : kDeviceParallelTypes) {
    if (std::get<std::string>(v) == toString(pt)) return true;
  }
  return false;
}

const AttrValue* Attributes::find(const std::string& name) const {
  for (const auto& [n, v] : items_) {
    if (n == name) return &v;
  }
  return nullptr;
}

void Attributes::set(const std::string& name, AttrValue value) {
  for (auto& [n, v] : items_) {
    if (n == name) {
      v = std::move(value);
      return;
    }
  }
  items_.emplace_back(name, std::move(value));
}

const AttrValue& Attributes::value(const std::string& name) const {
  const AttrValue* v = find(name);
  MF_CHECK(v != nullptr, "no attribute '", name, "' on this expr");
  return *v;
}

void Attributes::typeMismatch(const std::string& name) const {
  MF_THROW_INTERNAL("attribute '", name, "' is a ", toString(typeOf(value(name))), ", read as another type");
}

Attributes completeAttributes(const char* op, const std::vector<AttrDef>& defs, const Attributes& given) {
  for (const auto& [name, value] : given.items()) {
    bool declared = false;
    for (const AttrDef& d : defs) declared |= name == d.name;
    if (declared) continue;
    std::vector<std::string> names;
    for (const AttrDef& d : defs) names.push_back(d.name);
    MF_USER_ARG_CHECK(false, op, ": unknown attribute '", name, "'; ", op, " takes ",
                      names.empty() ? std::string("no attributes") : listText(names));
  }
  Attributes out;
  for (const AttrDef& d : defs) {
    const bool has = given.has(d.name);
    MF_USER_ARG_CHECK(has || d.default_value, op, ": missing attribute '", d.name, "' (", toString(d.type), ")");
    AttrValue v = has ? given.value(d.name) : *d.default_value;
    // An int given for a float attribute is the float (dropout_p=0).
    if (d.type == AttrType::Float && typeOf(v) == AttrType::Int) v = static_cast<double>(std::get<int64_t>(v));
    if (d.type == AttrType::OptionalFloat && typeOf(v) == AttrType::Float) v = OptionalFloat(std::get<double>(v));
    MF_USER_ARG_CHECK(typeOf(v) == d.type, op, ": attribute '", d.name, "' must be a ", toString(d.type), "; got a ",
                      toString(typeOf(v)), " (", attrValueText(v), ")");
    MF_USER_ARG_CHECK(d.valid == nullptr || d.valid(v), op, ": attribute ", d.name, "=", attrValueText(v),
                      " is invalid; expected ", d.expected ? d.expected : "a valid value");
    out.set(d.name, std::move(v));
  }
  return out;
}

std::string attrValueText(const AttrValue& v) {
  switch (typeOf(v)) {
    case AttrType::Int: return std::to_string(std::get<int64_t>(v));
    case AttrType::Bool: return std::get<bool>(v) ? "true" : "false";
    case AttrType::Float: return numberText(std::get<double>(v));
    case AttrType::OptionalFloat: {
      const auto& s = std::get<OptionalFloat>(v);
      return s ? numberText(*s) : "none";
    }
    case AttrType::Dtype: return toString(std::get<DataType>(v));
    case AttrType::Ints: return listText(std::get<Ints>(v));
    case AttrType::Name: return std::get<std::string>(v);
  }
  MF_THROW_INTERNAL("bad attribute value");
}

namespace {
std::optional<double> number(const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == nullptr || *end != '\0') return std::nullopt;
  return v;
}

std::optional<int64_t> integer(const std::string& text) {
  std::optional<double> v = number(text);
  if (!v || *v != std::floor(*v) || text.find_first_of(".eE") != std::string::npos) return std::nullopt;
  return std::stoll(text);
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(' ');
  size_t e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
}  // namespace

std::optional<AttrValue> parseAttrValue(AttrType t, const std::string& raw) {
  const std::string text = trim(raw);
  switch (t) {
    case AttrType::Int: {
      if (auto i = integer(text)) return AttrValue(*i);
      return std::nullopt;
    }
    case AttrType::Bool:
      if (text == "true" || text == "false") return AttrValue(text == "true");
      return std::nullopt;
    case AttrType::Float: {
      if (auto d = number(text)) return AttrValue(*d);
      return std::nullopt;
    }
    case AttrType::OptionalFloat: {
      if (text == "none") return AttrValue(OptionalFloat());
      if (auto d = number(text)) return AttrValue(OptionalFloat(*d));
      return std::nullopt;
    }
    case AttrType::Dtype:
      for (DataType dt : {DataType::Float, DataType::Half, DataType::BFloat16, DataType::Double, DataType::Int,
                          DataType::Int32, DataType::Bool}) {
        if (text == toString(dt)) return AttrValue(dt);
      }
      return std::nullopt;
    case AttrType::Ints: {
      if (text.size() < 2 || text.front() != '[' || text.back() != ']') return std::nullopt;
      Ints list;
      std::istringstream in(text.substr(1, text.size() - 2));
      for (std::string item; std::getline(in, item, ',');) {
        item = trim(item);
        if (item.empty()) continue;
        std::optional<int64_t> i = integer(item);
        if (!i) return std::nullopt;
        list.push_back(*i);
      }
      return AttrValue(list);
    }
    case AttrType::Name: {
      const bool word = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      });
      if (word) return AttrValue(text);
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace mf
