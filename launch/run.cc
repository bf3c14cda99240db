// The run layer: execute a candidate for real and measure it, beside the
// planner's prediction for the same candidate, batch and world (`shardfit
// run` describes the job and prints; everything between is here).
// launch/run.h says who runs what.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include <torch/version.h>

#include <spdlog/spdlog.h>

#include "executor/checkpoint_format.h"
#include "executor/comm.h"
#include "executor/data.h"
#include "executor/engine.h"
#include "executor/hf_init.h"
#include "executor/launcher.h"
#include "executor/meter.h"
#include "executor/signals.h"
#include "executor/slurm_env.h"
#include "executor/train_checkpoint.h"
#include "executor/trainer.h"
#include "launch/output_file.h"
#include "launch/run.h"
#include "launch/run_outcome.h"
#include "launch/run_support.h"
#include "models/hf_architecture.h"
#include "models/model_config.h"
#include "models/module_table.h"
#include "planner/candidate.h"
#include "planner/plan_builder.h"
#include "planner/plan_output.h"
#include "planner/profile.h"
#include "reports/run_report.h"
#include "spec/errors.h"
#include "spec/exit_codes.h"
#include "spec/strategy.h"
#include "spec/wrap_policy.h"

namespace shardfit::launch {
namespace {
using spec::BadInput;
using spec::EnvironmentFailure;
using spec::Interrupted;
using spec::kExitCheckFailed;
using spec::kExitEnvironment;
using spec::kExitOk;
using spec::kExitOom;

// What the single-rank trainer and the engine both take from the job.
executor::TrainOptions train_options(const RunRequest& a, const Job& job) {
  executor::TrainOptions o;
  static_cast<spec::JobOptions&>(o) = job;  // seq_len, steps, grad_accum, schedule
  o.model = job.model;
  o.batch = job.batch;
  o.seed = a.seed;
  o.data = a.data;
  o.adamw.lr = a.lr;
  o.adamw.weight_decay = a.weight_decay;
  o.budget_bytes = job.budget_bytes;
  return o;
}

executor::EngineOptions engine_options(const RunRequest& a, const Job& job, int shard_group_size) {
  executor::EngineOptions o;
  static_cast<executor::TrainOptions&>(o) = train_options(a, job);
  o.candidate = job.candidate;
  o.clip_grad_norm = a.clip_grad_norm;
  o.shard_group_size = shard_group_size;
  // One GPU per rank: cuda:LOCAL_RANK (torchrun and --nproc set it; 0 alone or loopback).
  const char* local_rank = std::getenv("LOCAL_RANK");
  o.device = job.device == "cuda" ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank ? std::atoi(local_rank) : 0))
                                  : torch::Device(torch::kCPU);
  o.checkpoint.save_dir = a.save;
  o.checkpoint.save_every = a.save_every;
  o.checkpoint.resume_from = a.resume;
  o.allow_nonfinite = a.allow_nonfinite;
  if (a.save_on_signal) o.stop_requested = executor::stop_signal_received;  // the ranks agree on it
  o.init_from = a.init;
  o.allocator_history = a.allocator_history;
  return o;
}

// The planner's figures for this job, on job.profile (cpu: the exact
// allocator; cuda: the named card's caching-allocator model) under the same
// budget, with the same micro-batches per step; nullopt (with
// a warning) when no profile is found.
std::optional<planner::CandidatePrediction> predict(const RunRequest& a, const Job& job, int world, int gpus_per_node) {
  try {
    planner::PlanRequest r;
    static_cast<spec::JobOptions&>(r) = job;  // the same seq_len, steps, grad_accum, schedule
    r.model = job.model;
    r.profile = planner::load_profile(job.profile, a.profiles_dir);
    r.device_mem_bytes = job.budget_bytes;
    // A plan's topology: hybrid's shard group is a node; the others see one node of `world`.
    if (spec::sharding_traits(job.candidate.sharding).replicate_across_groups) {
      r.gpus_per_node = gpus_per_node;
      r.nodes = world / gpus_per_node;
    } else {
      r.gpus_per_node = world;
      r.nodes = 1;
    }
    return planner::predict_candidate(r, job.candidate, job.batch, job.steps >= 2 ? 2 : 1);
  } catch (const std::exception& e) {
    spdlog::warn("no prediction in the report: {}", e.what());
    return std::nullopt;
  }
}

std::optional<double> predicted_step_time(const std::optional<planner::CandidatePrediction>& pred) {
  if (!pred || !(pred->step_time_s > 0)) return std::nullopt;
  return pred->step_time_s;
}

// The report, completed with where and how it was made: printed (the
// CLI's summary), and written to --out.
void write_and_print(const RunRequest& a, reports::RunReport& r, const Job& job, const RunPrinter& print) {
  r.command = a.command_line;
  r.created = now_iso8601();
  r.machine = reports::this_machine(torch::get_num_threads());
  r.machine->libtorch = TORCH_VERSION;
  print.report(r, job);
  if (!a.out.empty()) write_output_file("--out", a.out, reports::to_json(r).dump(2) + "\n");
}

reports::RunReport report_skeleton(const Job& job, int64_t params, int world, int gpus_per_node,
                                   const std::string& backend) {
  reports::RunReport r;
  r.candidate = job.candidate.to_id();
  r.model = {{"name", job.model.name}, {"params", params}, {"seq_len", job.seq_len}};
  r.hardware = {{"profile", job.profile},
                {"device_mem_bytes", job.budget_bytes > 0 ? nlohmann::json(job.budget_bytes) : nlohmann::json(nullptr)},
                {"gpus_per_node", gpus_per_node},
                {"nodes", std::max(1, world / std::max(1, gpus_per_node))}};
  r.batch_per_gpu = job.batch;
  r.schedule = job.schedule;
  r.world_size = world;
  r.backend = backend;
  r.device = job.device;
  return r;
}

// One rank alone, ddp/fp32/wrap=none: the single-rank trainer, as before.
int run_single_rank_trainer(const RunRequest& a, const Job& job, const RunPrinter& print) {
  auto result = executor::train_single_rank(train_options(a, job), print.step);
  reports::RunReport r = report_skeleton(job, result.param_count, 1, 1, "none");
  r.steps = static_cast<int64_t>(result.loss.size());
  r.loss = result.loss;
  r.tokens_per_s = result.tokens_per_s;
  r.ranks.push_back(rank_report(0, result.peak_allocated_bytes, result.timeline, result.oom, result.oom_message));
  const auto pred = predict(a, job, 1, 1);
  attach_prediction(r.ranks, pred);
  reports::set_step_time(r, static_cast<double>(job.batch * job.seq_len), predicted_step_time(pred));
  write_and_print(a, r, job, print);
  return oom_exit(a.oom_ok, a.out, r);
}

// What every rank of a job must agree on, by option (check_ranks_agree).
std::map<std::string, std::string> job_options(const RunRequest& a, const Job& job, int gpus_per_node) {
  auto num = [](double v) { return nlohmann::json(v).dump(); };
  return {{"--model", job.model.name}, {"--strategy", job.candidate.to_id()}, {"--batch", std::to_string(job.batch)},
          {"--seq-len", std::to_string(job.seq_len)}, {"--steps", std::to_string(job.steps)},
          {"--seed", std::to_string(a.seed)}, {"--data", a.data}, {"--device", a.device},
          {"--gpu-mem", std::to_string(job.budget_bytes)}, {"--lr", num(a.lr)}, {"--weight-decay", num(a.weight_decay)},
          {"--grad-accum", std::to_string(job.grad_accum)}, {"--prefetch", std::to_string(job.schedule.prefetch)},
          {"--async-reduce", job.schedule.async_reduce ? "yes" : "no"}, {"--async-gather", job.schedule.async_gather ? "yes" : "no"},
          {"--ddp-bucket-cap-mb", std::to_string(job.schedule.ddp_bucket_cap_bytes) + " bytes"},
          {"--clip-grad-norm", num(a.clip_grad_norm)},
          {"--gpus-per-node", std::to_string(gpus_per_node)}, {"--save", a.save},
          {"--save-every", std::to_string(a.save_every)}, {"--resume", a.resume},
          {"--save-on-signal", a.save_on_signal ? "yes" : "no"}, {"--init", a.init}};
}

// This process is one rank of `comm` (gloo or loopback).
int run_rank(const RunRequest& a, const Job& job, executor::Communicator& comm, int gpus_per_node,
             const std::string& backend_label, const RunPrinter& print) {
  executor::EngineOptions o = engine_options(a, job, gpus_per_node);
  o.on_step_begin = test_death_hook(comm.rank());
  if (comm.backend() != executor::Backend::kLoopback) check_ranks_agree(comm, job_options(a, job, gpus_per_node), o.device);
  const bool leader = comm.rank() == 0 || comm.backend() == executor::Backend::kLoopback;
  if (!leader) spdlog::set_level(spdlog::level::warn);
  // Before training: a save into the same root makes a newer step the latest.
  const std::string resumed_from = a.resume.empty() ? "" : executor::resolve_resume_dir(a.resume).string();
  executor::EngineResult result = executor::train_data_parallel(o, comm, print.step);
  reports::RankReport mine = rank_report(comm.rank(), result.peak_allocated_bytes, result.timeline, result.oom,
                                         result.oom_message, result.device == "cuda" ? result.peak_reserved_bytes : -1);
  if (result.init_read_bytes >= 0) mine.init_read_bytes = result.init_read_bytes;

  std::vector<reports::RankReport> ranks;
  int code = kExitOk;
  if (comm.backend() != executor::Backend::kLoopback && comm.world_size() > 1) {
    for (const std::string& text : all_gather_strings(comm, rank_json(mine).dump(), o.device))
      ranks.push_back(rank_from_json(nlohmann::json::parse(text)));
  } else {
    ranks.push_back(mine);
  }
  if (leader) {
    const int world = comm.world_size();
    reports::RunReport r = report_skeleton(job, result.param_count, world, gpus_per_node, backend_label);
    r.steps = static_cast<int64_t>(result.loss.size());
    r.first_step = result.first_step;
    r.checkpoints = result.saved;
    r.resumed_from = resumed_from;
    r.resume_changes = job.resume_changes;
    if (!o.init_from.empty()) {
      r.init_from = o.init_from;
      r.init_data_bytes = result.init_data_bytes;
    }
    r.diverged_at_step = result.diverged_at_step;
    r.interrupted = result.stop_signal != 0;
    r.saved_on_signal_step = result.saved_on_signal_step;
    r.loss = result.loss;
    r.tokens_per_s = result.tokens_per_s;
    r.ddp_bucket_bytes = result.ddp_bucket_bytes;
    r.ranks = std::move(ranks);
    const auto pred = predict(a, job, world, gpus_per_node);
    attach_prediction(r.ranks, pred, job.device == "cuda");
    // Loopback: one process computes rank 0 alone, so its tokens/s is not the job's.
    if (comm.backend() != executor::Backend::kLoopback)
      reports::set_step_time(r, static_cast<double>(world) * static_cast<double>(job.batch * job.grad_accum * job.seq_len),
                             predicted_step_time(pred));
    write_and_print(a, r, job, print);
    code = oom_exit(a.oom_ok, a.out, r);
    if (result.diverged_at_step > 0) {
      std::fprintf(stderr, "shardfit run: diverged at step %lld (loss %g)%s; --allow-nonfinite trains on\n",
                   static_cast<long long>(result.diverged_at_step), result.loss.back(),
                   a.out.empty() ? "" : ("; report " + a.out).c_str());
      if (code == kExitOk) code = kExitCheckFailed;
    } else if (!a.export_path.empty()) {
      if (result.saved.empty()) {
        spdlog::warn("--export {}: no checkpoint was saved (out of memory?), nothing exported", a.export_path);
      } else {
        executor::ScopedUntracked host;
        executor::export_safetensors(result.saved.back(), a.export_path);
        print.line("exported " + result.saved.back() + " -> " + a.export_path);
        // Beside it, the config.json that makes the pair a Hugging Face model directory.
        const std::filesystem::path config = std::filesystem::path(a.export_path).parent_path() / "config.json";
        write_output_file("--export", config.string(), models::to_hf_config(job.model).dump(2) + "\n");
        print.line("wrote " + config.string());
      }
    }
  }
  comm.barrier();  // rank 0 hosts the store: nobody leaves before everybody is done
  if (result.stop_signal != 0)
    return end_rank_saved_on_signal(leader, {result.stop_signal, result.saved_on_signal_step, result.saved.back()},
                                    comm.world_size(), a.save, a.out);
  return code;
}

// --save/--resume/--export, checked once before any rank starts.
// Returns, under --resume-anyway, the options that differ from the checkpoint's job.
std::vector<std::string> check_checkpoint_args(const RunRequest& a, const Job& job, int world, int gpus_per_node,
                                               executor::Backend backend) {
  try {
    executor::check_save_on_signal(a.save_on_signal, !a.save.empty());
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  const bool any = !a.save.empty() || !a.resume.empty() || !a.export_path.empty();
  if (a.resume_anyway && a.resume.empty()) throw BadInput("--resume-anyway: needs --resume DIR");
  if (!any) {
    if (a.save_every > 0) throw BadInput("--save-every " + std::to_string(a.save_every) + ": needs --save DIR");
    return {};
  }
  if (a.reference_trainer) throw BadInput("--reference-trainer: has no checkpoints (drop --save/--resume/--export)");
  if (backend == executor::Backend::kLoopback)
    throw BadInput("--backend loopback: rehearses one rank of a world, so it cannot save or resume the world's "
                   "checkpoint (drop --save/--resume/--export)");
  if (!a.export_path.empty() && a.save.empty())
    throw BadInput("--export " + a.export_path + ": needs --save DIR (it consolidates the last checkpoint saved)");
  if (!a.save.empty()) check_save_dir(a.save);  // before training, not after it
  if (!a.export_path.empty()) check_export_path(a.export_path);
  if (!a.resume.empty()) {
    std::filesystem::path dir;
    executor::CheckpointInfo info;
    try {
      dir = executor::resolve_resume_dir(a.resume);
      info = executor::read_checkpoint_info(dir);
      // Every rank file and every tensor's data against its checksum, once,
      // before any rank starts: a damaged checkpoint is one line here, not a
      // line from each rank after the job began. Ranks under an outside
      // launcher (RANK set) check their own files as they load them.
      if (std::getenv("RANK") == nullptr) executor::ckpt::verify_path(dir);
    } catch (const std::invalid_argument& e) {
      throw BadInput(std::string("--resume: ") + e.what());
    }
    if (info.world_size != world)
      throw BadInput("--resume " + a.resume + ": written by " + std::to_string(info.world_size) +
                     " ranks, this job has " + std::to_string(world) + " (shards are cut per rank)");
    // The shards must be cut the same way: the same units (model and wrap
    // policy), each over the same shard group (sharding, world, nodes).
    const spec::UnitPartition units =
        spec::wrap_modules(models::module_table(job.model), spec::WrapPolicy::parse(job.candidate.wrap));
    const int group = spec::shard_group_for(job.candidate.sharding, world, gpus_per_node);
    bool same = info.units.size() == units.units.size();
    for (size_t i = 0; same && i < units.units.size(); ++i) {
      const nlohmann::json& u = info.units[i];
      same = u.value("unit", "") == units.units[i].name && u.value("numel", int64_t{-1}) == units.units[i].numel &&
             u.value("shard_group_size", -1) == group;
    }
    if (!same)
      throw BadInput("--resume " + a.resume + ": its shards are cut for another model, wrap policy or sharding than " +
                     job.model.name + " " + job.candidate.to_id() + " on " + std::to_string(world) + " ranks");
    const int64_t step = info.metadata.value("step", int64_t{0});
    if (step >= job.steps)
      throw BadInput("--resume " + a.resume + ": the checkpoint is at step " + std::to_string(step) + "; --steps " +
                     std::to_string(job.steps) + " (the total, counted from the start) leaves nothing to train");
    const nlohmann::json now = {{"candidate", job.candidate.to_id()}, {"batch_per_gpu", job.batch},
                                {"seq_len", job.seq_len},              {"grad_accum", job.grad_accum},
                                {"seed", a.seed},                      {"data", a.data},
                                {"lr", a.lr},                          {"weight_decay", a.weight_decay},
                                {"clip_grad_norm", a.clip_grad_norm}};
    const std::vector<std::string> changes = resume_option_changes(info.metadata.value("job", nlohmann::json()), now);
    if (!changes.empty() && !a.resume_anyway)
      throw BadInput("--resume " + a.resume + ": " + changes.front() + (changes.size() > 1 ? " (and more)" : "") +
                     " since the checkpoint: the run would not continue its loss curve bit for bit "
                     "(--resume-anyway resumes all the same and says so in the report)");
    return changes;
  }
  return {};
}

int launch(const RunRequest& a, const Job& job, int nproc, int gpus_per_node) {
  executor::install_stop_signal_handlers();  // SIGTERM/SIGINT: stop the ranks, report, exit 128+sig
  executor::LaunchOptions lo;
  lo.timeout = std::chrono::milliseconds(0);  // each rank's collectives time out on their own
  // Let the survivors' own errors (naming the peer they lost) reach the log.
  lo.survivor_grace = std::chrono::milliseconds(static_cast<int64_t>(std::min(a.timeout_s, 3.0) * 1000));
  lo.ranks_save_on_signal = a.save_on_signal;  // their step, their save: bounded by --timeout + 5 s
  lo.save_on_signal_wait = std::chrono::milliseconds(static_cast<int64_t>((a.timeout_s + 5) * 1000));
  const std::string note = a.save_on_signal ? export_stop_note_path() : "";
  // The report records the command as typed (with --nproc), not the ranks'.
  ::setenv("SHARDFIT_COMMAND_LINE", a.command_line.c_str(), 1);
  const executor::LaunchResult res = executor::launch_local(nproc, executor::without_nproc_option(own_argv()), lo);
  const std::optional<SavedOnSignal> saved = note.empty() ? std::nullopt : take_stop_note(note);
  if (res.ranks_saved_on_signal)  // rank 0 wrote the report
    throw Interrupted((saved ? saved_on_signal_line(*saved, nproc, a.save) : res.error) +
                          (a.out.empty() ? "" : "; report " + a.out), res.interrupted_by);
  if (res.interrupted_by != 0) {
    if (!a.out.empty()) {  // what the launcher knows: the job, and that it did not finish
      reports::RunReport r = report_skeleton(job, job.model.param_count(), nproc, gpus_per_node, "gloo");
      r.interrupted = true;
      r.command = a.command_line;
      r.created = now_iso8601();
      write_output_file("--out", a.out, reports::to_json(r).dump(2) + "\n");
    }
    throw Interrupted(res.error + (a.out.empty() ? "" : "; report " + a.out), res.interrupted_by);
  }
  if (launch_went_oom(res)) return kExitOom;
  if (res.exit_code == kExitEnvironment) throw EnvironmentFailure(res.error);
  if (res.exit_code != kExitOk) std::cerr << "shardfit run: " << res.error << "\n";
  return res.exit_code;
}

int run_job(const RunRequest& a, const RunPrinter& print) {
  bool cuda = false;
  try {
    cuda = executor::parse_device(a.device).is_cuda();
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  // The default backend follows the device: nccl for CUDA ranks, gloo for CPU ones.
  const executor::Backend backend = executor::parse_backend(!a.backend.empty() ? a.backend : cuda ? "nccl" : "gloo");
  if (backend == executor::Backend::kNccl && !executor::engine_supports_nccl())
    throw BadInput("--backend nccl: this build has no NCCL backend (NCCL and the CUDA runtime were not found when "
                   "it was built); use gloo on the CPU, or loopback");
  if (backend == executor::Backend::kNccl && !executor::engine_supports_cuda())
    throw BadInput("--backend nccl: reduces CUDA tensors, and this build has no CUDA (LibTorch for CPU); use gloo");
  try {
    executor::check_backend_device(backend, cuda);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  if (cuda && a.reference_trainer)
    throw BadInput("--reference-trainer: the single-rank reference runs on the CPU only; drop --device cuda");
  if (!cuda && !a.allocator_history.empty())
    throw BadInput("--allocator-history " + a.allocator_history +
                   ": records the CUDA caching allocator; only with --device cuda");
  Job job = resolve_job(a);
  try {  // a task started by srun: Slurm's variables as torchrun's (not under --nproc, which sets them)
    if (a.nproc == 0) executor::apply_slurm_env();
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  const bool in_job = std::getenv("RANK") != nullptr && std::getenv("WORLD_SIZE") != nullptr;
  // Under torchrun (or Slurm's variables read as its): all of them, read
  // and bounded once, before the world size is taken from them.
  std::optional<executor::RankEnv> rank_env;
  if (in_job) {
    try {
      rank_env = executor::rank_env_from_environment();
    } catch (const std::invalid_argument& e) {
      throw BadInput(e.what());
    }
  }
  // The prediction's profile must describe the device measured.
  // On the CPU a cpu-kind profile: "cpu", or one `shardfit calibrate` wrote.
  if (!cuda && job.profile != "cpu" && planner::load_profile(job.profile, a.profiles_dir).kind != planner::DeviceKind::kCpu)
    throw BadInput("--profile " + job.profile + ": a cpu run is measured exactly and predicted with a cpu profile "
                   "(cpu, or one `shardfit calibrate` wrote); --profile names the card for --device cuda");
  if (cuda && planner::load_profile(job.profile, a.profiles_dir).kind != planner::DeviceKind::kCuda)
    throw BadInput("--profile " + job.profile + ": not a CUDA profile (--device cuda predicts with the caching "
                   "allocator model of a card, e.g. " + kDefaultCudaProfile + ")");

  // Options of one mode only: given without it they would be ignored.
  if (backend != executor::Backend::kLoopback && (a.rank >= 0 || a.world_size > 0))
    throw BadInput(std::string(a.rank >= 0 ? "--rank" : "--world-size") +
                   ": only with --backend loopback (ranks of a real job are --nproc's, torchrun's or Slurm's)");
  if (!a.candidate.empty() && a.plan.empty())
    throw BadInput("--candidate " + a.candidate + ": only with --plan (without one, --strategy names the candidate)");
  const int loopback_rank = std::max(a.rank, 0);

  // How many ranks, and who am I.
  int nproc = a.nproc;
  if (backend == executor::Backend::kLoopback && nproc > 0)
    throw BadInput("--nproc with --backend loopback: loopback is one process; use --world-size N [--rank R]");
  if (!in_job && nproc == 0 && backend != executor::Backend::kLoopback && job.plan_world > 1) nproc = job.plan_world;
  // Under torchrun or Slurm the launcher placed the ranks; --nproc's own
  // ranks (SHARDFIT_COMMAND_LINE set by this binary) inherit the flag.
  const bool outside_launcher = in_job && std::getenv("SHARDFIT_COMMAND_LINE") == nullptr;
  if (a.oversubscribe && (outside_launcher || (!in_job && nproc == 0)))
    throw BadInput(std::string("--oversubscribe: only with --nproc N (or a plan of N GPUs), whose ranks it lets "
                               "exceed the cores") +
                   (outside_launcher ? "; under torchrun or Slurm the launcher placed the ranks" : ""));
  if (!in_job && nproc > 0) check_local_ranks(nproc, a.oversubscribe);
  if (a.reference_trainer && (nproc > 0 || in_job || backend == executor::Backend::kLoopback))
    throw BadInput("--reference-trainer: one rank only (no --nproc, torchrun or loopback)");
  int world = 1;
  if (nproc > 0 && !in_job) {
    world = nproc;
  } else if (in_job) {
    world = rank_env->world_size;
  } else if (backend == executor::Backend::kLoopback) {
    world = a.world_size > 0 ? a.world_size : (job.plan_world > 0 ? job.plan_world : 1);
    if (loopback_rank >= world)
      throw BadInput("--rank " + std::to_string(loopback_rank) + ": outside the world of " + std::to_string(world));
  }
  if (cuda && nproc > 0 && !in_job && static_cast<int>(torch::cuda::device_count()) < nproc)
    throw BadInput("--nproc " + std::to_string(nproc) + " --device cuda: " +
                   std::to_string(torch::cuda::device_count()) +
                   " CUDA device(s) visible, one per rank (loopback rehearses a bigger world on one)");
  if (job.plan_world > 0 && world != job.plan_world)
    throw BadInput(std::to_string(world) + " ranks for a plan of " + std::to_string(job.plan_world) + " GPUs (" +
                   a.plan + "): run it with --nproc " + std::to_string(job.plan_world));
  int gpus_per_node = a.gpus_per_node_given ? a.gpus_per_node : job.plan_gpus_per_node;
  if (gpus_per_node <= 0) gpus_per_node = in_job ? rank_env->local_world_size : world;
  job.resume_changes = check_checkpoint_args(a, job, world, gpus_per_node, backend);
  if (!a.init.empty() && (!a.resume.empty() || a.reference_trainer))
    throw BadInput("--init " + a.init + ": not with --resume (it restores weights) or --reference-trainer");
  if (a.data != "synthetic" && std::getenv("RANK") == nullptr) {  // the whole token file, once a job
    try {
      executor::check_token_file(a.data, job.model, job.seq_len);
    } catch (const std::invalid_argument& e) {
      throw BadInput(std::string("--data ") + e.what());
    }
  }
  try {  // headers against the model's names, shapes and dtypes; the data (checksums, or finite values) once a job:
         // by this launcher, or by rank 0 under an outside one (torchrun, Slurm), not again by --nproc's rank 0
    const char* env_rank = std::getenv("RANK");
    const bool ours = std::getenv("SHARDFIT_COMMAND_LINE") != nullptr;  // a rank this binary's --nproc started
    const bool verify_data = !in_job || (!ours && env_rank && std::string(env_rank) == "0");
    if (!a.init.empty())
      for (const std::string& file : executor::check_hf_checkpoint(a.init, job.model, verify_data))
        spdlog::info("--init {}: no shardfit checksums (a Hugging Face file): every value checked finite instead",
                     file);
  } catch (const std::invalid_argument& e) {
    throw BadInput(std::string("--init: ") + e.what());
  }
  const executor::EngineOptions checked = engine_options(a, job, gpus_per_node);
  executor::check_engine_options(checked, world);  // one line, before any rank starts
  if (!a.out.empty()) check_output_file("--out", a.out);  // the report must land where it is asked to

  if (nproc > 0 && !in_job) return launch(a, job, nproc, gpus_per_node);
  if (a.save_on_signal) executor::install_save_on_signal_handlers();  // before the rendezvous

  try {
    if (in_job) {
      const executor::RankEnv& env = *rank_env;
      // Ranks on one host share its cores.
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      torch::set_num_threads(static_cast<int>(std::max(1u, cores / std::max(1, env.local_world_size))));
      auto comm = executor::make_communicator(
          executor::comm_options_for(env, backend, std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000))));
      return run_rank(a, job, *comm, gpus_per_node, executor::backend_name(backend), print);
    }
    if (backend == executor::Backend::kLoopback) {
      executor::CommOptions co;
      co.backend = executor::Backend::kLoopback;
      co.rank = loopback_rank;
      co.world_size = world;
      auto comm = executor::make_communicator(co);
      return run_rank(a, job, *comm, gpus_per_node, "loopback", print);
    }
    if (a.reference_trainer) {
      if (job.candidate.to_id() != "ddp/fp32/wrap=none" || a.grad_accum != 1 || a.clip_grad_norm != 0)
        throw BadInput("--reference-trainer: trains ddp/fp32/wrap=none only, without --grad-accum or --clip-grad-norm");
      return run_single_rank_trainer(a, job, print);
    }
    executor::CommOptions co;
    co.backend = executor::Backend::kLoopback;  // a world of one: nothing to communicate
    auto comm = executor::make_communicator(co);
    return run_rank(a, job, *comm, 1, "none", print);
  } catch (const executor::CommError& e) {
    throw EnvironmentFailure(e.what());
  }
}

}  // namespace

int run(const RunRequest& a, const RunPrinter& print) { return run_job(a, print); }

}  // namespace shardfit::launch
