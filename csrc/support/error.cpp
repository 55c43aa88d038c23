#include "support/error.h"

namespace mf {

void throwInternal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(str("meshfuser internal error (this is a bug; please report it with the "
                          "program that triggered it): ",
                          msg.empty() ? "" : msg + " ", "[", cond, " failed at ", file, ":", line, "]"));
}

}  // namespace mf
