// PublishedQuant's int4 parts (loading/published_quant.h): compressed-tensors' pack-quantized tensors of a
// module, each checked with every problem listed: weight_packed, weight_shape, weight_scale and, when the
// config is asymmetric, weight_zero_point; a g_idx (activation-ordered groups) is refused.
#include <cstring>
#include <vector>

#include "loading/published_quant.h"
#include "model/int4.h"

namespace markbase {

namespace {

int64_t int_at(const TensorInfo& t, int64_t i) {  // I32 or I64, any alignment
    if (t.dtype == DType::I64) {
        int64_t v;
        std::memcpy(&v, t.data + 8 * i, sizeof v);
        return v;
    }
    int32_t v;
    std::memcpy(&v, t.data + 4 * i, sizeof v);
    return v;
}

}  // namespace

bool PublishedQuant::refuse_companion(const std::string& name, const std::string& why) {
    const TensorInfo* t = ck_.files.find(name);
    if (!t) return false;
    used_.insert(name);
    problem(t->file + ": tensor " + name + ": " + why);
    return true;
}

bool PublishedQuant::read_int4_module(const std::string& module, const TensorInfo& t, int64_t rows, int64_t K,
                                      int64_t r0, RowJob& job) {
    const int64_t words = (K + 7) / 8, G = int4_groups(K);
    bool ok = true;
    if (t.dtype != DType::I32) {
        problem(t.file + ": tensor " + t.name + ": expected dtype I32 (eight int4 weights a word), found " +
                dtype_name(t.dtype));
        ok = false;
    } else if (t.shape != std::vector<int64_t>{rows, words}) {
        problem(t.file + ": tensor " + t.name + ": expected shape " + shape_text({rows, words}) + " (" +
                std::to_string(K) + " weights a row, eight a word), found " + shape_text(t.shape));
        ok = false;
    }
    ok = check_weight_shape(module, rows, K) && ok;
    ok = read_int4_scales(module, rows, K, job.scale + r0 * G) && ok;
    if (qc_.symmetric)
        ok = !refuse_companion(
                 module + ".weight_zero_point",
                 "unexpected (config.json's quantization_config says symmetric: no zero points)") &&
             ok;
    else
        ok = read_int4_zeros(module, rows, K, job.zero + r0 * G) && ok;
    ok = !refuse_companion(
             module + ".weight_g_idx",
             "activation-ordered groups (a g_idx mapping columns to groups) are not supported") &&
         ok;
    ok = !refuse_companion(module + ".weight",
                           "unexpected beside " + t.name + " (the weight is stored once)") &&
         ok;
    if (!ok) return false;
    job.parts.push_back(t.data);
    job.part_stride = 4 * words;
    ck_.bound_bytes += t.nbytes;
    return true;
}

bool PublishedQuant::check_weight_shape(const std::string& module, int64_t rows, int64_t K) {
    const std::string name = module + ".weight_shape";
    used_.insert(name);
    const TensorInfo* s = ck_.files.find(name);
    const std::string want = shape_text({rows, K});
    if (!s) {
        problem("missing tensor " + name + " (expected I32 or I64 [2] holding " + want +
                ": the unpacked shape of " + module + ".weight_packed)");
        return false;
    }
    if (s->dtype != DType::I32 && s->dtype != DType::I64) {
        problem(s->file + ": tensor " + name + ": expected dtype I32 or I64, found " + dtype_name(s->dtype));
        return false;
    }
    if (s->shape != std::vector<int64_t>{2}) {
        problem(s->file + ": tensor " + name + ": expected shape [2], found " + shape_text(s->shape));
        return false;
    }
    const std::vector<int64_t> held{int_at(*s, 0), int_at(*s, 1)};
    if (held != std::vector<int64_t>{rows, K}) {
        problem(s->file + ": tensor " + name + ": holds " + shape_text(held) + ", expected " + want +
                " (the shape config.json gives " + module + ".weight)");
        return false;
    }
    ck_.bound_bytes += s->nbytes;
    return true;
}

bool PublishedQuant::read_int4_scales(const std::string& module, int64_t rows, int64_t K, float* out) {
    const std::string name = module + ".weight_scale";
    used_.insert(name);
    const TensorInfo* s = ck_.files.find(name);
    const int64_t G = int4_groups(K);
    if (!s) {
        problem("missing tensor " + name + " (expected BF16, F16 or F32 " + shape_text({rows, G}) +
                ": a scale per 128 weights of " + module + ".weight_packed)");
        return false;
    }
    if (s->dtype != DType::BF16 && s->dtype != DType::F16 && s->dtype != DType::F32) {
        problem(s->file + ": tensor " + name + ": expected dtype BF16, F16 or F32, found " +
                dtype_name(s->dtype));
        return false;
    }
    if (s->shape != std::vector<int64_t>{rows, G}) {
        problem(s->file + ": tensor " + name + ": expected shape " + shape_text({rows, G}) +
                " (a scale per 128 weights), found " + shape_text(s->shape));
        return false;
    }
    if (std::string bad = scale_problem(*s, rows * G, G); !bad.empty()) {
        problem(std::move(bad));
        return false;
    }
    for (int64_t i = 0; i < rows * G; ++i) out[i] = scale_at(*s, i);
    ck_.bound_bytes += s->nbytes;
    return true;
}

bool PublishedQuant::read_int4_zeros(const std::string& module, int64_t rows, int64_t K, uint8_t* out) {
    const std::string name = module + ".weight_zero_point";
    used_.insert(name);
    const TensorInfo* s = ck_.files.find(name);
    const int64_t G = int4_groups(K);
    const std::vector<int64_t> packed{(rows + 7) / 8, G}, unpacked{rows, G};
    const std::string want = "I32 " + shape_text(packed) + " (eight zero points a word along the output " +
                             "dimension) or I8 " + shape_text(unpacked);
    if (!s) {
        problem("missing tensor " + name + " (expected " + want +
                ": config.json's quantization_config says symmetric false)");
        return false;
    }
    if (s->dtype == DType::I32 && s->shape == packed) {
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t g = 0; g < G; ++g) out[r * G + g] = int4_packed_zero_at(s->data, G, r, g);
    } else if (s->dtype == DType::I8 && s->shape == unpacked) {
        int64_t bad = 0, first = 0;
        for (int64_t i = 0; i < rows * G; ++i) {
            const int v = static_cast<int8_t>(s->data[i]);
            if (v >= -8 && v <= 7) {
                out[i] = static_cast<uint8_t>(v + 8);
            } else if (bad++ == 0) {
                first = i;
            }
        }
        if (bad) {
            problem(s->file + ": tensor " + name + ": " + std::to_string(bad) + " of " +
                    std::to_string(rows * G) + " zero points outside -8..7 (first at row " +
                    std::to_string(first / G) + ", group " + std::to_string(first % G) + ": " +
                    std::to_string(static_cast<int8_t>(s->data[first])) + ")");
            return false;
        }
    } else {
        problem(s->file + ": tensor " + name + ": expected " + want + ", found " + dtype_name(s->dtype) +
                " " + shape_text(s->shape));
        return false;
    }
    ck_.bound_bytes += s->nbytes;
    return true;
}

}  // namespace markbase
