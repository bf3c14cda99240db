// The engine's class, shared by its two halves: executor/engine.cc (the
// training loop: units built, steps, the optimizer, checkpoints) and
// executor/engine_hooks.cc (the unit state machine: the hooks each wrapped
// unit passes through in forward and backward, and the schedule's actions
// at each). Internal: the API is engine.h.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "executor/comm.h"
#include "executor/data.h"
#include "executor/engine.h"
#include "executor/flat_param.h"
#include "executor/hf_init.h"
#include "executor/meter.h"
#include "models/autograd_hooks.h"
#include "models/model.h"
#include "spec/grad_buckets.h"
#include "spec/schedule.h"
#include "spec/strategy.h"
#include "spec/wrap_policy.h"

namespace shardfit::executor::engine_detail {

// fp16's dynamic loss scale, with torch.cuda.amp.GradScaler's defaults.
struct DynamicLossScaler {
  static constexpr double kInitScale = 65536.0;
  static constexpr double kGrowthFactor = 2.0;
  static constexpr double kBackoffFactor = 0.5;
  static constexpr int64_t kGrowthInterval = 2000;  // overflow-free steps before growing
  double scale = kInitScale;
  int64_t good_steps = 0;
  void update(bool overflow) {
    if (overflow) {
      scale *= kBackoffFactor;
      good_steps = 0;
    } else if (++good_steps == kGrowthInterval) {
      scale *= kGrowthFactor;
      good_steps = 0;
    }
  }
};

// The engine is the ModuleRunner its model runs under.
class Engine final : public models::ModuleRunner {
 public:
  Engine(const EngineOptions& options, Communicator& world);
  EngineResult train(const std::function<void(const StepLog&)>& on_step);

  torch::Tensor run(models::ModuleBase& module, const std::vector<torch::Tensor>& inputs,
                    const models::ModuleFn& fn) override;

 private:
  void build_units();
  void alloc_flat_grad();
  void build_grad_buckets();
  void launch_bucket(int bucket);
  void zero_grad();
  void train_step(int64_t step, DataSource& data, double* loss);
  bool wants_save(int64_t step) const;
  std::filesystem::path save(int64_t step);
  int64_t resume(const std::string& from);
  void optimizer_step();
  std::vector<FlatParam*> unit_pointers();

  // The hooks, in the simulator's names.
  void pre_forward(int u);
  void post_forward(int u);
  void pre_backward(int u);
  void backward_end(int u);
  void post_backward(int u);
  // The schedule's actions for a unit's hook, or (u < 0) the step's.
  void run_hook(spec::Hook hook, int u);
  void apply(spec::Op op, int u);
  void on_recompute(int module, bool begin);
  void close_open_units();
  void mark(const std::string& label) { meter_->mark(label); }
  // The few host scalars the engine reduces (all_reduce_host).
  double all_reduce_scalar(Communicator& comm, double value, ReduceOp op) {
    ScopedUntracked host;
    torch::Tensor t = torch::full({1}, value, torch::kDouble);
    all_reduce_host(comm, t, op, device_);
    return t.item<double>();
  }
  const std::string& unit_name(int u) const { return units_.units[u].name; }

  const EngineOptions& o_;
  Communicator* world_;
  c10::Device device_;  // where units, grads and activations live
  std::unique_ptr<DeviceMeter> meter_;
  spec::StrategyTraits traits_;  // what o_.candidate means, decoded once
  spec::Schedule schedule_;      // what it does at each hook (spec/schedule.h)
  c10::ScalarType compute_dtype_;
  std::unique_ptr<Communicator> bridged_world_;  // bf16 over gloo (engine_comm.h)
  HybridGroups hybrid_;
  Communicator* shard_group_ = nullptr;  // all-gather / reduce-scatter group
  Communicator* replicate_ = nullptr;    // hybrid: across nodes
  int group_size_ = 1;                   // N of the flat param layout

  std::shared_ptr<models::TrainableModel> model_;
  std::unique_ptr<HfCheckpoint> init_;  // `run --init`, until the units are built
  spec::UnitPartition units_;
  int root_unit_ = 0;
  std::vector<int> unit_of_root_;  // module index -> unit rooted there, or -1
  std::vector<bool> recompute_;    // module index -> re-runs its forward in backward
  std::vector<std::unique_ptr<FlatParam>> flat_;
  torch::Tensor flat_grad_;  // ddp/zero1: every unit's grads, one buffer
  std::unique_ptr<DynamicLossScaler> scaler_;
  int64_t optimizer_steps_ = 0;
  int64_t skipped_steps_ = 0;

  // Per micro-batch state.
  std::string prefix_;  // "step<k>/"
  bool last_micro_ = true;
  std::vector<int> fwd_depth_, rcp_depth_, ends_left_;
  std::vector<bool> bwd_begun_, bwd_done_;
  std::vector<int> open_;  // units whose backward began and has not ended, in begin order
  bool in_recompute_ = false;
  std::vector<std::unique_ptr<models::ScopedModuleRunner>> recompute_scopes_;
  // Reductions in flight, in launch order (the schedule's kWaitReduce
  // finishes them): units (zero2/3/hybrid) or gradient buckets (ddp/zero1).
  std::vector<int> in_flight_;
  // ddp/zero1: DDP's gradient buckets over flat_grad_ (spec/grad_buckets.h),
  // told by each parameter's AccumulateGrad when its gradient is in.
  spec::GradBuckets buckets_;
  std::vector<std::unique_ptr<PendingCollective>> bucket_work_;
  std::vector<std::shared_ptr<torch::autograd::Node>> grad_accumulators_;  // keep the hooks alive
  // Units in the order their forward first began: backward prefetch (FSDP's
  // BACKWARD_PRE) gathers, at a unit's backward begin, the unit before it.
  std::vector<int> forward_order_;
  std::vector<bool> forward_seen_;
};

}  // namespace shardfit::executor::engine_detail
