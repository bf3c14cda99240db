#include "launch/run_job.h"

#include <torch/version.h>

#include <algorithm>
#include <stdexcept>

#include "executor/engine.h"
#include "planner/plan_output.h"
#include "planner/profile.h"
#include "spec/errors.h"
#include "spec/job.h"

namespace shardfit::launch {
using spec::BadInput;

namespace {
// A cpu-kind profile (cpu, or one `shardfit calibrate` wrote); false when
// it is a card's or cannot be read here (a plan made on another machine).
bool is_cpu_profile(const std::string& name, const std::string& profiles_dir) {
  try {
    return planner::load_profile(name, profiles_dir).kind == planner::DeviceKind::kCpu;
  } catch (const std::invalid_argument&) {
    return false;
  }
}
}  // namespace

Job resolve_job(const RunRequest& a) {
  Job job;
  std::string strategy = a.strategy;
  std::string model_name = a.model;
  if (!a.plan.empty()) {
    const planner::Plan plan = planner::read_plan_file(a.plan);
    if (plan.optimizer != "adamw")
      throw BadInput("--plan " + a.plan + ": planned for " + plan.optimizer +
                     "; shardfit run trains with AdamW (plan it with --optimizer adamw)");
    const planner::PlanCandidate* c = &planner::candidate_to_use(plan, a.plan, "--candidate", a.candidate);
    if (a.strategy_given && planner::parse_candidate(a.strategy).to_id() != c->id())
      throw BadInput("--strategy " + a.strategy + ": conflicts with --plan's candidate " + c->id());
    // The plan's max batch is per micro-batch of its accumulation.
    job.grad_accum = a.grad_accum_given ? a.grad_accum : plan.grad_accum;
    job.schedule.prefetch = a.prefetch_given ? a.prefetch : plan.schedule.prefetch;
    job.schedule.ddp_bucket_cap_bytes = plan.schedule.ddp_bucket_cap_bytes;
    job.schedule.async_reduce = a.async_reduce || plan.schedule.async_reduce;
    job.schedule.async_gather = a.async_gather || plan.schedule.async_gather;
    if (!a.model.empty() && a.model != plan.model.name)
      throw BadInput("--model " + a.model + ": the plan " + a.plan + " is for " + plan.model.name);
    if (!a.batch_given && c->max_batch_per_gpu < 1)
      throw BadInput("--plan " + a.plan + ": " + c->id() + " fits no batch (max batch 0); pass --batch to run it anyway");
    strategy = c->id();
    model_name = plan.model.name;
    job.batch = a.batch_given ? a.batch : c->max_batch_per_gpu;
    job.seq_len = a.seq_len_given ? a.seq_len : plan.model.seq_len;
    job.loss = plan.model.loss;
    job.attention = plan.model.attention;  // sdpa: resolved below for the candidate, as the plan did
    job.budget_bytes = plan.hardware.device_mem_bytes;
    job.plan_world = plan.hardware.world_size();
    job.plan_gpus_per_node = plan.hardware.gpus_per_node;
  } else {
    if (model_name.empty()) throw BadInput("--model is required (or --plan FILE)");
    job.batch = a.batch;
    job.grad_accum = a.grad_accum;
    job.schedule = {a.prefetch, a.async_reduce, a.async_gather};
  }
  job.steps = a.steps;
  // --ddp-bucket-cap-mb: the option's own rule (MB to bytes); a plan's bytes
  // meet check_job_options' below.
  try {
    if (a.plan.empty() || a.ddp_bucket_cap_given)
      job.schedule.ddp_bucket_cap_bytes = spec::bucket_cap_bytes(a.ddp_bucket_cap_mb);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  job.model = models::resolve_model(model_name);
  if (!a.loss.empty()) job.loss = a.loss;
  if (!a.attention.empty()) job.attention = a.attention;
  try {
    models::set_loss(&job.model, job.loss);
    models::set_attention(&job.model, job.attention);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  job.candidate = planner::parse_candidate(strategy);
  if (a.plan.empty() || a.seq_len_given)
    job.seq_len = a.seq_len_given ? a.seq_len : std::min<int64_t>(128, job.model.max_positions);
  // The job's rules (one each, with one message), before any rank starts:
  // the plan's values meet them as the options' do.
  try {
    spec::check_batch(job.batch);
    spec::check_job_options(job);
    if (a.gpus_per_node_given) spec::check_gpus_per_node(a.gpus_per_node, "--gpus-per-node");
    models::check_seq_len(job.model, job.seq_len);
  } catch (const std::invalid_argument& e) {
    throw BadInput(e.what());
  }
  // --gpu-mem's one rule is its option's (MemorySize): here it parses.
  if (!a.gpu_mem.empty()) job.budget_bytes = planner::parse_size_bytes(a.gpu_mem);
  // The prediction's profile: cpu on the CPU (exact allocator, as measured);
  // on cuda --profile, else a CUDA plan's own, else kDefaultCudaProfile.
  job.device = a.device;
  const std::string plan_profile = a.plan.empty() ? "" : planner::read_plan_file(a.plan).hardware.profile;
  if (!a.profile.empty())
    job.profile = a.profile;
  else if (a.device == "cuda")
    job.profile = !plan_profile.empty() && plan_profile != "cpu" ? plan_profile : kDefaultCudaProfile;
  else if (!plan_profile.empty() && plan_profile != "cpu" && is_cpu_profile(plan_profile, a.profiles_dir))
    job.profile = plan_profile;  // a calibrated cpu profile the plan was made with (shardfit calibrate)
  // --attention sdpa: the kernel PyTorch picks where the job runs (the CPU
  // engine runs eager); then whether this build has it.
  if (job.model.sdpa_attention) {
    const bool cuda = job.device == "cuda";
    const double cc = cuda ? planner::load_profile(job.profile, a.profiles_dir).compute_capability : 0;
    job.model = models::resolve_sdpa(job.model, cuda, cc, job.candidate.precision != planner::Precision::kFp32);
    job.attention = models::attention_name(job.model);
  }
  if (models::fused_attention(job.model) && !executor::engine_supports_fused_attention())
    throw BadInput("--attention " + job.attention + ": this build has LibTorch " + TORCH_VERSION +
                   (executor::engine_supports_cuda() ? "" : " for CPU") + "; the " + job.attention +
                   " kernel needs a CUDA LibTorch 2.0 or later (plan with it, run eager here)");
  return job;
}

}  // namespace shardfit::launch
