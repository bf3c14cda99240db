// What FSDP1 (pytorch_fsdp.cc) and FSDP2 (pytorch_fsdp2.cc) share
// (pytorch_fsdp.h): the request each checks, the schedule each replays (DDP's
// too: pytorch_ddp.cc), AdamW over shards, and the shards FSDP1's AdamW
// steps.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "planner/adamw_steps.h"
#include "planner/pytorch_fsdp.h"
#include "planner/pytorch_ledger.h"

namespace shardfit::planner {

void check_fsdp_request(const PytorchDdpInputs& in, int world_size, int steps, const std::string& who) {
  if (!in.no_grads || !in.optimizer_param_steps || in.param_numels.empty() ||
      in.optimizer_param_steps->size() != 2 * in.param_numels.size())
    throw std::invalid_argument("--stack pytorch " + who + ": the trace file lacks the no-grads traces or each "
                                "parameter's optimizer steps: record it again with pytorch/trace_recorder.py");
  if (world_size < 1) throw std::invalid_argument("world size must be at least 1");
  if (steps < 1) throw std::invalid_argument("steps must be at least 1");
}

spec::Schedule pytorch_schedule(spec::Sharding sharding, const spec::ScheduleOptions& options) {
  spec::check_schedule_options(options);
  if (options.runtime == spec::Runtime::kTorchDdp && sharding != spec::Sharding::kDdp &&
      sharding != spec::Sharding::kZero1)
    throw std::invalid_argument("PyTorch's DDP shards nothing but ZeroRedundancyOptimizer's state: " +
                                std::string(spec::sharding_name(sharding)));
  // build_torch reads only the sharding's traits: whether parameters are
  // sharded and resharded after forward.
  spec::StrategyTraits traits;
  static_cast<spec::ShardingTraits&>(traits) = spec::sharding_traits(sharding);
  return spec::Schedule(traits, options);
}

void run_schedule_hook(const spec::Schedule& schedule, spec::Hook hook, int unit, const Ledger& ledger,
                       const std::function<void(spec::Op op, bool forward)>& apply, bool last_micro_batch) {
  const bool forward = hook == spec::Hook::kPreForward || hook == spec::Hook::kPostForward;
  for (spec::Op op : schedule.actions(hook, {unit == 0, last_micro_batch})) {
    if (ledger.oom()) return;
    apply(op, forward);
  }
}

ShardedAdamw sharded_adamw_steps(const PytorchDdpInputs& in, const std::vector<int64_t>& shards) {
  // A traced AdamW step for one parameter resized to a shard: every storage
  // of the parameter's size (its exp_avg and exp_avg_sq, the update's sqrt
  // and division: optim/adamw.py _single_tensor_adamw) becomes the shard's
  // size; the rest (none in 1.13's for-loop AdamW on a GPU parameter; its
  // `step` is a host tensor) stays. The parameter is the largest, so that no
  // other storage shares its size.
  const size_t ref = static_cast<size_t>(
      std::max_element(in.param_numels.begin(), in.param_numels.end()) - in.param_numels.begin());
  if (in.list_step_first && in.list_step_later) {
    // foreach=True or fused=True: one step over the list of shards, each
    // the largest parameter's part resized.
    std::vector<MultiTensorAdamwStep::Entry> list;
    for (int64_t shard : shards)
      if (shard > 0) list.push_back({static_cast<int>(ref), 4 * shard});
    return {in.list_step_first->compose(list), in.list_step_later->compose(list)};
  }
  std::vector<ModelTrace> steps;
  std::vector<int> order;
  for (int64_t shard : shards) {
    if (shard == 0) continue;
    for (int k = 0; k < 2; ++k) {
      ModelTrace t = (*in.optimizer_param_steps)[2 * ref + k];
      for (auto& e : t.events)
        if (e.kind == MemEvent::kAlloc && e.bytes == 4 * in.param_numels[ref]) e.bytes = 4 * shard;
      steps.push_back(std::move(t));
    }
    order.push_back(static_cast<int>(order.size()));
  }
  return {compose_optimizer_step(steps, order, true), compose_optimizer_step(steps, order, false)};
}

std::vector<int64_t> fsdp1_optimized_shards(const std::vector<ModuleNode>& modules, const spec::UnitPartition& part,
                                            int world, int rank, bool no_shard, bool use_orig_params) {
  std::vector<int64_t> shard(part.units.size());
  for (size_t u = 0; u < part.units.size(); ++u)
    shard[u] = fsdp1_rank_numel(part.units[u].numel, world, no_shard);
  if (!use_orig_params) return shard;  // the units' pre-order, as part.units is
  std::unordered_map<std::string, std::pair<size_t, int64_t>> at;  // name -> unit, offset in its flat parameter
  for (size_t u = 0; u < part.units.size(); ++u) {
    int64_t offset = 0;
    for (const ParamInfo& p : part.units[u].params) {
      at.emplace(p.name, std::make_pair(u, offset));
      offset += p.numel;
    }
  }
  std::vector<int64_t> out;
  for (const ModuleNode& m : modules)
    for (const ParamInfo& p : m.params) {
      const auto it = at.find(p.name);
      if (it == at.end()) continue;
      const auto [u, offset] = it->second;
      const int64_t begin = no_shard ? 0 : rank * shard[u], end = begin + shard[u];
      out.push_back(std::max<int64_t>(0, std::min(offset + p.numel, end) - std::max(offset, begin)));
    }
  return out;
}

}  // namespace shardfit::planner
