// A FileCheck-style matcher for tests of printed text (IR, host programs): a test states the lines
// it cares about, in order, instead of the whole text, and matches generated names (T7, i12,
// iDIDx9) by pattern, so that it keeps passing when numbering or unrelated printing changes.
//
// `checks` holds one directive per non-blank line (leading "//" allowed):
//   CHECK: p       p on a line at or after the previous match (on its line, after it)
//   CHECK-NEXT: p  p on the line right after the previous match's line
//   CHECK-SAME: p  p on the previous match's line, after the previous match
//   CHECK-NOT: p   p nowhere between the previous match and the next positive match (or the end)
// In a pattern p, text matches literally (a run of spaces matches any run of spaces or tabs),
// `{{re}}` is an ECMAScript regular expression, `[[NAME:re]]` matches re and binds NAME to the
// text it matched, and `[[NAME]]` matches the text NAME was bound to (earlier on the same line or
// by an earlier directive). A CHECK-NOT may use variables but not bind them. "[[" not followed by
// a name and ":" or "]]" is literal: "mesh=[[0 1] [2 3]]", and "[[[X]]" is "[" then [[X]].
#pragma once

#include <string>

namespace mf {

struct CheckLinesResult {
  bool ok = true;
  std::string message;  // on failure: which directive, where the search started, the text numbered
};

// Whether `text` satisfies `checks` (see above). Malformed checks (an unknown directive, an
// unterminated {{ or [[, an unbound variable, a CHECK-NEXT/SAME with no match before it) fail too.
CheckLinesResult checkLines(const std::string& text, const std::string& checks);

}  // namespace mf
