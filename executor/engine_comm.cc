// The engine's communication adapters (engine_comm.h).
#include "executor/engine_comm.h"

#include <signal.h>

#include <algorithm>
#include <functional>

#include <torch/torch.h>

#include "executor/meter.h"

namespace shardfit::executor {
namespace {

// LibTorch 1.13's ProcessGroupGloo has no bfloat16 ("Invalid scalar type");
// NCCL has. Until the gloo backend in comm.cc learns it, this decorator
// carries the engine's bf16 collectives over gloo:
//  - all-gather, broadcast: the same bytes viewed as uint8 (exact, no copy);
//  - reduce-scatter, all-reduce: in place through an fp32 bounce buffer of
//    at most kBounceElements per chunk, reduced (and averaged) in fp32 and
//    rounded once. The bounce buffer is communication-library scratch, as
//    gloo's own <= 2 MiB segments are: host memory, not counted.
// Everything else passes straight through.
class GlooBf16Bridge final : public Communicator {
 public:
  static constexpr int64_t kBounceElements = int64_t{1} << 16;  // 256 KiB of fp32

  explicit GlooBf16Bridge(Communicator& inner) : inner_(&inner) {}
  explicit GlooBf16Bridge(std::unique_ptr<Communicator> owned) : owned_(std::move(owned)), inner_(owned_.get()) {}

  Backend backend() const override { return inner_->backend(); }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  const std::vector<int>& global_ranks() const override { return inner_->global_ranks(); }

  void all_gather_into(const at::Tensor& out_flat, const at::Tensor& in_shard) override {
    if (!bridged(out_flat)) return inner_->all_gather_into(out_flat, in_shard);
    inner_->all_gather_into(out_flat.view(torch::kUInt8), in_shard.view(torch::kUInt8));
  }
  void reduce_scatter(const at::Tensor& out_shard, const at::Tensor& in_flat, ReduceOp op) override {
    if (!bridged(in_flat)) return inner_->reduce_scatter(out_shard, in_flat, op);
    const int64_t n = out_shard.numel();
    if (in_flat.numel() != n * world_size())
      return inner_->reduce_scatter(out_shard, in_flat, op);  // let the inner check explain
    reduce_in_place(in_flat.view({-1}), op);
    keep_rank_slice(in_flat, out_shard, rank());
  }
  void all_reduce(const at::Tensor& t, ReduceOp op) override {
    if (!bridged(t)) return inner_->all_reduce(t, op);
    reduce_in_place(t.view({-1}), op);
  }
  // Unbridged: the inner call, in flight. bf16: one fp32 bounce of the
  // whole tensor (host scratch, as above, but not chunked: it must live
  // until wait()), all-reduced in flight and rounded back at wait().
  std::unique_ptr<PendingCollective> reduce_scatter_async(const at::Tensor& out_shard, const at::Tensor& in_flat,
                                                          ReduceOp op) override {
    const int64_t n = out_shard.numel();
    if (!bridged(in_flat) || in_flat.numel() != n * world_size())
      return inner_->reduce_scatter_async(out_shard, in_flat, op);
    at::Tensor flat = in_flat.view({-1}), out = out_shard.view({-1});
    const int rank = this->rank();
    return bounced(flat, op, [flat, out, rank] { keep_rank_slice(flat, out, rank); });
  }
  std::unique_ptr<PendingCollective> all_gather_into_async(const at::Tensor& out_flat,
                                                           const at::Tensor& in_shard) override {
    if (!bridged(out_flat)) return inner_->all_gather_into_async(out_flat, in_shard);
    return inner_->all_gather_into_async(out_flat.view(torch::kUInt8), in_shard.view(torch::kUInt8));
  }
  std::unique_ptr<PendingCollective> all_reduce_async(const at::Tensor& t, ReduceOp op) override {
    if (!bridged(t)) return inner_->all_reduce_async(t, op);
    return bounced(t.view({-1}), op, [] {});
  }
  void broadcast(const at::Tensor& t, int root) override {
    if (!bridged(t)) return inner_->broadcast(t, root);
    inner_->broadcast(t.view({-1}).view(torch::kUInt8), root);
  }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<Communicator> new_group(const std::vector<int>& ranks) override {
    return std::make_unique<GlooBf16Bridge>(inner_->new_group(ranks));
  }

 private:
  bool bridged(const at::Tensor& t) const {
    return t.scalar_type() == torch::kBFloat16 && inner_->backend() == Backend::kGloo &&
           inner_->world_size() > 1 && t.is_contiguous();
  }
  void reduce_in_place(const at::Tensor& flat, ReduceOp op) {
    for (int64_t begin = 0; begin < flat.numel(); begin += kBounceElements) {
      at::Tensor chunk = flat.narrow(0, begin, std::min(kBounceElements, flat.numel() - begin));
      ScopedUntracked scratch;
      at::Tensor bounce = chunk.to(torch::kFloat);
      inner_->all_reduce(bounce, op);
      chunk.copy_(bounce);
    }
  }

  class Bounced final : public PendingCollective {
   public:
    Bounced(at::Tensor flat, at::Tensor bounce, std::unique_ptr<PendingCollective> inner,
            std::function<void()> finish)
        : flat_(std::move(flat)), bounce_(std::move(bounce)), inner_(std::move(inner)), finish_(std::move(finish)) {}
    void wait() override {
      if (!inner_) return;
      inner_->wait();
      inner_.reset();
      flat_.copy_(bounce_);
      bounce_.reset();  // an untracked block: its free subtracts nothing
      finish_();
    }

   private:
    at::Tensor flat_, bounce_;
    std::unique_ptr<PendingCollective> inner_;
    std::function<void()> finish_;
  };
  std::unique_ptr<PendingCollective> bounced(const at::Tensor& flat, ReduceOp op, std::function<void()> finish) {
    at::Tensor bounce;
    {
      ScopedUntracked scratch;
      bounce = flat.to(torch::kFloat);
    }
    auto inner = inner_->all_reduce_async(bounce, op);
    return std::make_unique<Bounced>(flat, std::move(bounce), std::move(inner), std::move(finish));
  }

  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
};

}  // namespace

std::unique_ptr<Communicator> with_bf16_over_gloo(Communicator& world) {
  return std::make_unique<GlooBf16Bridge>(world);
}

void all_reduce_host(Communicator& comm, const at::Tensor& host, ReduceOp op, c10::Device device) {
  if (comm.backend() != Backend::kNccl) {
    comm.all_reduce(host, op);
    return;
  }
  at::Tensor on_device = host.to(device);
  comm.all_reduce(on_device, op);
  host.copy_(on_device);
}

int agree_on_stop_signal(Communicator& world, int mine, c10::Device device) {
  ScopedUntracked host;
  torch::Tensor got = torch::zeros({2}, torch::kDouble);  // [any SIGTERM, any SIGINT]
  if (mine == SIGTERM) got[0] = 1.0;
  if (mine == SIGINT) got[1] = 1.0;
  all_reduce_host(world, got, ReduceOp::kSum, device);
  if (got[0].item<double>() > 0) return SIGTERM;
  return got[1].item<double>() > 0 ? SIGINT : 0;
}

void warm_up_groups(const std::vector<Communicator*>& groups, c10::Device device) {
  std::vector<Communicator*> seen;
  for (Communicator* g : groups) {
    if (g == nullptr || g->backend() != Backend::kNccl) continue;
    if (std::find(seen.begin(), seen.end(), g) != seen.end()) continue;
    seen.push_back(g);
    ScopedUntracked host;
    torch::Tensor t = torch::zeros({1}, torch::kDouble);
    all_reduce_host(*g, t, ReduceOp::kSum, device);
  }
}

}  // namespace shardfit::executor
