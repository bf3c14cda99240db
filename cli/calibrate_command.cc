// `shardfit calibrate --device cpu [--nproc N] [--stack pytorch] --out FILE`: measures what the
// time model's cpu profile otherwise guesses (launch/calibrate.h says what
// and how) and writes a profile with those figures, for `plan --device FILE`
// and `run --profile FILE`.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/validators.h"
#include "launch/calibrate.h"
#include "launch/output_file.h"
#include "planner/profile.h"

namespace shardfit::cli {

Command add_calibrate_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "calibrate",
      "Measure this machine's matmul, memory and collective rates into a profile (cpu)");
  struct Args {
    std::string device = "cpu", out, base = "cpu", name = "cpu-calibrated", stack = "shardfit";
    int nproc = 1;
  };
  auto a = std::make_shared<Args>();
  sub->add_option("--device", a->device,
                  "What to measure: cpu (a CUDA card is calibrated by scripts/gpu-check)")
      ->capture_default_str();
  sub->add_option("--nproc", a->nproc, "Ranks that will share this host's cores (as `run --nproc`)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  sub->add_option("--base", a->base, "The profile whose other figures the result keeps")
      ->capture_default_str();
  sub->add_option("--name", a->name, "The result's profile name")->capture_default_str();
  sub->add_option("--stack", a->stack,
                  "shardfit: the engine's kernels and collectives; pytorch: also PyTorch's AdamW step, over "
                  "tensors and FSDP2's DTensors, and FSDP's hooks and ZeroRedundancyOptimizer's broadcasts on "
                  "max(--nproc, 2) ranks (needs the project's Python)")
      ->capture_default_str();
  sub->add_option("--out", a->out, "Where to write the profile JSON")->required()->check(Named);
  return {
      sub, [a] {
        if (a->device != "cpu")
          throw BadInput("--device " + a->device +
                         ": calibrate measures CPU ranks (cpu); a CUDA card's "
                         "figures come from scripts/gpu-check (reports/gpu/)");
        if (a->stack != "shardfit" && a->stack != "pytorch")
          throw BadInput("--stack " + a->stack + ": expected shardfit or pytorch");
        check_output_file("--out", a->out);  // before minutes of measuring, not after
        launch::CalibrateRequest request;
        request.nproc = a->nproc;
        request.base = a->base;
        request.name = a->name;
        request.profiles_dir = profiles_dir();
        request.pytorch = a->stack == "pytorch";
        const nlohmann::json p = launch::calibrate_cpu(
            request, [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
        write_output_file("--out", a->out, p.dump(2) + "\n");
        planner::load_profile(a->out, profiles_dir());  // what plan and run will read: it must load
        std::printf("wrote %s (profile %s)\n", a->out.c_str(), a->name.c_str());
        return kExitOk;
      }};
}

}  // namespace shardfit::cli
