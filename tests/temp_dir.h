// A temporary directory for a test, removed with everything in it when the object goes away. Its path is short
// (/tmp/tessera-XXXXXX), so unix sockets fit inside it (a socket path has at most 107 characters).
//
//   TempDir dir;
//   std::string sock = dir.path() + "/kubelet.sock";
//
// Thread-safety: a plain value; path() may be read from any thread.
#ifndef TESSERA_TESTS_TEMP_DIR_H_
#define TESSERA_TESTS_TEMP_DIR_H_

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace tessera::testing {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tessera-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

  // Writes a file below the directory (creating parents) and returns its path. Writes a temporary file and
  // renames it over the target, as editors and ConfigMap updates do.
  std::string Write(const std::string& relative, const std::string& content) const {
    const std::filesystem::path p = std::filesystem::path(path_) / relative;
    std::filesystem::create_directories(p.parent_path());
    const std::string tmp = p.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << content;
    }
    std::filesystem::rename(tmp, p);
    return p.string();
  }

 private:
  std::string path_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TEMP_DIR_H_
