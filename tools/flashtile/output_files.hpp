// A command's output files, written all or nothing. Each output goes to a fresh temporary
// file beside it (unique name, O_EXCL, no symlink following, fsync'd); commit() then swaps
// every temporary into place and, if any swap fails, swaps the earlier ones back, so a
// failed command leaves every old file as it was and no temporary behind.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace flashtile::cli {

class OutputFiles {
 public:
  OutputFiles() = default;
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;
  ~OutputFiles();  // removes what was staged and not committed

  // Checks, before any work, that `path` (named by `flag` in errors) can be an output: a new
  // name in an existing directory, or an existing regular file (not a symlink, a directory,
  // a device or a FIFO), and not the same file as another output. Throws flashtile::Error.
  void reserve(const std::string& flag, const std::string& path);
  // Writes the bytes of a reserved output to its temporary file.
  void stage(const std::string& path, std::string_view header, const void* data, size_t bytes);
  // Moves every staged file into place, all or none. Throws flashtile::Error on failure.
  void commit();

 private:
  struct Output {
    std::string flag, path, temp;
    bool existed = false;
    bool swapped = false;  // temp now holds the old file (or the target is new and placed)
  };
  Output& find(const std::string& path);
  void roll_back();
  std::vector<Output> outputs_;
};

}  // namespace flashtile::cli
