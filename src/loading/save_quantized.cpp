#include "loading/save_quantized.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "loading/regular_file.h"
#include "loading/saved_tensors.h"
#include "model/int4.h"

namespace markbase {

namespace fs = std::filesystem;
// ordered: config.json keeps the source's key order, as transformers writes it
using json = nlohmann::ordered_json;

namespace {

// The files beside the weights that vLLM and transformers read (tokenizer, chat template, sampling defaults,
// the multimodal processors' settings); each is copied where the source folder has it.
constexpr const char* kSideFiles[] = {
    "tokenizer.json",          "tokenizer_config.json", "tokenizer.model",
    "special_tokens_map.json", "chat_template.jinja",   "chat_template.json",
    "generation_config.json",  "processor_config.json", "preprocessor_config.json"};

fs::path normalised(const fs::path& dir) {
    fs::path p = fs::absolute(dir).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();  // "out/" names the folder "out"
    return p;
}

// compressed-tensors' quantization_config as llm-compressor writes it for its FP8_DYNAMIC scheme (weights per
// channel, activations per token at run time: vLLM's fused MoE has no FP8 weights-only path, and MarkBase
// sets the activation scheme aside) or for W4A16 / W4A16_ASYM.
json quantization_config(WeightFormat f, bool symmetric, const std::vector<std::string>& ignore) {
    const bool fp8 = f == WeightFormat::kFp8;
    const char* format = fp8 ? "float-quantized" : "pack-quantized";
    const json weights = {{"num_bits", fp8 ? 8 : 4},
                          {"type", fp8 ? "float" : "int"},
                          {"strategy", fp8 ? "channel" : "group"},
                          {"group_size", fp8 ? json(nullptr) : json(kInt4Group)},
                          {"symmetric", fp8 || symmetric},
                          {"dynamic", false},
                          {"actorder", nullptr},
                          {"block_structure", nullptr},
                          {"observer", "minmax"},
                          {"observer_kwargs", json::object()}};
    const json activations = {{"num_bits", 8},
                              {"type", "float"},
                              {"strategy", "token"},
                              {"symmetric", true},
                              {"dynamic", true},
                              {"group_size", nullptr},
                              {"block_structure", nullptr},
                              {"actorder", nullptr},
                              {"observer", nullptr},
                              {"observer_kwargs", json::object()}};
    const json group = {{"targets", json::array({"Linear"})},
                        {"weights", weights},
                        {"input_activations", fp8 ? activations : json(nullptr)},
                        {"output_activations", nullptr},
                        {"format", format}};
    return {{"quant_method", "compressed-tensors"},
            {"format", format},
            {"quantization_status", "compressed"},
            {"config_groups", {{"group_0", group}}},
            {"ignore", ignore},
            {"kv_cache_scheme", nullptr},
            {"sparsity_config", json::object()},
            {"global_compression_ratio", nullptr}};
}

void write_text(const fs::path& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (out) out << text;
    out.flush();
    if (!out) throw Error("cannot write " + path.string() + ": " + std::strerror(errno));
}

// The source's config.json with the quantization_config replaced (a published one may sit in text_config).
void write_config(const Checkpoint& ck, const fs::path& dir, const json& qc) {
    const fs::path src = ck.dir / "config.json";
    json config = json::parse(read_regular_file(src));  // the loader has parsed and checked it already
    if (config.contains("text_config") && config.at("text_config").is_object())
        config.at("text_config").erase("quantization_config");
    config["quantization_config"] = qc;
    write_text(dir / "config.json", config.dump(2) + "\n");
}

uint64_t tensor_bytes(const TensorToWrite& t) {
    uint64_t n = static_cast<uint64_t>(dtype_size(t.dtype));
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    return n;
}

std::string shard_name(size_t i, size_t n) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i, n);
    return buf;
}

// One model.safetensors, or shards of at most max_bytes of tensors (one larger tensor gets a shard of its
// own) and their index, as transformers' save_pretrained names them. Returns the number of shards.
int write_shards(const fs::path& dir, const std::vector<TensorToWrite>& tensors, uint64_t max_bytes) {
    const std::map<std::string, std::string> metadata{{"format", "pt"}};  // transformers wants "pt"
    std::vector<std::vector<TensorToWrite>> shards(1);
    uint64_t cur = 0, total = 0;
    for (const TensorToWrite& t : tensors) {
        const uint64_t b = tensor_bytes(t);
        if (!shards.back().empty() && cur + b > max_bytes) {
            shards.emplace_back();
            cur = 0;
        }
        shards.back().push_back(t);
        cur += b;
        total += b;
    }
    if (shards.size() == 1) {
        write_safetensors(dir / "model.safetensors", tensors, metadata);
        return 1;
    }
    json weight_map = json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
        const std::string file = shard_name(s + 1, shards.size());
        for (const TensorToWrite& t : shards[s]) weight_map[t.name] = file;
        write_safetensors(dir / file, shards[s], metadata);
    }
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text(dir / "model.safetensors.index.json", index.dump(2) + "\n");
    return static_cast<int>(shards.size());
}

void copy_side_files(const fs::path& src, const fs::path& dir) {
    for (const char* f : kSideFiles)
        if (path_problem(src / f).empty()) fs::copy_file(src / f, dir / f);
}

uint64_t folder_bytes(const fs::path& dir) {
    uint64_t n = 0;
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
        if (e.is_regular_file()) n += e.file_size();
    return n;
}

}  // namespace

Error nothing_to_save(const fs::path& source) {
    return Error("nothing to save: the model in " + source.string() +
                 " is bf16 (saving writes a quantised model: add --quantize fp8 or --quantize int4)");
}

void check_save_target(const fs::path& dir, const fs::path& source) {
    const fs::path target = normalised(dir);
    const std::string head = "cannot save to " + dir.string() + ": ";
    if (path_missing(target)) return;
    if (const std::string why = path_problem(target, true); !why.empty())
        throw Error(head + "it " + why + " (saving needs a new or empty folder)");
    std::error_code ec;
    if (fs::equivalent(target, source, ec))
        throw Error(head + "it is the folder the model was loaded from (saving needs a new or empty folder)");
    if (!fs::is_empty(target, ec) || ec)
        throw Error(head +
                    "the folder is not empty (saving needs a new or empty folder; nothing is overwritten)");
}

SaveResult save_quantized(const Checkpoint& ck, const fs::path& dir, const SaveOptions& options) {
    if (ck.format == WeightFormat::kBf16) throw nothing_to_save(ck.dir);
    check_save_target(dir, ck.dir);
    SaveResult r;
    r.dir = normalised(dir);
    r.format = ck.format;
    SavedTensors st = saved_tensors(ck);
    r.symmetric = st.symmetric;
    r.notes = std::move(st.notes);
    // beside DIR, so the rename stays on one file system
    const fs::path tmp =
        r.dir.parent_path() / ("." + r.dir.filename().string() + ".partial-" + std::to_string(::getpid()));
    std::error_code ec;
    try {
        fs::create_directories(r.dir.parent_path());
        fs::remove_all(tmp);
        fs::create_directory(tmp);
        r.shards = write_shards(tmp, st.tensors, options.max_shard_bytes);
        write_config(ck, tmp, quantization_config(r.format, r.symmetric, st.ignore));
        copy_side_files(ck.dir, tmp);
        r.bytes = folder_bytes(tmp);
        fs::rename(tmp, r.dir);  // rename(2) replaces an empty folder
    } catch (const fs::filesystem_error& e) {
        fs::remove_all(tmp, ec);
        throw Error("cannot save to " + dir.string() + ": " + e.code().message() + " (" + e.path1().string() +
                    ")");
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
    return r;
}

std::string save_summary(const SaveResult& r) {
    const std::string scheme = r.format == WeightFormat::kFp8
                                   ? "an FP8 compressed-tensors checkpoint (float-quantized, a scale per row)"
                                   : std::string("an int4 compressed-tensors checkpoint (pack-quantized, ") +
                                         (r.symmetric ? "symmetric" : "asymmetric") + ", group 128)";
    return "saved " + scheme + " to " + r.dir.string() + ": " + std::to_string(r.shards) +
           (r.shards == 1 ? " shard, " : " shards, ") + std::to_string(r.bytes) + " bytes";
}

}  // namespace markbase
