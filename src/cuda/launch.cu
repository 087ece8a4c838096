#include <cstdlib>
#include <cstring>

#include "cuda/launch.h"

namespace markbase::cuda {

bool pdl_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("MARKBASE_CUDA_PDL");
        return e ? std::strcmp(e, "0") != 0 : true;  // on unless MARKBASE_CUDA_PDL=0
    }();
    return on;
}

}  // namespace markbase::cuda
