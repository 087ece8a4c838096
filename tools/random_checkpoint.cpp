// markbase-random-ckpt VARIANT OUTDIR [--layers N] [--seed S] [--shard-gb G]
// Writes a random-weight checkpoint at a released variant's real widths (the layout and value ranges of
// ../shared/tools/make_random_ckpt.py, but without Python or torch), for CPU benchmarks where no real
// weights can be downloaded.
#include "loading/random_checkpoint.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/error.h"
#include "model/variants.h"

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr,
                     "usage: %s VARIANT(e2b|e4b|26b-a4b|31b) OUTDIR [--layers N] [--seed S] [--shard-gb G]\n",
                     argv[0]);
        return 2;
    }
    int layers = 0;
    unsigned long long seed = 1234;
    double shard_gb = 4.0;
    for (int i = 3; i + 1 < argc; i += 2) {
        const std::string k = argv[i];
        if (k == "--layers")
            layers = std::atoi(argv[i + 1]);
        else if (k == "--seed")
            seed = std::strtoull(argv[i + 1], nullptr, 10);
        else if (k == "--shard-gb")
            shard_gb = std::atof(argv[i + 1]);
        else {
            std::fprintf(stderr, "error: unknown option %s\n", k.c_str());
            return 2;
        }
    }
    try {
        const auto bytes =
            markbase::write_random_checkpoint(argv[2], markbase::variant_config(argv[1], layers), seed,
                                              static_cast<uint64_t>(shard_gb * (1ull << 30)));
        std::printf("wrote %s: %.3f GB of bf16 weights\n", argv[2], bytes / 1e9);
    } catch (const markbase::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
