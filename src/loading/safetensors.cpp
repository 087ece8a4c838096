// Safetensors reader and writer. The header is untrusted input (downloaded checkpoints, half-copied files),
// so every field is checked before any pointer into the mapping is formed; after open() succeeds, every
// TensorInfo points at exactly nbytes readable bytes and no two tensors share a byte.
#include "loading/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "loading/json_excerpt.h"
#include "loading/mapping_guard.h"
#include "loading/regular_file.h"
#include "model/error.h"

namespace markbase {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Real headers are ~100 KB even for the largest checkpoints; anything near this is corruption, and refusing
// it keeps a flipped high bit in the length from making us parse gigabytes of tensor data as JSON.
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

struct DTypeEntry {
    DType t;
    const char* name;
    int size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::BF16, "BF16", 2}, {DType::F16, "F16", 2},         {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},   {DType::I8, "I8", 1},           {DType::I16, "I16", 2},
    {DType::I32, "I32", 4},   {DType::I64, "I64", 8},         {DType::U8, "U8", 1},
    {DType::U16, "U16", 2},   {DType::U32, "U32", 4},         {DType::U64, "U64", 8},
    {DType::BOOL, "BOOL", 1}, {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
};

const DTypeEntry* dtype_entry(DType t) {
    for (const auto& e : kDTypes)
        if (e.t == t) return &e;
    return nullptr;
}

std::string errno_text(int err) {
    return std::error_code(err, std::generic_category()).message();
}

std::string known_dtypes() {
    std::string s;
    for (const auto& e : kDTypes) s += (s.empty() ? "" : ", ") + std::string(e.name);
    return s;
}

// Overflow-safe product of non-negative factors; false when it does not fit in uint64.
bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
    return !__builtin_mul_overflow(a, b, out);
}

// One shard's tensors and metadata, validated.
struct ParsedShard {
    std::vector<TensorInfo> tensors;
    std::map<std::string, std::string> metadata;
};

// The 8-byte little-endian header length, checked against the file's size.
uint64_t header_length(const MappedFile& m) {
    const std::string& file = m.path();
    auto fail = [&](const std::string& msg) -> Error { return Error(file + ": " + msg); };
    if (m.size() < 8)
        throw fail("file is " + std::to_string(m.size()) +
                   " bytes, too short for a safetensors file (expected at least the 8-byte header length)");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | m.data()[i];  // little-endian regardless of host order
    if (n > kMaxHeaderBytes)
        throw fail("header length is " + std::to_string(n) + " bytes, larger than the " +
                   std::to_string(kMaxHeaderBytes) + "-byte limit (corrupt file or not safetensors)");
    if (n > m.size() - 8)
        throw fail("header length is " + std::to_string(n) + " bytes but only " +
                   std::to_string(m.size() - 8) + " bytes follow the length field (file truncated?)");
    if (n < 2) throw fail("header length is " + std::to_string(n) + " bytes, too short for a JSON object");
    return n;
}

// The header: a JSON object with distinct keys. nlohmann keeps the last of duplicate keys silently; a
// callback sees every top-level key so a duplicate tensor name (two definitions, one silently lost) is
// reported instead.
json parse_header(std::string_view hdr, const std::string& file) {
    std::set<std::string> seen;
    std::string duplicate;
    json j = parse_json(hdr, file, "header", "", [&](int depth, json::parse_event_t ev, const json& parsed) {
        if (ev == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
            const auto& k = parsed.get_ref<const std::string&>();
            if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
        }
    });
    if (!j.is_object())
        throw Error(file + ": header must be a JSON object, found " + std::string(j.type_name()));
    if (!duplicate.empty())
        throw Error(file + ": tensor '" + text_excerpt(duplicate) + "' appears more than once in the header");
    return j;
}

void read_metadata(const json& e, const std::string& file, std::map<std::string, std::string>& out) {
    if (!e.is_object())
        throw Error(file + ": __metadata__ must be an object of strings, found " +
                    std::string(e.type_name()));
    for (auto mi = e.begin(); mi != e.end(); ++mi) {
        if (!mi.value().is_string())
            throw Error(file + ": __metadata__ key '" + text_excerpt(mi.key()) +
                        "' must be a string, found " + json_excerpt(mi.value()));
        out[mi.key()] = mi.value().get<std::string>();
    }
}

// Errors about one tensor of a shard: "<file>: tensor '<name>': <msg>".
struct TensorErrors {
    const std::string& file;
    const std::string& name;
    Error operator()(const std::string& msg) const {
        return Error(file + ": tensor '" + text_excerpt(name) + "': " + msg);
    }
};

const DTypeEntry& read_dtype(const json& e, const TensorErrors& tfail) {
    auto dt = e.find("dtype");
    if (dt == e.end()) throw tfail("missing \"dtype\"");
    if (!dt->is_string()) throw tfail("\"dtype\" must be a string, found " + json_excerpt(*dt));
    const auto& dts = dt->get_ref<const std::string&>();
    const DTypeEntry* de = nullptr;
    for (const auto& d : kDTypes)
        if (dts == d.name) de = &d;
    if (!de)
        throw tfail("unknown dtype \"" + text_excerpt(dts) + "\" (expected one of " + known_dtypes() + ")");
    return *de;
}

// Fills t.shape and `numel`; false when the element count overflows 64 bits (every dimension still checked).
bool read_shape(const json& e, TensorInfo& t, uint64_t& numel, const TensorErrors& tfail) {
    auto sh = e.find("shape");
    if (sh == e.end()) throw tfail("missing \"shape\"");
    if (!sh->is_array())
        throw tfail("\"shape\" must be an array of non-negative integers, found " + json_excerpt(*sh));
    numel = 1;
    bool fits = true;
    for (const json& d : *sh) {
        // Non-negative integers parse as number_unsigned; negatives, floats and huge values do not.
        if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
            throw tfail("\"shape\" must be an array of non-negative integers, found " + json_excerpt(*sh));
        uint64_t dim = d.get<uint64_t>();
        t.shape.push_back(int64_t(dim));
        if (!checked_mul(numel, dim, &numel)) fits = false;
    }
    return fits;
}

// A tensor's bytes [begin, end) in the data section.
struct Range {
    uint64_t begin, end;
    const std::string* name;
};

Range read_offsets(const json& e, uint64_t data_size, const TensorErrors& tfail) {
    auto off = e.find("data_offsets");
    if (off == e.end()) throw tfail("missing \"data_offsets\"");
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
        throw tfail("\"data_offsets\" must be two non-negative integers [begin, end], found " +
                    json_excerpt(*off));
    uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end)
        throw tfail("data_offsets begin " + std::to_string(begin) + " is greater than end " +
                    std::to_string(end));
    if (end > data_size)
        throw tfail("data_offsets end " + std::to_string(end) + " is beyond the data section, which is " +
                    std::to_string(data_size) + " bytes (file truncated?)");
    return {begin, end, nullptr};
}

// One tensor's header entry, checked against the data section that follows the n-byte header; `range`
// receives its bytes.
TensorInfo parse_tensor(const std::string& name, const json& e, const MappedFile& m, uint64_t n,
                        Range& range) {
    const TensorErrors tfail{m.path(), name};
    if (!e.is_object()) throw tfail("entry must be an object, found " + json_excerpt(e));
    TensorInfo t;
    t.name = name;
    t.file = m.path();
    const DTypeEntry& de = read_dtype(e, tfail);
    t.dtype = de.t;
    uint64_t numel = 1;
    const bool numel_fits = read_shape(e, t, numel, tfail);
    range = read_offsets(e, m.size() - 8 - n, tfail);
    const uint64_t begin = range.begin, end = range.end;
    uint64_t expect = 0;
    if (!numel_fits || !checked_mul(numel, uint64_t(de.size), &expect))
        throw tfail("shape " + t.shape_str() + " x " + de.name +
                    " overflows 64 bits, but data_offsets span " + std::to_string(end - begin) + " bytes");
    if (expect != end - begin)
        throw tfail("shape " + t.shape_str() + " of " + de.name + " needs " + std::to_string(expect) +
                    " bytes, but data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                    "] span " + std::to_string(end - begin) + " bytes");
    t.nbytes = end - begin;
    t.data = m.data() + 8 + n + begin;
    t.file_offset = 8 + n + begin;
    return t;
}

// Overlap would let a write through one tensor (or a quantizer's in-place view) corrupt another; empty
// tensors hold no bytes and cannot overlap anything.
void check_no_overlap(std::vector<Range>& ranges, const std::string& file) {
    std::erase_if(ranges, [](const Range& r) { return r.begin == r.end; });
    std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < ranges.size(); ++i)
        if (ranges[i].begin < ranges[i - 1].end)
            throw Error(file + ": tensor '" + *ranges[i].name + "' bytes [" +
                        std::to_string(ranges[i].begin) + ", " + std::to_string(ranges[i].end) +
                        ") overlap tensor '" + *ranges[i - 1].name + "' bytes [" +
                        std::to_string(ranges[i - 1].begin) + ", " + std::to_string(ranges[i - 1].end) + ")");
}

ParsedShard parse_shard(const MappedFile& m) {
    const std::string& file = m.path();
    const uint64_t n = header_length(m);
    const json j = parse_header(std::string_view(reinterpret_cast<const char*>(m.data() + 8), n), file);
    ParsedShard out;
    std::vector<Range> ranges;
    for (auto it = j.begin(); it != j.end(); ++it) {
        if (it.key() == "__metadata__") {
            read_metadata(it.value(), file, out.metadata);
            continue;
        }
        Range range{};
        out.tensors.push_back(parse_tensor(it.key(), it.value(), m, n, range));
        ranges.push_back(range);
    }
    for (size_t i = 0; i < ranges.size(); ++i) ranges[i].name = &out.tensors[i].name;
    check_no_overlap(ranges, file);
    return out;
}

}  // namespace

const char* dtype_name(DType t) {
    const DTypeEntry* e = dtype_entry(t);
    return e ? e->name : "?";
}

int dtype_size(DType t) {
    const DTypeEntry* e = dtype_entry(t);
    return e ? e->size : 0;
}

int64_t TensorInfo::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string TensorInfo::shape_str() const {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

MappedFile::MappedFile(const fs::path& path, bool prefetch) : path_(path.string()) {
    // Refused before the open: a FIFO would block it, a symlink loop would read as "cannot open".
    // (A missing file is left to open(), whose message says so.)
    if (const std::string why = path_problem(path); !why.empty() && !path_missing(path))
        throw Error("cannot map " + path_ + ": it " + why);
    // O_NONBLOCK: a path swapped for a FIFO since the check does not block (fstat then refuses it).
    int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) throw Error("cannot open " + path_ + ": " + errno_text(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        throw Error("cannot stat " + path_ + ": " + errno_text(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error("cannot map " + path_ + ": not a regular file");
    }
    size_ = uint64_t(st.st_size);
    if (size_ > 0) {
        // MAP_PRIVATE + PROT_READ: pages come straight from the page cache, nothing is copied, and a stray
        // write faults instead of changing the checkpoint on disk.
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            throw Error("cannot mmap " + path_ + " (" + std::to_string(size_) +
                        " bytes): " + errno_text(err));
        }
        data_ = static_cast<const uint8_t*>(p);
        guard_ = register_mapping(p, size_, path_);
        if (prefetch) ::madvise(p, size_, MADV_WILLNEED);  // advice only: failure changes nothing we rely on
    }
    ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
    unregister_mapping(guard_);
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// Maps one shard and adds its tensors; duplicates across shards would make which copy wins arbitrary.
void SafetensorsSet::add_shard(const fs::path& file) {
    auto m = std::make_shared<MappedFile>(file);
    ParsedShard shard = parse_shard(*m);
    for (auto& t : shard.tensors) {
        if (auto it = tensors_.find(t.name); it != tensors_.end())
            throw Error("tensor '" + t.name + "' appears in both " + it->second.file + " and " + t.file);
        std::string name = t.name;
        tensors_.emplace(std::move(name), std::move(t));
    }
    for (auto& [k, v] : shard.metadata) metadata_[k] = v;
    maps_.push_back(std::move(m));
}

void write_safetensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    const std::string p = path.string();
    json hdr = json::object();
    if (!metadata.empty()) hdr["__metadata__"] = metadata;
    // Data goes in order of falling dtype size (as the reference writer does): with the 8-aligned data
    // section every tensor then starts at a multiple of its element size, so in-place readers get aligned
    // pointers.
    std::vector<size_t> order(tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype);
    });
    std::vector<uint64_t> sizes;
    uint64_t offset = 0;
    for (size_t i : order) {
        const TensorToWrite& t = tensors[i];
        auto tfail = [&](const std::string& msg) {
            return Error("writing " + p + ": tensor '" + t.name + "': " + msg);
        };
        if (t.name.empty() || t.name == "__metadata__") throw tfail("invalid tensor name");
        if (hdr.contains(t.name)) throw tfail("name given twice");
        if (!dtype_entry(t.dtype)) throw tfail("invalid dtype");
        uint64_t n = uint64_t(dtype_size(t.dtype));
        for (int64_t d : t.shape) {
            if (d < 0) throw tfail("negative dimension " + std::to_string(d));
            if (!checked_mul(n, uint64_t(d), &n)) throw tfail("byte size overflows 64 bits");
        }
        if (n > 0 && !t.data) throw tfail("data is null but " + std::to_string(n) + " bytes are needed");
        hdr[t.name] = {
            {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
        sizes.push_back(n);
        offset += n;
    }
    // Pad with spaces to a multiple of 8, as the reference writer does, so the data section starts aligned.
    std::string h = hdr.dump();
    h.append((8 - h.size() % 8) % 8, ' ');
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(h.size()) >> (8 * i));

    // Write beside the target and rename: an interrupted run leaves no half-written checkpoint behind.
    fs::path tmp = path;
    tmp += ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw Error("cannot create " + tmp.string() + ": " + errno_text(errno));
        out.write(reinterpret_cast<const char*>(len), 8);
        out.write(h.data(), std::streamsize(h.size()));
        for (size_t k = 0; k < order.size(); ++k)
            if (sizes[k])
                out.write(static_cast<const char*>(tensors[order[k]].data), std::streamsize(sizes[k]));
        out.flush();
        if (!out) {
            int err = errno;
            out.close();
            std::error_code ec;
            fs::remove(tmp, ec);
            throw Error("cannot write " + tmp.string() + ": " + errno_text(err));
        }
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
        std::error_code ec2;
        fs::remove(tmp, ec2);
        throw Error("cannot rename " + tmp.string() + " to " + p + ": " + ec.message());
    }
}

}  // namespace markbase
