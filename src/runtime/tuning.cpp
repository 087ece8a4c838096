#include "runtime/tuning.h"

#include <charconv>

#include "model/error.h"

namespace markbase {

namespace {

constexpr std::string_view kKeys =
    "device_sampling, gemv, attn_cluster, tp_allreduce, load_threads, load_chunk_mib, "
    "load_direct, "
    "attn_gemm_rows, batch_attn_keys, batch_attn_heads, batch_attn, decode_attn, stream_gemm, tile_gemm, "
    "batch_experts, moe_gemm, gemm_inputs, cpu_pin, skip";

[[noreturn]] void bad(std::string_view source, std::string_view key, std::string_view value,
                      std::string_view expected) {
    throw Error(std::string(source) + ": " + std::string(key) + "=" + std::string(value) + ": expected " +
                std::string(expected));
}

bool parse_flag(std::string_view source, std::string_view key, std::string_view v) {
    if (v != "0" && v != "1") bad(source, key, v, "0 or 1");
    return v == "1";
}

int64_t parse_int(std::string_view source, std::string_view key, std::string_view v, int64_t lo, int64_t hi,
                  std::string_view expected) {
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size() || n < lo || n > hi)
        bad(source, key, v, expected);
    return n;
}

void set(Tuning& t, std::string_view source, std::string_view key, std::string_view v) {
    if (key == "device_sampling") {
        t.device_sampling = parse_flag(source, key, v);

    } else if (key == "gemv") {
        if (v == "auto")
            t.gemv = Tuning::Gemv::kAuto;
        else if (v == "rows")
            t.gemv = Tuning::Gemv::kRows;
        else if (v == "async_geglu")
            t.gemv = Tuning::Gemv::kAsyncGeglu;
        else
            bad(source, key, v, "auto, rows or async_geglu");
    } else if (key == "attn_cluster") {
        if (v == "auto")
            t.attn_cluster = Tuning::Choice::kAuto;
        else
            t.attn_cluster = parse_flag(source, key, v) ? Tuning::Choice::kOn : Tuning::Choice::kOff;
    } else if (key == "tp_allreduce") {
        if (v == "p2p")
            t.tp_allreduce = Tuning::AllReduce::kP2p;
        else if (v == "nccl")
            t.tp_allreduce = Tuning::AllReduce::kNccl;
        else
            bad(source, key, v, "p2p or nccl");
    } else if (key == "load_threads") {
        t.load_threads = static_cast<int>(parse_int(source, key, v, 0, 4096, "0 (automatic) to 4096"));
    } else if (key == "load_chunk_mib") {
        t.load_chunk_mib = static_cast<int>(parse_int(source, key, v, 1, 4096, "1 to 4096"));
    } else if (key == "load_direct") {
        t.load_direct = parse_flag(source, key, v);
    } else if (key == "attn_gemm_rows") {
        t.attn_gemm_rows = parse_int(source, key, v, 0, int64_t{1} << 24, "0 (automatic) or 16 to 16777216");
        if (t.attn_gemm_rows > 0 && t.attn_gemm_rows < 16)
            bad(source, key, v, "0 (automatic) or 16 to 16777216");
    } else if (key == "cpu_pin") {
        t.cpu_pin = parse_flag(source, key, v);
    } else if (key == "batch_attn_keys") {
        t.batch_attn_keys = static_cast<int>(parse_int(source, key, v, 16, 1 << 20, "16 to 1048576"));
    } else if (key == "batch_attn_heads") {
        t.batch_attn_heads = static_cast<int>(parse_int(source, key, v, 0, 8, "0 (automatic), 1, 2, 4 or 8"));
        if (t.batch_attn_heads & (t.batch_attn_heads - 1)) bad(source, key, v, "0 (automatic), 1, 2, 4 or 8");
    } else if (key == "batch_attn") {
        if (v != "warp" && v != "mma") bad(source, key, v, "mma or warp");
        t.batch_attn = v == "mma" ? Tuning::BatchAttn::kMma : Tuning::BatchAttn::kWarp;
    } else if (key == "decode_attn") {
        if (v != "auto" && v != "pieces" && v != "mma") bad(source, key, v, "auto, pieces or mma");
        t.decode_attn = v == "mma"      ? Tuning::DecodeAttn::kMma
                        : v == "pieces" ? Tuning::DecodeAttn::kPieces
                                        : Tuning::DecodeAttn::kAuto;
    } else if (key == "stream_gemm") {
        t.stream_gemm = static_cast<int>(parse_int(source, key, v, 0, 64, "0 (off) to 64"));
    } else if (key == "tile_gemm") {
        t.tile_gemm = static_cast<int>(parse_int(source, key, v, 0, 128, "0 (off) to 128"));
    } else if (key == "batch_experts") {
        t.batch_experts = static_cast<int>(parse_int(source, key, v, 0, 1024, "0 (off) to 1024"));
    } else if (key == "moe_gemm") {
        t.moe_gemm = parse_flag(source, key, v);
    } else if (key == "gemm_inputs") {
        if (v != "halves" && v != "bf16") bad(source, key, v, "bf16 or halves");
        t.gemm_inputs = v == "bf16" ? Tuning::GemmInputs::kBf16 : Tuning::GemmInputs::kHalves;
    } else if (key == "skip") {
        t.skip.clear();
        for (std::string_view rest = v; !rest.empty();) {
            const size_t plus = rest.find('+');
            const std::string_view name = rest.substr(0, plus);
            if (name.empty()) bad(source, key, v, "launch names joined by '+' (qkv+route_topk)");
            t.skip.emplace_back(name);
            rest = plus == std::string_view::npos ? std::string_view() : rest.substr(plus + 1);
        }
        if (t.skip.empty()) bad(source, key, v, "launch names joined by '+' (qkv+route_topk)");
    } else {
        throw Error(std::string(source) + ": unknown key '" + std::string(key) +
                    "' (known: " + std::string(kKeys) + ")");
    }
}

}  // namespace

Tuning parse_tuning(std::string_view spec, std::string_view source) {
    Tuning t;
    for (std::string_view rest = spec; !rest.empty();) {
        const size_t comma = rest.find(',');
        const std::string_view item = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        if (item.empty()) continue;
        const size_t eq = item.find('=');
        if (eq == std::string_view::npos || eq == 0)
            throw Error(std::string(source) + ": '" + std::string(item) +
                        "' is not key=value (known keys: " + std::string(kKeys) + ")");
        set(t, source, item.substr(0, eq), item.substr(eq + 1));
    }
    return t;
}

std::string tuning_string(const Tuning& t) {
    const Tuning d;
    std::string s;
    auto add = [&](const std::string& kv) { s += (s.empty() ? "" : ",") + kv; };
    auto choice = [](Tuning::Choice c) {
        return c == Tuning::Choice::kAuto ? "auto" : c == Tuning::Choice::kOn ? "1" : "0";
    };
    if (t.device_sampling != d.device_sampling)
        add(std::string("device_sampling=") + (t.device_sampling ? "1" : "0"));
    if (t.gemv != d.gemv)
        add(std::string("gemv=") + (t.gemv == Tuning::Gemv::kRows ? "rows" : "async_geglu"));
    if (t.attn_cluster != d.attn_cluster) add(std::string("attn_cluster=") + choice(t.attn_cluster));
    if (t.tp_allreduce != d.tp_allreduce) add("tp_allreduce=nccl");
    if (t.load_threads != d.load_threads) add("load_threads=" + std::to_string(t.load_threads));
    if (t.load_chunk_mib != d.load_chunk_mib) add("load_chunk_mib=" + std::to_string(t.load_chunk_mib));
    if (t.load_direct != d.load_direct) add(std::string("load_direct=") + (t.load_direct ? "1" : "0"));
    if (t.attn_gemm_rows != d.attn_gemm_rows) add("attn_gemm_rows=" + std::to_string(t.attn_gemm_rows));
    if (t.batch_attn_keys != d.batch_attn_keys) add("batch_attn_keys=" + std::to_string(t.batch_attn_keys));
    if (t.batch_attn_heads != d.batch_attn_heads)
        add("batch_attn_heads=" + std::to_string(t.batch_attn_heads));
    if (t.batch_attn != d.batch_attn)
        add(std::string("batch_attn=") + (t.batch_attn == Tuning::BatchAttn::kWarp ? "warp" : "mma"));
    if (t.decode_attn != d.decode_attn)
        add(std::string("decode_attn=") + (t.decode_attn == Tuning::DecodeAttn::kMma      ? "mma"
                                           : t.decode_attn == Tuning::DecodeAttn::kPieces ? "pieces"
                                                                                          : "auto"));
    if (t.stream_gemm != d.stream_gemm) add("stream_gemm=" + std::to_string(t.stream_gemm));
    if (t.tile_gemm != d.tile_gemm) add("tile_gemm=" + std::to_string(t.tile_gemm));
    if (t.batch_experts != d.batch_experts) add("batch_experts=" + std::to_string(t.batch_experts));
    if (t.moe_gemm != d.moe_gemm) add(std::string("moe_gemm=") + (t.moe_gemm ? "1" : "0"));
    if (t.gemm_inputs != d.gemm_inputs)
        add(std::string("gemm_inputs=") + (t.gemm_inputs == Tuning::GemmInputs::kBf16 ? "bf16" : "halves"));
    if (t.cpu_pin != d.cpu_pin) add(std::string("cpu_pin=") + (t.cpu_pin ? "1" : "0"));
    if (!t.skip.empty()) {
        std::string names;
        for (const std::string& n : t.skip) names += (names.empty() ? "" : "+") + n;
        add("skip=" + names);
    }
    return s;
}

}  // namespace markbase
