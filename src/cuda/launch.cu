#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cuda/launch.h"
#include "model/error.h"

namespace markbase::cuda {

bool pdl_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("MARKBASE_CUDA_PDL");
        return e ? std::strcmp(e, "0") != 0 : true;  // on unless MARKBASE_CUDA_PDL=0
    }();
    return on;
}

int carveout_preference() {
    const char* e = std::getenv("MARKBASE_CUDA_CARVEOUT_SMALL");
    if (!e) return -1;
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (!*e || *end || v < -1 || v > 100)
        throw Error(std::string("MARKBASE_CUDA_CARVEOUT_SMALL=") + e +
                    ": expected -1 (the driver's choice) to 100");
    return static_cast<int>(v);
}

void apply_carveout(const void* kernel) {
    const int want = carveout_preference();
    static std::mutex mu;
    static std::unordered_map<const void*, int> applied;  // kernel -> the preference it was given
    std::lock_guard<std::mutex> lock(mu);
    const auto it = applied.find(kernel);
    if (it == applied.end() ? want == -1 : it->second == want) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, want));
    applied[kernel] = want;
}

}  // namespace markbase::cuda
