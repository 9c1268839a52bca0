// Replays inputs through a fuzz harness's LLVMFuzzerTestOneInput without
// libFuzzer, so that every committed corpus input (the seeds and the
// regression inputs of crashes once found) runs as a plain ctest in every
// build, gcc and sanitizer builds included (tests/fuzz/CMakeLists.txt):
//
//   <name>_corpus DIR_OR_FILE...
//
// Each file is named on stdout before it runs, so the one that crashes a
// harness is the last line of the test's output.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

bool collect(const fs::path& path, std::vector<fs::path>& files) {
  std::error_code error;
  if (fs::is_directory(path, error)) {
    std::vector<fs::path> found;
    for (const auto& entry : fs::directory_iterator(path, error)) {
      if (entry.is_regular_file()) found.push_back(entry.path());
    }
    if (error) {
      std::fprintf(stderr, "cannot list %s: %s\n", path.c_str(), error.message().c_str());
      return false;
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
    return true;
  }
  if (fs::is_regular_file(path, error)) {
    files.push_back(path);
    return true;
  }
  std::fprintf(stderr, "%s is neither a corpus directory nor an input file\n", path.c_str());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    if (!collect(argv[i], files)) return 2;
  }
  if (files.empty()) {
    std::fprintf(stderr, "no inputs in the corpus: an empty corpus tests nothing\n");
    return 2;
  }
  for (const auto& file : files) {
    std::printf("%s\n", file.c_str());
    std::fflush(stdout);
    std::ifstream in(file, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.eof() && in.fail()) {
      std::fprintf(stderr, "cannot read %s\n", file.c_str());
      return 2;
    }
    // An empty vector's data() may be null; libFuzzer passes a valid pointer.
    static const uint8_t kEmpty = 0;
    const uint8_t* data = bytes.empty() ? &kEmpty : reinterpret_cast<const uint8_t*>(bytes.data());
    LLVMFuzzerTestOneInput(data, bytes.size());
  }
  std::printf("%zu inputs ran without a failure\n", files.size());
  return 0;
}
