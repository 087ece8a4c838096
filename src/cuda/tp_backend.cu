// The tensor-parallel CUDA backend (issue 7, --tensor-parallel-size N): one process, one host thread and one
// CudaModel per GPU. Rank r holds plan_partition(c, N, r)'s shard (its query heads and KV heads, dense-MLP
// rows, experts and vocabulary rows), runs the same decode step as one GPU with NCCL collectives on its
// stream (step.cu: after the embedding, o_proj and the FFN, and a max over the argmax keys), and
// captures that step as its own CUDA graph, so a decoded token is still one graph launch per GPU with no host
// round trip. Every rank ends a step with the same token; the ids are checked to agree.
#include <algorithm>
#include <numeric>

#include "cuda/model.h"
#include "parallel/nccl_comm.h"
#include "parallel/partition.h"
#include "parallel/rank_threads.h"

namespace markbase::cuda {

namespace {

class TpBackendImpl final : public CudaBackend {
  public:
    TpBackendImpl(const ModelConfig& c, const Checkpoint* ck, uint64_t seed, const BackendOptions& opt)
        : config_(c), world_(opt.tensor_parallel), device_select_(opt.tuning.device_sampling) {
        if (opt.slots > 1)
            throw Error("batched decode (--parallel) does not combine with tensor parallelism yet");
        const int visible = NcclGroup::device_count();
        if (visible < world_)
            throw Error("--tensor-parallel-size " + std::to_string(world_) + ": only " +
                        std::to_string(visible) + " CUDA device(s) are visible");
        std::vector<PartitionPlan> plans;
        for (int r = 0; r < world_; ++r) plans.push_back(plan_partition(c, world_, r));  // refuses bad splits
        std::vector<int> devices(static_cast<size_t>(world_));
        std::iota(devices.begin(), devices.end(), 0);
        group_ = std::make_unique<NcclGroup>(devices);
        threads_ = std::make_unique<RankThreads>(world_);
        models_.resize(static_cast<size_t>(world_));
        const int chunk = std::max(1, opt.chunk);
        on_ranks([&](int r) {
            const PartitionPlan& p = plans[static_cast<size_t>(r)];
            auto dw = ck ? upload_shard(*ck, p) : synthetic_shard(c, p, seed);
            ShardContext sc;
            sc.group = group_.get();
            sc.rank = r;
            sc.world = world_;
            sc.vocab_begin = p.vocab.begin;
            sc.vocab_total = c.vocab_size;
            if (c.moe) {
                sc.expert_begin = static_cast<int>(p.layers[0].experts.begin);
                sc.expert_count = static_cast<int>(p.layers[0].experts.size());
            }
            models_[static_cast<size_t>(r)] = std::make_unique<CudaModel>(std::move(dw), opt.ctx_size, chunk,
                                                                          opt.tuning, opt.kv_dtype, &sc);
        });
        on_ranks([&](int r) { model(r).connect(); });
        // the decode step's sums: NVLink peer sums where every pair of GPUs has peer access, unless the
        // tuning asks for NCCL
        if (opt.tuning.tp_allreduce == Tuning::AllReduce::kP2p && peers_reachable(devices)) {
            std::vector<CudaModel::PeerEndpoint> ends(static_cast<size_t>(world_));
            on_ranks([&](int r) {
                for (int q : devices) {  // map every other GPU's memory into this one's address space
                    if (q == group_->device(r)) continue;
                    const cudaError_t e = cudaDeviceEnablePeerAccess(q, 0);
                    if (e == cudaErrorPeerAccessAlreadyEnabled)
                        cudaGetLastError();
                    else
                        CUDA_CHECK(e);
                }
                ends[static_cast<size_t>(r)] = model(r).peer_endpoint();
            });
            on_ranks([&](int r) { model(r).use_peers(ends); });
            peer_sums_ = true;
        }
    }

    ~TpBackendImpl() override {
        if (threads_) {  // each model is freed on its own device
            try {
                on_ranks([&](int r) { models_[static_cast<size_t>(r)].reset(); });
            } catch (...) {
            }
        }
    }

    const ModelConfig& config() const override { return config_; }
    std::string name() const override {
        return "cuda tp=" + std::to_string(world_) + " (" + std::to_string(world_) + " x " +
               cuda_device_info().name + (peer_sums_ ? ", NVLink peer sums" : ", NCCL") + ")";
    }
    int64_t n_past() const override { return models_[0]->n_past; }
    int64_t ctx_size() const override { return models_[0]->ctx(); }
    void reset() override {
        for (auto& m : models_) m->n_past = 0;
    }
    bool truncate(int64_t n_keep) override {  // the ranks' caches have the same shape: they agree
        bool ok = true;
        for (auto& m : models_) ok = m->truncate(n_keep) && ok;
        return ok;
    }
    uint64_t cache_bytes() const override {
        uint64_t b = 0;
        for (const auto& m : models_) b += m->cache_bytes();
        return b;
    }

    void eval(const int* ids, int64_t n, float* logits, bool all_logits) override {
        // each rank checks the ids and writes its vocabulary columns of the host rows
        on_ranks([&](int r) { eval_model(model(r), config_, ids, n, logits, all_logits); });
    }
    // Sampling: each rank selects the k best of its vocabulary columns on its GPU; the global k best are
    // among those world x k candidates, merged here in the sampler's order (logit descending, id ascending).
    // CudaTpSampling (tests/cuda/test_cuda_tp.cpp) passed on two H200s, and there the 31B's sampled decode
    // took 11.6 ms/token against 13.8 with the row on the host. Tuning::device_sampling = false sends the
    // whole row to the host sampler.
    int max_select_k() const override { return device_select_ && models_[0]->can_select() ? kTopKMax : 0; }
    int max_select_penalty_ids() const override { return CudaModel::kMaxPenaltyIds; }
    bool eval_select(int id, const DeviceSelect& req, DeviceSelection* out, float* logits) override {
        check_token_ids(config_, &id, 1);
        const int n_pen = static_cast<int>(req.pen_ids.size());
        pen_.assign(req.pen_ids.begin(), req.pen_ids.end());
        pen_.insert(pen_.end(), req.pen_counts.begin(), req.pen_counts.end());
        const size_t w = models_.size();
        std::vector<std::vector<Sampler::Top>> tops(w);
        std::vector<int64_t> finite(w, 0);
        std::vector<char> ok(w, 0);
        on_ranks([&](int r) {
            const size_t i = static_cast<size_t>(r);
            ok[i] = model(r).decode_select(id, pen_.data(), n_pen, req.repeat_penalty, req.presence_penalty,
                                           req.frequency_penalty, req.k, &tops[i], &finite[i], nullptr);
        });
        // a NaN/+inf on any rank: the whole row goes to the host sampler, which names the problem
        if (std::find(ok.begin(), ok.end(), 0) != ok.end()) {
            if (logits) on_ranks([&](int r) { model(r).copy_logits(logits); });
            return false;
        }
        out->top.clear();
        out->n_finite = 0;
        for (size_t r = 0; r < w; ++r) {
            out->top.insert(out->top.end(), tops[r].begin(), tops[r].end());
            out->n_finite += finite[r];
        }
        std::sort(out->top.begin(), out->top.end(), [](const Sampler::Top& a, const Sampler::Top& b) {
            return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
        });
        if (out->top.size() > static_cast<size_t>(req.k)) out->top.resize(static_cast<size_t>(req.k));
        return true;
    }

    std::vector<int> decode_greedy(int steps, float* last_logits) override {
        if (n_past() == 0) throw Error("decode_greedy: evaluate a prompt first");
        std::vector<std::vector<int>> ids(models_.size());
        on_ranks([&](int r) {
            ids[static_cast<size_t>(r)] = model(r).decode_greedy(steps, last_logits);
            if (model(r).peer_timed_out())
                throw Error("tensor parallel: rank " + std::to_string(r) +
                            " waited 2 s for a peer's partial sum; the decoded tokens are not valid");
        });
        for (size_t r = 1; r < ids.size(); ++r)
            if (ids[r] != ids[0])
                throw Error("internal: tensor-parallel ranks 0 and " + std::to_string(r) +
                            " decoded different tokens");
        return ids[0];
    }
    std::vector<CudaProfileEntry> profile_step() override {
        throw Error("the per-kernel profile runs on one GPU: use --tensor-parallel-size 1");
    }
    bool profile_gated() const override { return false; }
    void slot_eval(int, const int*, int64_t) override {
        throw Error("batched decode (--parallel) does not combine with tensor parallelism yet");
    }
    std::vector<int> decode_batch(const int*, const int*, int, float*) override {
        throw Error("batched decode (--parallel) does not combine with tensor parallelism yet");
    }
    std::vector<CudaProfileEntry> profile_prefill(const int*, int) override {
        throw Error("the per-kernel profile runs on one GPU: use --tensor-parallel-size 1");
    }
    std::vector<CudaProfileEntry> profile_batch(const int*, const int*, int) override {
        throw Error("the per-kernel profile runs on one GPU: use --tensor-parallel-size 1");
    }
    CudaDeviceInfo device() const override { return cuda_device_info(); }
    uint64_t weight_bytes() const override {
        uint64_t b = 0;
        for (const auto& m : models_) b += m->weights().bytes;
        return b;
    }

  private:
    static bool peers_reachable(const std::vector<int>& devices) {
        for (int a : devices)
            for (int b : devices) {
                int ok = 0;
                if (a != b && (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || !ok)) {
                    cudaGetLastError();
                    return false;
                }
            }
        return true;
    }
    CudaModel& model(int r) { return *models_[static_cast<size_t>(r)]; }
    // f(rank) on every rank's thread with that rank's device current
    template <class F>
    void on_ranks(F&& f) {
        const std::function<void(int)> task = [&](int r) {
            CUDA_CHECK(cudaSetDevice(group_->device(r)));
            f(r);
        };
        threads_->run(task);
    }

    ModelConfig config_;
    int world_;
    bool device_select_;      // Tuning::device_sampling: top-k on each GPU (see max_select_k)
    bool peer_sums_ = false;  // the decode step's sums through peer_sum rather than NCCL
    std::unique_ptr<NcclGroup> group_;
    std::unique_ptr<RankThreads> threads_;
    std::vector<std::unique_ptr<CudaModel>> models_;
    std::vector<int> pen_;  // eval_select's ids then counts
};

}  // namespace

std::unique_ptr<CudaBackend> make_tp_backend(const ModelConfig& c, const Checkpoint* ck, uint64_t seed,
                                             const BackendOptions& opt) {
    return std::make_unique<TpBackendImpl>(c, ck, seed, opt);
}

}  // namespace markbase::cuda
