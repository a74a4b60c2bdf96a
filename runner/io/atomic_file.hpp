// Files written whole or not at all: the bytes go to a temporary file beside the destination
// (same directory, so the final rename is atomic), which commit() flushes to disk, closes and
// renames over the destination. A destination that is a symbolic link is followed: the file it
// links to is replaced, never the link itself. Until then nothing at the destination changes; an AtomicFile
// destroyed without commit() removes its temporary file, and so does a SIGTERM, SIGINT or SIGHUP
// that ends the process before commit() (the handler removes every open temporary file, then
// passes the signal on to the handler that was there before).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace ringattn {

class AtomicFile {
 public:
  // Creates the temporary file; throws InvalidArgument naming `path` when it cannot (the
  // directory is missing or not writable, or `path` exists and is not a regular file).
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends `bytes`; throws RuntimeError naming the path on any failed or short write.
  void write(const void* data, size_t bytes);
  // Flushes the data to disk (fsync) and closes the temporary file, checking both.
  void finish();
  // finish(), then renames the temporary file over the destination.
  void commit();
  const std::string& path() const { return path_; }

 private:
  void discard() noexcept;
  std::string path_, target_, tmp_;  // target_: path_ with its links followed
  int fd_ = -1;
  bool committed_ = false;
};

// The files of one job that appear together or not at all: each is finished (its bytes on disk
// in its temporary file) when added; commit() moves them all into place, and a FileSet
// destroyed without commit() removes them all. (A rename that fails half-way through commit()
// leaves the files before it in place: renames in one directory do not fail in practice.)
class FileSet {
 public:
  void add(std::unique_ptr<AtomicFile> finished);
  void commit();
  bool empty() const { return files_.empty(); }

 private:
  std::vector<std::unique_ptr<AtomicFile>> files_;
};

// Why `path` cannot be an output file, "" when it can: its directory is missing, not a directory
// or not writable (a probe file is created there and removed: sysfs and procfs pass access(2)),
// or `path` is a directory or another non-regular file (a device: a rename would replace it).
// Checks `path` as given and the file its links end at.
std::string output_path_problem(const std::string& path);

// `path` with the symbolic links of its last component followed (dangling ones too): the file a
// write through `path` replaces. Its directories' links need no following: rename resolves them.
std::string resolve_output_path(const std::string& path);

// Writes `text` to `path` through an AtomicFile.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace ringattn
