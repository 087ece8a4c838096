#include "loading/random_checkpoint.h"

#include <fstream>
#include <map>

#include "loading/config_json.h"
#include "loading/safetensors.h"
#include "model/error.h"
#include "model/tensor_plan.h"

namespace markbase {

namespace {

// splitmix64: a fast, well-mixed generator; one stream per tensor so shards can be drawn independently.
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
};

std::vector<bf16> draw(const PlannedTensor& p, uint64_t seed) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    std::vector<bf16> out(static_cast<size_t>(n));
    Rng rng{seed};
    float lo = 0, hi = 0;
    random_init_bounds(p, lo, hi);
    for (auto& v : out) v = float_to_bf16(lo + (hi - lo) * rng.uniform());
    return out;
}

}  // namespace

uint64_t write_random_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config,
                                 uint64_t seed, uint64_t shard_bytes) {
    const ModelConfig c = parse_config_text(config.dump(), "random checkpoint config");
    std::filesystem::create_directories(dir);
    const std::vector<PlannedTensor> plan = plan_tensors(c, nullptr);

    // Group tensors into shards of at most shard_bytes (a tensor larger than that gets a shard of its own).
    std::vector<std::vector<size_t>> shards(1);
    uint64_t cur = 0, total = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
        uint64_t b = 2;
        for (int64_t d : plan[i].shape) b *= static_cast<uint64_t>(d);
        if (!shards.back().empty() && cur + b > shard_bytes) {
            shards.emplace_back();
            cur = 0;
        }
        shards.back().push_back(i);
        cur += b;
        total += b;
    }
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
        const std::string file = shards.size() == 1
                                     ? "model.safetensors"
                                     : "model-" + std::string(5 - std::to_string(s + 1).size(), '0') +
                                           std::to_string(s + 1) + "-of-" +
                                           std::string(5 - std::to_string(shards.size()).size(), '0') +
                                           std::to_string(shards.size()) + ".safetensors";
        std::vector<std::vector<bf16>> data;
        std::vector<TensorToWrite> tw;
        data.reserve(shards[s].size());
        for (size_t i : shards[s]) {
            data.push_back(draw(plan[i], seed * 1000003ull + i));
            tw.push_back({c.weight_prefix + plan[i].name, DType::BF16, plan[i].shape, data.back().data()});
            weight_map[c.weight_prefix + plan[i].name] = file;
        }
        write_safetensors(dir / file, tw, {{"format", "pt"}});
    }
    if (shards.size() > 1) {
        nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
        std::ofstream(dir / "model.safetensors.index.json") << index.dump(1) << "\n";
    }
    std::ofstream f(dir / "config.json");
    f << config.dump(1) << "\n";
    if (!f) throw Error((dir / "config.json").string() + ": cannot write");
    return total;
}

}  // namespace markbase
