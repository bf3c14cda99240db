// The loopback backend: one process stands in for rank r of a world of N
// and rehearses its memory; every collective acts as if all ranks held this
// rank's inputs (executor/comm.h).
#include "executor/comm.h"
#include "executor/comm_detail.h"

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace shardfit::executor {
namespace {

using comm_detail::check_avg_dtype;
using comm_detail::check_dense;
using comm_detail::check_pair;
using comm_detail::checked_members;
using comm_detail::index_of;
using comm_detail::place_shard;
using comm_detail::scale_in_place;

// ---- loopback --------------------------------------------------------------
// Every collective acts as if all ranks held this rank's inputs. Nothing is
// allocated: copies into slots, in-place multiply.

class LoopbackCommunicator final : public Communicator {
 public:
  LoopbackCommunicator(int rank, std::vector<int> global_ranks)
      : rank_(rank), global_ranks_(std::move(global_ranks)) {}

  Backend backend() const override { return Backend::kLoopback; }
  int rank() const override { return rank_; }
  int world_size() const override { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const override { return global_ranks_; }

  void all_gather_into(const at::Tensor& out_flat, const at::Tensor& in_shard) override {
    const char* op = "all_gather_into";
    check_pair(op, "out_flat", out_flat, "in_shard", in_shard, world_size());
    const int64_t n = in_shard.numel();
    at::Tensor out = out_flat.view({-1}), in = in_shard.view({-1});
    place_shard(op, out.narrow(0, rank_ * n, n), in, out);
    at::Tensor own = out.narrow(0, rank_ * n, n);
    for (int r = 0; r < world_size(); ++r)
      if (r != rank_) out.narrow(0, r * n, n).copy_(own);
  }

  void reduce_scatter(const at::Tensor& out_shard, const at::Tensor& in_flat, ReduceOp reduce) override {
    const char* op = "reduce_scatter";
    check_pair(op, "in_flat", in_flat, "out_shard", out_shard, world_size());
    check_avg_dtype(op, out_shard, reduce);
    keep_rank_slice(in_flat, out_shard, rank_);
    if (reduce == ReduceOp::kSum) scale_in_place(out_shard.view({-1}), world_size(), false);  // N identical contributions
  }

  void all_reduce(const at::Tensor& t, ReduceOp reduce) override {
    check_dense("all_reduce", "t", t);
    check_avg_dtype("all_reduce", t, reduce);
    if (reduce == ReduceOp::kSum) scale_in_place(t, world_size(), false);
  }

  void broadcast(const at::Tensor& t, int root) override {
    check_dense("broadcast", "t", t);
    if (root < 0 || root >= world_size())
      throw std::logic_error("broadcast: root " + std::to_string(root) + " is outside the group of " +
                             std::to_string(world_size()));
  }

  void barrier() override {}

  std::unique_ptr<Communicator> new_group(const std::vector<int>& ranks) override {
    checked_members(ranks, world_size(), rank_);
    std::vector<int> globals;
    for (int r : ranks) globals.push_back(global_ranks_[r]);
    return std::make_unique<LoopbackCommunicator>(index_of(ranks, rank_), std::move(globals));
  }

 private:
  int rank_;
  std::vector<int> global_ranks_;
};

}  // namespace

std::unique_ptr<Communicator> comm_detail::make_loopback(int rank, int world_size) {
  std::vector<int> globals(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) globals[r] = r;
  return std::make_unique<LoopbackCommunicator>(rank, std::move(globals));
}

}  // namespace shardfit::executor
