// 2.6: the 26B-A4B experts branch on the CPU. The router reads the raw residual r (= x_ here); the experts
// read pre_feedforward_layernorm_2(r); the weighted sum goes through post_feedforward_layernorm_2.
// Rows are grouped by expert so each selected expert's weights are read once per pass (a prompt chunk, or a
// batched decode step's rows, whose router logits and expert products are then each row's alone: see
// CpuModel::matmul).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu/forward.h"
#include "cpu/ops.h"

namespace markbase::cpu {

void CpuModel::moe(int i, int n) {
    const LayerWeights& w = w_.layers[i];
    const int H = c_.hidden, E = c_.n_experts, K = c_.top_k, Ie = c_.expert_width;
    const float eps = c_.rms_eps;
    const float* x = x_.data();

    // Router: z = RMSNorm_noweight(r) * scale * H^-0.5; softmax over all E; top-K; renormalise; *
    // per_expert_scale
    std::vector<float> z(static_cast<size_t>(n) * H), router_logits(static_cast<size_t>(n) * E);
    const float hs = 1.0f / std::sqrt(static_cast<float>(H));
    parallel_if(pool_, n, 4 * H, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
            float* zt = z.data() + t * H;
            rmsnorm(x + t * H, nullptr, H, eps, zt);
            for (int j = 0; j < H; ++j) zt[j] = zt[j] * bf16_to_float(w.router_scale[j]) * hs;
            // the experts' input, pre_feedforward_layernorm_2(r)
            rmsnorm(x + t * H, w.pre_ffn_norm_2, H, eps, moe_in_.data() + t * H);
        }
    });
    matmul(z.data(), n, H, w.router_proj, E, router_logits.data());

    std::vector<std::vector<std::pair<int, float>>> by_expert(E);  // expert -> (token, weight)
    std::vector<int> order(E);
    for (int t = 0; t < n; ++t) {
        const float* lg = router_logits.data() + int64_t{t} * E;
        const float mx = *std::max_element(lg, lg + E);
        std::vector<float> p(E);
        double sum = 0.0;
        for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(lg[e] - mx));
        for (int e = 0; e < E; ++e) p[e] = static_cast<float>(p[e] / sum);
        std::iota(order.begin(), order.end(), 0);
        // highest probability first; ties to the lower expert id, as torch.topk does on CPU
        const int ranked = std::min(K + 1, E);  // the (K+1)-th too: how close the choice was
        std::partial_sort(order.begin(), order.begin() + ranked, order.end(),
                          [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
        if (K < E) {  // relative to the largest |logit|: rounding moves the logits in proportion to it
            float big = 0.0f;
            for (int e = 0; e < E; ++e) big = std::max(big, std::fabs(lg[e]));
            const float gap = lg[order[K - 1]] - lg[order[K]];
            router_margin_ = std::min(router_margin_, big > 0.0f ? gap / big : 0.0f);
        }
        float top_sum = 0.0f;
        for (int k = 0; k < K; ++k) top_sum += p[order[k]];
        for (int k = 0; k < K; ++k) {
            const int e = order[k];
            by_expert[e].push_back({t, p[e] / top_sum * bf16_to_float(w.per_expert_scale[e])});
        }
    }

    // Experts: out[t] += weight * down_e( gelu(gate_e(in_t)) * up_e(in_t) ), in = moe_in_ (above)
    std::fill(moe_out_.begin(), moe_out_.begin() + int64_t{n} * H, 0.0f);
    std::vector<float> gathered, gu, h, down;
    for (int e = 0; e < E; ++e) {
        const auto& toks = by_expert[e];
        if (toks.empty()) continue;
        const int m = static_cast<int>(toks.size());
        gathered.resize(static_cast<size_t>(m) * H);
        for (int r = 0; r < m; ++r)
            std::copy_n(moe_in_.data() + int64_t{toks[r].first} * H, H, gathered.data() + int64_t{r} * H);
        gu.resize(static_cast<size_t>(m) * 2 * Ie);
        matmul(gathered.data(), m, H, w.experts_gate_up + int64_t{e} * 2 * Ie * H, 2 * Ie, gu.data());
        h.resize(static_cast<size_t>(m) * Ie);
        for (int r = 0; r < m; ++r) {
            const float* g = gu.data() + int64_t{r} * 2 * Ie;  // rows [0, Ie) gate, [Ie, 2Ie) up
            gelu_mul(pool_, g, g + Ie, h.data() + int64_t{r} * Ie, Ie);
        }
        down.resize(static_cast<size_t>(m) * H);
        matmul(h.data(), m, Ie, w.experts_down + int64_t{e} * H * Ie, H, down.data());
        for (int r = 0; r < m; ++r) {
            float* out = moe_out_.data() + int64_t{toks[r].first} * H;
            const float wt = toks[r].second;
            const float* dn = down.data() + int64_t{r} * H;
            for (int j = 0; j < H; ++j) out[j] += wt * dn[j];
        }
    }
    for (int t = 0; t < n; ++t) {
        float* out = moe_out_.data() + int64_t{t} * H;
        rmsnorm(out, w.post_ffn_norm_2, H, eps, out);
    }
}

}  // namespace markbase::cpu
