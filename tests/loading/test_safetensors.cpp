// Safetensors loader: round trips through write_safetensors, sharded folders, and one deliberately corrupted
// file per validation rule (each must throw markbase::Error naming the file and what was wrong), plus a
// fuzz-style sweep that must never crash (run under AddressSanitizer with -DMARKBASE_SANITIZE=ON).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "loading/safetensors.h"
#include "model/error.h"

namespace fs = std::filesystem;
using namespace markbase;

namespace {

// A fresh folder under the system temp dir, removed with everything in it when the test ends.
struct TempDir {
    fs::path path;
    TempDir() {
        static std::atomic<int> counter{0};
        path = fs::temp_directory_path() /
               ("markbase_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" +
                std::to_string(std::random_device{}()));
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    fs::path operator/(const std::string& name) const { return path / name; }
};

void write_bytes(const fs::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string le64(uint64_t n) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[size_t(i)] = char(uint8_t(n >> (8 * i)));
    return s;
}

// A raw file: the given header text (unpadded) followed by `data_bytes` zero bytes.
fs::path write_raw(const TempDir& d, const std::string& name, const std::string& header,
                   size_t data_bytes = 0) {
    fs::path p = d / name;
    write_bytes(p, le64(header.size()) + header + std::string(data_bytes, '\0'));
    return p;
}

// Runs f, which must throw markbase::Error whose message contains every one of `needles`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
    try {
        f();
    } catch (const Error& e) {
        std::string msg = e.what();
        for (const auto& n : needles)
            EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
        return;
    } catch (const std::exception& e) {
        ADD_FAILURE() << "threw a non-markbase exception: " << e.what();
        return;
    }
    ADD_FAILURE() << "no exception thrown";
}

// Opens a file with one tensor entry `entry` (a JSON object text) and `data_bytes` of data; expects an error
// naming the file, the tensor and each of `needles`.
void expect_bad_entry(const std::string& entry, size_t data_bytes, const std::vector<std::string>& needles) {
    TempDir d;
    fs::path p = write_raw(d, "bad.safetensors", "{\"w.weight\":" + entry + "}", data_bytes);
    std::vector<std::string> all = {p.string(), "w.weight"};
    all.insert(all.end(), needles.begin(), needles.end());
    expect_error([&] { SafetensorsSet::open(p); }, all);
}

std::vector<uint16_t> iota16(size_t n, uint16_t start) {
    std::vector<uint16_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = uint16_t(start + i);
    return v;
}

}  // namespace

TEST(Safetensors, DTypeNamesAndSizes) {
    const std::pair<DType, std::pair<const char*, int>> want[] = {
        {DType::BF16, {"BF16", 2}}, {DType::F16, {"F16", 2}},         {DType::F32, {"F32", 4}},
        {DType::F64, {"F64", 8}},   {DType::I8, {"I8", 1}},           {DType::I16, {"I16", 2}},
        {DType::I32, {"I32", 4}},   {DType::I64, {"I64", 8}},         {DType::U8, {"U8", 1}},
        {DType::U16, {"U16", 2}},   {DType::U32, {"U32", 4}},         {DType::U64, {"U64", 8}},
        {DType::BOOL, {"BOOL", 1}}, {DType::F8_E4M3, {"F8_E4M3", 1}}, {DType::F8_E5M2, {"F8_E5M2", 1}},
    };
    for (const auto& [t, ns] : want) {
        EXPECT_STREQ(dtype_name(t), ns.first);
        EXPECT_EQ(dtype_size(t), ns.second);
    }
    TensorInfo ti;
    ti.shape = {128, 1408, 2816};
    EXPECT_EQ(ti.shape_str(), "[128, 1408, 2816]");
    EXPECT_EQ(ti.numel(), 128LL * 1408 * 2816);
    ti.shape = {};
    EXPECT_EQ(ti.shape_str(), "[]");
    EXPECT_EQ(ti.numel(), 1);
}

TEST(Safetensors, RoundTrip) {
    TempDir d;
    auto bf = iota16(6, 0x3f80);
    std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f};
    std::vector<int64_t> i64 = {1, -2, int64_t(1) << 40, -(int64_t(1) << 50)};
    float scalar = 42.0f;
    std::vector<TensorToWrite> ts = {
        {"a.bf16", DType::BF16, {2, 3}, bf.data()}, {"b.f32", DType::F32, {4}, f32.data()},
        {"c.i64", DType::I64, {2, 2}, i64.data()},  {"d.scalar", DType::F32, {}, &scalar},
        {"e.empty", DType::BF16, {0, 5}, nullptr},
    };
    fs::path p = d / "model.safetensors";
    write_safetensors(p, ts, {{"format", "pt"}, {"note", "hello"}});
    EXPECT_FALSE(fs::exists(d / "model.safetensors.tmp"));

    // The header is space-padded to a multiple of 8, so the data section is 8-aligned.
    std::string raw = read_bytes(p);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(raw[size_t(i)]);
    EXPECT_EQ(n % 8, 0u);
    MappedFile m(p, /*prefetch=*/true);
    EXPECT_EQ(m.size(), raw.size());
    EXPECT_EQ(std::memcmp(m.data(), raw.data(), raw.size()), 0);

    for (const fs::path& open_path : {p, d.path}) {  // the file itself and its folder
        SafetensorsSet s = SafetensorsSet::open(open_path);
        ASSERT_EQ(s.tensors().size(), 5u);
        ASSERT_EQ(s.files().size(), 1u);
        EXPECT_EQ(s.files()[0], p.string());
        EXPECT_EQ(s.total_bytes(), 12u + 16u + 32u + 4u + 0u);
        EXPECT_EQ(s.metadata().at("format"), "pt");
        EXPECT_EQ(s.metadata().at("note"), "hello");

        const TensorInfo& a = s.get("a.bf16");
        EXPECT_EQ(a.dtype, DType::BF16);
        EXPECT_EQ(a.shape_str(), "[2, 3]");
        EXPECT_EQ(a.nbytes, 12u);
        EXPECT_EQ(a.file, p.string());
        EXPECT_EQ(std::memcmp(a.data, bf.data(), 12), 0);
        const TensorInfo& b = s.get("b.f32");
        EXPECT_EQ(b.dtype, DType::F32);
        EXPECT_EQ(std::memcmp(b.data, f32.data(), 16), 0);
        const TensorInfo& c = s.get("c.i64");
        EXPECT_EQ(c.dtype, DType::I64);
        EXPECT_EQ(std::memcmp(c.data, i64.data(), 32), 0);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data) % 8, 0u);
        const TensorInfo& sc = s.get("d.scalar");
        EXPECT_TRUE(sc.shape.empty());
        EXPECT_EQ(sc.numel(), 1);
        float got = 0;
        std::memcpy(&got, sc.data, 4);
        EXPECT_EQ(got, 42.0f);
        const TensorInfo& e = s.get("e.empty");
        EXPECT_EQ(e.numel(), 0);
        EXPECT_EQ(e.nbytes, 0u);
        EXPECT_EQ(e.shape_str(), "[0, 5]");

        EXPECT_EQ(s.find("nope"), nullptr);
        expect_error([&] { s.get("nope"); }, {"missing tensor nope", p.string()});
    }
}

TEST(Safetensors, WriterRejectsBadInputAndLeavesNothing) {
    TempDir d;
    float x = 1;
    expect_error(
        [&] {
            write_safetensors(d / "a.safetensors", {{"w", DType::F32, {1}, &x}, {"w", DType::F32, {1}, &x}});
        },
        {"a.safetensors", "'w'", "twice"});
    expect_error(
        [&] {
            write_safetensors(d / "b.safetensors", {{"w", DType::F32, {-1}, &x}});
        },
        {"'w'", "-1"});
    expect_error(
        [&] {
            write_safetensors(d / "c.safetensors", {{"w", DType::F32, {4}, nullptr}});
        },
        {"'w'", "16 bytes"});
    expect_error([&] { write_safetensors(d / "no_such_dir" / "x.safetensors", {}); }, {"no_such_dir"});
    EXPECT_TRUE(fs::is_empty(d.path));
}

TEST(Safetensors, ShardedFolderWithIndex) {
    TempDir d;
    auto a = iota16(4, 1), b = iota16(6, 100), c = iota16(2, 200);
    write_safetensors(d / "model-00001-of-00002.safetensors", {{"x.a", DType::BF16, {2, 2}, a.data()}});
    write_safetensors(d / "model-00002-of-00002.safetensors",
                      {{"x.b", DType::BF16, {6}, b.data()}, {"x.unlisted", DType::BF16, {2}, c.data()}},
                      {{"format", "pt"}});
    write_bytes(d / "model.safetensors.index.json",
                R"({"metadata": {"total_size": 20}, "weight_map": {
                    "x.a": "model-00001-of-00002.safetensors", "x.b": "model-00002-of-00002.safetensors"}})");
    // A stray single-file checkpoint must not be preferred over the index.
    write_safetensors(d / "model.safetensors", {{"stray", DType::BF16, {1}, a.data()}});

    SafetensorsSet s = SafetensorsSet::open(d.path);
    EXPECT_EQ(s.files().size(), 2u);
    EXPECT_EQ(s.tensors().size(), 3u);  // the unlisted tensor is kept
    EXPECT_EQ(s.find("stray"), nullptr);
    EXPECT_EQ(s.get("x.a").file, (d / "model-00001-of-00002.safetensors").string());
    EXPECT_EQ(s.get("x.b").file, (d / "model-00002-of-00002.safetensors").string());
    EXPECT_EQ(std::memcmp(s.get("x.b").data, b.data(), 12), 0);
    EXPECT_EQ(std::memcmp(s.get("x.unlisted").data, c.data(), 4), 0);
    EXPECT_EQ(s.total_bytes(), 8u + 12u + 4u);
    EXPECT_EQ(s.metadata().at("format"), "pt");
    expect_error([&] { s.get("x.zzz"); }, {"missing tensor x.zzz", "model-00001-of-00002.safetensors",
                                           "model-00002-of-00002.safetensors"});
}

TEST(Safetensors, IndexNamesMissingShard) {
    TempDir d;
    auto a = iota16(1, 1);
    write_safetensors(d / "s1.safetensors", {{"x.a", DType::BF16, {1}, a.data()}});
    write_bytes(d / "model.safetensors.index.json",
                R"({"weight_map": {"x.a": "s1.safetensors", "x.b": "s2.safetensors"}})");
    expect_error([&] { SafetensorsSet::open(d.path); }, {"model.safetensors.index.json", "s2.safetensors"});
}

TEST(Safetensors, IndexTensorNotInItsShard) {
    TempDir d;
    auto a = iota16(1, 1);
    write_safetensors(d / "s1.safetensors", {{"x.a", DType::BF16, {1}, a.data()}});
    write_safetensors(d / "s2.safetensors", {{"x.b", DType::BF16, {1}, a.data()}});
    write_bytes(
        d / "model.safetensors.index.json",
        R"({"weight_map": {"x.a": "s1.safetensors", "x.b": "s2.safetensors", "x.c": "s2.safetensors"}})");
    expect_error([&] { SafetensorsSet::open(d.path); },
                 {"index says tensor 'x.c' is in shard", "s2.safetensors", "has no such tensor"});
    // Listed in the wrong shard: also an error, and it says where the tensor really is.
    write_safetensors(d / "s1.safetensors",
                      {{"x.a", DType::BF16, {1}, a.data()}, {"x.c", DType::BF16, {1}, a.data()}});
    write_bytes(
        d / "model.safetensors.index.json",
        R"({"weight_map": {"x.a": "s2.safetensors", "x.b": "s2.safetensors", "x.c": "s1.safetensors"}})");
    expect_error([&] { SafetensorsSet::open(d.path); },
                 {"'x.a'", "s2.safetensors", "it is in", "s1.safetensors"});
}

TEST(Safetensors, BadIndex) {
    TempDir d;
    write_bytes(d / "model.safetensors.index.json", "{not json");
    expect_error([&] { SafetensorsSet::open(d.path); }, {"model.safetensors.index.json", "not valid JSON"});
    write_bytes(d / "model.safetensors.index.json", R"({"weight_map": [1]})");
    expect_error([&] { SafetensorsSet::open(d.path); }, {"model.safetensors.index.json", "weight_map"});
    write_bytes(d / "model.safetensors.index.json", R"({"weight_map": {"x": "../evil.safetensors"}})");
    expect_error([&] { SafetensorsSet::open(d.path); }, {"model.safetensors.index.json", "'x'", "../evil"});
}

TEST(Safetensors, DuplicateTensorAcrossShards) {
    TempDir d;
    auto a = iota16(1, 1);
    write_safetensors(d / "s1.safetensors", {{"x.a", DType::BF16, {1}, a.data()}});
    write_safetensors(d / "s2.safetensors", {{"x.a", DType::BF16, {1}, a.data()}});
    write_bytes(d / "model.safetensors.index.json",
                R"({"weight_map": {"x.a": "s1.safetensors", "y": "s2.safetensors"}})");
    expect_error([&] { SafetensorsSet::open(d.path); }, {"'x.a'", "s1.safetensors", "s2.safetensors"});
}

TEST(Safetensors, FolderFallbacks) {
    auto a = iota16(1, 1);
    {  // any single *.safetensors file
        TempDir d;
        write_safetensors(d / "weights.safetensors", {{"w", DType::BF16, {1}, a.data()}});
        EXPECT_NE(SafetensorsSet::open(d.path).find("w"), nullptr);
    }
    {  // nothing at all: say what was looked for
        TempDir d;
        expect_error([&] { SafetensorsSet::open(d.path); },
                     {d.path.string(), "model.safetensors.index.json", "model.safetensors", "*.safetensors"});
    }
    {  // several shards and no index: ambiguous
        TempDir d;
        write_safetensors(d / "a.safetensors", {{"w", DType::BF16, {1}, a.data()}});
        write_safetensors(d / "b.safetensors", {{"v", DType::BF16, {1}, a.data()}});
        expect_error([&] { SafetensorsSet::open(d.path); }, {"a.safetensors", "b.safetensors", "index"});
    }
    TempDir d;
    expect_error([&] { SafetensorsSet::open(d / "missing.safetensors"); },
                 {"missing.safetensors", "does not exist"});
    expect_error([&] { MappedFile m(d / "missing.safetensors"); }, {"missing.safetensors", "No such file"});
    expect_error([&] { MappedFile m(d.path); }, {d.path.string(), "not a regular file"});
}

TEST(Safetensors, FileTooShort) {
    TempDir d;
    write_bytes(d / "empty.safetensors", "");
    MappedFile m(d / "empty.safetensors");  // mapping an empty file is fine; parsing it is not
    EXPECT_EQ(m.size(), 0u);
    EXPECT_EQ(m.data(), nullptr);
    expect_error([&] { SafetensorsSet::open(d / "empty.safetensors"); },
                 {"empty.safetensors", "0 bytes", "8-byte"});
    write_bytes(d / "short.safetensors", "abc");
    expect_error([&] { SafetensorsSet::open(d / "short.safetensors"); }, {"short.safetensors", "3 bytes"});
}

TEST(Safetensors, HeaderLengthBeyondFile) {
    TempDir d;
    write_bytes(d / "t.safetensors", le64(1000) + "{}");
    expect_error([&] { SafetensorsSet::open(d / "t.safetensors"); },
                 {"t.safetensors", "1000", "only 2 bytes"});
    write_bytes(d / "huge.safetensors", le64(uint64_t(1) << 40) + "{}");
    expect_error([&] { SafetensorsSet::open(d / "huge.safetensors"); },
                 {"huge.safetensors", std::to_string(uint64_t(1) << 40), "limit"});
    write_bytes(d / "max.safetensors", le64(~uint64_t(0)) + "{}");
    expect_error([&] { SafetensorsSet::open(d / "max.safetensors"); }, {"max.safetensors", "limit"});
}

TEST(Safetensors, HeaderNotJsonObject) {
    TempDir d;
    expect_error([&] { SafetensorsSet::open(write_raw(d, "j.safetensors", "{\"a\": [1,")); },
                 {"j.safetensors", "not valid JSON"});
    expect_error([&] { SafetensorsSet::open(write_raw(d, "arr.safetensors", "[1, 2, 3]")); },
                 {"arr.safetensors", "JSON object", "array"});
    // A valid empty header is a valid (empty) checkpoint.
    EXPECT_TRUE(SafetensorsSet::open(write_raw(d, "ok.safetensors", "{}")).tensors().empty());
}

TEST(Safetensors, EntryNotObject) {
    expect_bad_entry("[1, 2]", 0, {"must be an object", "[1,2]"});
}

TEST(Safetensors, UnknownDType) {
    expect_bad_entry(R"({"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]})", 2,
                     {"unknown dtype \"Q4_K\"", "BF16"});
    expect_bad_entry(R"({"dtype":7,"shape":[2],"data_offsets":[0,2]})", 2,
                     {"\"dtype\" must be a string", "7"});
    expect_bad_entry(R"({"shape":[2],"data_offsets":[0,2]})", 2, {"missing \"dtype\""});
}

TEST(Safetensors, BadShape) {
    expect_bad_entry(R"({"dtype":"BF16","shape":5,"data_offsets":[0,10]})", 10, {"\"shape\"", "found 5"});
    expect_bad_entry(R"({"dtype":"BF16","shape":[2,-3],"data_offsets":[0,12]})", 12,
                     {"non-negative", "[2,-3]"});
    expect_bad_entry(R"({"dtype":"BF16","shape":[2.5],"data_offsets":[0,4]})", 4, {"non-negative", "[2.5]"});
    expect_bad_entry(R"({"dtype":"BF16","shape":["2"],"data_offsets":[0,4]})", 4,
                     {"non-negative", "[\"2\"]"});
    expect_bad_entry(R"({"dtype":"BF16","data_offsets":[0,4]})", 4, {"missing \"shape\""});
}

TEST(Safetensors, BadDataOffsets) {
    expect_bad_entry(R"({"dtype":"U8","shape":[2],"data_offsets":[0]})", 2,
                     {"two non-negative integers", "[0]"});
    expect_bad_entry(R"({"dtype":"U8","shape":[2],"data_offsets":[0,2,4]})", 4,
                     {"two non-negative", "[0,2,4]"});
    expect_bad_entry(R"({"dtype":"U8","shape":[2],"data_offsets":[-1,1]})", 2,
                     {"two non-negative", "[-1,1]"});
    expect_bad_entry(R"({"dtype":"U8","shape":[2],"data_offsets":[0,"2"]})", 2, {"two non-negative"});
    expect_bad_entry(R"({"dtype":"U8","shape":[2],"data_offsets":{"a":1}})", 2, {"two non-negative"});
    expect_bad_entry(R"({"dtype":"U8","shape":[2]})", 2, {"missing \"data_offsets\""});
    expect_bad_entry(R"({"dtype":"U8","shape":[0],"data_offsets":[4,2]})", 4, {"begin 4", "end 2"});
}

TEST(Safetensors, DataEndBeyondFile) {
    expect_bad_entry(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", 12,
                     {"end 16", "data section", "12 bytes"});
}

TEST(Safetensors, ByteLengthMismatch) {
    expect_bad_entry(R"({"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]})", 16,
                     {"[2, 3]", "BF16", "needs 12 bytes", "span 10 bytes"});
    // numel * dtype size overflows 64 bits: must be caught, not wrapped around to a small number.
    expect_bad_entry(R"({"dtype":"F32","shape":[4611686018427387904, 4],"data_offsets":[0,0]})", 0,
                     {"overflows"});
    expect_bad_entry(R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]})", 0,
                     {"overflows"});
}

TEST(Safetensors, OverlappingTensors) {
    TempDir d;
    fs::path p = write_raw(d, "o.safetensors",
                           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]},)"
                           R"("c":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           20);
    expect_error([&] { SafetensorsSet::open(p); }, {"o.safetensors", "'c'", "[4, 12)", "'a'", "[0, 8)"});
    // An empty tensor inside another's range holds no bytes and is fine.
    fs::path q = write_raw(d, "e.safetensors",
                           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                           8);
    EXPECT_EQ(SafetensorsSet::open(q).tensors().size(), 2u);
}

TEST(Safetensors, DuplicateNameInOneFile) {
    TempDir d;
    fs::path p = write_raw(d, "dup.safetensors",
                           R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                           R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                           2);
    expect_error([&] { SafetensorsSet::open(p); }, {"dup.safetensors", "'a'", "more than once"});
}

TEST(Safetensors, BadMetadata) {
    TempDir d;
    expect_error([&] { SafetensorsSet::open(write_raw(d, "m1.safetensors", R"({"__metadata__": [1]})")); },
                 {"m1.safetensors", "__metadata__", "object"});
    expect_error(
        [&] { SafetensorsSet::open(write_raw(d, "m2.safetensors", R"({"__metadata__": {"k": 3}})")); },
        {"m2.safetensors", "'k'", "string", "3"});
}

// Truncations and random byte flips of a valid file: open must succeed or throw markbase::Error, never crash
// or read out of bounds (ASan build). When it succeeds, every tensor's bytes must lie inside the mapping.
TEST(Safetensors, FuzzHeaderNeverCrashes) {
    TempDir d;
    auto a = iota16(24, 7);
    std::vector<float> f = {1, 2, 3};
    write_safetensors(d / "src.safetensors",
                      {{"layer.0.w", DType::BF16, {4, 6}, a.data()},
                       {"layer.0.b", DType::F32, {3}, f.data()},
                       {"s", DType::I64, {}, a.data()}},
                      {{"format", "pt"}});
    const std::string good = read_bytes(d / "src.safetensors");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(good[size_t(i)]);
    ASSERT_LT(8 + n, good.size());

    int variant = 0, opened = 0;
    auto try_open = [&](const std::string& bytes) {
        fs::path p = d / ("v" + std::to_string(variant++ % 8) + ".safetensors");
        write_bytes(p, bytes);
        try {
            SafetensorsSet s = SafetensorsSet::open(p);
            ++opened;
            for (const auto& [name, t] : s.tensors()) {
                volatile uint8_t sink = 0;
                for (uint64_t i = 0; i < t.nbytes; ++i) sink = sink ^ t.data[i];  // ASan checks each read
                EXPECT_EQ(t.nbytes, uint64_t(t.numel()) * uint64_t(dtype_size(t.dtype)));
            }
        } catch (const Error&) {
        }
    };

    for (size_t cut = 0; cut <= 8 + n + 1; ++cut) try_open(good.substr(0, cut));
    std::mt19937 rng(1234);
    for (int k = 0; k < 400; ++k) {
        std::string bad = good;
        int flips = 1 + int(rng() % 3);
        for (int i = 0; i < flips; ++i) {
            size_t pos = rng() % (8 + n);  // the length field and the header text
            bad[pos] = (k % 2) ? char(rng()) : char(uint8_t(bad[pos]) ^ (1u << (rng() % 8)));
        }
        try_open(bad);
    }
    EXPECT_GT(opened, 0);  // some flips (e.g. in the padding or metadata text) keep the file valid
}
