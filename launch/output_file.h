// The files a command writes its results to (run --out and --export, plan
// --out, calibrate --out, ...): checked before any work, written whole
// after it.
#pragma once

#include <string>

namespace shardfit::launch {

// An output file (`option` FILE), before any work: a regular file or none
// yet (not a directory, a device such as /dev/full, or a file under /proc
// or /sys), in an existing writable directory. One line naming the option,
// as spec::BadInput.
void check_output_file(const std::string& option, const std::string& file);
// Writes `text` to `file` whole (through a temporary file renamed over it)
// or throws spec::EnvironmentFailure, one line naming `option`: a short
// write or a full disk after the work is exit 3, not a lost report or a
// truncated one.
void write_output_file(const std::string& option, const std::string& file, const std::string& text);

}  // namespace shardfit::launch
