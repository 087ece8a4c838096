#include "runtime/prefix_reuse.h"

#include <cstdint>

namespace markbase {

std::vector<int> reuse_cached_prefix(Backend& be, std::vector<int>& cached, const std::vector<int>& ids) {
    if (static_cast<int64_t>(cached.size()) != be.n_past()) {  // the caller lost track: trust nothing
        be.reset();
        cached.clear();
    }
    size_t common = 0;
    while (common < cached.size() && common < ids.size() && cached[common] == ids[common]) ++common;
    if (common == ids.size() && common > 0) --common;  // at least one new token must be fed to get logits
    if (!be.truncate(static_cast<int64_t>(common))) {
        be.reset();
        common = 0;
    }
    cached.resize(common);
    return std::vector<int>(ids.begin() + static_cast<std::ptrdiff_t>(common), ids.end());
}

}  // namespace markbase
