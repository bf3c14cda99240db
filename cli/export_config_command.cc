// `shardfit export-config --plan P.json [--candidate ID] --format
// python|fsdp|accelerate|deepspeed [--main-process-ip ADDR] [--out FILE]`:
// one planned candidate as the settings the user's launcher reads. The mapping and its sources are in
// planner/launch_config.h; what the user must still do goes to stderr.
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "launch/output_file.h"
#include "cli/validators.h"
#include "models/hf_architecture.h"
#include "models/model_config.h"
#include "planner/launch_config.h"
#include "planner/plan_output.h"

namespace shardfit::cli {
namespace {

struct Args {
  std::string plan;
  std::string candidate;
  std::string format;
  std::string out;
  std::string main_process_ip;
  int main_process_port = 29500;
};

// The Hugging Face class of the model's transformer block ("" when the
// plan's model is not one shardfit can read any more).
std::string block_class_of(const std::string& model_name) {
  try {
    return models::hf_block_class(models::resolve_model(model_name));
  } catch (const std::invalid_argument&) {
    return "";
  }
}

int run(const Args& a) {
  planner::LaunchFormat format;
  try {
    format = planner::parse_launch_format(a.format);
  } catch (const std::invalid_argument& e) {
    throw BadInput(std::string("--format: ") + e.what());
  }
  if (!a.out.empty()) check_output_file("--out", a.out);
  const planner::Plan plan = planner::read_plan_file(a.plan);
  const planner::PlanCandidate* c = &planner::candidate_to_use(plan, a.plan, "--candidate", a.candidate);
  planner::LaunchConfig config;
  try {
    planner::LaunchOptions options;
    options.block_class = plan.model.block_class.empty() ? block_class_of(plan.model.name) : plan.model.block_class;
    options.main_process_ip = a.main_process_ip;
    options.main_process_port = a.main_process_port;
    config = planner::export_launch_config(plan, *c, format, options);
  } catch (const std::invalid_argument& e) {
    throw BadInput(std::string("--format ") + a.format + ": " + e.what());
  }
  if (a.out.empty()) {
    std::cout << config.text;
  } else {
    write_output_file("--out", a.out, config.text);
  }
  for (const auto& note : config.notes) std::cerr << "note: " << note << "\n";
  return kExitOk;
}

}  // namespace

Command add_export_config_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "export-config",
      "Write a planned candidate as a Python module that applies FSDP/DDP, PyTorch kwargs (JSON), an "
      "Accelerate config (YAML) or a DeepSpeed ds_config.json");
  auto a = std::make_shared<Args>();
  sub->add_option("--plan", a->plan, "Plan JSON written by `shardfit plan --out`")->required()->check(Named);
  sub->add_option("--candidate", a->candidate, "Candidate id (default: the plan's chosen one)");
  sub->add_option("--format", a->format, "python, fsdp, accelerate or deepspeed")->required();
  sub->add_option("--main-process-ip", a->main_process_ip,
                  "Accelerate, several nodes: the address of the node with machine_rank 0 (required there)");
  sub->add_option("--main-process-port", a->main_process_port, "Accelerate, several nodes: its port (default 29500)");
  sub->add_option("--out", a->out, "Write here instead of stdout")->check(Named);
  sub->footer(
      "A candidate the target cannot express (+offload under DDP, FSDP2's hybrid or explicit prefetch in "
      "Accelerate, +ckpt with wrap=none) is refused with exit 2. Mapping: planner/launch_config.h.");
  return {sub, [a] { return run(*a); }};
}

}  // namespace shardfit::cli
