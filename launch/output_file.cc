#include "launch/output_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <system_error>

#include "spec/errors.h"

namespace shardfit::launch {
namespace fs = std::filesystem;
using spec::BadInput;
using spec::EnvironmentFailure;

void check_output_file(const std::string& option, const std::string& file) {
  if (file.empty()) throw BadInput(option + " \"\": needs a file name");
  std::error_code ec;
  if (fs::is_directory(file, ec)) throw BadInput(option + " " + file + ": is a directory, expected a file name");
  if (fs::exists(file, ec) && !fs::is_regular_file(file, ec))
    throw BadInput(option + " " + file + ": not a regular file (a device, socket or pipe)");
  const fs::path absolute = fs::absolute(file, ec);
  for (const char* pseudo : {"/proc", "/sys"}) {
    const std::string prefix = std::string(pseudo) + "/";
    if (absolute.string().rfind(prefix, 0) == 0)
      throw BadInput(option + " " + file + ": " + pseudo + " is the kernel's, not a place for files");
  }
  fs::path parent = fs::path(file).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec)) throw BadInput(option + " " + file + ": no directory " + parent.string());
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw BadInput(option + " " + file + ": directory " + parent.string() + " is not writable");
}

void write_output_file(const std::string& option, const std::string& file, const std::string& text) {
  // Written beside it and renamed over it: a failed write (a full disk, an
  // I/O error) leaves whatever was there, never a truncated file under the
  // name, and is the environment's failure (exit 3), not a lost report.
  const std::string tmp = file + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (f) {
      f << text;
      f.close();
    }
    if (!f) {
      fs::remove(tmp, ec);
      throw EnvironmentFailure(option + " " + file + ": the write failed (disk full or unwritable?); nothing written");
    }
  }
  fs::rename(tmp, file, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw EnvironmentFailure(option + " " + file + ": cannot put the file in place (" + why + ")");
  }
}

}  // namespace shardfit::launch
