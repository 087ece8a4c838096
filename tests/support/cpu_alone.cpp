#include "support/cpu_alone.h"

#include <algorithm>

namespace markbase::testing {

AloneRun run_alone_on_cpu(const Checkpoint& ck, const BackendOptions& o, const std::vector<int>& prompt,
                          int decodes) {
    auto be = make_cpu_backend(ck, o);
    const int64_t V = ck.config.vocab_size;
    AloneRun a;
    std::vector<float> row(static_cast<size_t>(V));
    be->eval(prompt.data(), static_cast<int64_t>(prompt.size()), row.data(), false);
    for (int i = 0;; ++i) {
        a.rows.push_back(row);
        a.next.push_back(static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin()));
        if (i == decodes) break;
        be->eval(&a.next.back(), 1, row.data(), false);
    }
    return a;
}

}  // namespace markbase::testing
