// Memory-mapped safetensors checkpoints: one file or a sharded set with model.safetensors.index.json.
// Nothing is copied: tensors are views into the mapped files. Everything is validated when opened (header
// length within the file, well-formed JSON, known dtype, shape * dtype size == byte range, ranges inside the
// data section and non-overlapping, index entries present in their shards); errors name the file and tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace markbase {

enum class DType { BF16, F16, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, BOOL, F8_E4M3, F8_E5M2 };

const char* dtype_name(DType t);
int dtype_size(DType t);

struct TensorInfo {
    std::string name;
    DType dtype = DType::BF16;
    std::vector<int64_t> shape;
    const uint8_t* data = nullptr;  // inside the mapped file
    uint64_t nbytes = 0;
    uint64_t file_offset = 0;  // where data starts in the file (for loaders that read instead of mapping)
    std::string file;          // the shard it came from (for error messages)

    int64_t numel() const;
    std::string shape_str() const;  // "[128, 1408, 2816]"
};

// A read-only mapping of one file; unmapped on destruction. Should the file be truncated while mapped,
// reading past its new end ends the process with "error: <file> changed size while mapped (truncated?)"
// instead of a bare SIGBUS (loading/mapping_guard.h). An empty file gives data() == nullptr and size 0 (mmap
// cannot map zero bytes; callers decide whether empty is an error). `prefetch` asks the kernel to read the
// whole file ahead (MADV_WILLNEED). It is off by default: the CPU backend reads weights in place, and a 60 GB
// model must not be pulled into the page cache ahead of need on a machine that cannot hold it.
class MappedFile {
  public:
    explicit MappedFile(const std::filesystem::path& path, bool prefetch = false);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    const uint8_t* data() const { return data_; }
    uint64_t size() const { return size_; }
    const std::string& path() const { return path_; }

  private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    uint64_t size_ = 0;
    int guard_ = -1;  // mapping_guard.h: a SIGBUS inside the mapping names the file
};

class SafetensorsSet {
  public:
    // `path` is a model folder (index or single model.safetensors) or one .safetensors file.
    static SafetensorsSet open(const std::filesystem::path& path);

    const TensorInfo* find(std::string_view name) const;
    // Throws markbase::Error "missing tensor NAME (looked in FILES)" when absent.
    const TensorInfo& get(std::string_view name) const;
    const std::map<std::string, TensorInfo, std::less<>>& tensors() const { return tensors_; }
    std::vector<std::string> files() const;  // the shards' paths, in the order they were opened
    uint64_t total_bytes() const;            // sum of all tensors' nbytes (not the files' sizes)
    // Every shard's "__metadata__" merged (string -> string); a later shard's value wins on a key clash.
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

  private:
    void add_shard(const std::filesystem::path& file);

    std::vector<std::shared_ptr<MappedFile>> maps_;
    std::map<std::string, TensorInfo, std::less<>> tensors_;
    std::map<std::string, std::string> metadata_;
};

// Writing, for tests and for tools that make random checkpoints without Python.
struct TensorToWrite {
    std::string name;
    DType dtype = DType::BF16;
    std::vector<int64_t> shape;
    const void* data = nullptr;  // exactly numel * dtype_size bytes
};
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace markbase
