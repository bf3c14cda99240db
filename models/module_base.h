// The seam between a model and whoever runs it.
//
// Every module of a shardfit model calls its own forward through
// ModuleBase::call. By default that just runs the forward. The planner's
// tracer and the executor install a ModuleRunner (thread-local) to see each
// module's forward begin and end, to put identity autograd nodes on its inputs
// and output (so backward begin/end are seen too, as FSDP's pre/post-backward
// hooks see them), and to checkpoint a module (recompute it in backward).
// The model itself stays single-device and knows nothing of sharding
// (torchtitan's rule: parallelism is applied from outside).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace shardfit::models {

class ModuleBase;

// A module's own forward over its explicit tensor inputs. Every tensor a
// module reads that can carry gradient must be in `inputs` (not captured), so
// that checkpointing can recompute the module from its inputs alone.
using ModuleFn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

class ModuleRunner {
 public:
  virtual ~ModuleRunner() = default;
  virtual torch::Tensor run(ModuleBase& module, const std::vector<torch::Tensor>& inputs,
                            const ModuleFn& fn) = 0;
};

// The runner active on this thread (nullptr: plain forward).
ModuleRunner* current_runner();

class ScopedModuleRunner {
 public:
  explicit ScopedModuleRunner(ModuleRunner* runner);
  ~ScopedModuleRunner();
  ScopedModuleRunner(const ScopedModuleRunner&) = delete;
  ScopedModuleRunner& operator=(const ScopedModuleRunner&) = delete;

 private:
  ModuleRunner* previous_;
};

class ModuleBase : public torch::nn::Module {
 public:
  explicit ModuleBase(std::string type_name, bool is_block = false)
      : torch::nn::Module(type_name), type_name_(std::move(type_name)), is_block_(is_block) {}

  const std::string& type_name() const { return type_name_; }
  bool is_block() const { return is_block_; }
  // Position in the model's pre-order module table and dotted path ("" for
  // the root); set by index_modules() once the model is built.
  int index() const { return index_; }
  const std::string& path() const { return path_; }
  // Full names of parameters this module uses but does not own (tied
  // weights), so wrap policies keep owner and user in one unit.
  virtual std::vector<std::string> borrowed_params() const { return {}; }

  torch::Tensor call(const std::vector<torch::Tensor>& inputs, const ModuleFn& fn) {
    ModuleRunner* runner = current_runner();
    return runner ? runner->run(*this, inputs, fn) : fn(inputs);
  }

 private:
  friend void index_modules(torch::nn::Module& root);
  std::string type_name_;
  bool is_block_;
  int index_ = -1;
  std::string path_;
};

// Gives every ModuleBase in the tree its index and path, in the order of
// torch::nn::Module::named_modules (pre-order, registration order).
void index_modules(torch::nn::Module& root);

// A container with no forward of its own (Hugging Face's nn.ModuleList).
class ModuleListImpl : public ModuleBase {
 public:
  ModuleListImpl() : ModuleBase("ModuleList") {}
};

}  // namespace shardfit::models
