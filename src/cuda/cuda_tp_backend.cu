// The tensor-parallel CUDA backend (issue 7, --tensor-parallel-size N): one process, one host thread and one
// CudaModel per GPU. Rank r holds plan_partition(c, N, r)'s shard (its query heads and KV heads, dense-MLP
// rows, experts and vocabulary rows), runs the same decode step as one GPU with NCCL collectives on its
// stream (cuda_step.cu: after the embedding, o_proj and the FFN, and a max over the argmax keys), and
// captures that step as its own CUDA graph, so a decoded token is still one graph launch per GPU with no host
// round trip. Every rank ends a step with the same token; the ids are checked to agree.
#include <cstdlib>
#include <numeric>

#include "cuda/cuda_model.h"
#include "parallel/nccl_comm.h"
#include "parallel/partition.h"
#include "parallel/rank_threads.h"

namespace markbase::cuda {

namespace {

class TpBackendImpl final : public CudaBackend {
  public:
    TpBackendImpl(const ModelConfig& c, const Checkpoint* ck, uint64_t seed, const BackendOptions& opt)
        : config_(c), world_(opt.tensor_parallel) {
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
            models_[static_cast<size_t>(r)] =
                std::make_unique<CudaModel>(std::move(dw), opt.ctx_size, chunk, &sc);
        });
        on_ranks([&](int r) { model(r).connect(); });
        if (peer_sums_wanted() && peers_reachable(devices)) {
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
    bool truncate(int64_t n_keep) override {
        std::vector<char> ok(models_.size(), 0);
        for (size_t r = 0; r < models_.size(); ++r) ok[r] = models_[r]->truncate(n_keep) ? 1 : 0;
        return ok[0] != 0;  // the ranks' caches have the same shape: they agree
    }
    uint64_t cache_bytes() const override {
        uint64_t b = 0;
        for (const auto& m : models_) b += m->cache_bytes();
        return b;
    }

    void eval(const int* ids, int64_t n, float* logits, bool all_logits) override {
        check_token_ids(config_, ids, n);
        // each rank writes its vocabulary columns of the host rows
        on_ranks([&](int r) { eval_model(model(r), config_, ids, n, logits, all_logits); });
    }
    // Sampling reads the whole logits row on the host (the device top-k runs on one GPU's row).
    int max_select_k() const override { return 0; }
    bool eval_select(int, const DeviceSelect&, DeviceSelection*, float*) override {
        throw Error("internal: device-side selection with tensor parallelism");
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
    CudaDeviceInfo device() const override { return cuda_device_info(); }
    uint64_t weight_bytes() const override {
        uint64_t b = 0;
        for (const auto& m : models_) b += m->weights().bytes;
        return b;
    }

  private:
    // MARKBASE_TP_ALLREDUCE: p2p (the default; used when every pair of GPUs has peer access) or nccl.
    static bool peer_sums_wanted() {
        const char* e = std::getenv("MARKBASE_TP_ALLREDUCE");
        if (!e || !*e || std::string(e) == "p2p") return true;
        if (std::string(e) == "nccl") return false;
        throw Error(std::string("MARKBASE_TP_ALLREDUCE=") + e + ": expected p2p or nccl");
    }
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
    bool peer_sums_ = false;  // the decode step's sums through peer_sum rather than NCCL
    std::unique_ptr<NcclGroup> group_;
    std::unique_ptr<RankThreads> threads_;
    std::vector<std::unique_ptr<CudaModel>> models_;
};

}  // namespace

std::unique_ptr<CudaBackend> make_tp_backend(const ModelConfig& c, const Checkpoint* ck, uint64_t seed,
                                             const BackendOptions& opt) {
    return std::make_unique<TpBackendImpl>(c, ck, seed, opt);
}

}  // namespace markbase::cuda
