// The project's own .npy reader and writer (format versions 1.0 and 2.0, C order, little-endian
// <f4 and <f2: the descriptors of the dtype table, core/dtype.hpp). Anything else, and every malformed, truncated or lying file, ends in an
// InvalidArgument that names the file and what is wrong; never in a crash or a silent misread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/types.hpp"

#include "runner/io/atomic_file.hpp"

namespace ringattn {

struct NpyHeader {
  DType dtype = DType::F32;      // the table's dtype of the descr: F32 for '<f4', F16 for '<f2'
  int int_bytes = 0;             // 4 or 8 for an integer array ('<i4', '<i8'; see read_npy_int_vector)
  std::vector<int64_t> shape;    // C order
  uint64_t data_offset = 0;      // bytes before the first element
  int major = 1, minor = 0;      // format version

  int64_t numel() const;
  int itemsize() const { return int_bytes > 0 ? int_bytes : dtype_size(dtype); }
  std::string shape_string() const;  // "[2, 4, 128, 64]"
};

// Parses and validates the header found at the start of `data` (`available` bytes of it are
// readable) of a file of `file_size` bytes; `name` appears in error messages. Checks the magic,
// the version, the header dictionary (descr, fortran_order False, shape, no other keys) and that
// the file holds exactly the bytes the shape asks for.
// With `integers`, the array must be '<i4' or '<i8' instead (int_bytes set).
NpyHeader parse_npy_header(const void* data, size_t available, uint64_t file_size, const std::string& name,
                           bool integers = false);

// A one-dimensional '<i4' or '<i8' array (e.g. FlashAttention's cu_seqlens), read whole. Errors
// name the file and what is wrong (the shape, the dtype, a truncated file).
std::vector<int64_t> read_npy_int_vector(const std::string& path);

// Reads a file's header and validates it against the file's size.
NpyHeader read_npy_header(const std::string& path);

// Reads ranges of elements of one .npy file without loading all of it (each rank reads only its
// shard's rows).
class NpyReader {
 public:
  explicit NpyReader(const std::string& path);
  ~NpyReader();
  NpyReader(const NpyReader&) = delete;
  NpyReader& operator=(const NpyReader&) = delete;

  const NpyHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  // Reads elements [first, first + count) (flat C-order index) into `dst`, converted to `to`.
  void read(int64_t first, int64_t count, void* dst, DType to);

 private:
  std::string path_;
  NpyHeader header_;
  std::FILE* file_ = nullptr;
  std::vector<uint8_t> scratch_;
};

// A whole array in memory, in the file's dtype.
struct NpyArray {
  NpyHeader header;
  std::vector<uint8_t> bytes;
  float at(int64_t i) const { return load_as_float(bytes.data(), header.dtype, i); }
};
NpyArray load_npy(const std::string& path);

// Writes a .npy file sequentially: the header first, then exactly numel elements through
// write(); close() (or the destructor, which swallows errors) checks the count.
class NpyWriter {
 public:
  NpyWriter(const std::string& path, const std::vector<int64_t>& shape, DType dtype);
  ~NpyWriter();
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;
  // Appends `count` elements of the writer's dtype.
  void write(const void* data, int64_t count);
  // Checks that every element was written, then flushes and closes the temporary file.
  void finish();
  // finish(), then moves the file into place. Until then `path` is untouched; a writer destroyed
  // without close() leaves nothing behind (written whole or not at all, see atomic_file.hpp).
  void close();
  // finish(), then hands the finished file over (to a FileSet that moves it into place with the
  // run's other outputs); the writer is closed.
  std::unique_ptr<AtomicFile> release_finished();

 private:
  std::string path_;
  std::unique_ptr<AtomicFile> file_;
  DType dtype_;
  int64_t expected_ = 0, written_ = 0;
};

// Writes a whole array (dtype F32 -> '<f4', F16 -> '<f2'; BF16 has no .npy descr in the table and is refused).
void write_npy(const std::string& path, const std::vector<int64_t>& shape, DType dtype, const void* data);

// The header bytes (magic, version, length, dictionary padded to 64 bytes) for a shape and dtype.
std::vector<uint8_t> make_npy_header(const std::vector<int64_t>& shape, DType dtype);

}  // namespace ringattn
