// mf_opt: runs one named pass (or, with --upto, the pipeline up to and including it) on IR text
// read from a file or standard input, and prints the resulting IR. For writing pass tests:
//   build/dev/mf_opt decompose_reshardings --upto < seed.ir
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "passes/pass.h"
#include "support/error.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: mf_opt PASS [--upto] [FILE]\n";
    return 2;
  }
  std::string pass = argv[1];
  bool upto = false;
  std::string file;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--upto") upto = true;
    else file = a;
  }
  std::stringstream text;
  if (file.empty()) {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(file);
    text << in.rdbuf();
  }
  try {
    std::cout << mf::runPassOnText(pass, text.str(), upto);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
