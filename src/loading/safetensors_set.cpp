// The set of a checkpoint's safetensors shards: a folder's index (model.safetensors.index.json, itself
// untrusted: every shard a plain file name in the folder, every tensor where the index says), its lone shard,
// or one file; then lookups by name. Each shard is mapped and checked by SafetensorsSet::add_shard
// (safetensors.cpp).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "loading/json_excerpt.h"
#include "loading/regular_file.h"
#include "loading/safetensors.h"
#include "model/error.h"

namespace markbase {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The index's shard files, each once in first-mention order (stable, readable errors) and checked.
std::vector<std::string> index_shards(const fs::path& path, const std::string& iname, const json& wm) {
    std::vector<std::string> shards;
    std::set<std::string> shard_set;
    for (auto it = wm.begin(); it != wm.end(); ++it) {
        if (!it.value().is_string())
            throw Error(iname + ": weight_map entry for tensor '" + text_excerpt(it.key()) +
                        "' must be a file name, found " + json_excerpt(it.value()));
        const auto& f = it.value().get_ref<const std::string&>();
        // The index is untrusted too: a shard must be a plain file name inside the model folder.
        if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
            throw Error(iname + ": weight_map entry for tensor '" + text_excerpt(it.key()) +
                        "' names shard \"" + text_excerpt(f) + "\", expected a file name in " +
                        path.string());
        if (shard_set.insert(f).second) shards.push_back(f);
    }
    for (const auto& f : shards)
        if (const std::string why = path_problem(path / f); !why.empty())
            throw Error(iname + ": shard " + f + " is listed in the index but " + (path / f).string() + " " +
                        why);
    return shards;
}

// Every tensor the index names is in the shard it names.
void check_index(const SafetensorsSet& set, const fs::path& path, const std::string& iname, const json& wm) {
    for (auto it = wm.begin(); it != wm.end(); ++it) {
        const std::string want = (path / it.value().get<std::string>()).string();
        const TensorInfo* t = set.find(it.key());
        if (!t || t->file != want)
            throw Error(iname + ": index says tensor '" + it.key() + "' is in shard " + want + ", but " +
                        want + " has no such tensor" + (t ? " (it is in " + t->file + ")" : ""));
    }
}

// A folder without an index: its model.safetensors, else its one *.safetensors file.
fs::path lone_shard(const fs::path& path) {
    if (!path_missing(path / "model.safetensors")) return path / "model.safetensors";
    std::error_code ec;
    std::vector<fs::path> found;
    for (const auto& de : fs::directory_iterator(path, ec))
        if (de.path().extension() == ".safetensors") found.push_back(de.path());
    if (ec) throw Error("cannot list " + path.string() + ": " + ec.message());
    if (found.size() == 1) return found[0];
    if (found.empty())
        throw Error(
            "no safetensors checkpoint in " + path.string() +
            ": looked for model.safetensors.index.json, model.safetensors, and any *.safetensors file");
    std::sort(found.begin(), found.end());
    std::string names;
    for (const auto& f : found) names += (names.empty() ? "" : ", ") + f.filename().string();
    throw Error(path.string() + " has " + std::to_string(found.size()) + " .safetensors files (" + names +
                ") but no model.safetensors.index.json to say which tensors are where");
}

}  // namespace

SafetensorsSet SafetensorsSet::open(const fs::path& path) {
    SafetensorsSet set;
    if (path_missing(path)) throw Error("safetensors path " + path.string() + " does not exist");
    if (!path_problem(path, true).empty()) {  // a file, or something MappedFile refuses by name
        set.add_shard(path);
        return set;
    }
    const fs::path index = path / "model.safetensors.index.json";
    if (path_missing(index)) {
        set.add_shard(lone_shard(path));
        return set;
    }
    const std::string iname = index.string();
    const json j = parse_json(read_regular_file(index), iname);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
        throw Error(iname + ": expected an object with a \"weight_map\" object (tensor name -> shard file)");
    const json& wm = j["weight_map"];
    for (const auto& f : index_shards(path, iname, wm)) set.add_shard(path / f);
    check_index(set, path, iname, wm);
    return set;
}

const TensorInfo* SafetensorsSet::find(std::string_view name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

const TensorInfo& SafetensorsSet::get(std::string_view name) const {
    if (const TensorInfo* t = find(name)) return *t;
    std::string fl;
    for (const auto& f : files()) fl += (fl.empty() ? "" : ", ") + f;
    throw Error("missing tensor " + std::string(name) + " (looked in " + fl + ")");
}

std::vector<std::string> SafetensorsSet::files() const {
    std::vector<std::string> out;
    for (const auto& m : maps_) out.push_back(m->path());
    return out;
}

uint64_t SafetensorsSet::total_bytes() const {
    uint64_t n = 0;
    for (const auto& [name, t] : tensors_) n += t.nbytes;
    return n;
}

}  // namespace markbase
