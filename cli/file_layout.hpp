// How the .npy files of `run` (--q/--k/--v, --out, --lse, --do, --dq/--dk/--dv) hold a tensor of
// elements (batch b, head h, token t, dim d); the runtime itself always holds [batch, heads, len,
// dim]. The layout is only the map between the two: sharding, the ring and the check do not see it.
//   bhsd  [batch, heads, len, dim]  the runtime's own order (--layout bhsd, the default)
//   bshd  [batch, len, heads, dim]  what most frameworks hold (--layout bshd)
//   thd   [len, heads, dim]         the packed layout of varlen users (three-dimensional --q/--k/--v
//                                   with documents): bshd of a batch of one without the batch axis
// An LSE file is the same without the dim axis: [batch, heads, len], [batch, len, heads] or
// [len, heads].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runner/io/npy.hpp"

namespace ringattn::cli {

enum class FileLayout { Bhsd, Bshd, Thd };

// --layout's text: "bhsd" (or empty: not given, the default) or "bshd". Throws InvalidArgument
// naming the text and the allowed values.
FileLayout parse_file_layout(const std::string& text);
// Why `text` is no --layout ("'x' is not a layout: allowed are ..."), for CLI11's check.
std::string bad_layout_message(const std::string& text);

// "bhsd", "bshd", "thd".
const char* file_layout_name(FileLayout l);
// How a message names the layout: "--layout bshd", or "the packed thd layout".
std::string layout_phrase(FileLayout l);

// The shape of a [B, H, T, D] tensor in a file of layout `l`; D = 0: an LSE's [B, H, T] (no dim
// axis). thd needs B = 1.
std::vector<int64_t> file_shape(FileLayout l, int64_t B, int64_t H, int64_t T, int64_t D = 0);
// The axes of such a file in words, e.g. "[batch, q_len, heads, dim]" (`heads`, `len`: what to
// call those two axes).
std::string file_axes(FileLayout l, const std::string& heads, const std::string& len);
// "[1, 2, 3]".
std::string shape_text(const std::vector<int64_t>& shape);

// A tensor's sizes in the problem's terms.
struct FileDims {
  int64_t batch = 0, heads = 0, len = 0, dim = 0;
};
// The sizes held by the file `path` of `flag` with header `h`, read in layout `l`; throws
// InvalidArgument naming the flag, the file, the axes expected (`heads`, `len`: their names) and
// the shape it holds when the number of dimensions is not the layout's or a dimension is < 1.
FileDims file_dims(const NpyHeader& h, FileLayout l, const char* flag, const std::string& path,
                   const std::string& heads, const std::string& len);

// The flat index of element (b, h, t, 0) in a file of layout `l` holding H heads of T tokens of D
// values each (D = 1 for an LSE), and the distance between tokens t and t + 1 of one head.
int64_t row_offset(FileLayout l, int64_t b, int64_t h, int64_t t, int64_t H, int64_t T, int64_t D);
inline int64_t token_stride(FileLayout l, int64_t H, int64_t D) { return l == FileLayout::Bhsd ? D : H * D; }

// A contiguous [B, H, T, W] tensor in the element order of a file of layout `l` (a copy; bhsd
// keeps the order). W = 1: an LSE.
std::vector<float> to_file_order(FileLayout l, const float* x, int64_t B, int64_t H, int64_t T, int64_t W);

}  // namespace ringattn::cli
