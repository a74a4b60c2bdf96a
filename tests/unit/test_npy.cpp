// The .npy reader and writer: round trips of every supported dtype and shape, numpy's own header
// text, and bad files (wrong magic, version, dtype, order, lying shapes, truncations) that must
// end in InvalidArgument, never a crash or a silent misread.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "common/test_util.hpp"
#include "core/error.hpp"
#include "runner/io/npy.hpp"

namespace ringattn {
namespace {

// A fresh file name per test (tests run in parallel under ctest).
std::string temp_path(const std::string& tag) {
  static int counter = 0;
  return (std::filesystem::temp_directory_path() /
          ("ringattn_npy_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".npy"))
      .string();
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A version 1.0 file with a hand-written dictionary and `data_bytes` bytes of payload.
std::vector<uint8_t> handmade(const std::string& dict, size_t data_bytes, uint8_t major = 1) {
  std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', major, 0};
  const size_t n = dict.size();
  b.push_back(uint8_t(n & 0xff));
  b.push_back(uint8_t(n >> 8));
  if (major == 2) {
    b.push_back(0);
    b.push_back(0);
  }
  b.insert(b.end(), dict.begin(), dict.end());
  b.resize(b.size() + data_bytes, 0x3f);
  return b;
}

TEST(Npy, RoundTripF4AndF2) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const std::vector<std::vector<int64_t>> shapes = {{7}, {3, 5}, {2, 3, 17, 64}, {1, 1, 1, 1}, {2, 4, 9}, {}};
  for (DType dt : {DType::F32, DType::F16})
    for (const auto& shape : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<uint8_t> data(size_t(n * dtype_size(dt)));
      std::normal_distribution<float> nd(0.f, 3.f);
      for (int64_t i = 0; i < n; ++i) store_from_float(data.data(), dt, i, nd(rng));
      const std::string path = temp_path("rt");
      write_npy(path, shape, dt, data.data());
      const NpyArray a = load_npy(path);
      EXPECT_EQ(a.header.shape, shape) << "seed " << seed;
      EXPECT_EQ(a.header.dtype, dt);
      EXPECT_EQ(a.header.data_offset % 64, 0u) << "numpy aligns the data to 64 bytes";
      EXPECT_EQ(a.bytes, data) << "seed " << seed << " dtype " << dtype_name(dt) << " shape " << a.header.shape_string();
      // Partial reads convert on the way.
      if (n >= 3) {
        NpyReader r(path);
        float three[3] = {NAN, NAN, NAN};
        r.read(n - 3, 3, three, DType::F32);
        for (int i = 0; i < 3; ++i) EXPECT_EQ(three[i], load_as_float(data.data(), dt, n - 3 + i));
      }
      std::remove(path.c_str());
    }
}

TEST(Npy, ReadsNumpyHeadersAsNumpyWritesThem) {
  // Exactly what numpy 1.x writes for np.zeros((2, 3), np.float32), plus variations numpy accepts.
  const std::vector<std::string> dicts = {
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + std::string(59, ' ') + "\n",
      "{\"shape\": (2,3), \"descr\": \"<f4\", \"fortran_order\": False}\n",
      "{'fortran_order': False, 'shape': (2L, 3L), 'descr': '<f4'}",
  };
  for (const auto& d : dicts) {
    const std::string path = temp_path("np");
    write_bytes(path, handmade(d, 24));
    const NpyHeader h = read_npy_header(path);
    EXPECT_EQ(h.shape, (std::vector<int64_t>{2, 3})) << d;
    EXPECT_EQ(h.dtype, DType::F32);
    std::remove(path.c_str());
  }
  const std::string path = temp_path("v2");
  write_bytes(path, handmade("{'descr': '<f2', 'fortran_order': False, 'shape': (5,), }\n", 10, 2));
  const NpyHeader h = read_npy_header(path);
  EXPECT_EQ(h.major, 2);
  EXPECT_EQ(h.dtype, DType::F16);
  EXPECT_EQ(h.shape, std::vector<int64_t>{5});
  std::remove(path.c_str());
}

// The dtype messages, whole: their lists come from the dtype table.
TEST(Npy, DtypeMessagesNameTheTablesDescriptors) {
  auto message = [](const std::string& dict) {
    const std::string path = temp_path("descr");
    write_bytes(path, handmade(dict, 48));
    std::string m = "(no error)";
    try {
      read_npy_header(path);
    } catch (const InvalidArgument& e) {
      m = e.what();
    }
    std::remove(path.c_str());
    return m.substr(m.find(": ") + 2);  // after the file name
  };
  EXPECT_EQ(message("{'descr': '>f2', 'fortran_order': False, 'shape': (2, 3), }\n"),
            "big-endian data ('>f2') is not supported; save it little-endian ('<f4' or '<f2')");
  EXPECT_EQ(message("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }\n"),
            "dtype '<f8' is not supported: allowed are '<f4' (float32) and '<f2' (float16)");
  const std::string path = temp_path("bf16");
  const uint16_t x[2] = {0, 0};
  try {
    write_npy(path, {2}, DType::BF16, x);
    ADD_FAILURE() << "wrote bf16";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "bf16 has no .npy type; write fp32 or fp16 instead");
  }
  std::remove(path.c_str());
}

// Each bad file, and the words its message must contain.
TEST(Npy, BadFilesGiveNamedErrors) {
  struct Case {
    std::vector<uint8_t> bytes;
    std::string expect;
  };
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
  std::vector<Case> cases = {
      {{}, "not a .npy file"},
      {{'P', 'K', 3, 4, 0, 0, 0, 0, 0, 0}, "not a .npy file"},
      {handmade(ok, 24, 3), "version 3.0"},
      {handmade("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }\n", 48), "'<i8' is not supported"},
      {handmade("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24), "big-endian"},
      {handmade("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", 24), "fortran_order"},
      {handmade(ok, 23), "needs 24 bytes"},                        // truncated data
      {handmade(ok, 25), "needs 24 bytes"},                        // trailing bytes
      {handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (2000000, 3000000), }\n", 24), "needs"},
      {handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }\n", 24), "non-negative"},
      {handmade("{'descr': '<f4', 'fortran_order': False}\n", 24), "'shape' is missing"},
      {handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}\n", 24), "unexpected key 'x'"},
      {handmade("{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3)}\n", 24), "expected ','"},
      {handmade("[1, 2]", 24), "expected '{'"},
      {handmade("{'descr': '<f4', 'shape': (99999999999999999999,), 'fortran_order': False}", 24), "exceeds"},
  };
  // A header that announces more dictionary than the file has.
  auto announced = handmade(ok, 0);
  announced[8] = 0xff;
  announced[9] = 0x7f;
  cases.push_back({announced, "truncated .npy header"});
  for (const Case& c : cases) {
    const std::string path = temp_path("bad");
    write_bytes(path, c.bytes);
    try {
      read_npy_header(path);
      ADD_FAILURE() << "accepted a bad file, expected an error containing '" << c.expect << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << "the message names the file: " << e.what();
    }
    std::remove(path.c_str());
  }
  EXPECT_THROW(read_npy_header("/nonexistent/dir/x.npy"), InvalidArgument);
  EXPECT_THROW(write_npy(temp_path("bf"), {2}, DType::BF16, nullptr), InvalidArgument);
}

// Random damage to valid files: every outcome is either a clean InvalidArgument or a header
// that is consistent with the file's size (and then reading all of it works).
TEST(Npy, FuzzedFilesNeverCrash) {
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  const std::string path = temp_path("fuzz");
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 600; ++iter) {
    std::vector<int64_t> shape;
    const int nd = int(rng() % 5);
    for (int i = 0; i < nd; ++i) shape.push_back(int64_t(rng() % 6));
    const DType dt = rng() % 2 ? DType::F32 : DType::F16;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<uint8_t> data(size_t(n * dtype_size(dt)), 0x41);
    write_npy(path, shape, dt, data.data());
    std::vector<uint8_t> b = read_bytes(path);
    switch (iter % 4) {
      case 0:  // flip random bytes, header included
        for (int k = 0, m = 1 + int(rng() % 4); k < m && !b.empty(); ++k) b[rng() % b.size()] ^= uint8_t(1 + rng() % 255);
        break;
      case 1:  // truncate anywhere
        b.resize(b.empty() ? 0 : rng() % b.size());
        break;
      case 2: {  // rewrite one character of the dictionary with a random printable one
        const size_t i = 10 + rng() % (b.size() > 10 ? std::min<size_t>(b.size() - 10, 70) : 1);
        if (i < b.size()) b[i] = uint8_t(32 + rng() % 95);
        break;
      }
      case 3:  // random bytes after a valid magic
        b.resize(8 + rng() % 200);
        for (size_t i = 6; i < b.size(); ++i) b[i] = uint8_t(rng());
        break;
    }
    write_bytes(path, b);
    try {
      const NpyArray a = load_npy(path);
      EXPECT_EQ(uint64_t(a.header.data_offset) + a.bytes.size(), b.size()) << "seed " << seed << " iter " << iter;
      ++accepted;
    } catch (const InvalidArgument&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << seed << " iter " << iter << ": unexpected exception type: " << e.what();
    }
  }
  std::remove(path.c_str());
  EXPECT_GT(rejected, 100) << "seed " << seed;
  RecordProperty("accepted", accepted);
}

}  // namespace
}  // namespace ringattn
