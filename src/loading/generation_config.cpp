#include "loading/generation_config.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/error.h"

namespace markbase {

GenerationDefaults read_generation_config(const std::filesystem::path& dir) {
    GenerationDefaults g;
    const auto path = dir / "generation_config.json";
    std::ifstream f(path);
    if (!f) return g;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
        throw Error(path.string() + ": not valid JSON: " + e.what());
    }
    auto num = [&](const char* k) -> std::optional<float> {
        if (j.contains(k) && j[k].is_number()) return j[k].get<float>();
        return std::nullopt;
    };
    g.temperature = num("temperature");
    g.top_p = num("top_p");
    g.min_p = num("min_p");
    g.repetition_penalty = num("repetition_penalty");
    if (j.contains("top_k") && j["top_k"].is_number_integer()) g.top_k = j["top_k"].get<int>();
    if (j.contains("do_sample") && j["do_sample"].is_boolean()) g.do_sample = j["do_sample"].get<bool>();
    if (j.contains("eos_token_id")) {
        const auto& e = j["eos_token_id"];
        if (e.is_number_integer()) g.stop_ids.push_back(e.get<int>());
        if (e.is_array())
            for (const auto& v : e)
                if (v.is_number_integer()) g.stop_ids.push_back(v.get<int>());
    }
    return g;
}

}  // namespace markbase
