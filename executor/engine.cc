#include "executor/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <stdexcept>

#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>

#include "executor/data.h"
#include "models/autograd_hooks.h"
#include "models/model.h"
#include "planner/plan_builder.h"
#include "planner/trace.h"
#include "planner/wrap_policy.h"

namespace shardfit::executor {
namespace {

using planner::Sharding;

c10::ScalarType compute_scalar_type(planner::Precision p) {
  switch (p) {
    case planner::Precision::kFp16:
      return torch::kHalf;
    case planner::Precision::kBf16:
      return torch::kBFloat16;
    case planner::Precision::kFp32:
      break;
  }
  return torch::kFloat;
}

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

// LibTorch 1.13's CPU kernels lack some Half ops (addmm among them): try the
// ops a transformer step needs on a tiny input before committing to fp16.
std::string cpu_precision_problem(c10::ScalarType dtype) {
  if (dtype == torch::kFloat) return "";
  ScopedUntracked probe;
  try {
    torch::NoGradGuard no_grad;
    auto o = torch::TensorOptions().dtype(dtype);
    auto x = torch::ones({2, 4}, o), w = torch::ones({4, 4}, o), b = torch::zeros({4}, o);
    auto y = torch::addmm(b, x, w);
    y = torch::layer_norm(y, {4}, w[0], b);
    y = torch::softmax(torch::matmul(y.view({1, 2, 4}), y.view({1, 4, 2})), -1);
    (void)torch::gelu(y, "tanh");
    return "";
  } catch (const std::exception& e) {
    std::string what = e.what();
    return what.substr(0, what.find('\n'));
  }
}

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
    at::Tensor slice = in_flat.view({-1}).narrow(0, rank() * n, n);
    if (slice.data_ptr() != out_shard.data_ptr()) out_shard.view({-1}).copy_(slice);
  }
  void all_reduce(const at::Tensor& t, ReduceOp op) override {
    if (!bridged(t)) return inner_->all_reduce(t, op);
    reduce_in_place(t.view({-1}), op);
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

  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
};

bool any_requires_grad(const std::vector<torch::Tensor>& ts) {
  for (const auto& t : ts)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

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
  void zero_grad();
  void train_step(int64_t step, DataSource& data, double* loss);
  void optimizer_step();
  std::vector<FlatParam*> unit_pointers();

  // The hooks, in the simulator's names.
  void pre_forward(int u);
  void post_forward(int u);
  void pre_backward(int u);
  void backward_end(int u);
  void post_backward(int u);
  void recompute_begin(int u);
  void on_recompute(int module, bool begin);
  void close_open_units();
  void mark(const std::string& label) { meter_.mark(label); }
  const std::string& unit_name(int u) const { return units_.units[u].name; }

  const EngineOptions& o_;
  Communicator* world_;
  TrackingAllocator& meter_;
  Sharding sharding_;
  bool sharded_;                // zero2/zero3/hybrid: params live as shards
  bool reshard_after_forward_;  // zero3/hybrid
  c10::ScalarType compute_dtype_;
  std::unique_ptr<GlooBf16Bridge> bridged_world_;
  HybridGroups hybrid_;
  Communicator* shard_group_ = nullptr;  // all-gather / reduce-scatter group
  Communicator* replicate_ = nullptr;    // hybrid: across nodes
  int group_size_ = 1;                   // N of the flat param layout

  std::shared_ptr<models::TrainableModel> model_;
  planner::UnitPartition units_;
  int root_unit_ = 0;
  std::vector<int> unit_of_root_;  // module index -> unit rooted there, or -1
  std::vector<bool> checkpoint_;   // module index -> recomputed in backward
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
  // Units in the order their forward first began: backward prefetch (FSDP's
  // BACKWARD_PRE) gathers, at a unit's backward begin, the unit before it.
  std::vector<int> forward_order_;
  std::vector<bool> forward_seen_;
};

}  // namespace

void check_engine_options(const EngineOptions& o, int world_size) {
  const auto& m = o.model;
  if (o.batch < 1) throw std::invalid_argument("--batch " + std::to_string(o.batch) + ": must be at least 1");
  if (o.steps < 1) throw std::invalid_argument("--steps " + std::to_string(o.steps) + ": must be at least 1");
  if (o.grad_accum < 1)
    throw std::invalid_argument("--grad-accum " + std::to_string(o.grad_accum) + ": must be at least 1");
  if (o.seq_len < 2 || o.seq_len > m.max_positions)
    throw std::invalid_argument("--seq-len " + std::to_string(o.seq_len) + ": must be in 2.." +
                                std::to_string(m.max_positions) + " for " + m.name);
  if (m.family == models::Family::kBert && o.seq_len < 5)
    throw std::invalid_argument("--seq-len " + std::to_string(o.seq_len) +
                                ": BERT sentence pairs need at least 5 tokens");
  const planner::Candidate& c = o.candidate;
  if (c.sharding == Sharding::kDdp && c.offload)
    throw std::invalid_argument("--strategy " + c.to_id() +
                                ": offload needs sharded state (use zero1, zero2, zero3 or hybrid)");
  if (c.sharding == Sharding::kHybrid) {
    const int g = o.shard_group_size > 0 ? o.shard_group_size : world_size;
    if (world_size % g != 0) {
      throw std::invalid_argument("--strategy " + c.to_id() + ": --gpus-per-node " + std::to_string(g) +
                                  " does not divide the world of " + std::to_string(world_size) + " ranks (" +
                                  std::to_string(world_size) + " % " + std::to_string(g) + " = " +
                                  std::to_string(world_size % g) + ")");
    }
  }
  const std::string problem = cpu_precision_problem(compute_scalar_type(c.precision));
  if (!problem.empty()) {
    throw std::invalid_argument("--strategy " + c.to_id() + ": this CPU LibTorch cannot compute in " +
                                planner::precision_name(c.precision) + " (" + problem + "); use bf16 or fp32");
  }
}

Engine::Engine(const EngineOptions& o, Communicator& world)
    : o_(o), world_(&world), meter_(TrackingAllocator::cpu()) {
  check_engine_options(o, world.world_size());
  bridged_world_ = std::make_unique<GlooBf16Bridge>(world);
  world_ = bridged_world_.get();
  const planner::Candidate& c = o.candidate;
  sharding_ = c.sharding;
  sharded_ = sharding_ == Sharding::kZero2 || sharding_ == Sharding::kZero3 || sharding_ == Sharding::kHybrid;
  reshard_after_forward_ = sharding_ == Sharding::kZero3 || sharding_ == Sharding::kHybrid;
  compute_dtype_ = compute_scalar_type(c.precision);
  if (compute_dtype_ == torch::kHalf) scaler_ = std::make_unique<DynamicLossScaler>();

  const int n = world.world_size();
  if (sharding_ == Sharding::kHybrid) {
    group_size_ = o.shard_group_size > 0 ? o.shard_group_size : n;
    hybrid_ = make_hybrid_groups(*world_, group_size_);  // throws, showing the arithmetic
    shard_group_ = hybrid_.shard.get();
    replicate_ = hybrid_.replicate.get();
  } else {
    group_size_ = sharding_ == Sharding::kDdp ? 1 : n;
    shard_group_ = world_;
  }
}

std::vector<FlatParam*> Engine::unit_pointers() {
  std::vector<FlatParam*> out;
  for (auto& f : flat_) out.push_back(f.get());
  return out;
}

// Wrap (units from the module tree), then each unit's flat parameter. The
// full model was built on the host, untracked: the same values on every
// rank, as the one-rank model has.
void Engine::build_units() {
  const planner::Candidate& c = o_.candidate;
  const std::vector<planner::ModuleNode> modules = planner::module_tree(o_.model);
  units_ = planner::wrap_modules(modules, planner::WrapPolicy::parse(c.wrap));
  // The meta-built module table and this model must index modules alike.
  int index = 0;
  for (const auto& item : model_->named_modules("", /*include_self=*/true)) {
    auto* base = dynamic_cast<models::ModuleBase*>(item.value().get());
    if (index >= static_cast<int>(modules.size()) || modules[index].path != item.key() ||
        (base && base->index() != index)) {
      throw std::logic_error("module table mismatch at " + std::to_string(index) + " ('" + item.key() + "')");
    }
    ++index;
  }
  unit_of_root_.assign(modules.size(), -1);
  for (size_t u = 0; u < units_.units.size(); ++u) {
    unit_of_root_[units_.units[u].root_module] = static_cast<int>(u);
    if (units_.units[u].root_module == 0) root_unit_ = static_cast<int>(u);
  }
  checkpoint_.assign(modules.size(), false);
  if (c.ckpt)
    for (int m : planner::checkpoint_modules(modules, units_)) checkpoint_[m] = true;

  FlatParamConfig config;
  config.sharded_params = sharded_;
  config.shard_optimizer = sharding_ == Sharding::kZero1;
  config.offload = c.offload;
  config.compute_dtype = compute_dtype_;
  const int group_rank = sharding_ == Sharding::kDdp ? 0 : shard_group_->rank();
  auto named = model_->named_parameters(/*recurse=*/true);
  for (const planner::Unit& unit : units_.units) {
    std::vector<torch::Tensor> params;
    for (const planner::ParamInfo& p : unit.params) {
      const torch::Tensor* t = named.find(p.name);
      if (t == nullptr) throw std::logic_error("unit " + unit.name + ": no parameter " + p.name);
      params.push_back(*t);
    }
    flat_.push_back(std::make_unique<FlatParam>(unit.name, planner::FlatParamLayout(unit.params, group_size_),
                                                group_rank, config, params));
  }
  const size_t num_units = units_.units.size();
  fwd_depth_.assign(num_units, 0);
  rcp_depth_.assign(num_units, 0);
  ends_left_.assign(num_units, 0);
  bwd_begun_.assign(num_units, false);
  bwd_done_.assign(num_units, false);
  forward_seen_.assign(num_units, false);
}

// ddp/zero1: one flat gradient buffer for every unit (DDP's
// gradient_as_bucket_view), allocated when the first backward starts and
// zeroed, not freed, between steps.
void Engine::alloc_flat_grad() {
  int64_t total = 0;
  for (auto& f : flat_) total += f->padded_numel();
  flat_grad_ = torch::zeros({total}, torch::TensorOptions().dtype(compute_dtype_));
  int64_t offset = 0;
  for (auto& f : flat_) {
    f->attach_flat_grad(flat_grad_.narrow(0, offset, f->padded_numel()));
    offset += f->padded_numel();
  }
}

// zero2/3/hybrid free last step's shard grads (set_to_none); ddp/zero1 zero
// their flat grad in place.
void Engine::zero_grad() {
  if (flat_grad_.defined()) flat_grad_.zero_();
  for (auto& f : flat_) f->free_shard_grad();
}

torch::Tensor Engine::run(models::ModuleBase& module, const std::vector<torch::Tensor>& inputs,
                          const models::ModuleFn& fn) {
  const int idx = module.index();
  const int u = idx >= 0 && idx < static_cast<int>(unit_of_root_.size()) ? unit_of_root_[idx] : -1;
  const bool recompute = in_recompute_;
  if (u >= 0) {
    // Only the outermost call of a unit's root module gathers / reshards.
    if (!recompute) {
      if (fwd_depth_[u]++ == 0) pre_forward(u);
    } else if (rcp_depth_[u]++ == 0) {
      recompute_begin(u);
    }
    // Each call whose inputs carry gradient ends its backward on them.
    if (torch::GradMode::is_enabled() && any_requires_grad(inputs)) ++ends_left_[u];
  }
  // Every module gets the identity nodes, as under the tracer, so autograd
  // runs the very graph the planner traced; only units' nodes act.
  std::function<void()> on_end, on_begin;
  if (u >= 0) {
    on_end = [this, u] { backward_end(u); };
    on_begin = [this, u] { pre_backward(u); };
  }
  std::vector<torch::Tensor> ins = models::with_backward_callback(inputs, std::move(on_end));
  torch::Tensor y;
  if (idx >= 0 && idx < static_cast<int>(checkpoint_.size()) && checkpoint_[idx]) {
    y = models::checkpoint(ins, fn, [this, idx](bool begin) { on_recompute(idx, begin); });
  } else {
    y = fn(ins);
  }
  y = models::with_backward_callback({y}, std::move(on_begin))[0];
  if (u >= 0) {
    if (!recompute) {
      if (--fwd_depth_[u] == 0) post_forward(u);
    } else {
      --rcp_depth_[u];
    }
  }
  return y;
}

// FORWARD: zero2/3/hybrid gather the unit if it is SHARDED.
void Engine::pre_forward(int u) {
  if (!forward_seen_[u]) {
    forward_seen_[u] = true;
    forward_order_.push_back(u);
  }
  if (sharded_) flat_[u]->unshard(*shard_group_);
}

// zero3/hybrid reshard after forward, except the root unit, which backward
// needs first; zero2 keeps the unit gathered until its backward ends.
void Engine::post_forward(int u) {
  if (reshard_after_forward_ && u != root_unit_) flat_[u]->reshard();
  mark(prefix_ + "forward/" + unit_name(u));
}

// PRE_BACKWARD (the unit's output gradient is ready): re-gather if SHARDED,
// prefetch the unit that runs backward next, then the unsharded grad
// AccumulateGrad adds into. A unit used twice acts at its first span only.
void Engine::pre_backward(int u) {
  if (bwd_begun_[u]) return;
  bwd_begun_[u] = true;
  open_.push_back(u);
  if (!sharded_) return;
  flat_[u]->unshard(*shard_group_);
  auto it = std::find(forward_order_.begin(), forward_order_.end(), u);
  if (it != forward_order_.end() && it != forward_order_.begin()) {
    FlatParam& next = *flat_[*std::prev(it)];
    if (next.state() == ParamState::kSharded) next.unshard(*shard_group_);
  }
  flat_[u]->alloc_unsharded_grad();
}

// The unit's input gradients are ready: POST_BACKWARD once its last span ends.
void Engine::backward_end(int u) {
  if (ends_left_[u] > 0 && --ends_left_[u] > 0) return;
  if (!bwd_begun_[u] || bwd_done_[u]) return;
  post_backward(u);
}

// POST_BACKWARD: reduce-scatter into the shard grad and reshard (sharded),
// or all-reduce the flat grad in place (ddp/zero1, on the last micro-batch:
// DDP's no_sync for the others).
void Engine::post_backward(int u) {
  bwd_done_[u] = true;
  open_.erase(std::find(open_.begin(), open_.end(), u));
  if (sharded_) {
    flat_[u]->reduce_grad(*shard_group_, replicate_);
  } else if (last_micro_) {
    flat_[u]->reduce_grad(*world_, nullptr);
  }
  mark(prefix_ + "backward/" + unit_name(u));
}

// A checkpointed forward re-runs inside backward: its units must be gathered.
void Engine::recompute_begin(int u) {
  if (sharded_) flat_[u]->unshard(*shard_group_);
}

// Checkpointed module `module` re-runs its forward. The runner is
// re-installed for the recomputation (autograd may run it on another thread).
void Engine::on_recompute(int module, bool begin) {
  if (begin) {
    recompute_scopes_.push_back(std::make_unique<models::ScopedModuleRunner>(this));
    in_recompute_ = true;
    const int u = unit_of_root_[module];
    if (u >= 0) recompute_begin(u);
  } else {
    in_recompute_ = false;
    recompute_scopes_.pop_back();
  }
}

// Units whose inputs need no gradient have no backward-end node: their
// backward ends with the whole backward, latest begun first (the tracer's
// order).
void Engine::close_open_units() {
  while (!open_.empty()) post_backward(open_.back());
}

void Engine::train_step(int64_t step, DataSource& data, double* loss_out) {
  prefix_ = "step" + std::to_string(step) + "/";
  zero_grad();
  const int64_t accum = o_.grad_accum;
  double loss_sum = 0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    last_micro_ = micro + 1 == accum;
    std::fill(ends_left_.begin(), ends_left_.end(), 0);
    std::fill(bwd_begun_.begin(), bwd_begun_.end(), false);
    std::fill(bwd_done_.begin(), bwd_done_.end(), false);
    open_.clear();
    const int64_t first = (world_->rank() * accum + micro) * o_.batch;
    models::Batch batch = data.get(step, first, o_.batch);
    torch::Tensor loss;
    {
      models::ScopedModuleRunner scoped(this);
      loss = model_->forward_loss(batch);
      if (!sharded_ && !flat_grad_.defined()) alloc_flat_grad();
      // The backward seed: 1 (as loss.backward()), divided over the
      // micro-batches and multiplied by fp16's loss scale.
      const double seed = (scaler_ ? scaler_->scale : 1.0) / static_cast<double>(accum);
      if (seed == 1.0) {
        loss.backward();
      } else {
        torch::autograd::backward({loss}, {torch::full({}, seed, loss.options())});
      }
      close_open_units();
    }
    loss_sum += loss.item<double>();
    // The forward/backward scope ends: the loss and the batch go before the
    // optimizer step.
    loss = torch::Tensor();
    batch = models::Batch();
  }
  optimizer_step();
  mark(prefix_ + "optimizer");
  *loss_out = loss_sum / static_cast<double>(accum);
}

// fp16: unscale (and skip the step on overflow); optional global-norm
// clipping; then AdamW unit by unit, as the simulator orders it. The scalar
// tensors these collectives carry are host values, not counted.
void Engine::optimizer_step() {
  double factor = 1.0;
  if (scaler_) {
    bool finite = true;
    for (auto& f : flat_) {
      torch::Tensor g = f->optimizer_grad();
      if (g.defined()) finite = finite && all_finite(g);
    }
    double overflow = finite ? 0.0 : 1.0;
    {
      ScopedUntracked host;
      torch::Tensor t = torch::full({1}, overflow, torch::kDouble);
      world_->all_reduce(t, ReduceOp::kSum);
      overflow = t.item<double>();
    }
    const double scale = scaler_->scale;
    scaler_->update(overflow > 0);
    if (overflow > 0) {
      ++skipped_steps_;
      return;
    }
    factor = 1.0 / scale;
  }
  if (o_.clip_grad_norm > 0) {
    double sum_sq = 0;
    for (auto& f : flat_) {
      torch::Tensor g = f->optimizer_grad();
      if (g.defined()) sum_sq += sum_of_squares(g);
    }
    // ddp holds every gradient whole; the others hold slices of the shard
    // group (hybrid's replicas hold the same slices: sum one group).
    if (sharding_ != Sharding::kDdp) {
      ScopedUntracked host;
      torch::Tensor t = torch::full({1}, sum_sq, torch::kDouble);
      shard_group_->all_reduce(t, ReduceOp::kSum);
      sum_sq = t.item<double>();
    }
    const double norm = std::sqrt(sum_sq) * factor;
    const double coef = o_.clip_grad_norm / (norm + 1e-6);
    if (coef < 1.0) factor *= coef;
  }
  if (factor != 1.0) {
    for (auto& f : flat_) {
      torch::Tensor g = f->optimizer_grad();
      if (g.defined()) multiply_in_place(g, factor);
    }
  }
  ++optimizer_steps_;
  Communicator& group = sharding_ == Sharding::kZero1 ? *world_ : *shard_group_;
  for (auto& f : flat_) f->optimizer_step(o_.adamw, optimizer_steps_, group);
}

EngineResult Engine::train(const std::function<void(const StepLog&)>& on_step) {
  const int world = world_->world_size();
  auto data = o_.data == "synthetic"
                  ? make_synthetic(o_.model, o_.seq_len, o_.seed)
                  : make_token_file(o_.data, o_.model, o_.seq_len, world * o_.batch * o_.grad_accum);
  EngineResult result;
  {
    torch::manual_seed(o_.seed);
    ScopedUntracked host;  // the full model, before its shards are cut
    model_ = models::build_model(o_.model, torch::TensorOptions().dtype(torch::kFloat));
  }
  result.param_count = models::count_parameters(*model_);
  meter_.reset_peak();
  const int64_t baseline = meter_.allocated_bytes();  // storages that predate the run
  meter_.set_budget_bytes(o_.budget_bytes > 0 ? baseline + o_.budget_bytes : 0);
  try {
    build_units();
    result.units = static_cast<int>(flat_.size());
    if (o_.on_init) o_.on_init(unit_pointers());
    mark("init");
    if (world_->rank() == 0 && spdlog::should_log(spdlog::level::info)) {
      spdlog::info("{} units, {:.2f} MiB on the device after init ({} ranks, shard group {})", flat_.size(),
                   (meter_.allocated_bytes() - baseline) / 1048576.0, world, group_size_);
    }

    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    auto timed_from = start;
    const int64_t tokens_per_step = world * o_.batch * o_.grad_accum * o_.seq_len;
    for (int64_t step = 1; step <= o_.steps; ++step) {
      if (o_.on_step_begin) o_.on_step_begin(step);
      double loss = 0;
      train_step(step, *data, &loss);
      {
        ScopedUntracked host;  // the job's loss: the mean over ranks
        torch::Tensor t = torch::full({1}, loss, torch::kDouble);
        world_->all_reduce(t, ReduceOp::kAvg);
        loss = t.item<double>();
      }
      result.loss.push_back(loss);
      if (o_.on_step_end) o_.on_step_end(step, unit_pointers());
      if (step == 1) timed_from = clock::now();
      const auto now = clock::now();
      const double elapsed = std::chrono::duration<double>(now - start).count();
      const int64_t timed_steps = o_.steps >= 2 ? step - 1 : 1;
      const double timed_s = std::chrono::duration<double>(now - (o_.steps >= 2 ? timed_from : start)).count();
      if (timed_steps > 0 && timed_s > 0)
        result.tokens_per_s = static_cast<double>(timed_steps * tokens_per_step) / timed_s;
      if (on_step) on_step({step, o_.steps, loss, result.tokens_per_s, elapsed});
    }
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) {
      meter_.set_budget_bytes(0);
      throw;
    }
    in_recompute_ = false;
    recompute_scopes_.clear();
    result.oom = true;
    const auto* c10e = dynamic_cast<const c10::Error*>(&e);
    result.oom_message = c10e ? c10e->what_without_backtrace() : e.what();
    mark("oom");
  }
  meter_.set_budget_bytes(0);
  result.skipped_steps = skipped_steps_;
  result.loss_scale = scaler_ ? scaler_->scale : 0.0;
  result.peak_allocated_bytes = meter_.peak_allocated_bytes() - baseline;
  result.timeline = meter_.timeline();
  for (auto& t : result.timeline) {
    t.allocated_bytes -= baseline;
    t.peak_allocated_bytes -= baseline;
  }
  return result;
}

EngineResult train_data_parallel(const EngineOptions& options, Communicator& world,
                                 const std::function<void(const StepLog&)>& on_step) {
  Engine engine(options, world);
  return engine.train(on_step);
}

}  // namespace shardfit::executor
