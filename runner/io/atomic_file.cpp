#include "runner/io/atomic_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <system_error>

#include <fmt/format.h>

#include "core/error.hpp"

namespace ringattn {
namespace {

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Whether a file can be created in `dir`: permission bits and access(2) do not say so for every
// file system (sysfs and procfs grant root write access to directories that create nothing), so a
// probe file is created there, exclusively, and removed at once.
std::string creation_problem(const std::string& dir) {
  static std::atomic<unsigned> counter{0};
  const std::string probe = fmt::format("{}/.ringattn-probe-{}-{}", dir, ::getpid(), counter++);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return "";  // a name taken is not a directory that refuses files
    return fmt::format("no file can be created in its directory '{}': {}", dir, std::strerror(errno));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

std::string path_problem(const std::string& path) {
  if (path.back() == '/') return "the path names a directory, not a file";
  const std::string dir = directory_of(path);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return fmt::format("its directory '{}' does not exist", dir);
  if (!S_ISDIR(st.st_mode)) return fmt::format("'{}' is not a directory", dir);
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return fmt::format("its directory '{}' is not writable: {}", dir, std::strerror(errno));
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return S_ISDIR(st.st_mode) ? std::string("it is a directory")
                               : std::string("it exists and is not a regular file (a device or pipe)");
  return creation_problem(dir);
}

// The temporary files open now, for the signal handler: a fixed table of pointers into the
// AtomicFiles' own names (a handler may not allocate); beyond kSlots files at once the rest are
// not removed on a signal.
constexpr int kSlots = 64;
std::atomic<const char*> g_partials[kSlots];
constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP};
struct sigaction g_previous[3];

void remove_partials_and_pass_on(int sig) {
  for (auto& slot : g_partials)
    if (const char* name = slot.exchange(nullptr)) ::unlink(name);
  for (int i = 0; i < 3; ++i)
    if (kSignals[i] == sig) ::sigaction(sig, &g_previous[i], nullptr);
  ::raise(sig);
}

void install_signal_cleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int i = 0; i < 3; ++i) {
      struct sigaction now {};
      ::sigaction(kSignals[i], nullptr, &g_previous[i]);
      if (g_previous[i].sa_handler == SIG_IGN) continue;  // an ignored signal stays ignored
      now.sa_handler = remove_partials_and_pass_on;
      sigemptyset(&now.sa_mask);
      ::sigaction(kSignals[i], &now, nullptr);
    }
  });
}

void track_partial(const char* name) {
  install_signal_cleanup();
  for (auto& slot : g_partials) {
    const char* expected = nullptr;
    if (slot.compare_exchange_strong(expected, name)) return;
  }
}

void untrack_partial(const char* name) {
  for (auto& slot : g_partials) {
    const char* expected = name;
    if (slot.compare_exchange_strong(expected, nullptr)) return;
  }
}

}  // namespace

std::string resolve_output_path(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p = path;
  std::error_code ec;
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  return p.string();
}

std::string output_path_problem(const std::string& path) {
  if (path.empty()) return "the path is empty";
  // The path as given (stat follows its links: a link to a device or pipe is refused), then the
  // file its links end at, which is the one written.
  if (std::string why = path_problem(path); !why.empty()) return why;
  const std::string target = resolve_output_path(path);
  std::error_code ec;
  // A loop of links (or a chain too long to follow) leaves a link: the rename would replace it.
  if (std::filesystem::is_symlink(std::filesystem::symlink_status(target, ec)))
    return "its symbolic links form a loop or a chain of more than 40; give the file itself";
  if (target == path) return "";
  if (std::string why = path_problem(target); !why.empty()) return fmt::format("it links to '{}': {}", target, why);
  return "";
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  if (const std::string why = output_path_problem(path_); !why.empty())
    fail_arg("cannot write '{}': {}", path_, why);
  target_ = resolve_output_path(path_);
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0; fd_ < 0; ++attempt) {
    tmp_ = fmt::format("{}.partial-{}-{}", target_, ::getpid(), counter++);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || attempt > 100))
      fail_arg("cannot write '{}': creating '{}' failed: {}", path_, tmp_, std::strerror(errno));
  }
  track_partial(tmp_.c_str());
}

AtomicFile::~AtomicFile() {
  if (!committed_) discard();
}

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) {
    untrack_partial(tmp_.c_str());
    ::unlink(tmp_.c_str());
  }
  tmp_.clear();
}

void AtomicFile::write(const void* data, size_t bytes) {
  if (fd_ < 0) fail_runtime("'{}': write after close", path_);
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      discard();
      fail_runtime("writing '{}' failed: {} (nothing was written to it)", path_, std::strerror(err));
    }
    p += n;
    bytes -= size_t(n);
  }
}

void AtomicFile::finish() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  const bool synced = ::fsync(fd) == 0 || errno == EINVAL;  // EINVAL: a file system without fsync
  const int sync_err = errno;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    const int err = !synced ? sync_err : errno;
    discard();
    fail_runtime("writing '{}' failed: {} (nothing was written to it)", path_, std::strerror(err));
  }
}

void AtomicFile::commit() {
  if (committed_) return;
  if (tmp_.empty()) fail_runtime("'{}': commit after a failed write", path_);
  finish();
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    discard();
    fail_runtime("writing '{}' failed: renaming the finished temporary file onto it: {}", path_, std::strerror(err));
  }
  untrack_partial(tmp_.c_str());
  committed_ = true;
}

void FileSet::add(std::unique_ptr<AtomicFile> finished) {
  finished->finish();
  files_.push_back(std::move(finished));
}

void FileSet::commit() {
  for (auto& f : files_) f->commit();
  files_.clear();
}

void write_file_atomically(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

}  // namespace ringattn
