#include "output_files.hpp"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "flashtile/flashtile.hpp"

namespace flashtile::cli {
namespace {

[[noreturn]] void fail(const std::string& what) { throw Error(ErrorKind::invalid_argument, what); }
[[noreturn]] void fail_system(const std::string& what) {
  throw Error(ErrorKind::runtime, what + ": " + std::strerror(errno));
}

std::string parent_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// ".<name>.<random>.tmp" in the same directory, short enough for NAME_MAX whatever the name.
std::string temp_name(const std::string& path) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::filesystem::path p(path);
  std::string base = p.filename().string();
  constexpr size_t kSuffix = 1 + 16 + 4;  // ".%016llx" ".tmp"
  if (base.size() + 1 + kSuffix > NAME_MAX) base.resize(NAME_MAX - 1 - kSuffix);
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, ".%016llx.tmp", static_cast<unsigned long long>(rng()));
  return (p.parent_path() / ("." + base + suffix)).string();
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

OutputFiles::~OutputFiles() {
  for (const Output& o : outputs_)
    if (!o.temp.empty()) ::unlink(o.temp.c_str());
}

void OutputFiles::reserve(const std::string& flag, const std::string& path) {
  if (path.empty()) fail(flag + " must name a file");
  struct stat st {};
  Output out{flag, path, "", false, false};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) fail(flag + " " + path + " is a symbolic link; give the file's real path");
    if (S_ISDIR(st.st_mode)) fail(flag + " " + path + " is a directory");
    if (!S_ISREG(st.st_mode))
      fail(flag + " " + path + " is not a regular file (a device, FIFO or socket is never replaced)");
    out.existed = true;
  } else if (errno != ENOENT) {
    fail_system(flag + " " + path);
  }
  struct stat dir {};
  const std::string parent = parent_of(path);
  if (::stat(parent.c_str(), &dir) != 0 || !S_ISDIR(dir.st_mode))
    fail(flag + " " + path + ": the directory " + parent + " does not exist");
  for (const Output& other : outputs_) {
    std::error_code ec;
    auto resolved = [&ec](const std::string& p) {
      return std::filesystem::weakly_canonical(std::filesystem::absolute(p, ec), ec);
    };
    const bool same = resolved(other.path) == resolved(path);
    if (same) fail(flag + " and " + other.flag + " name the same file (" + path + ")");
  }
  outputs_.push_back(out);
}

OutputFiles::Output& OutputFiles::find(const std::string& path) {
  for (Output& o : outputs_)
    if (o.path == path) return o;
  throw Error(ErrorKind::runtime, path + " was not reserved as an output");
}

void OutputFiles::stage(const std::string& path, std::string_view header, const void* data,
                        size_t bytes) {
  Output& o = find(path);
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    o.temp = temp_name(path);
    fd = ::open(o.temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) {
      o.temp.clear();
      fail_system(o.flag + " " + path + ": cannot create a temporary file beside it");
    }
  }
  if (fd < 0) {
    o.temp.clear();
    fail_system(o.flag + " " + path + ": cannot create a temporary file beside it");
  }
  auto write_all = [&](const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      p += w;
      n -= size_t(w);
    }
    return true;
  };
  const bool ok = write_all(header.data(), header.size()) &&
                  write_all(static_cast<const char*>(data), bytes) && ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (!ok) {
    errno = saved;
    fail_system(o.flag + " " + path + ": write failed");
  }
}

void OutputFiles::roll_back() {
  for (Output& o : outputs_) {
    if (!o.swapped) continue;
    if (o.existed)
      ::renameat2(AT_FDCWD, o.temp.c_str(), AT_FDCWD, o.path.c_str(), RENAME_EXCHANGE);
    else
      ::unlink(o.path.c_str());
    o.swapped = false;
  }
}

void OutputFiles::commit() {
  for (Output& o : outputs_) {
    if (o.temp.empty()) continue;
    // Existing targets are exchanged with their temporary (the old file survives under the
    // temporary name until every output is in place); new ones must still not exist.
    const unsigned flags = o.existed ? RENAME_EXCHANGE : RENAME_NOREPLACE;
    int status = ::renameat2(AT_FDCWD, o.temp.c_str(), AT_FDCWD, o.path.c_str(), flags);
    struct stat now {};
    if (status != 0 && errno == EEXIST && ::lstat(o.path.c_str(), &now) == 0 && S_ISREG(now.st_mode)) {
      // Another writer created the file meanwhile (concurrent runs): the last one wins.
      o.existed = true;
      status = ::renameat2(AT_FDCWD, o.temp.c_str(), AT_FDCWD, o.path.c_str(), RENAME_EXCHANGE);
    }
    if (status != 0 && (errno == EINVAL || errno == ENOSYS) && o.existed) {
      // A file system without exchange: a plain rename, which cannot be rolled back.
      status = ::rename(o.temp.c_str(), o.path.c_str());
      if (status == 0) {
        o.existed = false;
        o.temp.clear();
      }
    }
    if (status != 0) {
      const int saved = errno;
      roll_back();
      errno = saved;
      fail_system(o.flag + " " + o.path + ": cannot move the output into place" +
                  (saved == EEXIST ? " (the file appeared meanwhile)" : ""));
    }
    o.swapped = true;
  }
  for (Output& o : outputs_) {  // every output is in place: drop the old files
    if (o.existed && !o.temp.empty()) ::unlink(o.temp.c_str());
    if (!o.existed) o.temp.clear();  // the temporary became the output
    fsync_directory(parent_of(o.path));
  }
  for (Output& o : outputs_) o.temp.clear();
}

}  // namespace flashtile::cli
