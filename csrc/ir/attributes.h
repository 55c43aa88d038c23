// Typed op attributes. An op's registry entry declares its attributes (AttrDef: name, type,
// default, valid values); an Expr stores them by name (Attributes) and readers ask for them typed:
//   e->attr<Ints>("pad_widths"), e->attr<int64_t>("dim"), e->attr<DataType>("dtype").
// The printer and the parser write and read them from the declaration alone (`name=value`, in
// declaration order), and Fusion::newExpr completes and validates them, so a builder, the parser
// and the public C++ API (fd.op) all produce attributes that the declaration allows.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "ir/types.h"

namespace mf {

using Ints = std::vector<int64_t>;
using OptionalFloat = std::optional<double>;

// The kinds of attribute values; the order matches AttrValue's alternatives.
// Name: one of a few words (scatter_reduce's reduce=sum, an exchange's mesh_axis=DIDx).
enum class AttrType { Int, Bool, Float, OptionalFloat, Dtype, Ints, Name };
using AttrValue = std::variant<int64_t, bool, double, OptionalFloat, DataType, Ints, std::string>;

AttrType typeOf(const AttrValue& v);
const char* toString(AttrType t);  // "int", "bool", "float", "float or none", "dtype", "int list"

// The declaration of one attribute in an op's registry entry.
struct AttrDef {
  const char* name;
  AttrType type;
  // Taken when the attribute is not given; none: the attribute is required.
  std::optional<AttrValue> default_value;
  // Which values are valid (nullptr: every value of the type) and how an error says so.
  bool (*valid)(const AttrValue&) = nullptr;
  const char* expected = nullptr;  // "an integer >= 0"
  // Printed only when it differs from the default (an option most uses leave unset).
  bool omitted_when_default = false;
};

// Validity predicates for AttrDef::valid.
bool nonNegative(const AttrValue& v);          // Int >= 0, or every entry of Ints >= 0
bool positive(const AttrValue& v);             // Int >= 1, or every entry of Ints >= 1
bool extentOrSymbolic(const AttrValue& v);     // every entry of Ints >= -1 (-1: symbolic)
bool atMostOneEntry(const AttrValue& v);       // Ints of 0 or 1 entries
bool probability(const AttrValue& v);          // Float in [0, 1)
bool finiteOrNone(const AttrValue& v);         // OptionalFloat: none or finite
bool floatingDtype(const AttrValue& v);        // Dtype: float, half, bfloat16, double
bool meshAxisName(const AttrValue& v);         // Name: DIDx, DIDy or DIDz

// An expr's attributes: values by name, in declaration order once completed.
class Attributes {
 public:
  Attributes() = default;
  Attributes(std::initializer_list<std::pair<std::string, AttrValue>> items) : items_(items) {}

  bool has(const std::string& name) const { return find(name) != nullptr; }
  void set(const std::string& name, AttrValue value);
  const AttrValue& value(const std::string& name) const;  // internal error when absent
  template <typename T>
  const T& get(const std::string& name) const {
    const T* v = std::get_if<T>(&value(name));
    if (v == nullptr) typeMismatch(name);
    return *v;
  }
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  bool operator==(const Attributes& o) const { return items_ == o.items_; }
  bool operator!=(const Attributes& o) const { return !(*this == o); }

 private:
  const AttrValue* find(const std::string& name) const;
  [[noreturn]] void typeMismatch(const std::string& name) const;
  std::vector<std::pair<std::string, AttrValue>> items_;
};

// `given` checked against `defs` for op `op`: unknown names, missing required attributes, wrong
// types and invalid values are user errors naming the op and the attribute; defaults fill the rest.
// The result holds every declared attribute, in declaration order.
Attributes completeAttributes(const char* op, const std::vector<AttrDef>& defs, const Attributes& given);

// Text form (printed IR): 3, true, 0.1, none, float, [1, 2].
std::string attrValueText(const AttrValue& v);
// The value of `text` as an attribute of type `t`, or nullopt when it is not one.
std::optional<AttrValue> parseAttrValue(AttrType t, const std::string& text);

}  // namespace mf
