#include "cli/file_layout.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"

namespace ringattn::cli {

std::string bad_layout_message(const std::string& text) {
  return fmt::format("'{}' is not a layout: allowed are bhsd ([batch, heads, seq, dim], the default) and "
                     "bshd ([batch, seq, heads, dim])", text);
}

FileLayout parse_file_layout(const std::string& text) {
  if (text.empty() || text == "bhsd") return FileLayout::Bhsd;
  if (text == "bshd") return FileLayout::Bshd;
  throw InvalidArgument("--layout " + bad_layout_message(text));
}

const char* file_layout_name(FileLayout l) {
  switch (l) {
    case FileLayout::Bhsd: return "bhsd";
    case FileLayout::Bshd: return "bshd";
    case FileLayout::Thd: return "thd";
  }
  return "?";
}

std::string layout_phrase(FileLayout l) {
  return l == FileLayout::Thd ? std::string("the packed thd layout") : fmt::format("--layout {}", file_layout_name(l));
}

std::vector<int64_t> file_shape(FileLayout l, int64_t B, int64_t H, int64_t T, int64_t D) {
  std::vector<int64_t> s;
  switch (l) {
    case FileLayout::Bhsd: s = {B, H, T}; break;
    case FileLayout::Bshd: s = {B, T, H}; break;
    case FileLayout::Thd: s = {T, H}; break;
  }
  if (D > 0) s.push_back(D);
  return s;
}

std::string file_axes(FileLayout l, const std::string& heads, const std::string& len) {
  switch (l) {
    case FileLayout::Bhsd: return fmt::format("[batch, {}, {}, dim]", heads, len);
    case FileLayout::Bshd: return fmt::format("[batch, {}, {}, dim]", len, heads);
    case FileLayout::Thd: return fmt::format("[{}, {}, dim]", len, heads);
  }
  return "?";
}

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

FileDims file_dims(const NpyHeader& h, FileLayout l, const char* flag, const std::string& path,
                   const std::string& heads, const std::string& len) {
  const size_t rank = l == FileLayout::Thd ? 3 : 4;
  if (h.shape.size() != rank)
    fail_arg("{} {}: expected {} dimensions {} ({}) but the file holds shape {}", flag, path, rank,
             file_axes(l, heads, len), layout_phrase(l), h.shape_string());
  for (int64_t d : h.shape)
    if (d < 1) fail_arg("{} {}: every dimension must be >= 1, the file holds shape {}", flag, path, h.shape_string());
  const std::vector<int64_t>& s = h.shape;
  switch (l) {
    case FileLayout::Bhsd: return {s[0], s[1], s[2], s[3]};
    case FileLayout::Bshd: return {s[0], s[2], s[1], s[3]};
    case FileLayout::Thd: return {1, s[1], s[0], s[2]};
  }
  return {};
}

int64_t row_offset(FileLayout l, int64_t b, int64_t h, int64_t t, int64_t H, int64_t T, int64_t D) {
  return l == FileLayout::Bhsd ? ((b * H + h) * T + t) * D : ((b * T + t) * H + h) * D;
}

std::vector<float> to_file_order(FileLayout l, const float* x, int64_t B, int64_t H, int64_t T, int64_t W) {
  std::vector<float> y(size_t(B * H * T * W));
  if (l == FileLayout::Bhsd) {
    std::copy_n(x, y.size(), y.data());
    return y;
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        std::copy_n(x + ((b * H + h) * T + t) * W, W, y.data() + row_offset(l, b, h, t, H, T, W));
  return y;
}

}  // namespace ringattn::cli
