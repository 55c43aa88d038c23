#include "check_lines.h"

#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace mf {
namespace {

enum class Kind { Check, Next, Same, Not };

struct Directive {
  Kind kind;
  std::string name;     // as written ("CHECK-NEXT"), for messages
  std::string pattern;  // the text after the colon, trimmed
  size_t checks_line;   // 1-based, in `checks`
};

// A malformed directive or pattern: reported as the failure.
struct Malformed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<std::string> splitLines(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<Directive> parseChecks(const std::string& checks) {
  static const std::vector<std::pair<std::string, Kind>> kinds = {
      {"CHECK-NEXT:", Kind::Next}, {"CHECK-SAME:", Kind::Same}, {"CHECK-NOT:", Kind::Not}, {"CHECK:", Kind::Check}};
  std::vector<Directive> out;
  std::vector<std::string> lines = splitLines(checks);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string line = trim(lines[i]);
    if (line.rfind("//", 0) == 0) line = trim(line.substr(2));
    if (line.empty()) continue;
    bool known = false;
    for (const auto& [prefix, kind] : kinds) {
      if (line.rfind(prefix, 0) != 0) continue;
      std::string pattern = trim(line.substr(prefix.size()));
      if (pattern.empty()) throw Malformed(prefix + " with an empty pattern (checks line " + std::to_string(i + 1) + ")");
      if ((kind == Kind::Next || kind == Kind::Same) && out.empty()) {
        throw Malformed(prefix + " as the first directive has no match to follow (checks line " +
                        std::to_string(i + 1) + ")");
      }
      out.push_back({kind, prefix.substr(0, prefix.size() - 1), pattern, i + 1});
      known = true;
      break;
    }
    if (!known) throw Malformed("checks line " + std::to_string(i + 1) + " is not a directive: " + line);
  }
  return out;
}

// How many capturing groups a regular expression opens ("(" not escaped, not in a [...] class,
// not "(?"), so that ours after it get the right numbers.
size_t countGroups(const std::string& re) {
  size_t n = 0;
  bool in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    char c = re[i];
    if (c == '\\') {
      ++i;
    } else if (in_class) {
      in_class = c != ']';
    } else if (c == '[') {
      in_class = true;
    } else if (c == '(' && (i + 1 >= re.size() || re[i + 1] != '?')) {
      ++n;
    }
  }
  return n;
}

std::string escapeLiteral(const std::string& s) {
  static const std::string special = R"(\^$.|?*+()[]{}/)";
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == ' ' || c == '\t') {
      while (i + 1 < s.size() && (s[i + 1] == ' ' || s[i + 1] == '\t')) ++i;
      out += "[ \\t]+";
    } else {
      if (special.find(c) != std::string::npos) out += '\\';
      out += c;
    }
  }
  return out;
}

// A pattern compiled to a regular expression; `binds` maps each variable it binds to its group.
struct Compiled {
  std::regex re;
  std::map<std::string, size_t> binds;
};

bool isVariableName(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

Compiled compile(const Directive& d, const std::map<std::string, std::string>& vars) {
  const std::string& p = d.pattern;
  std::string where = " in " + d.name + ": " + p + " (checks line " + std::to_string(d.checks_line) + ")";
  std::string re;
  size_t groups = 0;
  Compiled c;
  std::string literal;
  auto flush = [&] {
    re += escapeLiteral(literal);
    literal.clear();
  };
  size_t i = 0;
  while (i < p.size()) {
    if (p.compare(i, 2, "{{") == 0) {
      flush();
      size_t end = p.find("}}", i + 2);
      if (end == std::string::npos) throw Malformed("unterminated {{" + where);
      std::string inner = p.substr(i + 2, end - i - 2);
      re += "(?:" + inner + ")";
      groups += countGroups(inner);
      i = end + 2;
      continue;
    }
    size_t name_end = i + 2;
    while (name_end < p.size() && (std::isalnum(static_cast<unsigned char>(p[name_end])) || p[name_end] == '_')) ++name_end;
    std::string name = p.compare(i, 2, "[[") == 0 ? p.substr(i + 2, name_end - i - 2) : "";
    bool variable = isVariableName(name) && (p.compare(name_end, 1, ":") == 0 || p.compare(name_end, 2, "]]") == 0);
    if (!variable) {  // "[[0 1] [2 3]]" (a 2-D mesh) and "[[[X]]" hold literal brackets
      literal += p[i++];
      continue;
    }
    flush();
    size_t end = p.find("]]", name_end);
    if (end == std::string::npos) throw Malformed("unterminated [[" + where);
    if (p[name_end] == ':') {
      if (d.kind == Kind::Not) throw Malformed("a CHECK-NOT cannot bind " + name + where);
      std::string inner_re = p.substr(name_end + 1, end - name_end - 1);
      re += "(" + inner_re + ")";
      c.binds[name] = ++groups;
      groups += countGroups(inner_re);
    } else if (auto b = c.binds.find(name); b != c.binds.end()) {
      re += "\\" + std::to_string(b->second);  // bound earlier in this pattern
    } else if (auto v = vars.find(name); v != vars.end()) {
      re += escapeLiteral(v->second);
    } else {
      throw Malformed("variable " + name + " is used before it is bound" + where);
    }
    i = end + 2;
  }
  flush();
  try {
    c.re = std::regex(re, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw Malformed(std::string("bad regular expression (") + e.what() + ")" + where);
  }
  return c;
}

struct Position {
  size_t line = 0;
  size_t col = 0;
};

struct Match {
  Position start, end;
  std::smatch groups;
};

// The first match of `c` in lines [from, to) (the first from `from.col`, the last up to `to.col`
// when to.line is a line of the text), or nothing.
std::optional<Match> search(const std::vector<std::string>& lines, const Compiled& c, Position from,
                            std::optional<Position> to = std::nullopt) {
  for (size_t l = from.line; l < lines.size(); ++l) {
    if (to && l > to->line) break;
    const std::string& line = lines[l];
    size_t begin = l == from.line ? std::min(from.col, line.size()) : 0;
    size_t end = to && l == to->line ? std::min(to->col, line.size()) : line.size();
    if (begin > end) continue;
    Match m;
    if (std::regex_search(line.begin() + begin, line.begin() + end, m.groups, c.re)) {
      size_t at = begin + static_cast<size_t>(m.groups.position(0));
      m.start = {l, at};
      m.end = {l, at + static_cast<size_t>(m.groups.length(0))};
      return m;
    }
  }
  return std::nullopt;
}

std::string numbered(const std::vector<std::string>& lines) {
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) out += std::to_string(i + 1) + ": " + lines[i] + "\n";
  return out;
}

}  // namespace

CheckLinesResult checkLines(const std::string& text, const std::string& checks) {
  std::vector<std::string> lines = splitLines(text);
  CheckLinesResult result;
  auto fail = [&](const std::string& why) {
    result.ok = false;
    result.message = why + "\n--- text ---\n" + numbered(lines);
    return result;
  };
  try {
    std::vector<Directive> directives = parseChecks(checks);
    std::map<std::string, std::string> vars;
    Position pos;
    bool matched_before = false;
    std::vector<const Directive*> pending_nots;
    // Every pending CHECK-NOT must be absent between `from` and `to` (the end when nothing follows).
    auto check_nots = [&](Position from, std::optional<Position> to) -> std::optional<std::string> {
      for (const Directive* n : pending_nots) {
        if (auto m = search(lines, compile(*n, vars), from, to)) {
          return n->name + ": " + n->pattern + " (checks line " + std::to_string(n->checks_line) + ") matched line " +
                 std::to_string(m->start.line + 1) + ": " + lines[m->start.line];
        }
      }
      pending_nots.clear();
      return std::nullopt;
    };
    for (const Directive& d : directives) {
      if (d.kind == Kind::Not) {
        compile(d, vars);  // malformed patterns fail here, even when nothing follows
        pending_nots.push_back(&d);
        continue;
      }
      Compiled c = compile(d, vars);
      std::optional<Match> m;
      std::string where;
      if (d.kind == Kind::Check) {
        m = search(lines, c, pos);
        where = "at or after line " + std::to_string(pos.line + 1);
      } else if (d.kind == Kind::Next) {
        Position next{pos.line + 1, 0};
        if (matched_before && next.line < lines.size()) m = search(lines, c, next, Position{next.line, lines[next.line].size()});
        where = "on line " + std::to_string(next.line + 1) + " (the line after the previous match)";
      } else {
        if (matched_before && pos.line < lines.size()) m = search(lines, c, pos, Position{pos.line, lines[pos.line].size()});
        where = "on line " + std::to_string(pos.line + 1) + " after column " + std::to_string(pos.col + 1);
      }
      if (!m) return fail(d.name + ": " + d.pattern + " (checks line " + std::to_string(d.checks_line) + ") not found " + where);
      if (auto bad = check_nots(pos, m->start)) return fail(*bad);
      for (const auto& [name, group] : c.binds) vars[name] = m->groups[group].str();
      pos = m->end;
      matched_before = true;
    }
    if (auto bad = check_nots(pos, std::nullopt)) return fail(*bad);
  } catch (const Malformed& e) {
    return fail(std::string("malformed checks: ") + e.what());
  }
  return result;
}

}  // namespace mf
