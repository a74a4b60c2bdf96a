#include "runner/io/npy.hpp"

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.hpp"

namespace ringattn {

static_assert(std::endian::native == std::endian::little, "the .npy I/O assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// No real array has more dimensions than numpy's own limit.
constexpr size_t kMaxDims = 64;
// Beyond 2^40 elements per dimension a shape is a lie, not a file; keeps the products in range.
constexpr int64_t kMaxDim = int64_t(1) << 40;

// A tiny parser for the Python literal numpy writes as the header:
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// Only strings, True/False and tuples of non-negative integers are accepted.
class DictParser {
 public:
  DictParser(const std::string& text, const std::string& name) : s_(text), name_(name) {}

  void parse(std::string& descr, bool& fortran, std::vector<int64_t>& shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_ws();
    expect('{');
    skip_ws();
    while (peek() != '}') {
      const std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (have_descr) bad("the key 'descr' appears twice");
        descr = parse_string();
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_fortran) bad("the key 'fortran_order' appears twice");
        fortran = parse_bool();
        have_fortran = true;
      } else if (key == "shape") {
        if (have_shape) bad("the key 'shape' appears twice");
        shape = parse_shape();
        have_shape = true;
      } else {
        bad(fmt::format("unexpected key '{}' (allowed: descr, fortran_order, shape)", key));
      }
      skip_ws();
      if (peek() == ',') {
        ++i_;
        skip_ws();
      } else if (peek() != '}') {
        bad("expected ',' or '}' after a value");
      }
    }
    ++i_;
    skip_ws();
    if (i_ != s_.size()) bad("text after the closing '}'");
    if (!have_descr) bad("the key 'descr' is missing");
    if (!have_fortran) bad("the key 'fortran_order' is missing");
    if (!have_shape) bad("the key 'shape' is missing");
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail_arg("{}: malformed .npy header dictionary at character {}: {}", name_, i_, what);
  }
  char peek() const {
    if (i_ >= s_.size()) bad("the dictionary ends early");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) bad(fmt::format("expected '{}'", c));
    ++i_;
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  std::string parse_string() {
    const char q = peek();
    if (q != '\'' && q != '"') bad("expected a quoted string");
    ++i_;
    std::string out;
    while (peek() != q) {
      if (s_[i_] == '\\') bad("escapes are not supported in header strings");
      out += s_[i_++];
    }
    ++i_;
    return out;
  }
  bool parse_bool() {
    if (s_.compare(i_, 4, "True") == 0) {
      i_ += 4;
      return true;
    }
    if (s_.compare(i_, 5, "False") == 0) {
      i_ += 5;
      return false;
    }
    bad("expected True or False");
  }
  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    expect('(');
    skip_ws();
    while (peek() != ')') {
      if (peek() < '0' || peek() > '9') bad("shape entries must be non-negative integers");
      int64_t v = 0;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
        v = v * 10 + (s_[i_++] - '0');
        if (v > kMaxDim) bad(fmt::format("a shape entry exceeds {}", kMaxDim));
      }
      if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2 long literal
      shape.push_back(v);
      if (shape.size() > kMaxDims) bad(fmt::format("more than {} dimensions", kMaxDims));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        skip_ws();
      } else if (peek() != ')') {
        bad("expected ',' or ')' in the shape");
      }
    }
    ++i_;
    return shape;
  }

  const std::string& s_;
  const std::string& name_;
  size_t i_ = 0;
};

// The table's dtypes that .npy has, "'<f4' (float32) and '<f2' (float16)" (`spell` writes one,
// `last` joins the last two, ", " the others).
template <typename F>
std::string npy_list(const char* last, F&& spell) {
  std::vector<std::string> items;
  for (const DTypeInfo& d : kDTypes)
    if (d.npy_descr != nullptr) items.push_back(spell(d));
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i == 0 ? "" : i + 1 == items.size() ? last : ", ") + items[i];
  return s;
}

std::string descr_of(DType t) {
  if (const char* d = dtype_info(t).npy_descr) return d;
  fail_arg("{} has no .npy type; write {} instead", dtype_name(t),
           npy_list(" or ", [](const DTypeInfo& d) { return std::string(d.name); }));
}

// The dtype of a float .npy descr; InvalidArgument naming the file, the descr and the allowed ones.
DType dtype_of_descr(const std::string& descr, const std::string& name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.npy_descr == nullptr) continue;
    if (descr == d.npy_descr) return d.id;
    std::string big_endian = d.npy_descr;
    big_endian[0] = '>';
    if (descr == big_endian)
      fail_arg("{}: big-endian data ('{}') is not supported; save it little-endian ({})", name, descr,
               npy_list(" or ", [](const DTypeInfo& e) { return fmt::format("'{}'", e.npy_descr); }));
  }
  fail_arg("{}: dtype '{}' is not supported: allowed are {}", name, descr,
           npy_list(" and ", [](const DTypeInfo& e) { return fmt::format("'{}' ({})", e.npy_descr, e.full_name); }));
}

std::FILE* open_or_fail(const std::string& path, const char* mode, const char* what) {
  std::FILE* f = std::fopen(path.c_str(), mode);
  if (!f) fail_arg("cannot open '{}' for {}: {}", path, what, std::strerror(errno));
  return f;
}

}  // namespace

int64_t NpyHeader::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string NpyHeader::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

NpyHeader parse_npy_header(const void* data, size_t available, uint64_t file_size, const std::string& name,
                           bool integers) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (available > file_size) available = size_t(file_size);
  if (available < kMagicLen + 2 || std::memcmp(p, kMagic, kMagicLen) != 0)
    fail_arg("{}: not a .npy file (the file does not start with the magic \\x93NUMPY)", name);
  NpyHeader h;
  h.major = p[6];
  h.minor = p[7];
  size_t prefix = 0, dict_len = 0;
  if (h.major == 1) {
    if (available < 10) fail_arg("{}: truncated .npy header ({} bytes)", name, available);
    prefix = 10;
    dict_len = size_t(p[8]) | size_t(p[9]) << 8;
  } else if (h.major == 2) {
    if (available < 12) fail_arg("{}: truncated .npy header ({} bytes)", name, available);
    prefix = 12;
    dict_len = size_t(p[8]) | size_t(p[9]) << 8 | size_t(p[10]) << 16 | size_t(p[11]) << 24;
  } else {
    fail_arg("{}: .npy format version {}.{} is not supported (allowed: 1.0, 2.0)", name, h.major, h.minor);
  }
  if (h.minor != 0)
    fail_arg("{}: .npy format version {}.{} is not supported (allowed: 1.0, 2.0)", name, h.major, h.minor);
  if (dict_len > available - prefix)
    fail_arg("{}: truncated .npy header: it announces {} bytes of dictionary but the file has {} after the prefix",
             name, dict_len, available - prefix);
  const std::string dict(reinterpret_cast<const char*>(p + prefix), dict_len);
  std::string descr;
  bool fortran = false;
  DictParser(dict, name).parse(descr, fortran, h.shape);

  if (integers) {
    if (descr == "<i4" || descr == "<i8")
      h.int_bytes = descr == "<i4" ? 4 : 8;
    else
      fail_arg("{}: dtype '{}' is not supported here: allowed are '<i4' (int32) and '<i8' (int64)", name, descr);
  } else {
    h.dtype = dtype_of_descr(descr, name);
  }
  if (fortran) fail_arg("{}: fortran_order is True; only C-order arrays are supported (use np.ascontiguousarray)", name);

  h.data_offset = prefix + dict_len;
  // Each dimension is <= 2^40 and there are at most 64, so check the running product as it goes.
  uint64_t bytes = uint64_t(h.itemsize());
  for (int64_t d : h.shape) {
    if (d != 0 && bytes > std::numeric_limits<uint64_t>::max() / uint64_t(d))
      fail_arg("{}: shape {} is too large to be real", name, h.shape_string());
    bytes *= uint64_t(d);
  }
  const uint64_t expected = h.data_offset + bytes;
  if (bytes > file_size || expected != file_size)
    fail_arg("{}: shape {} of {} needs {} bytes of data after a {}-byte header ({} in all) but the file has {} bytes",
             name, h.shape_string(), descr, bytes, h.data_offset, expected, file_size);
  return h;
}

std::vector<int64_t> read_npy_int_vector(const std::string& path) {
  std::FILE* f = open_or_fail(path, "rb", "reading");
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) {
    bytes.insert(bytes.end(), buf, buf + n);
    if (bytes.size() > (size_t(1) << 30)) {
      std::fclose(f);
      fail_arg("{}: more than 1 GiB; an integer vector here is far smaller", path);
    }
  }
  std::fclose(f);
  const NpyHeader h = parse_npy_header(bytes.data(), bytes.size(), bytes.size(), path, true);
  if (h.shape.size() != 1) fail_arg("{}: shape {} is not one-dimensional", path, h.shape_string());
  std::vector<int64_t> v(size_t(h.shape[0]));
  for (size_t i = 0; i < v.size(); ++i) {
    const uint8_t* e = bytes.data() + h.data_offset + i * size_t(h.int_bytes);
    if (h.int_bytes == 4) {
      int32_t x;
      std::memcpy(&x, e, 4);
      v[i] = x;
    } else {
      std::memcpy(&v[i], e, 8);
    }
  }
  return v;
}

NpyHeader read_npy_header(const std::string& path) {
  NpyReader r(path);
  return r.header();
}

NpyReader::NpyReader(const std::string& path) : path_(path) {
  file_ = open_or_fail(path, "rb", "reading");
  try {
    if (std::fseek(file_, 0, SEEK_END) != 0) fail_arg("cannot seek in '{}'", path);
    const long size = std::ftell(file_);
    if (size < 0) fail_arg("cannot tell the size of '{}'", path);
    std::rewind(file_);
    // Version 2 headers may hold up to 4 GiB of dictionary; read the prefix first, then as much as
    // it announces (bounded by the file's size).
    uint8_t prefix[12] = {0};
    const size_t got = std::fread(prefix, 1, sizeof(prefix), file_);
    size_t dict_len = 0, prefix_len = 0;
    if (got >= 10 && prefix[6] == 1) {
      dict_len = size_t(prefix[8]) | size_t(prefix[9]) << 8;
      prefix_len = 10;
    } else if (got >= 12 && prefix[6] == 2) {
      dict_len = size_t(prefix[8]) | size_t(prefix[9]) << 8 | size_t(prefix[10]) << 16 | size_t(prefix[11]) << 24;
      prefix_len = 12;
    }
    const size_t want = std::min<uint64_t>(uint64_t(size), prefix_len + dict_len);
    std::vector<uint8_t> head(std::max(want, got));
    std::rewind(file_);
    const size_t n = std::fread(head.data(), 1, head.size(), file_);
    header_ = parse_npy_header(head.data(), n, uint64_t(size), path);
  } catch (...) {
    std::fclose(file_);
    file_ = nullptr;
    throw;
  }
}

NpyReader::~NpyReader() {
  if (file_) std::fclose(file_);
}

void NpyReader::read(int64_t first, int64_t count, void* dst, DType to) {
  if (first < 0 || count < 0 || first + count > header_.numel())
    fail_arg("{}: elements [{}, {}) are outside the array of {} elements", path_, first, first + count, header_.numel());
  if (count == 0) return;
  const int isz = header_.itemsize();
  const uint64_t off = header_.data_offset + uint64_t(first) * uint64_t(isz);
  if (std::fseek(file_, long(off), SEEK_SET) != 0) fail_runtime("{}: cannot seek to byte {}", path_, off);
  const bool same = to == header_.dtype;
  const size_t bytes = size_t(count) * size_t(isz);
  void* target = dst;
  if (!same) {
    scratch_.resize(bytes);
    target = scratch_.data();
  }
  if (std::fread(target, 1, bytes, file_) != bytes)
    fail_arg("{}: the file ended while reading {} bytes at offset {} (truncated?)", path_, bytes, off);
  if (!same)
    for (int64_t i = 0; i < count; ++i) store_from_float(dst, to, i, load_as_float(target, header_.dtype, i));
}

NpyArray load_npy(const std::string& path) {
  NpyReader r(path);
  NpyArray a;
  a.header = r.header();
  a.bytes.resize(size_t(a.header.numel()) * size_t(a.header.itemsize()));
  r.read(0, a.header.numel(), a.bytes.data(), a.header.dtype);
  return a;
}

std::vector<uint8_t> make_npy_header(const std::vector<int64_t>& shape, DType dtype) {
  std::string shape_text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) fail_arg("npy: negative dimension {} in a shape", shape[i]);
    shape_text += std::to_string(shape[i]) + (shape.size() == 1 ? "," : i + 1 < shape.size() ? ", " : "");
  }
  shape_text += ")";
  std::string dict = "{'descr': '" + descr_of(dtype) + "', 'fortran_order': False, 'shape': " + shape_text + ", }";
  // Pad with spaces and a final newline so the data starts on a 64-byte boundary (as numpy does).
  size_t prefix = 10;
  if (dict.size() + 1 + 10 > 65535) prefix = 12;
  const size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';
  std::vector<uint8_t> out(kMagic, kMagic + kMagicLen);
  out.push_back(prefix == 10 ? 1 : 2);
  out.push_back(0);
  const size_t n = dict.size();
  out.push_back(uint8_t(n & 0xff));
  out.push_back(uint8_t((n >> 8) & 0xff));
  if (prefix == 12) {
    out.push_back(uint8_t((n >> 16) & 0xff));
    out.push_back(uint8_t((n >> 24) & 0xff));
  }
  out.insert(out.end(), dict.begin(), dict.end());
  return out;
}

NpyWriter::NpyWriter(const std::string& path, const std::vector<int64_t>& shape, DType dtype)
    : path_(path), dtype_(dtype) {
  const auto head = make_npy_header(shape, dtype);  // validates the dtype before creating a file
  expected_ = 1;
  for (int64_t d : shape) expected_ *= d;
  file_ = std::make_unique<AtomicFile>(path);
  file_->write(head.data(), head.size());
}

void NpyWriter::write(const void* data, int64_t count) {
  if (!file_) fail_runtime("{}: write after close", path_);
  if (written_ + count > expected_)
    fail_runtime("{}: {} elements written but the shape holds {}", path_, written_ + count, expected_);
  if (count == 0) return;  // an empty array may come with a null pointer
  file_->write(data, size_t(count) * size_t(dtype_size(dtype_)));
  written_ += count;
}

void NpyWriter::finish() {
  if (!file_) fail_runtime("{}: finish after close", path_);
  if (written_ != expected_) fail_runtime("{}: {} elements written but the shape holds {}", path_, written_, expected_);
  file_->finish();
}

void NpyWriter::close() {
  if (!file_) return;
  finish();
  file_->commit();
  file_.reset();
}

std::unique_ptr<AtomicFile> NpyWriter::release_finished() {
  finish();
  return std::move(file_);
}

NpyWriter::~NpyWriter() = default;

void write_npy(const std::string& path, const std::vector<int64_t>& shape, DType dtype, const void* data) {
  NpyWriter w(path, shape, dtype);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  w.write(data, n);
  w.close();
}

}  // namespace ringattn
