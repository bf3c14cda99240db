// `shardfit plan`: predict, without running anything, each candidate's peak
// memory and the largest batch per GPU that fits.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/progress.h"
#include "launch/hf_trace_route.h"
#include "launch/output_file.h"
#include "cli/validators.h"
#include "models/hf_architecture.h"
#include "models/model_config.h"
#include "planner/plan_builder.h"
#include "planner/plan_text.h"
#include "spec/job.h"

namespace shardfit::cli {
namespace {

using launch::HfTraceOptions;
using launch::HfTraceRoute;

struct PlanArgs {
  std::string model;
  std::string trace;
  std::string stack = "shardfit";
  bool ddp_bucket_view = false;
  bool ddp_static_graph = false;
  bool single_gpu_unwrapped = false;
  double ddp_bucket_cap_mb = planner::kDdpBucketCapBytes / (1024.0 * 1024);
  std::string torch = planner::kPinnedTorch;
  std::string zero_grad;   // empty: --torch's default
  std::string loop_keeps;  // empty: outputs
  std::string checkpoint;  // empty: --torch's default
  std::string fsdp_backward_prefetch = "pre";
  int fsdp_version = 1;
  std::string fsdp_reduce_dtype = "param";
  bool adamw_foreach = false;  // the older spelling of --adamw-step foreach
  std::string adamw_step;      // empty: each candidate's PyTorch default
  bool fsdp_keep_low_precision_grads = false;
  bool fsdp_use_orig_params = false;
  int steps = 2;
  std::string seq_len = "128";  // a comma list sweeps, as --gpus, --nodes and --gpu-mem do
  std::string loss = "full";
  std::string attention = "sdpa";
  bool attention_given = false;
  std::string gpus = "1";
  std::string nodes = "1";
  std::string device;
  std::string gpu_mem;
  std::string strategies;
  std::string precision = "all";
  std::string optimizer = "adamw";
  std::string objective = "throughput";
  int grad_accum = 1;
  int prefetch = 1;
  bool async_reduce = false;
  bool async_gather = false;
  std::string out;
  bool json = false;
  size_t top = 0;  // --all's rows; 0 = all
  bool all = false;
  bool seq_len_given = false;
};

// The options of PyTorch's own stack (--stack pytorch): which PyTorch, and
// what its DDP, FSDP, optimizer and checkpointing calls are given.
void set_stack_options(const PlanArgs& a, planner::PlanRequest& r) {
  if (a.stack != "shardfit" && a.stack != "pytorch") throw BadInput("--stack " + a.stack + ": expected shardfit or pytorch");
  r.stack = a.stack == "pytorch" ? planner::Stack::kPytorch : planner::Stack::kShardfit;
  if (a.ddp_bucket_view && r.stack != planner::Stack::kPytorch)
    throw BadInput("--ddp-bucket-view: a PyTorch DDP option; give --stack pytorch");
  r.ddp_bucket_view = a.ddp_bucket_view;
  if (a.ddp_static_graph && r.stack != planner::Stack::kPytorch)
    throw BadInput("--ddp-static-graph: a PyTorch DDP option; give --stack pytorch");
  r.ddp_static_graph = a.ddp_static_graph;
  if (a.single_gpu_unwrapped && r.stack != planner::Stack::kPytorch)
    throw BadInput("--single-gpu-unwrapped: how a PyTorch job runs on one GPU; give --stack pytorch");
  r.single_gpu_unwrapped = a.single_gpu_unwrapped;
  // --torch: which PyTorch runs the job, and so what the loop's calls do
  // when the script passes nothing (planner::torch_defaults).
  planner::TorchDefaults defaults;
  try {
    defaults = planner::torch_defaults(a.torch);
  } catch (const std::invalid_argument& e) {
    throw BadInput("--torch " + a.torch + ": " + e.what());
  }
  if (a.torch != planner::kPinnedTorch && r.stack != planner::Stack::kPytorch)
    throw BadInput("--torch: whose PyTorch runs the job; give --stack pytorch");
  r.torch = a.torch;
  const std::string zero_grad = a.zero_grad.empty() ? defaults.zero_grad : a.zero_grad;
  if (zero_grad != "none" && zero_grad != "zero")
    throw BadInput("--zero-grad " + zero_grad + ": expected none (set_to_none=True) or zero (set_to_none=False)");
  if (!a.zero_grad.empty() && r.stack != planner::Stack::kPytorch)
    throw BadInput("--zero-grad: a PyTorch optimizer option; give --stack pytorch");
  r.zero_grad_set_to_none = zero_grad == "none";
  if (!a.loop_keeps.empty() && a.loop_keeps != "outputs" && a.loop_keeps != "loss")
    throw BadInput("--loop-keeps " + a.loop_keeps + ": expected outputs or loss");
  if (!a.loop_keeps.empty() && r.stack != planner::Stack::kPytorch)
    throw BadInput("--loop-keeps: what a PyTorch training loop holds; give --stack pytorch");
  r.loop_keeps_outputs = a.loop_keeps != "loss";
  const std::string checkpoint = a.checkpoint.empty() ? defaults.checkpoint : a.checkpoint;
  if (checkpoint != "non-reentrant" && checkpoint != "reentrant")
    throw BadInput("--checkpoint " + checkpoint + ": expected non-reentrant or reentrant");
  if (!a.checkpoint.empty() && r.stack != planner::Stack::kPytorch)
    throw BadInput("--checkpoint: torch.utils.checkpoint's kind; give --stack pytorch");
  r.ckpt_reentrant = checkpoint == "reentrant";
  const std::string& bp = a.fsdp_backward_prefetch;
  if (bp != "pre" && bp != "post" && bp != "none")
    throw BadInput("--fsdp-backward-prefetch " + bp + ": expected pre (BACKWARD_PRE), post (BACKWARD_POST) or none");
  if (bp != "pre" && r.stack != planner::Stack::kPytorch)
    throw BadInput("--fsdp-backward-prefetch: a PyTorch FSDP option; give --stack pytorch (shardfit's engine "
                   "prefetches by --prefetch)");
  if (a.fsdp_version != 1 && a.fsdp_version != 2)
    throw BadInput("--fsdp-version " + std::to_string(a.fsdp_version) +
                   ": expected 1 (FullyShardedDataParallel) or 2 (fully_shard)");
  if (a.fsdp_version != 1 && r.stack != planner::Stack::kPytorch)
    throw BadInput("--fsdp-version: a PyTorch FSDP option; give --stack pytorch");
  if (a.fsdp_version == 2 && bp != "pre")
    throw BadInput("--fsdp-backward-prefetch " + bp + ": FSDP2 (--fsdp-version 2) has no such option; it "
                   "gathers the next group when a group's backward starts, as pre does");
  r.fsdp_version = a.fsdp_version;
  try {
    planner::parse_fsdp_reduce_dtype(a.fsdp_reduce_dtype);
  } catch (const std::invalid_argument& e) {
    throw BadInput("--fsdp-reduce-dtype " + a.fsdp_reduce_dtype + ": " + e.what());
  }
  if (a.fsdp_reduce_dtype != "param" && r.stack != planner::Stack::kPytorch)
    throw BadInput("--fsdp-reduce-dtype: a PyTorch FSDP option; give --stack pytorch (shardfit's engine reduces "
                   "in the compute dtype)");
  r.fsdp_reduce_dtype = a.fsdp_reduce_dtype;
  if (a.fsdp_keep_low_precision_grads && r.stack != planner::Stack::kPytorch)
    throw BadInput("--fsdp-keep-low-precision-grads: a PyTorch FSDP option; give --stack pytorch");
  if (a.fsdp_keep_low_precision_grads && a.fsdp_version == 2)
    throw BadInput("--fsdp-keep-low-precision-grads: FSDP1's MixedPrecision option; FSDP2 (--fsdp-version 2) has "
                   "no such option");
  r.fsdp_keep_low_precision_grads = a.fsdp_keep_low_precision_grads;
  if (a.fsdp_use_orig_params && (r.stack != planner::Stack::kPytorch || a.fsdp_version == 2))
    throw BadInput("--fsdp-use-orig-params: FSDP1's FullyShardedDataParallel option; give --stack pytorch and "
                   "--fsdp-version 1 (FSDP2's parameters are always the original ones, as DTensors)");
  r.fsdp_use_orig_params = a.fsdp_use_orig_params;
  const std::string adamw_step = a.adamw_foreach ? "foreach" : a.adamw_step;
  if (a.adamw_foreach && !a.adamw_step.empty() && a.adamw_step != "foreach")
    throw BadInput("--adamw-foreach with --adamw-step " + a.adamw_step + ": one AdamW step; give one of them");
  const auto step = planner::parse_adamw_step(adamw_step);
  if (!adamw_step.empty() && !step)
    throw BadInput("--adamw-step " + adamw_step +
                   ": expected for-loop (foreach=False), foreach (foreach=True) or fused (fused=True)");
  if (!adamw_step.empty() && r.stack != planner::Stack::kPytorch)
    throw BadInput(std::string(a.adamw_foreach ? "--adamw-foreach" : "--adamw-step") +
                   ": a PyTorch optimizer option; give --stack pytorch (shardfit's engine steps AdamW unit by unit)");
  if (step == planner::AdamwStep::kFused && r.torch == "1.13")
    throw BadInput("--adamw-step fused with --torch 1.13: its AdamW has no fused step");
  r.adamw_step = step;  // none given: each candidate's PyTorch default
  r.fsdp_backward_prefetch = bp == "post"   ? planner::FsdpBackwardPrefetch::kBackwardPost
                             : bp == "none" ? planner::FsdpBackwardPrefetch::kNone
                                            : planner::FsdpBackwardPrefetch::kBackwardPre;
  if (!r.zero_grad_set_to_none && r.ddp_bucket_view)
    throw BadInput("--zero-grad zero with --ddp-bucket-view: not simulated yet (the gradients, views of DDP's first "
                   "buckets, keep them alive while the second forward rebuilds them; measured, not yet modelled)");
  if (a.steps != 2 && r.stack != planner::Stack::kPytorch)
    throw BadInput("--steps: --stack pytorch only (shardfit's plans are for a job's steady state)");
}

// The attn_implementation a config.json names, or "" (none, or not JSON:
// the recorder says what is wrong with it).
std::string named_attention(const std::string& config_path) {
  std::ifstream in(config_path);
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const auto it = config.is_object() ? config.find("attn_implementation") : config.end();
  return it != config.end() && it->is_string() ? it->get<std::string>() : "";
}

// What the recorder is asked for `label`, a --model traced through
// transformers' own class from `config_path` ("" for a built-in, whose config
// names no attn_implementation):
// - the profile's kernels (a CUDA profile: --target cuda);
// - for --stack pytorch, the model cast to the bf16 or fp16 (CUDA only) that
//   --strategies or --precision names, as FSDP's MixedPrecision candidates
//   need (bf16 when both are named: the recorder casts to one);
// - the attention where the config names none: --attention, else what
//   transformers 5.17 runs there, sdpa, wherever the trace follows its
//   kernel for every candidate: on a CPU (pytorch/cpu_flash_attention.py;
//   eager where the recorder refuses it, said once). A CUDA trace's sdpa is
//   cuDNN's attention (pytorch/cuda_attention.py), bf16 and fp16 only, which
//   2.11 runs at compute capability 9.0 and 10.0: there it is asked for with
//   --attention sdpa; by default a CUDA profile traces eager and says so.
HfTraceOptions hf_trace_options(const PlanArgs& a, const planner::PlanRequest& r, const std::string& label,
                                const std::string& config_path) {
  HfTraceOptions o;
  o.cuda = r.profile.kind == planner::DeviceKind::kCuda;
  if (r.stack == planner::Stack::kPytorch)
    for (const char* dtype : {"fp16", "bf16"})
      if ((o.cuda || std::string(dtype) == "bf16") && (a.strategies + "," + a.precision).find(dtype) != std::string::npos)
        o.param_dtype = dtype;
  const std::string names = config_path.empty() ? "" : named_attention(config_path);
  if (a.attention_given && a.attention != "eager" && a.attention != "sdpa")
    throw BadInput("--attention " + a.attention + ": " + label + " is traced through transformers' own class, in "
                   "eager or sdpa attention (its attn_implementation)");
  if (a.attention_given && !names.empty() && names != a.attention)
    throw BadInput("--attention " + a.attention + ": " + config_path + " names attn_implementation " + names +
                   "; drop --attention (or change it there)");
  const double cc = r.profile.compute_capability;
  const bool cudnn = cc == 9.0 || cc == 10.0;
  const std::string sdpa_by =
      a.attention_given ? "--attention sdpa" : config_path + " names attn_implementation sdpa";
  if (o.cuda && !cudnn && (a.attention_given ? a.attention : names) == "sdpa")
    throw BadInput(fmt::format("{}: a CUDA trace's sdpa is cuDNN's attention, which PyTorch 2.11 runs on compute "
                               "capability 9.0 and 10.0, and {} is {:.1f}; use eager attention",
                               sdpa_by, a.device, cc));
  if (a.attention_given && names.empty()) {
    o.attention = a.attention;
  } else if (names.empty() && !o.cuda) {
    o.attention = "sdpa";
    o.sdpa_or_eager = true;
  } else if (names.empty()) {
    o.attention = "eager";
    spdlog::warn("plan: {}: traced in eager attention; transformers runs sdpa where the config names no "
                 "attn_implementation, but CUDA's fp32 sdpa (the memory-efficient kernel) is not traced{}",
                 label,
                 cudnn ? ": --attention sdpa plans the bf16 and fp16 candidates with cuDNN's attention"
                       : fmt::format(", nor, on {} (compute capability {:.1f}), its other kernels", a.device, cc));
  }
  return o;
}

// A trace recorded under another PyTorch than the one planned: its kernels'
// temporaries are still the recording one's.
void warn_on_trace_torch(const std::string& origin, const planner::PlanRequest& r) {
  const std::string& recorded = r.trace_file->torch_version;
  if (r.stack == planner::Stack::kPytorch && !recorded.empty() && recorded.rfind(r.torch + ".", 0) != 0)
    spdlog::warn("{}: recorded under PyTorch {}, planned as --torch {}: its kernels' temporaries are {}'s", origin,
                 recorded, r.torch, recorded);
}

// The job the plan is for (spec::JobOptions), as the options give it, and
// every axis of the sweep, checked by the job's rules before any work: the
// same rules and messages as `run` and the planner's own. --seq-len here is
// the sweep's first value; sweep_points sets each point's.
spec::JobOptions job_from(const PlanArgs& a) {
  spec::JobOptions job;
  try {
    job.steps = a.steps;
    job.grad_accum = a.grad_accum;
    job.schedule.prefetch = a.prefetch;
    job.schedule.async_reduce = a.async_reduce;
    job.schedule.async_gather = a.async_gather;
    // DDP's buckets, PyTorch's or the engine's (spec/grad_buckets.h).
    job.schedule.ddp_bucket_cap_bytes = spec::bucket_cap_bytes(a.ddp_bucket_cap_mb);
    for (int64_t seq : int_list(a.seq_len)) spec::check_seq_len(seq);
    for (int64_t gpus : int_list(a.gpus)) spec::check_gpus_per_node(gpus);
    for (int64_t nodes : int_list(a.nodes)) spec::check_nodes(nodes);
    job.seq_len = int_list(a.seq_len).front();
    spec::check_job_options(job);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  return job;
}

// --stack pytorch with --model: PyTorch's own step runs the model as
// transformers builds it, so it is traced through transformers' own class
// (launch/hf_trace_route.h) and `r.model` left unset, as for a model_type
// with no built-in. A config.json (a file, directory or Hub id) is traced as
// it is, read by transformers alone; a built-in name from its config as
// transformers reads it (models::to_hf_config). The attention where the
// config names none: hf_trace_options.
std::unique_ptr<HfTraceRoute> pytorch_stack_route(const PlanArgs& a, const planner::PlanRequest& r) {
  const std::string reason = "--stack pytorch runs the model as transformers builds it";
  if (a.loss != "full")
    throw BadInput("--loss " + a.loss + ": --stack pytorch runs transformers' own class, whose loss is the full "
                   "one; drop --loss");
  if (const models::ModelConfig* builtin = models::find_builtin(a.model)) {
    HfTraceOptions options = hf_trace_options(a, r, a.model, "");
    options.name = a.model;
    const nlohmann::json config = models::to_hf_config(*builtin);
    return HfTraceRoute::of_builtin(a.model, config.dump(2), reason, options);
  }
  std::string path;
  try {
    path = models::hf_config_file(a.model);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  if (!std::ifstream(path)) throw BadInput(path + ": cannot read file");
  return std::make_unique<HfTraceRoute>(path, reason, hf_trace_options(a, r, path, path));
}

// Everything a plan is asked but the sweep's axes (--seq-len, --gpus,
// --nodes, --gpu-mem), which sweep_points sets per point. A --model whose
// model_type has no built-in comes back as `route`: sweep_points traces it
// through transformers' own class at each sequence length.
planner::PlanRequest request_from(const PlanArgs& a, std::unique_ptr<HfTraceRoute>* route) {
  planner::PlanRequest r;
  std::optional<models::NoBuiltinModel> no_builtin;
  if (a.model.empty() == a.trace.empty()) throw BadInput("plan: give --model or --trace (one of them)");
  static_cast<spec::JobOptions&>(r) = job_from(a);
  set_stack_options(a, r);
  // A model traced in its own process (pytorch/trace_recorder.py): its loss
  // and attention are what its forward does.
  const bool loss_or_attention = a.loss != "full" || (a.attention_given && a.attention != "eager");
  const bool stack_route = !a.model.empty() && r.stack == planner::Stack::kPytorch;
  if (!a.trace.empty()) {
    if (loss_or_attention) throw BadInput("--trace: --loss and --attention are the traced model's own; drop them");
    try {
      r.trace_file = std::make_shared<planner::TraceFile>(planner::read_trace_file(a.trace));
    } catch (const std::invalid_argument& e) {
      throw BadInput(e.what());
    }
    warn_on_trace_torch("--trace " + a.trace, r);
  } else if (!stack_route) {
    try {
      r.model = models::resolve_model(a.model);
      models::set_loss(&r.model, a.loss);
      models::set_attention(&r.model, a.attention);
    } catch (const models::NoBuiltinModel& e) {
      if (a.loss != "full")
        throw BadInput("--model " + a.model + ": model_type '" + e.model_type + "' is traced through transformers' "
                       "own class, whose loss is its own; drop --loss");
      no_builtin = e;
    } catch (const std::invalid_argument& e) {
      throw BadInput(e.what());
    }
  }
  r.profile = planner::load_profile(a.device, profiles_dir());
  if (no_builtin)
    *route = std::make_unique<HfTraceRoute>(
        *no_builtin, hf_trace_options(a, r, no_builtin->config_path, no_builtin->config_path));
  else if (stack_route)
    *route = pytorch_stack_route(a, r);
  r.candidates.strategies = planner::split_list(a.strategies);
  r.candidates.precisions = planner::split_list(a.precision);
  if (a.optimizer != "adamw" && a.optimizer != "sgd")
    throw BadInput("--optimizer " + a.optimizer + ": expected adamw or sgd");
  r.optimizer = a.optimizer == "adamw" ? planner::Optimizer::kAdamW : planner::Optimizer::kSgd;
  r.objective = planner::parse_objective(a.objective);
  // --stack pytorch: --prefetch 2 is FSDP1's forward_prefetch=True (one unit
  // ahead: its forward_prefetch_limit); with FSDP2, --prefetch N is explicit
  // prefetching, N - 1 blocks ahead and N back (set_modules_to_*_prefetch).
  if (a.prefetch > 2 && r.stack == planner::Stack::kPytorch && a.fsdp_version == 1)
    throw BadInput("--prefetch " + std::to_string(a.prefetch) +
                   ": FSDP1 prefetches one unit ahead (forward_prefetch=True is --prefetch 2); for more, "
                   "--fsdp-version 2");
  if (a.async_reduce && r.stack == planner::Stack::kPytorch)
    throw BadInput("--async-reduce: shardfit's engine option (PyTorch's DDP and FSDP always reduce beside backward); "
                   "drop it with --stack pytorch");
  if (a.async_gather && r.stack == planner::Stack::kPytorch)
    throw BadInput("--async-gather: shardfit's engine option (PyTorch's FSDP always prefetches beside compute); "
                   "drop it with --stack pytorch");
  if (a.all && a.json) throw BadInput("--all: the table's rows; --json always has every candidate");
  return r;
}

// One request per point of the sweep: every combination of the values
// --seq-len, --gpus, --nodes and --gpu-mem list, in that nesting order.
std::vector<planner::PlanRequest> sweep_points(const PlanArgs& a, const planner::PlanRequest& base,
                                               HfTraceRoute* route) {
  // A traced model's sequence length is its trace's unless --seq-len says.
  const std::vector<int64_t> seqs =
      a.seq_len_given || !base.trace_file ? int_list(a.seq_len) : std::vector<int64_t>{base.trace_file->seq_len};
  std::vector<int64_t> mems = {0};
  if (!a.gpu_mem.empty()) {
    mems.clear();
    for (const std::string& m : items_of(a.gpu_mem)) mems.push_back(planner::parse_size_bytes(m));
  }
  std::vector<planner::PlanRequest> points;
  const std::shared_ptr<planner::TraceCache> traces = planner::make_trace_cache();
  for (int64_t seq : seqs)
    for (int64_t gpus : int_list(a.gpus))
      for (int64_t nodes : int_list(a.nodes))
        for (int64_t mem : mems) {
          planner::PlanRequest r = base;
          r.seq_len = seq;
          r.gpus_per_node = static_cast<int>(gpus);
          r.nodes = static_cast<int>(nodes);
          r.device_mem_bytes = mem;
          r.trace_cache = traces;
          points.push_back(std::move(r));
        }
  if (points.size() > kMaxSweepPoints)
    throw BadInput("plan: the sweep has " + std::to_string(points.size()) + " points (--seq-len x --gpus x --nodes x "
                   "--gpu-mem); at most " + std::to_string(kMaxSweepPoints));
  if (points.size() > 1 && (a.all || a.top > 0))
    throw BadInput(std::string(a.all ? "--all" : "--top") +
                   ": a sweep prints one grid line per point; give one value to each of --seq-len, --gpus, --nodes "
                   "and --gpu-mem for a plan's rows");
  // A --model traced through transformers' own class: one trace per length
  // (and, on a CPU, per rank's threads: the cores over the point's ranks).
  for (planner::PlanRequest& r : points)
    if (route) {
      const bool cpu = r.profile.kind != planner::DeviceKind::kCuda;
      r.trace_file = route->trace(r.seq_len, cpu ? planner::cpu_rank_threads(r.gpus_per_node * r.nodes) : 0);
      if (&r == &points.front()) warn_on_trace_torch("--model " + a.model, r);
    }
  return points;
}

// A sweep's outputs: the grid, or with --json every plan; --out writes the
// plans. Exit 2 only when no point fits batch 1.
int print_sweep(const PlanArgs& a, const std::vector<planner::Plan>& plans) {
  const std::string json = planner::sweep_to_json_text(plans);
  if (!a.out.empty()) write_output_file("--out", a.out, json);
  std::cout << (a.json ? json : planner::format_sweep_grid(plans));
  for (const planner::Plan& p : plans)
    if (!p.chosen.empty()) return kExitOk;
  std::cout.flush();
  throw BadInput("no candidate fits batch 1 of " + plans.front().model.name + " at any point of the sweep");
}

int run(const PlanArgs& a) {
  if (!a.out.empty()) check_output_file("--out", a.out);  // before the plan's minutes, not after
  std::unique_ptr<HfTraceRoute> route;
  const planner::PlanRequest base = request_from(a, &route);
  const std::vector<planner::PlanRequest> points = sweep_points(a, base, route.get());
  // A sweep of big models takes seconds to minutes: say where it is.
  ThrottledProgress progress;
  std::vector<planner::Plan> plans;
  for (planner::PlanRequest r : points) {
    const std::string where = points.size() == 1 ? "" : " (seq " + std::to_string(r.seq_len) + ", " +
                                                            std::to_string(r.gpus_per_node * r.nodes) + " GPUs)";
    r.on_progress = [&progress, &where](const std::string& stage, size_t done, size_t total,
                                        const std::string& label) {
      progress.done((stage == "trace" ? "plan: traced step" : "plan: candidate") + where, done, total, label);
    };
    plans.push_back(planner::build_plan(r));
    // A profile given as a file (shardfit calibrate's): the plan records
    // where it is, so `run --plan` and `validate` predict with the same one.
    if (planner::is_profile_path(a.device))
      plans.back().hardware.profile = std::filesystem::absolute(a.device).string();
  }
  if (plans.size() > 1) return print_sweep(a, plans);
  const planner::Plan& plan = plans.front();
  if (!a.out.empty()) write_output_file("--out", a.out, planner::plan_to_json_text(plan));
  if (a.json)
    std::cout << planner::plan_to_json_text(plan);
  else if (a.all || a.top > 0)
    std::cout << planner::format_plan_table(plan, a.top);
  else
    std::cout << planner::format_plan_summary(plan);
  if (plan.chosen.empty()) {
    std::cout.flush();
    throw BadInput("no candidate fits batch 1 of " + plan.model.name + " in " +
                   planner::format_size(plan.hardware.device_mem_bytes) +
                   " per GPU: use more GPUs, a larger device or a smaller model");
  }
  return kExitOk;
}

// --attention's help: what each value runs, and where.
constexpr const char* kAttentionHelp =
    "sdpa (transformers' default: scaled_dot_product_attention, per candidate the kernel PyTorch "
    "picks: in fp16/bf16 cuDNN's fused attention at compute capability 9.0 and 10.0 (Hopper) and "
    "flash elsewhere from 8.0, the memory-efficient kernel on CUDA in fp32 or below 8.0, eager on a CPU profile, what shardfit's CPU engine "
    "runs; bert, and a head dimension flash refuses, stay eager), eager (softmax(QK^T)V, keeps "
    "the heads x s x s probabilities: transformers' eager, and 2022's only attention) or flash "
    "(PyTorch's FlashAttention-2 kernel: keeps the output and one fp32 log-sum-exp per row; CUDA "
    "devices of compute capability 8.0+, fp16/bf16; gpt2 and llama families). The plan JSON "
    "names each candidate's. A CPU build of shardfit plans flash but runs only eager. A model traced "
    "through transformers' own class (--stack pytorch, a model_type with no built-in): the "
    "attn_implementation where its config names none, eager or sdpa; by default sdpa on a CPU "
    "profile, eager on CUDA";

}  // namespace

std::string profiles_dir() { return planner::find_profiles_dir(planner::default_profile_dirs(self_exe())); }

Command add_plan_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "plan", "Predict each strategy's peak memory, largest batch per GPU and speed, without running");
  auto a = std::make_shared<PlanArgs>();
  sub->add_option("--model", a->model,
                  "Built-in model name, or a Hugging Face config.json, model directory or Hub id (org/name, from "
                  "the local Hugging Face cache). A model_type with no built-in (gemma2, phi3, mixtral, ...) is "
                  "traced through transformers' own class by pytorch/trace_recorder.py, run by $SHARDFIT_PYTHON "
                  "(default: the build's Python), and planned as --trace plans it; so is every model with --stack "
                  "pytorch (a built-in from its config as `shardfit models NAME --hf-config` prints it)")
      ->check(Named);
  sub->add_option("--trace", a->trace,
                  "Plan a model traced in its own process instead (a shardfit.trace/1 file, e.g. from "
                  "pytorch/trace_recorder.py for a model written in Python); its sequence length is the plan's")
      ->check(Named);
  sub->add_option("--stack", a->stack,
                  "Whose training step to predict: shardfit (its engine, `shardfit run`) or pytorch (PyTorch's own "
                  "DistributedDataParallel or ZeroRedundancyOptimizer and torch.optim.AdamW in the loop "
                  "pytorch/validate.py runs, torch.utils.checkpoint as +ckpt; PyTorch FSDP when --strategies "
                  "names zero2|zero3[+offload]/PRECISION/wrap=size:N or block, or FSDP1's NO_SHARD as "
                  "ddp/PRECISION/wrap=size:N or block (docs/pytorch-fsdp.md); a --trace, or a --model traced "
                  "through transformers' own class; fp32, and the trace's autocast: bf16 on a CPU, fp16 "
                  "with GradScaler on CUDA)")
      ->capture_default_str();
  sub->add_option("--steps", a->steps,
                  "--stack pytorch: training steps the job runs; 2 or more plans its steady state (the default), 1 "
                  "a one-step job")
      ->capture_default_str()
      ->check(StepsBounds);
  sub->add_flag("--ddp-bucket-view", a->ddp_bucket_view,
                "--stack pytorch: DDP(gradient_as_bucket_view=True) (PyTorch's default is False)");
  sub->add_option("--ddp-bucket-cap-mb", a->ddp_bucket_cap_mb,
                  "ddp/zero1: DDP(bucket_cap_mb=...), the size gradient buckets close at (the first at 1 MiB); "
                  "--stack pytorch: the buckets DDP rebuilds after its first iteration; shardfit's engine: its "
                  "all-reduces (run it with the same option, or run --plan)")
      ->type_name("MB")
      ->capture_default_str();
  sub->add_flag("--ddp-static-graph", a->ddp_static_graph,
                "--stack pytorch: DDP(static_graph=True) (PyTorch's default is False)");
  sub->add_flag("--single-gpu-unwrapped", a->single_gpu_unwrapped,
                "--stack pytorch, --gpus 1: the ddp candidates' model is not wrapped in DDP (no buckets, no "
                "broadcasts), as Accelerate and the Hugging Face Trainer run a one-process job; without it, "
                "DistributedDataParallel on a world of one, as a torchrun script builds it");
  sub->add_option("--torch", a->torch,
                  "--stack pytorch: the PyTorch the job runs, whose defaults the plan follows where the job "
                  "passes nothing: 2.11 (the pinned stack: zero_grad(set_to_none=True), transformers' "
                  "use_reentrant=False) or 1.13 (2022's, the reference scenario's: set_to_none=False, "
                  "use_reentrant=True); --zero-grad and --checkpoint override them")
      ->capture_default_str();
  sub->add_option("--zero-grad", a->zero_grad,
                  "--stack pytorch: what the loop's opt.zero_grad() does: none (set_to_none=True, PyTorch 2.x's "
                  "default, the gradients dropped) or zero (set_to_none=False, PyTorch 1.x's default, zeroed in "
                  "place); default: --torch's");
  sub->add_option("--loop-keeps", a->loop_keeps,
                  "--stack pytorch: what the training loop holds of the forward's return until the next forward: "
                  "outputs (`outputs = model(x)` in the loop's body: the loss and the logits; the default) or loss "
                  "(a loss function returning the loss alone, as transformers' Trainer.compute_loss does: the "
                  "rest freed as the forward returns)");
  sub->add_option("--fsdp-backward-prefetch", a->fsdp_backward_prefetch,
                  "--stack pytorch, FSDP candidates: FSDP(backward_prefetch=...): pre (BACKWARD_PRE: the next "
                  "unit gathered when a unit's backward starts; Accelerate's default), post (BACKWARD_POST: when "
                  "its gradient is ready) or none")
      ->capture_default_str();
  sub->add_option("--fsdp-version", a->fsdp_version,
                  "--stack pytorch, FSDP candidates: 1 (FullyShardedDataParallel as PyTorch 1.13 has it: "
                  "flat parameters, wrap=size:N or block) or 2 (FSDP2's fully_shard on each block then the "
                  "root, wrap=block, or on the root alone, wrap=none: each parameter sharded on dim 0)")
      ->capture_default_str();
  sub->add_option("--adamw-step", a->adamw_step,
                  "--stack pytorch: torch.optim.AdamW's step: foreach (foreach=True, the multi-tensor step: each "
                  "temporary made for every parameter at once; zero1: ZeroRedundancyOptimizer's local AdamW, "
                  "FSDP: over the shards), fused (fused=True, PyTorch 2.x: one kernel updates every parameter in "
                  "place; its state only) or for-loop (foreach=False); default: what --torch's AdamW picks given "
                  "neither, per candidate: 2.11 the multi-tensor step on CUDA for DDP, zero1 and FSDP2 "
                  "parameters, the for-loop for FSDP1's flat ones and on a CPU; 1.13 the for-loop");
  sub->add_flag("--adamw-foreach", a->adamw_foreach, "--stack pytorch: --adamw-step foreach");
  sub->add_option("--fsdp-reduce-dtype", a->fsdp_reduce_dtype,
                  "--stack pytorch, FSDP candidates: MixedPrecision(Policy)'s reduce_dtype: param (none: the "
                  "gradients reduced in the dtype they are computed in), fp32 (torch.float32: beside bf16 "
                  "parameters, torchtitan's recipe), bf16 or fp16 (beside fp32 parameters: half the reduce-scatter)")
      ->capture_default_str();
  sub->add_flag("--fsdp-keep-low-precision-grads", a->fsdp_keep_low_precision_grads,
                "--stack pytorch, FSDP1 bf16 candidates: MixedPrecision(keep_low_precision_grads=True), the reduced "
                "gradient shards cast to param_dtype for the optimizer");
  sub->add_flag("--fsdp-use-orig-params", a->fsdp_use_orig_params,
                "--stack pytorch, FSDP1 candidates: FullyShardedDataParallel(use_orig_params=True), AdamW over each "
                "original parameter's part of the rank's shard (each rank its own), not the FlatParameters");
  sub->add_option("--checkpoint", a->checkpoint,
                  "--stack pytorch: the +ckpt candidates' torch.utils.checkpoint: non-reentrant (use_reentrant=False, "
                  "what transformers' gradient_checkpointing_enable() passes) or reentrant (use_reentrant=True, "
                  "1.13's default); default: --torch's");
  auto* seq = sub->add_option("--seq-len", a->seq_len,
                              "Tokens per sequence; a comma list (1024,2048) sweeps, as --gpus, --nodes and "
                              "--gpu-mem do: one plan per combination, printed as a grid")
                  ->capture_default_str()
                  ->check(ListOf(SeqLenBounds));
  sub->add_option("--loss", a->loss,
                  "full (the whole tokens x vocab logits) or chunked:N (cross-entropy N tokens at a time, "
                  "logits recomputed in backward; llama family)")
      ->capture_default_str();
  auto* attention = sub->add_option("--attention", a->attention, kAttentionHelp)->capture_default_str();
  sub->add_option("--gpus", a->gpus, "GPUs per node (a comma list sweeps)")
      ->capture_default_str()
      ->check(ListOf(GpusPerNodeBounds));
  sub->add_option("--nodes", a->nodes, "Nodes (a comma list sweeps)")
      ->capture_default_str()
      ->check(ListOf(NodesBounds));
  sub->add_option("--device", a->device, "Device profile name (profiles/*.json) or path")->required();
  sub->add_option("--gpu-mem", a->gpu_mem,
                  "Override the device memory (24GiB, 512MiB, bytes; a comma list sweeps); a cpu plan with bf16 "
                  "candidates needs it")
      ->check(ListOf(MemorySize));
  sub->add_option("--strategies", a->strategies,
                  "Comma-separated candidate ids or shardings (ddp, zero1, zero2, zero3, hybrid); default all")
      ->check(NonEmptyItems);
  sub->add_option("--precision", a->precision, "fp32, fp16, bf16 or all (comma-separated)")
      ->capture_default_str()
      ->check(NonEmptyItems);
  sub->add_option("--optimizer", a->optimizer, "adamw or sgd")->capture_default_str();
  sub->add_option("--objective", a->objective, "throughput (fastest that fits) or batch (largest batch)")
      ->capture_default_str();
  sub->add_option("--grad-accum", a->grad_accum,
                  "Micro-batches per optimizer step; max batch is then per micro-batch (run it with the same "
                  "--grad-accum)")
      ->capture_default_str()
      ->check(GradAccumBounds);
  sub->add_option("--prefetch", a->prefetch,
                  "Units gathered ahead of the one running (zero3/hybrid): N in backward (1 = FSDP's "
                  "BACKWARD_PRE), N - 1 in forward (FSDP's forward_prefetch); gathers stay synchronous. "
                  "--stack pytorch: 2 is FSDP1's forward_prefetch=True; with --fsdp-version 2, FSDP2's "
                  "set_modules_to_forward_prefetch (N - 1 blocks) and set_modules_to_backward_prefetch (N)")
      ->capture_default_str()
      ->check(PrefetchBounds);
  sub->add_flag("--async-reduce", a->async_reduce,
                "Gradients reduce beside the rest of backward, as FSDP2's and DDP's do: one reduce-scatter in "
                "flight (its unsharded grad lives through the next unit's backward), DDP's all-reduces waited "
                "for at backward's end (run it with the same flag, or run --plan)");
  sub->add_flag("--async-gather", a->async_gather,
                "Prefetched all-gathers (--prefetch) run beside compute, as FSDP's do, waited for where the unit "
                "runs; a staged gather's copy (mixed, offload) lives until then (run it with the same flag, or "
                "run --plan)");
  sub->add_option("--out", a->out, "Write the plan JSON here")->check(Named);
  sub->add_flag("--json", a->json, "Print the plan JSON instead of the table");
  sub->add_flag("--all", a->all,
                "Print every candidate's row (the default prints each strategy family's best with its memory "
                "breakdown, and why the chosen one won)");
  sub->add_option("--top", a->top,
                  "Print the N best rows of --all's table (and the chosen one); 0 = all. The plan JSON "
                  "(--json, --out) always has every candidate")
      ->capture_default_str();
  return {sub, [a, seq, attention] {
            a->seq_len_given = seq->count() > 0;
            a->attention_given = attention->count() > 0;
            return run(*a);
          }};
}

}  // namespace shardfit::cli
