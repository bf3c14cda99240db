#include "planner/plan_output.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "planner/profile.h"
#include "planner/pytorch_stack.h"
#include "spec/job.h"
#include "spec/json_fields.h"

namespace shardfit::planner {
namespace {

using nlohmann::json;

using spec::FieldReader;

// A plan field that carries a job's option meets that option's one rule
// (spec/job.h), its message after the field's name:
// "field 'hardware.nodes' fails --nodes 70000: at most 65536 (nodes)".
template <class Rule>
void job_rule(const FieldReader& r, const std::string& key, Rule rule) {
  try {
    rule();
  } catch (const std::invalid_argument& e) {
    r.fail(key, std::string("fails ") + e.what());
  }
}

json breakdown_to_json(const MemoryBreakdown& b) {
  return json{{"params", b.params_bytes},
              {"grads", b.grads_bytes},
              {"optimizer", b.optimizer_bytes},
              {"activations", b.activations_bytes},
              {"comm_buffers", b.comm_buffers_bytes},
              {"temporaries", b.temporaries_bytes},
              {"overhead", b.overhead_bytes}};
}

MemoryBreakdown breakdown_from(const FieldReader& r) {
  MemoryBreakdown b;
  b.params_bytes = r.integer("params", 0);
  b.grads_bytes = r.integer("grads", 0);
  b.optimizer_bytes = r.integer("optimizer", 0);
  b.activations_bytes = r.integer("activations", 0);
  b.comm_buffers_bytes = r.integer("comm_buffers", 0);
  b.temporaries_bytes = r.integer("temporaries", 0);
  b.overhead_bytes = r.integer("overhead", 0);
  return b;
}

Prediction prediction_from(const FieldReader& r) {
  Prediction p;
  p.peak_reserved_bytes = r.integer("peak_reserved_bytes", 0);
  p.peak_allocated_bytes = r.integer("peak_allocated_bytes", 0);
  p.breakdown = breakdown_from(r.object("breakdown_bytes"));
  p.step_time_s = r.number("step_time_s");
  p.tokens_per_s = r.number("tokens_per_s");
  p.peak_host_bytes = r.optional_integer("peak_host_bytes", 0);
  if (r.has("rank_peak_allocated_bytes")) {
    const nlohmann::json& v = r.need("rank_peak_allocated_bytes");
    if (!v.is_array()) r.fail("rank_peak_allocated_bytes", "must be a list");
    for (const auto& x : v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0)
        r.fail("rank_peak_allocated_bytes", "must be a list of whole numbers >= 0");
      p.rank_peak_allocated_bytes.push_back(x.get<int64_t>());
    }
  }
  if (r.has("rank_timelines")) {
    const nlohmann::json& v = r.need("rank_timelines");
    if (!v.is_array()) r.fail("rank_timelines", "must be a list (one timeline per rank)");
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_array()) r.fail("rank_timelines", "must be a list of lists of points");
      std::vector<Prediction::Point> timeline;
      for (size_t k = 0; k < v[i].size(); ++k) {
        FieldReader pr(v[i][k], r.field("rank_timelines") + "[" + std::to_string(i) + "][" + std::to_string(k) + "]",
                       r.origin());
        timeline.push_back({pr.text("phase"), pr.integer("allocated_bytes", 0), pr.integer("peak_allocated_bytes", 0)});
      }
      p.rank_timelines.push_back(std::move(timeline));
    }
  }
  if (r.has("time_breakdown_s")) {
    FieldReader t = r.object("time_breakdown_s");
    p.compute_s = t.optional_number("compute");
    p.comm_s = t.optional_number("comm");
    p.exposed_comm_s = t.optional_number("exposed_comm");
    p.offload_s = t.optional_number("offload");
    p.optimizer_s = t.optional_number("optimizer");
  }
  return p;
}

// `adamw_step` (a candidate's or pytorch_job's): one of AdamwStep's names.
std::string adamw_step_field(const FieldReader& r) {
  std::string step = r.text("adamw_step");
  if (!parse_adamw_step(step)) r.fail("adamw_step", "must be \"for-loop\", \"foreach\" or \"fused\"");
  return step;
}

PlanCandidate candidate_from(const FieldReader& r) {
  PlanCandidate pc;
  std::string id = r.text("id");
  try {
    pc.candidate = parse_candidate(id);
  } catch (const std::invalid_argument& e) {
    r.fail("id", std::string("is not a candidate id: ") + e.what());
  }
  // The spelled-out fields must agree with the id: a plan edited by hand in
  // one place and not the other would otherwise run something else.
  const Candidate& c = pc.candidate;
  auto disagree = [&](const std::string& key, const std::string& value) {
    r.fail(key, "is '" + value + "' but id '" + id + "' says otherwise");
  };
  std::string sharding = r.text("sharding");
  try {
    if (parse_sharding(sharding) != c.sharding) disagree("sharding", sharding);
  } catch (const std::invalid_argument&) {
    r.fail("sharding", "is '" + sharding + "', not a sharding name");
  }
  if (r.boolean("offload") != c.offload) disagree("offload", c.offload ? "false" : "true");
  if (r.boolean("activation_checkpointing") != c.recompute)
    disagree("activation_checkpointing", c.recompute ? "false" : "true");
  std::string precision = r.text("precision");
  if (precision != precision_name(c.precision)) disagree("precision", precision);
  std::string wrap = r.text("wrap");
  std::string canonical_wrap;
  try {
    canonical_wrap = parse_wrap(wrap);
  } catch (const std::invalid_argument&) {
    r.fail("wrap", "is '" + wrap + "', not a wrap policy");
  }
  if (canonical_wrap != c.wrap) disagree("wrap", wrap);

  pc.max_batch_per_gpu = r.integer("max_batch_per_gpu", 0);
  // The planner's search stops at 2^20 (run --batch's bound): a larger
  // figure was never a plan's, and `run --plan` would allocate it.
  if (pc.max_batch_per_gpu > (int64_t{1} << 20)) r.fail("max_batch_per_gpu", "is above 1048576, no plan's batch");
  pc.predicted = prediction_from(r.object("predicted"));
  pc.limit = r.text("limit");
  if (r.has("oom")) {
    const FieldReader o = r.object("oom");
    PlanCandidate::Oom oom;
    oom.batch = o.integer("batch", 1);
    oom.at = o.text("at");
    oom.request_bytes = o.integer("request_bytes", 0);
    oom.allocation_bytes = o.integer("allocation_bytes", 0);
    oom.allocated_bytes = o.integer("allocated_bytes", 0);
    oom.reserved_bytes = o.integer("reserved_bytes", 0);
    pc.oom = oom;
  }
  pc.units = static_cast<int>(r.optional_integer("units", 0));
  if (r.has("adamw_step")) {
    pc.adamw_step = adamw_step_field(r);
  } else if (r.has("adamw_foreach")) {
    pc.adamw_step = r.boolean("adamw_foreach") ? "foreach" : "for-loop";
  }
  if (r.has("attention")) {
    pc.attention = r.text("attention");
    if (pc.attention != "eager" && pc.attention != "flash" && pc.attention != "efficient" && pc.attention != "cudnn")
      r.fail("attention", "must be \"eager\", \"flash\", \"efficient\" or \"cudnn\"");
  }
  return pc;
}

Plan plan_from(const json& j, const std::string& origin) {
  FieldReader r(j, "", origin);
  std::string schema = r.text("schema");
  if (schema != kPlanSchema)
    r.fail("schema", "is '" + schema + "', expected '" + kPlanSchema + "'");

  Plan plan;
  FieldReader model = r.object("model");
  plan.model.name = model.text("name");
  plan.model.params = model.integer("params", 0);
  plan.model.seq_len = model.integer("seq_len", 1);
  if (j["model"].contains("loss")) plan.model.loss = model.text("loss");
  if (j["model"].contains("attention")) plan.model.attention = model.text("attention");
  if (j["model"].contains("block_class")) plan.model.block_class = model.text("block_class");
  if (plan.model.attention != "sdpa" && plan.model.attention != "eager" && plan.model.attention != "flash" &&
      plan.model.attention != "traced")
    model.fail("attention", "must be \"sdpa\", \"eager\", \"flash\" or \"traced\" (a model planned from --trace)");

  FieldReader hw = r.object("hardware");
  plan.hardware.profile = hw.text("profile");
  plan.hardware.device_mem_bytes = hw.integer("device_mem_bytes", 0);
  plan.hardware.allocator_budget_bytes = hw.optional_integer("allocator_budget_bytes", 0);
  // plan --gpus, --nodes and --grad-accum's rules (spec/job.h), named by the field.
  const int64_t gpus = hw.integer("gpus_per_node", 1), nodes = hw.integer("nodes", 1);
  job_rule(hw, "gpus_per_node", [gpus] { spec::check_gpus_per_node(gpus); });
  job_rule(hw, "nodes", [nodes] { spec::check_nodes(nodes); });
  plan.hardware.gpus_per_node = static_cast<int>(gpus);
  plan.hardware.nodes = static_cast<int>(nodes);

  if (r.has("optimizer")) plan.optimizer = r.text("optimizer");
  if (plan.optimizer != "adamw" && plan.optimizer != "sgd") r.fail("optimizer", "must be \"adamw\" or \"sgd\"");
  if (r.has("grad_accum")) {
    const int64_t accum = r.integer("grad_accum", 1);
    job_rule(r, "grad_accum", [accum] { spec::check_grad_accum(accum); });
    plan.grad_accum = static_cast<int>(accum);
  }
  if (r.has("prefetch")) plan.schedule.prefetch = static_cast<int>(r.integer("prefetch", 1));
  if (r.has("ddp_bucket_cap_bytes")) plan.schedule.ddp_bucket_cap_bytes = r.integer("ddp_bucket_cap_bytes", 1);
  if (r.has("async_reduce")) plan.schedule.async_reduce = r.boolean("async_reduce");
  if (r.has("async_gather")) plan.schedule.async_gather = r.boolean("async_gather");
  if (r.has("stack")) {
    plan.stack = r.text("stack");
    if (plan.stack != "shardfit" && plan.stack != "pytorch") r.fail("stack", "must be \"shardfit\" or \"pytorch\"");
  }
  if (r.has("ddp_bucket_view")) plan.ddp_bucket_view = r.boolean("ddp_bucket_view");
  if (r.has("ddp_static_graph")) plan.ddp_static_graph = r.boolean("ddp_static_graph");
  if (r.has("single_gpu_unwrapped")) plan.single_gpu_unwrapped = r.boolean("single_gpu_unwrapped");
  if (r.has("pytorch_job")) {
    const FieldReader p = r.object("pytorch_job");
    Plan::PytorchJob job;
    if (p.has("torch")) {
      job.torch = p.text("torch");
      try {
        torch_defaults(job.torch);
      } catch (const std::invalid_argument& e) {
        p.fail("torch", e.what());
      }
    }
    job.zero_grad = p.text("zero_grad");
    job.checkpoint = p.text("checkpoint");
    job.ddp_bucket_cap_bytes = p.integer("ddp_bucket_cap_bytes", 1);
    job.fsdp_backward_prefetch = p.text("fsdp_backward_prefetch");
    job.steps = static_cast<int>(p.integer("steps", 1));
    if (p.has("fsdp_version")) {
      job.fsdp_version = static_cast<int>(p.integer("fsdp_version", 1));
      if (job.fsdp_version > 2) p.fail("fsdp_version", "must be 1 or 2");
    }
    if (p.has("adamw_step")) {
      job.adamw_step = adamw_step_field(p);
    } else if (p.has("adamw_foreach") && p.boolean("adamw_foreach")) {
      job.adamw_step = "foreach";
    }
    if (p.has("fsdp_keep_low_precision_grads"))
      job.fsdp_keep_low_precision_grads = p.boolean("fsdp_keep_low_precision_grads");
    if (p.has("fsdp_use_orig_params")) job.fsdp_use_orig_params = p.boolean("fsdp_use_orig_params");
    if (p.has("loop_keeps")) {
      job.loop_keeps = p.text("loop_keeps");
      if (job.loop_keeps != "outputs" && job.loop_keeps != "loss") p.fail("loop_keeps", "must be outputs or loss");
    }
    if (p.has("fsdp_reduce_dtype")) {
      job.fsdp_reduce_dtype = p.text("fsdp_reduce_dtype");
      try {
        parse_fsdp_reduce_dtype(job.fsdp_reduce_dtype);
      } catch (const std::invalid_argument& e) {
        p.fail("fsdp_reduce_dtype", e.what());
      }
    }
    plan.pytorch_job = job;
  }
  if (r.has("objective")) {
    std::string objective = r.text("objective");
    try {
      plan.objective = parse_objective(objective);
    } catch (const std::invalid_argument&) {
      r.fail("objective", "is '" + objective + "' (use throughput or batch)");
    }
  }

  const json& list = r.need("candidates");
  if (!list.is_array()) r.fail("candidates", "must be an array");
  std::set<std::string> ids;
  for (size_t i = 0; i < list.size(); ++i) {
    std::string path = "candidates[" + std::to_string(i) + "]";
    plan.candidates.push_back(candidate_from(FieldReader(list[i], path, origin)));
    if (!ids.insert(plan.candidates.back().id()).second)
      r.fail_at(path + ".id", "repeats '" + plan.candidates.back().id() + "'");
  }

  const json& chosen = r.need("chosen");
  if (chosen.is_string()) {
    const PlanCandidate* found = plan.find(chosen.get<std::string>());
    if (!found)
      r.fail("chosen", "is '" + chosen.get<std::string>() + "', which is not among the candidates");
    plan.chosen = found->id();
  } else if (!chosen.is_null()) {
    r.fail("chosen", "must be a candidate id or null");
  }
  return plan;
}

}  // namespace

const char* objective_name(Objective objective) {
  return objective == Objective::kBatch ? "batch" : "throughput";
}

Objective parse_objective(const std::string& text) {
  if (text == "throughput") return Objective::kThroughput;
  if (text == "batch") return Objective::kBatch;
  throw std::invalid_argument("unknown objective '" + text + "' (use throughput or batch)");
}

const PlanCandidate* Plan::find(const std::string& id) const {
  std::string canonical;
  try {
    canonical = parse_candidate(id).to_id();
  } catch (const std::invalid_argument&) {
    return nullptr;
  }
  for (const PlanCandidate& c : candidates)
    if (c.id() == canonical) return &c;
  return nullptr;
}

const PlanCandidate& candidate_to_use(const Plan& plan, const std::string& path, const std::string& option,
                                      const std::string& id) {
  const std::string wanted = id.empty() ? plan.chosen : id;
  if (wanted.empty())
    throw std::invalid_argument("--plan " + path + ": no candidate fits batch 1, so none is chosen (name one with " +
                                option + ")");
  const PlanCandidate* c = plan.find(wanted);
  if (c == nullptr) throw std::invalid_argument(option + " " + wanted + ": not among the candidates of " + path);
  return *c;
}

bool ranks_above(const PlanCandidate& a, const PlanCandidate& b, Objective objective) {
  const double ta = a.predicted.tokens_per_s, tb = b.predicted.tokens_per_s;
  const int64_t ba = a.max_batch_per_gpu, bb = b.max_batch_per_gpu;
  if (objective == Objective::kThroughput) {
    if (ta != tb) return ta > tb;
    if (ba != bb) return ba > bb;
  } else {
    if (ba != bb) return ba > bb;
    if (ta != tb) return ta > tb;
  }
  // A full tie: bf16 over fp16, the same bytes and speed without loss scaling.
  return a.candidate.precision == Precision::kBf16 && b.candidate.precision == Precision::kFp16;
}

std::optional<size_t> choose(const std::vector<PlanCandidate>& candidates, Objective objective) {
  std::optional<size_t> best;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].max_batch_per_gpu < 1) continue;
    if (!best || ranks_above(candidates[i], candidates[*best], objective)) best = i;
  }
  return best;
}

void to_json(json& j, const PlanCandidate& c) {
  const Prediction& p = c.predicted;
  j = json{{"id", c.id()},
           {"sharding", sharding_name(c.candidate.sharding)},
           {"offload", c.candidate.offload},
           {"activation_checkpointing", c.candidate.recompute},
           {"precision", precision_name(c.candidate.precision)},
           {"wrap", c.candidate.wrap},
           {"max_batch_per_gpu", c.max_batch_per_gpu},
           {"predicted",
            {{"peak_reserved_bytes", p.peak_reserved_bytes},
             {"peak_allocated_bytes", p.peak_allocated_bytes},
             {"breakdown_bytes", breakdown_to_json(p.breakdown)},
             {"step_time_s", p.step_time_s},
             {"tokens_per_s", p.tokens_per_s},
             {"peak_host_bytes", p.peak_host_bytes},
             {"time_breakdown_s",
              {{"compute", p.compute_s},
               {"comm", p.comm_s},
               {"exposed_comm", p.exposed_comm_s},
               {"offload", p.offload_s},
               {"optimizer", p.optimizer_s}}}}},
           {"limit", c.limit},
           {"units", c.units}};
  if (c.oom)
    j["oom"] = {{"batch", c.oom->batch},
                {"at", c.oom->at},
                {"request_bytes", c.oom->request_bytes},
                {"allocation_bytes", c.oom->allocation_bytes},
                {"allocated_bytes", c.oom->allocated_bytes},
                {"reserved_bytes", c.oom->reserved_bytes}};
  if (!c.adamw_step.empty()) {
    j["adamw_step"] = c.adamw_step;
    j["adamw_foreach"] = c.adamw_step == "foreach";
  }
  if (!c.attention.empty()) j["attention"] = c.attention;
  if (!p.rank_peak_allocated_bytes.empty()) j["predicted"]["rank_peak_allocated_bytes"] = p.rank_peak_allocated_bytes;
  if (!p.rank_timelines.empty()) {
    json timelines = json::array();
    for (const auto& t : p.rank_timelines) {
      json points = json::array();
      for (const auto& x : t)
        points.push_back(
            {{"phase", x.phase}, {"allocated_bytes", x.allocated_bytes}, {"peak_allocated_bytes", x.peak_allocated_bytes}});
      timelines.push_back(points);
    }
    j["predicted"]["rank_timelines"] = timelines;
  }
}

void to_json(json& j, const Plan& plan) {
  json candidates = json::array();
  for (const PlanCandidate& c : plan.candidates) candidates.push_back(c);
  j = json{
      {"schema", kPlanSchema},
      {"model",
       {{"name", plan.model.name},
        {"params", plan.model.params},
        {"seq_len", plan.model.seq_len},
        {"loss", plan.model.loss},
        {"attention", plan.model.attention}}},
      {"hardware",
       {{"profile", plan.hardware.profile},
        {"device_mem_bytes", plan.hardware.device_mem_bytes},
        {"gpus_per_node", plan.hardware.gpus_per_node},
        {"nodes", plan.hardware.nodes}}},
      {"optimizer", plan.optimizer},
      {"grad_accum", plan.grad_accum},
      {"prefetch", plan.schedule.prefetch},
      {"ddp_bucket_cap_bytes", plan.schedule.ddp_bucket_cap_bytes},
      {"stack", plan.stack},
      {"ddp_bucket_view", plan.ddp_bucket_view},
      {"objective", objective_name(plan.objective)},
      {"candidates", std::move(candidates)},
      {"chosen", plan.chosen.empty() ? json(nullptr) : json(plan.chosen)}};
  if (plan.ddp_static_graph) j["ddp_static_graph"] = true;
  if (plan.hardware.allocator_budget_bytes > 0)
    j["hardware"]["allocator_budget_bytes"] = plan.hardware.allocator_budget_bytes;
  if (plan.single_gpu_unwrapped) j["single_gpu_unwrapped"] = true;
  if (!plan.model.block_class.empty()) j["model"]["block_class"] = plan.model.block_class;
  if (plan.pytorch_job)
    j["pytorch_job"] = {{"zero_grad", plan.pytorch_job->zero_grad},
                        {"checkpoint", plan.pytorch_job->checkpoint},
                        {"ddp_bucket_cap_bytes", plan.pytorch_job->ddp_bucket_cap_bytes},
                        {"fsdp_backward_prefetch", plan.pytorch_job->fsdp_backward_prefetch},
                        {"steps", plan.pytorch_job->steps},
                        {"fsdp_version", plan.pytorch_job->fsdp_version},
                        {"fsdp_reduce_dtype", plan.pytorch_job->fsdp_reduce_dtype},
                        {"adamw_foreach", plan.pytorch_job->adamw_step == "foreach"},
                        {"fsdp_keep_low_precision_grads", plan.pytorch_job->fsdp_keep_low_precision_grads},
                        {"fsdp_use_orig_params", plan.pytorch_job->fsdp_use_orig_params},
                        {"loop_keeps", plan.pytorch_job->loop_keeps}};
  if (plan.pytorch_job && !plan.pytorch_job->torch.empty()) j["pytorch_job"]["torch"] = plan.pytorch_job->torch;
  if (plan.pytorch_job && !plan.pytorch_job->adamw_step.empty())
    j["pytorch_job"]["adamw_step"] = plan.pytorch_job->adamw_step;
  if (plan.schedule.async_reduce) j["async_reduce"] = true;
  if (plan.schedule.async_gather) j["async_gather"] = true;
}

void from_json(const json& j, Plan& plan) { plan = plan_from(j, "plan"); }

std::string plan_to_json_text(const Plan& plan) { return json(plan).dump(2) + "\n"; }

Plan parse_plan(const std::string& json_text, const std::string& origin) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(origin + ": malformed JSON: " + e.what());
  } catch (const json::exception& e) {  // e.g. a number too large for a double (found by fuzz_plan)
    throw std::invalid_argument(origin + ": malformed JSON: " + e.what());
  }
  return plan_from(j, origin);
}

Plan read_plan_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot read plan file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_plan(text.str(), "plan file " + path);
}

void write_plan_file(const std::string& path, const Plan& plan) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << plan_to_json_text(plan);
  out.flush();
  if (!out) throw std::invalid_argument("cannot write plan file '" + path + "'");
}

}  // namespace shardfit::planner
