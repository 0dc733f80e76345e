// safetensors: bit-exact round trips, the bytes laid out as the format and Hugging Face's writer
// lay them, slices, conversions, sharded folders with their index, every kind of damaged input
// refused with a message that names the file and the tensor, and files exchanged with Hugging
// Face's own `safetensors` package when Python has it.
#include "tutti/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "io/io_test_util.h"
#include "io/safetensors_header.h"

namespace tutti::io {
namespace {

namespace fs = std::filesystem;
using namespace tutti::testing;

void write_file(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
void write_text(const std::string& path, const std::string& s) { write_file(path, Bytes(s.begin(), s.end())); }

// A file as the format lays it out: the header's length, the header, the buffer.
Bytes raw_file(const std::string& header, const Bytes& buffer = {}) {
  Bytes b;
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<unsigned char>(n >> (8 * i)));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), buffer.begin(), buffer.end());
  return b;
}

Bytes bytes_of(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  return Bytes(p, p + t.nbytes());
}

template <typename E = InvalidArgument, typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "nothing was thrown";
  return "";
}

// Opening `header` + `buffer` as a file throws InvalidArgument whose message has every one of
// `parts` and the file's path.
void expect_refused(const std::string& header, const Bytes& buffer, const std::vector<std::string>& parts) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_file(path, raw_file(header, buffer));
  const std::string msg = error_message([&] { SafetensorsFile f(path); });
  EXPECT_NE(msg.find("'" + path + "'"), std::string::npos) << msg;
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

// Values exact in every dtype (small integers), element i of tensor k.
float value(std::int64_t i, int k) { return static_cast<float>((i * 7 + k) % 13 - 6); }
Tensor pattern(const Shape& shape, DType dtype, int k) {
  const std::int64_t n = numel_of(shape);
  if (dtype == DType::i32 || dtype == DType::i64) {
    std::vector<std::int64_t> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(value(i, k));
    return Tensor::from_ints(v, shape, dtype);
  }
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = value(i, k);
  return Tensor::from_floats(v, shape, dtype);
}

const std::vector<DType> kDtypes = {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64};

// ---- round trips and layout ----------------------------------------------------------------

TEST(Safetensors, RoundTripIsBitExactForEveryDtypeAndShape) {
  TempDir dir;
  const std::vector<Shape> shapes = {{}, {1}, {0}, {3, 0, 2}, {7, 13}, {1000, 37}, {2, 3, 4, 5, 1}};
  NamedTensors tensors;
  std::uint32_t seed = 1;
  for (DType dtype : kDtypes) {
    for (const Shape& shape : shapes) {
      tensors.emplace_back(std::string(name_of(dtype)) + "." + shape_str(shape), random_bits(shape, dtype, seed++));
    }
  }
  const Metadata metadata = {
      {"format", "pt"}, {"model", "gpt-tiny"}, {"", "empty key"}, {"unicode", "\xc3\xa9t\xc3\xa9"}};
  const std::string path = dir.file("all.safetensors");
  save_safetensors(path, tensors, metadata);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"all.safetensors"});  // no temporary left

  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(), metadata);
  EXPECT_EQ(f.data_start() % 8, 0u);
  ASSERT_EQ(f.entries().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const SafetensorsEntry& e = f.entry(name);
    EXPECT_EQ(e.shape, t.shape()) << name;
    EXPECT_EQ(e.tutti_dtype, t.dtype()) << name;
    EXPECT_EQ(e.nbytes(), t.nbytes()) << name;
    EXPECT_EQ((f.data_start() + e.begin) % size_of(t.dtype()), 0u) << name << ": not aligned to its element size";
    const Tensor got = f.read(name);
    EXPECT_TRUE(got.device().is_cpu());
    EXPECT_TRUE(same_bits(got, t)) << name;
  }
  const StateDict all = f.read_all();
  ASSERT_EQ(all.size(), tensors.size());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(same_bits(all.at(name), t)) << name;

  // Saving again replaces the file whole.
  save_safetensors(path, {{"only", pattern({2}, DType::f32, 0)}});
  SafetensorsFile again(path);
  EXPECT_EQ(again.entries().size(), 1u);
  EXPECT_TRUE(again.metadata().empty());
}

TEST(Safetensors, LayoutIsByteExactAgainstAHandBuiltHeader) {
  TempDir dir;
  const Tensor b = pattern({3}, DType::f16, 1);
  const Tensor a = pattern({2}, DType::f32, 2);
  const Tensor c = pattern({}, DType::i64, 3);
  const Tensor e = pattern({0, 3}, DType::bf16, 4);
  const std::string path = dir.file("layout.safetensors");
  // Given in this order; the buffer holds them by element size, largest first, stable.
  save_safetensors(path, {{"b", b}, {"e", e}, {"a", a}, {"c", c}}, {{"format", "pt"}});
  std::string header = R"({"__metadata__":{"format":"pt"},)"
                       R"("c":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                       R"("b":{"dtype":"F16","shape":[3],"data_offsets":[16,22]},)"
                       R"("e":{"dtype":"BF16","shape":[0,3],"data_offsets":[22,22]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  ASSERT_EQ(header.size() % 8, 0u);
  Bytes buffer = bytes_of(c);
  for (const Tensor* t : {&a, &b}) {
    const Bytes more = bytes_of(*t);
    buffer.insert(buffer.end(), more.begin(), more.end());
  }
  EXPECT_EQ(read_file(path), raw_file(header, buffer));
}

TEST(Safetensors, NoTensorsIsTheFormatsEmptyFile) {
  TempDir dir;
  const std::string path = dir.file("empty.safetensors");
  save_safetensors(path, {});
  // What Hugging Face's writer writes for no tensors: "{}" padded to 8 bytes.
  EXPECT_EQ(read_file(path), raw_file("{}      "));
  SafetensorsFile f(path);
  EXPECT_TRUE(f.entries().empty());
}

TEST(Safetensors, ReadsHeadersAsOtherWritersLayThemOut) {
  // Entries in any order, spaces, a null __metadata__, fields the format may add later.
  TempDir dir;
  const std::string path = dir.file("other.safetensors");
  const Tensor x = pattern({2, 2}, DType::f32, 5);
  const Tensor y = pattern({3}, DType::i32, 6);
  Bytes buffer = bytes_of(y);
  const Bytes xb = bytes_of(x);
  buffer.insert(buffer.end(), xb.begin(), xb.end());
  write_file(path, raw_file(R"( { "x" : {"shape":[2,2], "data_offsets":[12,28], "dtype":"F32", "extra": {"k": 1}},
      "__metadata__": null, "y": {"dtype":"I32","shape":[3],"data_offsets":[0,12]} }    )",
                            buffer));
  SafetensorsFile f(path);
  ASSERT_EQ(f.entries().size(), 2u);
  EXPECT_EQ(f.entries()[0].name, "y");  // buffer order
  EXPECT_TRUE(same_bits(f.read("x"), x));
  EXPECT_TRUE(same_bits(f.read("y"), y));
  EXPECT_TRUE(f.metadata().empty());
}

// ---- reading: slices, conversions, dtypes tutti does not hold ------------------------------------

TEST(Safetensors, ReadsARangeOfElementsWithoutTheWhole) {
  TempDir dir;
  const Tensor w = random_bits({100, 37}, DType::f32, 7);
  const Tensor h = random_bits({50, 3}, DType::bf16, 8);
  const std::string path = dir.file("slice.safetensors");
  save_safetensors(path, {{"w", w}, {"h", h}});
  SafetensorsFile f(path);
  const std::int64_t live_before = Storage::live_bytes(Device::cpu());
  const Tensor part = f.read_elements("w", 123, 500);
  // Only the slice was allocated, not the tensor.
  EXPECT_EQ(Storage::live_bytes(Device::cpu()) - live_before, static_cast<std::int64_t>(part.nbytes()));
  EXPECT_EQ(part.shape(), Shape({500}));
  EXPECT_TRUE(same_bits(part, w.flatten().view(123, {500})));
  EXPECT_TRUE(same_bits(f.read_elements("w", 3700 - 1, 1), w.flatten().view(3699, {1})));
  EXPECT_EQ(f.read_elements("w", 3700, 0).numel(), 0);

  // Into a caller's buffer: a view in the middle of a larger tensor, the rest untouched.
  Tensor big = Tensor::zeros({1000}, DType::f32);
  f.read_elements_into("w", 10, big.view(200, {300}));
  EXPECT_TRUE(same_bits(big.view(200, {300}), w.flatten().view(10, {300})));
  EXPECT_EQ(big.to_floats()[199], 0.0f);
  EXPECT_EQ(big.to_floats()[500], 0.0f);

  // A slice converted on the way.
  const Tensor hf = f.read_elements("h", 5, 100, DType::f32);
  const std::vector<float> want = h.flatten().view(5, {100}).to_floats();
  const std::vector<float> got = hf.to_floats();
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))) << i;
  }

  for (auto [first, count] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {-1, 1}, {0, 3701}, {3700, 1}, {3699, 2}, {5, -1}, {INT64_MAX, 1}, {1, INT64_MAX}}) {
    const std::string msg = error_message([&] { f.read_elements("w", first, count); });
    EXPECT_NE(msg.find("'" + path + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor 'w'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3700 elements"), std::string::npos) << msg;
  }
  EXPECT_NE(error_message([&] { f.read_elements("missing", 0, 1); }).find("no tensor 'missing'"), std::string::npos);
  EXPECT_NE(error_message([&] { f.read_elements_into("w", 0, Tensor()); }).find("tensor 'w'"), std::string::npos);
}

TEST(Safetensors, ConvertsBetweenFloatDtypesRoundingToNearestEven) {
  TempDir dir;
  const Tensor x = Tensor::from_floats({1.0f, 1.0f / 3.0f, -2.5e-8f, 65520.0f, 1e30f, -0.0f}, {6}, DType::f32);
  const std::string path = dir.file("convert.safetensors");
  save_safetensors(path, {{"x", x}, {"i", pattern({4}, DType::i64, 0)}});
  SafetensorsFile f(path);
  const std::vector<float> xs = x.to_floats();
  const Tensor h = f.read("x", DType::f16);
  const Tensor b = f.read("x", DType::bf16);
  ASSERT_EQ(h.dtype(), DType::f16);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(h.data_as<Half>()[i].bits, float_to_half_bits(xs[i])) << i;
    EXPECT_EQ(b.data_as<BFloat16>()[i].bits, float_to_bf16_bits(xs[i])) << i;
  }
  // And back: f16 -> f32 is exact.
  save_safetensors(path, {{"h", h}});
  EXPECT_EQ(SafetensorsFile(path).read("h", DType::f32).to_floats(), h.to_floats());

  // Integers are read as they are.
  save_safetensors(path, {{"i", pattern({4}, DType::i64, 0)}});
  SafetensorsFile g(path);
  const std::string msg = error_message([&] { g.read("i", DType::f32); });
  EXPECT_NE(msg.find("tensor 'i' is I64, which cannot be read as f32"), std::string::npos) << msg;
  EXPECT_EQ(g.read_all(DType::f16).at("i").dtype(), DType::i64);
}

TEST(Safetensors, OtherDtypesListButReadingThemNamesFileTensorAndDtype) {
  TempDir dir;
  const std::string path = dir.file("f64.safetensors");
  write_file(path, raw_file(R"({"d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
                            R"("u":{"dtype":"U8","shape":[3],"data_offsets":[16,19]},)"
                            R"("q":{"dtype":"F4","shape":[2],"data_offsets":[19,20]}})",
                            Bytes(20, 0)));
  SafetensorsFile f(path);
  ASSERT_EQ(f.entries().size(), 3u);
  EXPECT_EQ(f.entry("d").dtype, "F64");
  EXPECT_FALSE(f.entry("d").tutti_dtype.has_value());
  for (const char* name : {"d", "u", "q"}) {
    for (auto read : std::vector<std::function<void()>>{[&] { f.read(name); }, [&] { f.read_elements(name, 0, 1); }}) {
      const std::string msg = error_message(read);
      EXPECT_NE(msg.find("safetensors file '" + path + "': tensor '" + name + "' has dtype " + f.entry(name).dtype +
                         ", which tutti does not read"),
                std::string::npos)
          << msg;
    }
  }
  const std::string msg = error_message([&] { f.read_all(); });
  EXPECT_NE(msg.find("tensor 'd' has dtype F64"), std::string::npos) << msg;
}

TEST(Safetensors, DeviceTensorsAreWrittenFromTheHost) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU visible: the device-to-host copy of save_safetensors not exercised";
  TempDir dir;
  NamedTensors host, device;
  for (DType dtype : kDtypes) {
    const std::string name(name_of(dtype));
    host.emplace_back(name, random_bits({17, 3}, dtype, 40));
    device.emplace_back(name, host.back().second.to(Device::cuda()));
  }
  device.emplace_back("empty", Tensor::empty({0}, DType::f32, Device::cuda()));
  host.emplace_back("empty", Tensor::empty({0}, DType::f32));
  save_safetensors(dir.file("device.safetensors"), device, {{"format", "pt"}});
  save_safetensors(dir.file("host.safetensors"), host, {{"format", "pt"}});
  EXPECT_EQ(read_file(dir.file("device.safetensors")), read_file(dir.file("host.safetensors")));
}

// ---- writing: refusals and atomicity -------------------------------------------------------

TEST(Safetensors, SaveRefusesBadEntriesBeforeTouchingTheFile) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const Tensor t = pattern({2}, DType::f32, 0);
  save_safetensors(path, {{"keep", t}});
  const Bytes before = read_file(path);
  const std::vector<std::pair<NamedTensors, std::string>> cases = {
      {{{"a", t}, {"a", t}}, "tensor 'a' is given twice"},
      {{{"", t}}, "empty name"},
      {{{"__metadata__", t}}, "'__metadata__'"},
      {{{"u", Tensor()}}, "tensor 'u' is undefined"},
      {{{"bad\xff", t}}, "not valid UTF-8"},
  };
  for (const auto& [tensors, expected] : cases) {
    const std::string msg = error_message([&] { save_safetensors(path, tensors); });
    EXPECT_NE(msg.find(expected), std::string::npos) << msg;
  }
  EXPECT_NE(error_message([&] {
              save_safetensors(path, {{"a", t}}, {{"k", "\xc0"}});
            }).find("UTF-8"),
            std::string::npos);
  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"w.safetensors"});
  // An OS failure is a BackendError naming the call, and leaves nothing behind.
  const std::string msg = error_message<BackendError>([&] {
    save_safetensors(dir.file("no/such/dir/x.safetensors"), {{"a", t}});
  });
  EXPECT_NE(msg.find("open('"), std::string::npos) << msg;
}

// ---- damaged files: one test per kind ------------------------------------------------------

TEST(SafetensorsRefuses, AMissingFile) {
  TempDir dir;
  const std::string msg = error_message([&] { SafetensorsFile f(dir.file("none.safetensors")); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

TEST(SafetensorsRefuses, AFileShorterThan8Bytes) {
  TempDir dir;
  for (std::size_t n : {0, 1, 7}) {
    const std::string path = dir.file("short.safetensors");
    write_file(path, Bytes(n, 0));
    const std::string msg = error_message([&] { SafetensorsFile f(path); });
    EXPECT_NE(msg.find("'" + path + "' is " + std::to_string(n) + " bytes"), std::string::npos) << msg;
  }
}

TEST(SafetensorsRefuses, AHeaderLengthPastTheEndOfTheFile) {
  TempDir dir;
  const std::string path = dir.file("cut.safetensors");
  Bytes b = raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", Bytes(4, 0));
  b.resize(30);  // cut inside the header
  write_file(path, b);
  const std::string msg = error_message([&] { SafetensorsFile f(path); });
  EXPECT_NE(msg.find("past the end of its 30 bytes"), std::string::npos) << msg;
}

TEST(SafetensorsRefuses, AnAbsurdHeaderLengthBeforeAllocatingIt) {
  TempDir dir;
  const std::string path = dir.file("huge.safetensors");
  for (std::uint64_t n : {std::uint64_t{1} << 63, ~std::uint64_t{0}, kSafetensorsMaxHeaderBytes + 1}) {
    Bytes b;
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<unsigned char>(n >> (8 * i)));
    b.push_back('{');
    write_file(path, b);
    // An allocation of that size would throw bad_alloc or length_error instead.
    const std::string msg = error_message([&] { SafetensorsFile f(path); });
    EXPECT_NE(msg.find("declares a header of " + std::to_string(n) + " bytes, more than the 100000000"),
              std::string::npos)
        << msg;
  }
}

TEST(SafetensorsRefuses, ATruncatedBuffer) {
  // The data cut short: the first tensor past the end is named.
  expect_refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],)"
                 R"("data_offsets":[8,16]}})",
                 Bytes(12, 0), {"tensor 'b' (F32 [2]) claims bytes [8, 16) of a data buffer of 12 bytes", "truncated"});
}

TEST(SafetensorsRefuses, InvalidJson) {
  expect_refused(R"({"a":{"dtype":"F32",)", {}, {"its header is not valid JSON"});
  expect_refused("{\"a\xff\":1}", {}, {"not valid JSON"});  // not UTF-8
  expect_refused("", {}, {"not valid JSON"});
}

TEST(SafetensorsRefuses, AHeaderThatIsNotAnObject) {
  expect_refused("[1, 2]  ", {}, {"its header is a JSON array, not an object"});
}

TEST(SafetensorsRefuses, ANonObjectEntry) {
  expect_refused(R"({"w":[1,2,3]})", {}, {"tensor 'w' is a JSON array, not an object"});
  expect_refused(R"({"w":"F32"})", {}, {"tensor 'w' is a JSON string"});
}

TEST(SafetensorsRefuses, AMissingField) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[1]}})", Bytes(4, 0), {"tensor 'w' has no \"data_offsets\""});
  expect_refused(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", Bytes(4, 0), {"tensor 'w' has no \"dtype\""});
  expect_refused(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", Bytes(4, 0), {"tensor 'w' has no \"shape\""});
}

TEST(SafetensorsRefuses, AnUnknownDtype) {
  expect_refused(R"({"w":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}})", Bytes(4, 0),
                 {"tensor 'w' has an unknown dtype \"F99\""});
  expect_refused(R"({"w":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", Bytes(4, 0),
                 {"tensor 'w': \"dtype\" is a JSON number, not a string"});
}

TEST(SafetensorsRefuses, ANegativeDimension) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,4]}})", Bytes(4, 0),
                 {"tensor 'w': dimension 1 of its shape is negative (-1)"});
}

TEST(SafetensorsRefuses, ANonIntegerDimension) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", Bytes(4, 0),
                 {"tensor 'w': dimension 0 of its shape is a JSON number (1.5), not a non-negative integer"});
  expect_refused(R"({"w":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", Bytes(4, 0),
                 {"tensor 'w': dimension 0 of its shape is a JSON string"});
  expect_refused(R"({"w":{"dtype":"F32","shape":3,"data_offsets":[0,4]}})", Bytes(4, 0),
                 {"tensor 'w': \"shape\" is a JSON number, not a list"});
  // Beyond 2^64: JSON has it, integers do not.
  expect_refused(R"({"w":{"dtype":"F32","shape":[100000000000000000000],"data_offsets":[0,4]}})", Bytes(4, 0),
                 {"tensor 'w': dimension 0"});
}

TEST(SafetensorsRefuses, AShapeWhoseElementCountOverflows) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", Bytes(4, 0),
                 {"tensor 'w': its shape [4294967296,4294967296] has more than 2^63 elements"});
  // A zero does not excuse the others: Tensor multiplies in order.
  expect_refused(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", {},
                 {"tensor 'w'", "more than 2^63 elements"});
  expect_refused(R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,0]}})", {},
                 {"tensor 'w': dimension 0 of its shape is 9223372036854775808, more than"});
  // Elements that fit, bytes that do not (2^61 x 64 bits).
  expect_refused(R"({"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})", {},
                 {"tensor 'w' (F64 [2305843009213693952]) has too many elements"});
}

TEST(SafetensorsRefuses, ReversedOffsets) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", Bytes(4, 0),
                 {"tensor 'w' (F32 [0]) has reversed data_offsets [4, 0]"});
}

TEST(SafetensorsRefuses, OffsetsOutOfRange) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]}})",
                 Bytes(4, 0), {"tensor 'w' (F32 [1]) claims bytes [18446744073709551612, 18446744073709551615)"});
  expect_refused(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}})", Bytes(4, 0),
                 {"tensor 'w': the end of its data_offsets is negative"});
  expect_refused(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", Bytes(4, 0),
                 {"tensor 'w': \"data_offsets\" is [0], not a list [begin, end]"});
}

TEST(SafetensorsRefuses, OverlappingTensors) {
  expect_refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 Bytes(12, 0), {"tensor 'b' (F32 [2]) at bytes [4, 12) overlaps tensor 'a' (F32 [2]) at bytes [0, 8)"});
  // The same bytes twice.
  expect_refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                 Bytes(8, 0), {"overlaps tensor 'a'"});
  // An empty tensor inside another's bytes.
  expect_refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                 Bytes(8, 0), {"tensor 'e' (F32 [0]) at bytes [4, 4) overlaps tensor 'a'"});
}

TEST(SafetensorsRefuses, ALengthThatDisagreesWithDtypeAndShape) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[4,3],"data_offsets":[0,40]}})", Bytes(40, 0),
                 {"tensor 'w' (F32 [4, 3]) needs 48 bytes but its data_offsets [0, 40) hold 40"});
  expect_refused(R"({"w":{"dtype":"F6_E2M3","shape":[3],"data_offsets":[0,2]}})", Bytes(2, 0),
                 {"tensor 'w' (F6_E2M3 [3]) holds 18 bits, not a whole number of bytes"});
}

TEST(SafetensorsRefuses, HolesInTheBuffer) {
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                 Bytes(12, 0), {"bytes [4, 8) of the data buffer, before tensor 'b' (F32 [1]), belong to no tensor"});
  expect_refused(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", Bytes(8, 0),
                 {"bytes [0, 4) of the data buffer, before tensor 'b'"});
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", Bytes(6, 0),
                 {"bytes [4, 6) at the end of the data buffer, after tensor 'a' (F32 [1]), belong to no tensor"});
  expect_refused("{}", Bytes(1, 0), {"bytes [0, 1) at the end of the data buffer belong to no tensor"});
}

TEST(SafetensorsRefuses, DuplicateNames) {
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                 R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 Bytes(8, 0), {"has the key 'a' twice (a name given twice)"});
  expect_refused(R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", Bytes(4, 0),
                 {"has the key 'dtype' twice"});
}

TEST(SafetensorsRefuses, MetadataThatIsNotStrings) {
  expect_refused(R"({"__metadata__":{"step":3}})", {}, {"\"__metadata__\" entry 'step' is a JSON number"});
  expect_refused(R"({"__metadata__":[]})", {}, {"\"__metadata__\" is a JSON array"});
}

TEST(SafetensorsRefuses, NestingDeeperThanTheFormat) {
  std::string deep = "{\"w\":{\"dtype\":\"F32\",\"shape\":[[[1]]],\"data_offsets\":[0,4]}}";
  expect_refused(deep, Bytes(4, 0), {"nested deeper than the 3 levels"});
  expect_refused(std::string(100000, '[') + std::string(100000, ']'), {}, {"nested deeper"});
}

// ---- folders: one file, shards and the index -----------------------------------------------

NamedTensors model_tensors() {
  NamedTensors t;
  // 400, 400, 1000 (alone: above the 800-byte limit), 200, 600, 8 bytes.
  t.emplace_back("layers.0.weight", random_bits({10, 10}, DType::f32, 1));
  t.emplace_back("layers.0.bias", random_bits({100}, DType::i32, 2));
  t.emplace_back("embed.weight", random_bits({500}, DType::bf16, 3));
  t.emplace_back("layers.1.weight", random_bits({100}, DType::f16, 4));
  t.emplace_back("layers.1.bias", random_bits({75}, DType::i64, 5));
  t.emplace_back("scale", random_bits({}, DType::f32, 6));
  t.emplace_back("empty", random_bits({0, 4}, DType::f32, 7));
  return t;
}

TEST(SafetensorsFolder, ShardsAtTheMaximumSizeWithAnIndexAsHuggingFaceDoes) {
  TempDir dir;
  const NamedTensors tensors = model_tensors();
  const std::string folder = dir.file("model");
  const auto written = save_safetensors_folder(folder, tensors, {{"format", "pt"}}, {.max_shard_bytes = 800});
  // embed.weight (1000 bytes) gets a shard of its own where it comes, and the shard being filled
  // (layers.0.*, 800 bytes) goes on after it; layers.1.* fill the next one to 800 bytes exactly.
  const std::vector<std::string> expected = {"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                                             "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
                                             "model.safetensors.index.json"};
  EXPECT_EQ(written, expected);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(folder)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, expected);

  const auto index = nlohmann::json::parse(read_file(folder + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 400 + 400 + 1000 + 200 + 600 + 4);
  const std::map<std::string, int> shard_of = {
      {"embed.weight", 1},  {"layers.0.weight", 2}, {"layers.0.bias", 2}, {"layers.1.weight", 3},
      {"layers.1.bias", 3}, {"scale", 4},           {"empty", 4}};
  EXPECT_EQ(index["weight_map"].size(), shard_of.size());
  for (const auto& [name, k] : shard_of) {
    EXPECT_EQ(index["weight_map"][name], "model-0000" + std::to_string(k) + "-of-00004.safetensors") << name;
  }
  EXPECT_EQ(SafetensorsFile(folder + "/model-00002-of-00004.safetensors").metadata(), Metadata({{"format", "pt"}}));

  SafetensorsFolder f(folder);
  EXPECT_EQ(f.files().size(), 4u);
  EXPECT_EQ(f.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    EXPECT_TRUE(same_bits(f.read(name), t)) << name;
    EXPECT_EQ(f.entry(name).shape, t.shape());
  }
  EXPECT_EQ(f.file_of("scale").path(), folder + "/model-00004-of-00004.safetensors");
  EXPECT_TRUE(same_bits(f.read_elements("layers.1.bias", 70, 5), tensors[4].second.view(70, {5})));
  const StateDict all = f.read_all();
  EXPECT_EQ(all.size(), tensors.size());
  const std::string msg = error_message([&] { f.read("nope"); });
  EXPECT_NE(msg.find("safetensors folder '" + folder + "' has no tensor 'nope'"), std::string::npos) << msg;
}

TEST(SafetensorsFolder, OneShardIsOneFileAndStaleFilesOfTheOtherLayoutGo) {
  TempDir dir;
  const NamedTensors tensors = model_tensors();
  const std::string folder = dir.file("m");
  save_safetensors_folder(folder, tensors, {}, {.max_shard_bytes = 800});
  write_text(folder + "/README.md", "kept");
  EXPECT_EQ(save_safetensors_folder(folder, tensors), std::vector<std::string>{"model.safetensors"});
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(folder)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"README.md", "model.safetensors"}));
  SafetensorsFolder f(folder);
  EXPECT_EQ(f.files().size(), 1u);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(same_bits(f.read(name), t)) << name;

  // And back to shards (5 now, another count): the single file goes.
  const auto written = save_safetensors_folder(folder, tensors, {}, {.max_shard_bytes = 600, .prefix = "model"});
  EXPECT_EQ(written.size(), 6u);
  EXPECT_FALSE(fs::exists(folder + "/model.safetensors"));
  EXPECT_EQ(SafetensorsFolder(folder).files().size(), 5u);
  // From 5 shards to 2: the old shards 3 to 5 of 5 go too.
  save_safetensors_folder(folder, tensors, {}, {.max_shard_bytes = 2000});
  files.clear();
  for (const auto& e : fs::directory_iterator(folder)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"README.md", "model-00001-of-00002.safetensors",
                                             "model-00002-of-00002.safetensors", "model.safetensors.index.json"}));

  // Another prefix lives beside it.
  save_safetensors_folder(folder, {{"x", pattern({1}, DType::f32, 0)}}, {}, {.prefix = "adapter"});
  EXPECT_EQ(SafetensorsFolder(folder, "adapter").names(), std::vector<std::string>{"x"});
  EXPECT_EQ(SafetensorsFolder(folder).names().size(), tensors.size());

  const std::string msg = error_message([&] {
    save_safetensors_folder(folder, {{"a", pattern({1}, DType::f32, 0)}, {"a", pattern({1}, DType::f32, 0)}}, {},
                            {.max_shard_bytes = 1});
  });
  EXPECT_NE(msg.find("tensor 'a' is given twice"), std::string::npos) << msg;
}

// A sharded folder of two tensors, "a" in shard 1 and "b" in shard 2, for the refusals below.
std::string two_shards(const TempDir& dir) {
  const std::string folder = dir.file("two");
  save_safetensors_folder(folder, {{"a", pattern({4}, DType::f32, 0)}, {"b", pattern({4}, DType::f32, 1)}}, {},
                          {.max_shard_bytes = 16});
  return folder;
}

TEST(SafetensorsFolderRefuses, AFolderWithoutModelFiles) {
  TempDir dir;
  const std::string msg = error_message([&] { SafetensorsFolder f(dir.file("")); });
  EXPECT_NE(msg.find("holds neither model.safetensors nor model.safetensors.index.json"), std::string::npos) << msg;
}

TEST(SafetensorsFolderRefuses, AnIndexNamingAMissingShard) {
  TempDir dir;
  const std::string folder = two_shards(dir);
  fs::remove(folder + "/model-00002-of-00002.safetensors");
  const std::string msg = error_message([&] { SafetensorsFolder f(folder); });
  EXPECT_NE(msg.find("safetensors index '" + folder +
                     "/model.safetensors.index.json' maps tensor 'b' to shard "
                     "'model-00002-of-00002.safetensors', which does not exist"),
            std::string::npos)
      << msg;
}

TEST(SafetensorsFolderRefuses, ATensorAbsentFromItsShard) {
  TempDir dir;
  const std::string folder = two_shards(dir);
  write_text(folder + "/model.safetensors.index.json",
             R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
                                "c": "model-00002-of-00002.safetensors"}})");
  const std::string msg = error_message([&] { SafetensorsFolder f(folder); });
  EXPECT_NE(msg.find("model.safetensors.index.json' maps tensor 'c' to shard 'model-00002-of-00002.safetensors', "
                     "which does not hold it"),
            std::string::npos)
      << msg;
}

TEST(SafetensorsFolderRefuses, AShardHoldingATensorTheIndexDoesNotMapThere) {
  TempDir dir;
  const std::string folder = two_shards(dir);
  // A shard the index does not name is not part of the model (and not opened).
  write_text(folder + "/model.safetensors.index.json", R"({"weight_map": {"a": "model-00001-of-00002.safetensors"}})");
  EXPECT_EQ(SafetensorsFolder(folder).names(), std::vector<std::string>{"a"});
  std::string msg;
  write_text(folder + "/model.safetensors.index.json",
             R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}})");
  msg = error_message([&] { SafetensorsFolder f(folder); });
  EXPECT_NE(msg.find("maps tensor 'b' to shard 'model-00001-of-00002.safetensors', which does not hold it"),
            std::string::npos)
      << msg;
  // Both shards named, one tensor of shard 2 unlisted.
  save_safetensors(folder + "/model-00002-of-00002.safetensors",
                   {{"b", pattern({4}, DType::f32, 1)}, {"extra", pattern({1}, DType::f32, 1)}});
  write_text(folder + "/model.safetensors.index.json",
             R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  msg = error_message([&] { SafetensorsFolder f(folder); });
  EXPECT_NE(msg.find("model-00002-of-00002.safetensors' holds tensor 'extra', which safetensors index '"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("does not list"), std::string::npos) << msg;
}

TEST(SafetensorsFolderRefuses, AMalformedIndex) {
  TempDir dir;
  const std::string folder = two_shards(dir);
  const std::string index = folder + "/model.safetensors.index.json";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "is not valid JSON"},
      {"[]", "is a JSON array, not an object"},
      {R"({"metadata": {}})", "has no \"weight_map\""},
      {R"({"weight_map": []})", "\"weight_map\" is a JSON array"},
      {R"({"weight_map": {"a": 1}})", "tensor 'a' is mapped to a JSON number"},
      {R"({"weight_map": {"a": "../two/model-00001-of-00002.safetensors"}})", "tensor 'a' is mapped to '../two/"},
      {R"({"weight_map": {"a": "x", "a": "y"}})", "has the key 'a' twice"},
  };
  for (const auto& [text, expected] : cases) {
    write_text(index, text);
    const std::string msg = error_message([&] { SafetensorsFolder f(folder); });
    EXPECT_NE(msg.find("safetensors index '" + index + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(expected), std::string::npos) << "'" << expected << "' not in: " << msg;
  }
}

// ---- Hugging Face's own package ------------------------------------------------------------

// The interpreter to try: $TUTTI_PYTHON, else python3.
std::string python() {
  const char* env = std::getenv("TUTTI_PYTHON");
  return env != nullptr && env[0] != '\0' ? env : "python3";
}

bool python_has_safetensors() {
  const std::string cmd = python() + " -c 'import safetensors, numpy' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

int run_python(const std::string& script, const std::string& arg) {
  TempDir dir("tutti_st_py");
  const std::string file = dir.file("check.py");
  write_text(file, script);
  return std::system((python() + " " + file + " " + arg).c_str());
}

// The values of pattern(), as Python computes them.
const char* kPythonValues = R"(
import sys, struct
import numpy as np
def values(n, k):
    return np.array([((i * 7 + k) % 13) - 6 for i in range(n)], dtype=np.float64)
)";

TEST(SafetensorsInterop, HuggingFaceReadsWhatTuttiWrites) {
  if (!python_has_safetensors()) {
    GTEST_SKIP() << "Python's safetensors package is not importable by '" << python()
                 << "' (pip install safetensors numpy, or set TUTTI_PYTHON): interoperability not checked";
  }
  TempDir dir;
  const std::string path = dir.file("tutti.safetensors");
  NamedTensors tensors;
  int k = 0;
  for (DType dtype : kDtypes) {
    for (const Shape& shape : std::vector<Shape>{{}, {0, 2}, {3, 5}}) {
      tensors.emplace_back(std::string(name_of(dtype)) + "_" + std::to_string(k), pattern(shape, dtype, k));
      ++k;
    }
  }
  save_safetensors(path, tensors, {{"format", "pt"}, {"by", "tutti"}});
  const std::string script = std::string(kPythonValues) + R"(
import safetensors
path = sys.argv[1]
with open(path, "rb") as f:
    tensors = dict(safetensors.deserialize(f.read()))
with safetensors.safe_open(path, "numpy") as f:
    assert f.metadata() == {"format": "pt", "by": "tutti"}, f.metadata()
decode = {"F32": "<f4", "F16": "<f2", "I32": "<i4", "I64": "<i8", "BF16": "<u2"}
assert len(tensors) == 15, sorted(tensors)
for name, t in tensors.items():
    k = int(name.split("_")[1])
    a = np.frombuffer(bytes(t["data"]), dtype=decode[t["dtype"]])
    if t["dtype"] == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    want = {"f32": "F32", "f16": "F16", "bf16": "BF16", "i32": "I32", "i64": "I64"}[name.split("_")[0]]
    assert t["dtype"] == want, (name, t["dtype"])
    n = int(np.prod(t["shape"]))
    assert a.size == n, (name, a.size, t["shape"])
    assert (a.astype(np.float64) == values(n, k)).all(), (name, a)
print("safetensors", safetensors.__version__, "read", len(tensors), "tensors")
)";
  EXPECT_EQ(run_python(script, path), 0);
}

TEST(SafetensorsInterop, TuttiReadsWhatHuggingFaceWrites) {
  if (!python_has_safetensors()) {
    GTEST_SKIP() << "Python's safetensors package is not importable by '" << python()
                 << "' (pip install safetensors numpy, or set TUTTI_PYTHON): interoperability not checked";
  }
  TempDir dir;
  const std::string path = dir.file("hf.safetensors");
  const std::string script = std::string(kPythonValues) + R"(
from safetensors.numpy import save_file
shapes = {"f32": (4, 3), "f16": (7,), "i32": (2, 2, 2), "i64": (), "empty": (0, 5)}
types = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64, "empty": np.float32}
tensors = {}
for k, name in enumerate(sorted(shapes)):
    n = int(np.prod(shapes[name]))
    tensors[name] = values(n, k).astype(types[name]).reshape(shapes[name])
save_file(tensors, sys.argv[1], metadata={"format": "pt"})
)";
  ASSERT_EQ(run_python(script, path), 0);
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(), Metadata({{"format", "pt"}}));
  EXPECT_EQ(f.data_start() % 8, 0u);  // Hugging Face pads the header to 8 bytes too
  const std::vector<std::pair<std::string, std::pair<Shape, DType>>> expected = {{"empty", {{0, 5}, DType::f32}},
                                                                                 {"f16", {{7}, DType::f16}},
                                                                                 {"f32", {{4, 3}, DType::f32}},
                                                                                 {"i32", {{2, 2, 2}, DType::i32}},
                                                                                 {"i64", {{}, DType::i64}}};
  ASSERT_EQ(f.entries().size(), expected.size());
  for (std::size_t k = 0; k < expected.size(); ++k) {
    const auto& [name, want] = expected[k];
    const Tensor t = f.read(name);
    EXPECT_EQ(t.shape(), want.first) << name;
    EXPECT_EQ(t.dtype(), want.second) << name;
    EXPECT_TRUE(same_bits(t, pattern(want.first, want.second, static_cast<int>(k)))) << name;
  }
}

}  // namespace
}  // namespace tutti::io
