// The IR parser. Grammar (one construct per line, as printFusion writes it):
//   Fusion {
//     symbols: s1=s0 ...                       (optional)
//     input T0_float[i0{s0}, iDIDx3{2}] mesh=[0 1] contiguity=tf stride_order=10
//     input S0_double
//     T2 = add(T0, 2_double)                   (attributes follow as name=value: sum(T0, dims=[0]))
//       T2_float[...] mesh=...                  (the output's header)
//       root: [...]                             (optional)
//       OuterSplit(i1{8}, factor 2) -> iDIDx5{2}, i6{4}     (transforms, in order)
//       loop: [...]  allocation: [...]          (optional)
//     T4, T5 = op(..)                           (an op of several outputs: one header each, in order)
//     outputs: T2
//   }
// Axes are named as printed (iDIDx5{2}rf: iteration type, parallel type, name, extent, rfactor
// mark); a name seen again refers to the same axis.
#include "ir/parser.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <sstream>
#include <unordered_map>

#include "support/error.h"
#include "support/text.h"

namespace mf {
namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : fusion_(std::make_unique<Fusion>()) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines_.push_back(line);
  }

  std::unique_ptr<Fusion> parse() {
    expectLine("Fusion {");
    while (true) {
      std::string line = trimmed(peek());
      if (startsWith(line, "symbols:")) {
        next();
        parseSymbols(line.substr(8));
      } else if (startsWith(line, "overlap:")) {
        next();
        fusion_->setOverlap(trimmed(line.substr(8)));
      } else if (startsWith(line, "input ")) {
        next();
        parseInput(line.substr(6));
      } else if (startsWith(line, "outputs:")) {
        next();
        std::istringstream names(line.substr(8));
        for (std::string name; names >> name;) fusion_->addOutput(lookupVal(name));
        break;
      } else {
        next();
        parseExpr(line);
      }
    }
    expectLine("}");
    return std::move(fusion_);
  }

 private:
  // ---- lines ----
  const std::string& peek() {
    reported_line_ = line_ + 1;
    fail(line_ < lines_.size(), "unexpected end of the IR text");
    return lines_[line_];
  }
  void next() { reported_line_ = ++line_; }
  static std::string trimmed(const std::string& s) {
    size_t b = s.find_first_not_of(' ');
    size_t e = s.find_last_not_of(' ');
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
  }
  static bool startsWith(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
  void expectLine(const std::string& want) {
    std::string got = trimmed(peek());
    fail(got == want, "expected '", want, "', got '", got, "'");
    next();
  }
  template <typename... Args>
  void fail(bool ok, const Args&... args) {
    MF_USER_CHECK(ok, "IR text line ", reported_line_, ": ", args...);
  }

  // ---- small tokens ----
  DataType parseDtype(const std::string& name) {
    for (DataType dt : {DataType::Float, DataType::Half, DataType::BFloat16, DataType::Double, DataType::Int,
                        DataType::Int32, DataType::Bool}) {
      if (name == toString(dt)) return dt;
    }
    fail(false, "unknown dtype '", name, "'");
    return DataType::Float;
  }

  // "[[0 1] [2 3]]" -> devices and shape.
  DeviceMesh parseMesh(const std::string& text) {
    std::vector<int64_t> devices;
    std::vector<int64_t> shape;
    std::vector<int64_t> count;
    int depth = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      char c = text[i];
      if (c == '[') {
        if (depth > 0) ++count[depth - 1];
        ++depth;
        if (static_cast<int>(count.size()) < depth) count.push_back(0);
        count[depth - 1] = 0;
      } else if (c == ']') {
        if (static_cast<int>(shape.size()) < depth) shape.resize(depth, 0);
        shape[depth - 1] = count[depth - 1];
        --depth;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t end = i;
        while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
        devices.push_back(std::stoll(text.substr(i, end - i)));
        ++count[depth - 1];
        i = end - 1;
      }
    }
    fail(depth == 0 && !devices.empty(), "malformed mesh '", text, "'");
    return DeviceMesh(devices, shape);
  }

  // "iDIDx5{2}rf" -> the axis (created on first sight).
  IterDomain* parseId(const std::string& token) {
    std::string t = trimmed(token);
    fail(!t.empty(), "expected an axis");
    IterType type = IterType::Iteration;
    if (t[0] == 'r') type = IterType::Reduction;
    else if (t[0] == 'b') type = IterType::Broadcast;
    else fail(t[0] == 'i', "axis '", t, "' must start with i, r or b");
    size_t pos = 1;
    ParallelType pt = ParallelType::Serial;
    for (ParallelType cand : {ParallelType::DIDx, ParallelType::DIDy, ParallelType::DIDz, ParallelType::Stream,
                              ParallelType::BIDx, ParallelType::BIDy, ParallelType::BIDz, ParallelType::TIDx,
                              ParallelType::TIDy, ParallelType::TIDz, ParallelType::Vectorize, ParallelType::Unroll}) {
      std::string name = toString(cand);
      if (t.compare(pos, name.size(), name) == 0) {
        pt = cand;
        pos += name.size();
        break;
      }
    }
    size_t brace = t.find('{', pos);
    size_t close = t.find('}', brace);
    fail(brace != std::string::npos && close != std::string::npos && brace > pos, "malformed axis '", t, "'");
    int64_t name = std::stoll(t.substr(pos, brace - pos));
    std::string extent_text = t.substr(brace + 1, close - brace - 1);
    std::string suffix = t.substr(close + 1);
    bool rf = startsWith(suffix, "rf");
    ParallelType swizzle = ParallelType::Serial;
    size_t tilde = suffix.find('~');
    if (tilde != std::string::npos) {
      for (ParallelType cand : {ParallelType::DIDx, ParallelType::DIDy, ParallelType::DIDz}) {
        if (suffix.substr(tilde + 1) == toString(cand)) swizzle = cand;
      }
      fail(swizzle != ParallelType::Serial, "malformed swizzle in axis '", t, "'");
    }
    auto it = ids_.find(name);
    if (it != ids_.end()) {
      IterDomain* id = it->second;
      fail(id->iterType() == type && id->parallelType() == pt && id->extent().toString() == extent_text, "axis ",
           name, " is printed as '", t, "' here but as '", id->toString(), "' before");
      return id;
    }
    Extent extent;
    bool digits = !extent_text.empty() && std::all_of(extent_text.begin(), extent_text.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    if (digits) {
      extent.value = std::stoll(extent_text);
    } else {
      extent.symbol = extent_text;
      fusion_->reserveSymbol(extent_text);
    }
    IterDomain* id = fusion_->newIterDomainNamed(name, extent, type);
    id->parallelize(pt);
    id->setRFactorProduct(rf);
    id->setSwizzle(swizzle);
    ids_[name] = id;
    return id;
  }

  // Splits "a, b, [c, d], e" at top-level commas.
  static std::vector<std::string> splitTopLevel(const std::string& s) {
    std::vector<std::string> parts;
    int depth = 0;
    std::string cur;
    for (char c : s) {
      if (c == '[' || c == '(' || c == '{') ++depth;
      if (c == ']' || c == ')' || c == '}') --depth;
      if (c == ',' && depth == 0) {
        parts.push_back(trimmed(cur));
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!trimmed(cur).empty()) parts.push_back(trimmed(cur));
    return parts;
  }

  std::vector<IterDomain*> parseIdList(const std::string& text) {  // "[i0{2}, i1{3}]"
    std::string t = trimmed(text);
    fail(t.size() >= 2 && t.front() == '[' && t.back() == ']', "expected an axis list, got '", t, "'");
    std::vector<IterDomain*> ids;
    for (const std::string& part : splitTopLevel(t.substr(1, t.size() - 2))) ids.push_back(parseId(part));
    return ids;
  }

  // ---- tensors ----
  // "T3_float[...] mesh=[0 1] contiguity=tf stride_order=10" plus its indented detail lines.
  TensorView* parseTensor(const std::string& header) {
    size_t underscore = header.find('_');
    size_t bracket = header.find('[');
    fail(header[0] == 'T' && underscore != std::string::npos && bracket != std::string::npos,
         "expected a tensor like T0_float[...], got '", header, "'");
    int64_t name = std::stoll(header.substr(1, underscore - 1));
    DataType dtype = parseDtype(header.substr(underscore + 1, bracket - underscore - 1));
    int depth = 0;
    size_t end = bracket;
    for (; end < header.size(); ++end) {
      if (header[end] == '[') ++depth;
      if (header[end] == ']' && --depth == 0) break;
    }
    fail(end < header.size(), "unterminated axis list in '", header, "'");
    std::vector<IterDomain*> logical = parseIdList(header.substr(bracket, end - bracket + 1));
    TensorView* tv = fusion_->newTensorNamed(name, dtype, logical);
    vals_["T" + std::to_string(name)] = tv;
    std::istringstream rest(header.substr(end + 1));
    std::string mesh_text;
    for (std::string word; rest >> word;) {
      if (startsWith(word, "mesh=")) {
        mesh_text = word.substr(5);
        // A mesh of several axes prints with spaces: read up to the matching bracket.
        int d = 0;
        for (char c : mesh_text) d += (c == '[') - (c == ']');
        while (d > 0 && rest >> word) {
          mesh_text += " " + word;
          for (char c : word) d += (c == '[') - (c == ']');
        }
        tv->setDeviceMesh(parseMesh(mesh_text));
      } else if (startsWith(word, "contiguity=")) {
        std::vector<bool> c;
        for (char ch : word.substr(11)) c.push_back(ch == 't');
        tv->setContiguity(c);
      } else if (startsWith(word, "name=")) {
        tv->setUserName(word.substr(5));
      } else if (startsWith(word, "stride_order=")) {
        std::vector<int64_t> order;
        for (char ch : word.substr(13)) order.push_back(ch - '0');
        tv->setStrideOrder(order);
      } else {
        fail(false, "unexpected '", word, "' after ", tv->toString());
      }
    }
    while (line_ < lines_.size()) {
      std::string line = trimmed(lines_[line_]);
      if (startsWith(line, "root: ")) {
        tv->setRoot(parseIdList(line.substr(6)));
      } else if (startsWith(line, "loop: ")) {
        tv->setLoop(parseIdList(line.substr(6)));
      } else if (startsWith(line, "allocation: ")) {
        tv->setAllocation(parseIdList(line.substr(12)));
      } else if (startsWith(line, "OuterSplit(") || startsWith(line, "InnerSplit(") || startsWith(line, "Merge(")) {
        parseTransform(line);
      } else {
        break;
      }
      next();
    }
    return tv;
  }

  // "OuterSplit(i1{8}, factor 2) -> iDIDx5{2}, i6{4}" or "Merge(i1{2}, i2{3}) -> i7{6}".
  void parseTransform(const std::string& line) {
    size_t open = line.find('(');
    size_t arrow = line.find(") -> ");
    fail(arrow != std::string::npos, "malformed transform '", line, "'");
    std::string kind = line.substr(0, open);
    std::vector<std::string> args = splitTopLevel(line.substr(open + 1, arrow - open - 1));
    std::vector<IterDomain*> outputs;
    for (const std::string& part : splitTopLevel(line.substr(arrow + 5))) outputs.push_back(parseId(part));
    if (kind == "Merge") {
      fail(args.size() == 2 && outputs.size() == 1, "a merge takes two axes to one: '", line, "'");
      fusion_->newTransform(IdTransform::Kind::Merge, {parseId(args[0]), parseId(args[1])}, outputs, 0, false);
      return;
    }
    fail(args.size() == 2 && startsWith(args[1], "factor ") && outputs.size() == 2, "malformed split '", line, "'");
    fusion_->newTransform(IdTransform::Kind::Split, {parseId(args[0])}, outputs, std::stoll(args[1].substr(7)),
                          kind == "InnerSplit");
  }

  // ---- values, inputs, exprs ----
  Val* lookupVal(const std::string& name) {
    auto it = vals_.find(name);
    fail(it != vals_.end(), "unknown value '", name, "'");
    return it->second;
  }

  // "T0", "S1_double" (an input), "2.5_float" (a constant), "S4{s0}_int" (an extent),
  // "S5[reciprocal(S1_double)]_double" (a scalar op's result).
  Val* parseOperand(const std::string& text) {
    if (vals_.count(text)) return vals_.at(text);
    size_t underscore = text.rfind('_');
    fail(underscore != std::string::npos, "unknown operand '", text, "'");
    DataType dtype = parseDtype(text.substr(underscore + 1));
    std::string value = text.substr(0, underscore);
    if (vals_.count(value)) return vals_.at(value);
    size_t bracket = value.find('[');
    if (bracket != std::string::npos && value[0] == 'S' && value.back() == ']') {
      // A scalar op's result: "S5[mul(S3_double, 2_double)]".
      std::string body = value.substr(bracket + 1, value.size() - bracket - 2);
      size_t open = body.find('(');
      fail(open != std::string::npos && body.back() == ')', "malformed scalar '", text, "'");
      const OpInfo* info = findOp(body.substr(0, open));
      fail(info != nullptr && info->on_scalars != nullptr, "scalar '", text, "': '", body.substr(0, open),
           "' is not an op on scalars");
      std::vector<Val*> operands;
      for (const std::string& arg : splitTopLevel(body.substr(open + 1, body.size() - open - 2))) {
        operands.push_back(parseOperand(arg));
      }
      Scalar* s = fusion_->newScalarNamed(std::stoll(value.substr(1, bracket - 1)), dtype, std::nullopt);
      s->setComputation({info->op, operands});
      vals_[value] = s;
      return s;
    }
    size_t brace = value.find('{');
    if (brace != std::string::npos && value[0] == 'S' && value.back() == '}') {
      std::string extent = value.substr(brace + 1, value.size() - brace - 2);
      Scalar* s = fusion_->newScalarNamed(std::stoll(value.substr(1, brace - 1)), dtype, std::nullopt, extent);
      vals_[value] = s;
      return s;
    }
    char* end = nullptr;
    double v = std::strtod(value.c_str(), &end);
    fail(end != nullptr && *end == '\0', "operand '", text, "' is neither a known value nor a constant");
    return fusion_->newScalar(dtype, v);
  }

  void parseInput(const std::string& text) {
    if (text[0] == 'S') {
      size_t underscore = text.find('_');
      fail(underscore != std::string::npos, "expected a scalar input like S0_double, got '", text, "'");
      std::string name = text.substr(0, underscore);
      Scalar* s = fusion_->newScalarNamed(std::stoll(name.substr(1)), parseDtype(text.substr(underscore + 1)), std::nullopt);
      vals_[name] = s;
      fusion_->addInput(s);
      return;
    }
    fusion_->addInput(parseTensor(text));
  }

  void parseSymbols(const std::string& text) {
    std::istringstream in(text);
    for (std::string pair; in >> pair;) {
      size_t eq = pair.find('=');
      fail(eq != std::string::npos, "expected symbol=symbol, got '", pair, "'");
      fusion_->reserveSymbol(pair.substr(0, eq));
      fusion_->unifySymbols(pair.substr(0, eq), pair.substr(eq + 1));
    }
  }

  void parseExpr(const std::string& line) {
    size_t eq = line.find(" = ");
    size_t open = line.find('(', eq);
    fail(eq != std::string::npos && open != std::string::npos && line.back() == ')',
         "expected 'T<n> = op(operands)', got '", line, "'");
    std::vector<std::string> out_names = splitTopLevel(line.substr(0, eq));  // several for attention
    std::string op_name = line.substr(eq + 3, open - eq - 3);
    const OpInfo* info = findOp(op_name);
    fail(info != nullptr, "unknown op '", op_name, "'");
    std::vector<Val*> operands;
    Attributes attrs;
    for (const std::string& arg : splitTopLevel(line.substr(open + 1, line.size() - open - 2))) {
      size_t key_end = arg.find('=');
      if (key_end == std::string::npos) {
        operands.push_back(parseOperand(arg));
        continue;
      }
      std::string key = arg.substr(0, key_end);
      const AttrDef* def = nullptr;
      for (const AttrDef& d : info->attributes) {
        if (key == d.name) def = &d;
      }
      fail(def != nullptr, op_name, ": unknown attribute '", key, "'", attributeList(*info));
      fail(!attrs.has(key), op_name, ": attribute '", key, "' given twice");
      std::optional<AttrValue> value = parseAttrValue(def->type, arg.substr(key_end + 1));
      fail(value.has_value(), op_name, ": attribute '", key, "' must be a ", toString(def->type), "; got '",
           arg.substr(key_end + 1), "'");
      attrs.set(key, *value);
    }
    fail(static_cast<int>(operands.size()) >= info->min_inputs && static_cast<int>(operands.size()) <= info->max_inputs,
         op_name, " takes ", info->min_inputs, "-", info->max_inputs, " operands, got ", operands.size());
    const size_t expr_line = reported_line_;
    std::vector<Val*> outs;
    for (const std::string& out_name : out_names) {
      fail(line_ < lines_.size(), "missing the output tensor ", out_name, " of '", line, "'");
      std::string header = trimmed(lines_[line_]);
      next();
      TensorView* out = parseTensor(header);
      fail(out->toString() == out_name, "the expr defines ", out_name, " but the next line describes ", out->toString());
      outs.push_back(out);
    }
    try {
      fusion_->newExpr(info->op, operands, outs, attrs);  // completes the attributes; runs the op's check
    } catch (const UserError& err) {
      reported_line_ = expr_line;
      fail(false, err.what());
    }
  }

  static std::string attributeList(const OpInfo& info) {
    if (info.attributes.empty()) return std::string("; ") + info.name + " takes no attributes";
    std::vector<std::string> names;
    for (const AttrDef& d : info.attributes) names.push_back(d.name);
    return "; " + std::string(info.name) + " takes " + listText(names);
  }

  std::unique_ptr<Fusion> fusion_;
  std::vector<std::string> lines_;
  size_t line_ = 0;           // the next line to read
  size_t reported_line_ = 0;  // 1-based line that errors name: the one being parsed
  std::unordered_map<int64_t, IterDomain*> ids_;
  std::map<std::string, Val*> vals_;
};

}  // namespace

std::unique_ptr<Fusion> parseFusion(const std::string& text) { return Parser(text).parse(); }

}  // namespace mf
