// PublishedQuant's FP8 parts (loading/published_quant.h): `<module>.weight` F8_E4M3 [out, in] with a
// `<module>.weight_scale` per channel or per tensor; `<module>.input_scale` set aside.
#include <vector>

#include "loading/published_quant.h"

namespace markbase {

namespace {

constexpr const char* kWeightScale = ".weight_scale";
constexpr const char* kInputScale = ".input_scale";

}  // namespace

bool PublishedQuant::read_fp8_module(const std::string& module, const TensorInfo& t, int64_t rows, int64_t K,
                                     int64_t r0, RowJob& job) {
    if (t.dtype != DType::F8_E4M3) {
        problem(t.file + ": tensor " + t.name + ": expected dtype F8_E4M3 (" + config_says(module, true) +
                "), found " + dtype_name(t.dtype));
        return false;
    }
    if (t.shape != std::vector<int64_t>{rows, K}) {
        problem(t.file + ": tensor " + t.name + ": expected shape " + shape_text({rows, K}) + ", found " +
                shape_text(t.shape));
        return false;
    }
    if (!read_fp8_scales(module, rows, job.scale + r0)) return false;
    if (const std::string in = module + kInputScale; ck_.files.find(in)) {  // weights-only: set aside
        used_.insert(in);
        ck_.skipped.push_back(in);
        ++input_scales_;
    }
    job.parts.push_back(t.data);
    ck_.bound_bytes += t.nbytes;
    return true;
}

bool PublishedQuant::read_fp8_scales(const std::string& module, int64_t rows, float* out) {
    const std::string name = module + kWeightScale;
    used_.insert(name);
    const TensorInfo* s = ck_.files.find(name);
    const std::string shapes = "[" + std::to_string(rows) + ", 1] per channel, or [1] or [] per tensor";
    if (!s) {
        problem("missing tensor " + name + " (expected F32 or BF16 " + shapes + ": the scale of " + module +
                ".weight, stored F8_E4M3)");
        return false;
    }
    if (s->dtype != DType::F32 && s->dtype != DType::BF16) {
        problem(s->file + ": tensor " + name + ": expected dtype F32 or BF16, found " + dtype_name(s->dtype));
        return false;
    }
    const bool per_row = s->shape == std::vector<int64_t>{rows, 1};
    if (!per_row && !s->shape.empty() && s->shape != std::vector<int64_t>{1}) {
        problem(s->file + ": tensor " + name + ": expected shape " + shapes + ", found " +
                shape_text(s->shape));
        return false;
    }
    if (std::string bad = scale_problem(*s, per_row ? rows : 1, per_row ? 1 : 0); !bad.empty()) {
        problem(std::move(bad));
        return false;
    }
    for (int64_t r = 0; r < rows; ++r) out[r] = scale_at(*s, per_row ? r : 0);
    ck_.bound_bytes += s->nbytes;
    return true;
}

}  // namespace markbase
