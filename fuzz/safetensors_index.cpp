// model.safetensors.index.json beside two small valid shards: the index decides which shard holds which
// tensor, and every inconsistency must be an error, never a wrong binding or a crash.
#include <vector>

#include "fuzz/fuzz_input.h"
#include "loading/safetensors.h"
#include "model/error.h"

namespace {

void write_shards() {
    const std::vector<uint16_t> a(6, 0x3f80), b(4, 0x4000);
    markbase::write_safetensors(markbase::fuzz::scratch_dir() / "model-00001-of-00002.safetensors",
                                {{"model.a.weight", markbase::DType::BF16, {2, 3}, a.data()}});
    markbase::write_safetensors(markbase::fuzz::scratch_dir() / "model-00002-of-00002.safetensors",
                                {{"model.b.weight", markbase::DType::BF16, {4}, b.data()}});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const bool shards = (write_shards(), true);
    (void)shards;
    markbase::fuzz::write_input("model.safetensors.index.json", data, size);
    try {
        const markbase::SafetensorsSet set = markbase::SafetensorsSet::open(markbase::fuzz::scratch_dir());
        unsigned sum = 0;
        for (const auto& [name, t] : set.tensors())
            if (t.nbytes > 0) sum += t.data[0] + t.data[t.nbytes - 1];
        if (sum == 0xdeadbeef) return 1;
    } catch (const markbase::Error&) {
    }
    return 0;
}
