// The models as a user checks them against Hugging Face: exact parameter
// counts, parameter names and shapes, a forward that gives a sensible loss,
// a model that can overfit one batch; config.json reading. The tracer the
// planner builds on is trace_test.cc, in the same test binary.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include "executor/adamw.h"
#include "executor/data.h"
#include "models/model.h"
#include "models/model_config.h"
#include "models/module_table.h"
#include "planner/trace.h"

namespace shardfit {
namespace {

using models::ModelConfig;

const torch::TensorOptions kMetaOpts = torch::TensorOptions().device(torch::kMeta);

std::map<std::string, std::vector<int64_t>> param_shapes(torch::nn::Module& m) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().sizes().vec();
  return out;
}

// A file in the temp directory, removed when the test ends.
class TempFile {
 public:
  TempFile(const std::string& stem, const std::string& text) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = (std::filesystem::temp_directory_path() /
             (std::string("shardfit_") + info->name() + "_" + std::to_string(::getpid()) + "_" +
              stem))
                .string();
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------- counts

struct ExpectedCount {
  const char* name;
  int64_t params;
};
// SPEC's numbers: sum of numel over Hugging Face's named_parameters() of
// GPT2LMHeadModel (tied lm_head once) / BertForSequenceClassification(2).
const ExpectedCount kExpectedCounts[] = {
    {"gpt2", 124439808},       {"gpt2-medium", 354823168}, {"gpt2-large", 774030080},
    {"gpt2-xl", 1557611200},   {"bert-base", 109483778},   {"bert-large", 335143938},
};

TEST(ModelsTest, ParamCountFromConfigIsExact) {
  for (const auto& e : kExpectedCounts)
    EXPECT_EQ(models::resolve_model(e.name).param_count(), e.params) << e.name;
}

TEST(ModelsTest, ParamCountOfBuiltModelIsExact) {
  // kMeta: no memory, no init, so even gpt2-xl builds instantly.
  for (const auto& e : kExpectedCounts) {
    auto model = models::build_model(models::resolve_model(e.name), kMetaOpts);
    EXPECT_EQ(models::count_parameters(*model), e.params) << e.name;
  }
}

TEST(ModelsTest, EveryBuiltinConfigAgreesWithItsModule) {
  ASSERT_EQ(models::builtin_models().size(), 17u);  // 8 gpt2/bert, 9 llama family
  for (const auto& c : models::builtin_models()) {
    auto model = models::build_model(c, kMetaOpts);
    EXPECT_EQ(models::count_parameters(*model), c.param_count()) << c.name;
  }
}

TEST(ModelsTest, UnknownBuiltinNameIsOneLineNamingIt) {
  try {
    models::resolve_model("gpt3");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("gpt3"), std::string::npos) << what;
    EXPECT_NE(what.find("gpt2-medium"), std::string::npos) << "lists the built-ins: " << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// ------------------------------------------------- Hugging Face names/shapes

TEST(ModelsTest, Gpt2NamesAndShapesMatchHuggingFace) {
  auto model = models::build_model(models::resolve_model("gpt2"), kMetaOpts);
  const auto shapes = param_shapes(*model);
  using S = std::vector<int64_t>;
  const std::map<std::string, S> expected = {
      {"transformer.wte.weight", S{50257, 768}},
      {"transformer.wpe.weight", S{1024, 768}},
      {"transformer.h.0.ln_1.weight", S{768}},
      {"transformer.h.0.ln_1.bias", S{768}},
      {"transformer.h.0.attn.c_attn.weight", S{768, 2304}},  // Conv1D: [in, out]
      {"transformer.h.0.attn.c_attn.bias", S{2304}},
      {"transformer.h.0.attn.c_proj.weight", S{768, 768}},
      {"transformer.h.0.attn.c_proj.bias", S{768}},
      {"transformer.h.0.ln_2.weight", S{768}},
      {"transformer.h.0.ln_2.bias", S{768}},
      {"transformer.h.0.mlp.c_fc.weight", S{768, 3072}},
      {"transformer.h.0.mlp.c_fc.bias", S{3072}},
      {"transformer.h.0.mlp.c_proj.weight", S{3072, 768}},
      {"transformer.h.0.mlp.c_proj.bias", S{768}},
      {"transformer.h.11.mlp.c_proj.bias", S{768}},
      {"transformer.ln_f.weight", S{768}},
      {"transformer.ln_f.bias", S{768}},
  };
  for (const auto& [name, shape] : expected) {
    auto it = shapes.find(name);
    ASSERT_NE(it, shapes.end()) << name;
    EXPECT_EQ(it->second, shape) << name;
  }
  // Hugging Face's named_parameters(): wte, wpe, 12 per block, ln_f (2).
  EXPECT_EQ(shapes.size(), 2u + 12u * 12u + 2u);
  // lm_head is tied to wte: a module with no parameter of its own.
  bool has_lm_head = false;
  for (const auto& m : model->named_modules()) has_lm_head |= m.key() == "lm_head";
  EXPECT_TRUE(has_lm_head);
  for (const auto& [name, shape] : shapes) EXPECT_NE(name.rfind("lm_head", 0), 0u) << name;
}

TEST(ModelsTest, TiedLmHeadSharesTheEmbeddingOnCpu) {
  // Tied means one tensor: a gradient through the logits lands in wte.
  auto model = models::build_model(models::resolve_model("gpt2-tiny"), {});
  models::Batch batch;
  batch.input_ids = torch::randint(0, 512, {1, 8}, torch::kLong);
  model->forward_loss(batch).backward();
  auto params = model->named_parameters();
  const auto& wte_grad = params["transformer.wte.weight"].grad();
  ASSERT_TRUE(wte_grad.defined());
  // Rows of tokens that never occur in the input get gradient only through
  // lm_head: nonzero means the output projection really uses wte.
  std::set<int64_t> used;
  for (int64_t i = 0; i < 8; ++i) used.insert(batch.input_ids[0][i].item<int64_t>());
  int64_t unused = 0;
  while (used.count(unused)) ++unused;
  EXPECT_GT(wte_grad[unused].abs().sum().item<double>(), 0.0);
}

TEST(ModelsTest, BertNamesAndShapesMatchHuggingFace) {
  auto model = models::build_model(models::resolve_model("bert-base"), kMetaOpts);
  const auto shapes = param_shapes(*model);
  using S = std::vector<int64_t>;
  const std::map<std::string, S> expected = {
      {"bert.embeddings.word_embeddings.weight", S{30522, 768}},
      {"bert.embeddings.position_embeddings.weight", S{512, 768}},
      {"bert.embeddings.token_type_embeddings.weight", S{2, 768}},
      {"bert.embeddings.LayerNorm.weight", S{768}},
      {"bert.embeddings.LayerNorm.bias", S{768}},
      {"bert.encoder.layer.0.attention.self.query.weight", S{768, 768}},  // Linear: [out, in]
      {"bert.encoder.layer.0.attention.self.query.bias", S{768}},
      {"bert.encoder.layer.0.attention.self.key.weight", S{768, 768}},
      {"bert.encoder.layer.0.attention.self.value.weight", S{768, 768}},
      {"bert.encoder.layer.0.attention.output.dense.weight", S{768, 768}},
      {"bert.encoder.layer.0.attention.output.LayerNorm.weight", S{768}},
      {"bert.encoder.layer.0.intermediate.dense.weight", S{3072, 768}},
      {"bert.encoder.layer.0.intermediate.dense.bias", S{3072}},
      {"bert.encoder.layer.0.output.dense.weight", S{768, 3072}},
      {"bert.encoder.layer.0.output.LayerNorm.bias", S{768}},
      {"bert.encoder.layer.11.output.LayerNorm.bias", S{768}},
      {"bert.pooler.dense.weight", S{768, 768}},
      {"bert.pooler.dense.bias", S{768}},
      {"classifier.weight", S{2, 768}},
      {"classifier.bias", S{2}},
  };
  for (const auto& [name, shape] : expected) {
    auto it = shapes.find(name);
    ASSERT_NE(it, shapes.end()) << name;
    EXPECT_EQ(it->second, shape) << name;
  }
  // Hugging Face: 5 embedding tensors, 16 per layer, pooler 2, classifier 2.
  EXPECT_EQ(shapes.size(), 5u + 16u * 12u + 2u + 2u);
}

// ------------------------------------------------------ forward and indices

TEST(ModelsTest, Gpt2TinyLossAtInitIsLogVocab) {
  const auto cfg = models::resolve_model("gpt2-tiny");
  torch::manual_seed(1);
  auto model = models::build_model(cfg, {});
  auto batch = executor::make_synthetic(cfg, 32, 7)->get(1, 0, 4);
  auto loss = model->forward_loss(batch);
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  const double l = loss.item<double>();
  ASSERT_TRUE(std::isfinite(l));
  // Init std 0.02 makes logits ~0: an untrained LM predicts uniformly, so
  // the loss is ln(vocab) = ln 512 = 6.238. 0.1 covers the small logits
  // that init leaves (observed within 0.01).
  EXPECT_NEAR(l, std::log(512.0), 0.1);
}

TEST(ModelsTest, BertTinyLossAtInitIsLogTwo) {
  const auto cfg = models::resolve_model("bert-tiny");
  torch::manual_seed(1);
  auto model = models::build_model(cfg, {});
  auto batch = executor::make_synthetic(cfg, 32, 7)->get(1, 0, 4);
  auto loss = model->forward_loss(batch);
  EXPECT_EQ(loss.dim(), 0);
  const double l = loss.item<double>();
  ASSERT_TRUE(std::isfinite(l));
  EXPECT_NEAR(l, std::log(2.0), 0.1);  // two labels, near-zero logits at init
}

TEST(ModelsTest, ForwardRunsOnMeta) {
  // The meta kernels LibTorch 1.13 lacks come from the planner (trace.h).
  planner::register_missing_meta_kernels();
  for (const char* name : {"gpt2-tiny", "bert-tiny"}) {
    const auto cfg = models::resolve_model(name);
    auto model = models::build_model(cfg, kMetaOpts);
    const auto ids = kMetaOpts.dtype(torch::kLong);
    models::Batch batch;
    batch.input_ids = torch::empty({3, 16}, ids);
    if (cfg.family == models::Family::kBert) {
      batch.token_type_ids = torch::empty({3, 16}, ids);
      batch.attention_mask = torch::empty({3, 16}, ids);
      batch.labels = torch::empty({3}, ids);
    }
    auto loss = model->forward_loss(batch);
    EXPECT_TRUE(loss.is_meta()) << name;
    EXPECT_EQ(loss.dim(), 0) << name;
    loss.backward();
    for (const auto& p : model->named_parameters())
      EXPECT_TRUE(p.value().grad().defined()) << name << " " << p.key();
  }
}

TEST(ModelsTest, IndexModulesFollowsNamedModulesOrder) {
  for (const char* name : {"gpt2-tiny", "bert-tiny"}) {
    auto model = models::build_model(models::resolve_model(name), kMetaOpts);
    int i = 0, blocks = 0;
    for (const auto& item : model->named_modules("", /*include_self=*/true)) {
      auto* base = dynamic_cast<models::ModuleBase*>(item.value().get());
      ASSERT_NE(base, nullptr) << name << " " << item.key() << " is not a ModuleBase";
      EXPECT_EQ(base->index(), i) << name << " " << item.key();
      EXPECT_EQ(base->path(), item.key());
      blocks += base->is_block();
      ++i;
    }
    EXPECT_EQ(blocks, 2) << name << ": one block per layer";
  }
}

// ---------------------------------------------------------------- overfit

// Trains on ONE fixed batch with dropout off; returns {first, last} loss.
std::pair<double, double> overfit(const char* name, int steps) {
  ModelConfig cfg = models::resolve_model(name);
  cfg.hidden_dropout = cfg.embd_dropout = cfg.attn_dropout = 0.0;
  torch::manual_seed(3);
  auto model = models::build_model(cfg, {});
  const auto batch = executor::make_synthetic(cfg, 32, 11)->get(1, 0, 8);
  executor::AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.0;
  executor::AdamW opt(model->parameters(), o);
  double first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    auto loss = model->forward_loss(batch);
    loss.backward();
    opt.step();
    (s == 0 ? first : last) = loss.item<double>();
  }
  return {first, last};
}

TEST(ModelsTest, Gpt2TinyOverfitsOneBatch) {
  // Measured over 4 init/data seeds: 6.25 at step 0, 1.12-1.16 at step 30,
  // 0.37-0.38 at step 40. The bar, 0.2 × initial = 1.25, is 3× above what 40
  // steps reach (room for other BLAS builds) and is not reached by a model
  // that does not learn (stays at ln 512 = 6.24).
  auto [first, last] = overfit("gpt2-tiny", 40);
  EXPECT_LT(last, 0.2 * first) << "first " << first << " last " << last;
}

TEST(ModelsTest, BertTinyOverfitsOneBatch) {
  // Eight labelled pairs. Measured over 4 seeds: 0.69 at step 0, 0.02-0.07
  // at step 15, 0.0008-0.0017 at step 30. 0.1 is far below chance (ln 2 =
  // 0.69) and 50× above what 30 steps reach.
  auto [first, last] = overfit("bert-tiny", 30);
  EXPECT_LT(last, 0.1) << "first " << first << " last " << last;
}

// -------------------------------------------------------------- config.json

ModelConfig resolve_text(const std::string& text, std::string* path_out = nullptr) {
  TempFile f("config.json", text);
  if (path_out) *path_out = f.path();
  return models::resolve_model(f.path());
}

// openai-community/gpt2's config.json, as on the hub.
const char* kGpt2ConfigJson = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
  "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
  "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
  "resid_pdrop": 0.1, "summary_activation": null, "vocab_size": 50257
})";

TEST(ConfigJsonTest, Gpt2ConfigResolves) {
  std::string path;
  const auto c = resolve_text(kGpt2ConfigJson, &path);
  EXPECT_EQ(c.family, models::Family::kGpt2);
  EXPECT_EQ(c.name, path);
  EXPECT_EQ(c.hidden, 768);
  EXPECT_EQ(c.layers, 12);
  EXPECT_EQ(c.heads, 12);
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_EQ(c.max_positions, 1024);
  EXPECT_EQ(c.intermediate, 3072);
  EXPECT_EQ(c.activation, "gelu_new");
  EXPECT_EQ(c.param_count(), 124439808);
}

TEST(ConfigJsonTest, SmallGpt2ConfigBuildsWithItsCount) {
  const auto c = resolve_text(
      R"({"model_type": "gpt2", "n_embd": 96, "n_layer": 3, "n_head": 6, "vocab_size": 1000,
          "n_positions": 64, "n_inner": 200, "resid_pdrop": 0.0})");
  EXPECT_EQ(c.intermediate, 200);
  EXPECT_EQ(c.hidden_dropout, 0.0);
  // wte + wpe + 3 blocks + ln_f, by hand.
  const int64_t h = 96, i = 200;
  const int64_t block = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h);
  EXPECT_EQ(c.param_count(), 1000 * h + 64 * h + 3 * block + 2 * h);
  auto model = models::build_model(c, kMetaOpts);
  EXPECT_EQ(models::count_parameters(*model), c.param_count());
}

TEST(ConfigJsonTest, BertConfigTakesNumLabelsFromId2Label) {
  const auto c = resolve_text(
      R"({"model_type": "bert", "hidden_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
          "max_position_embeddings": 64,
          "id2label": {"0": "neg", "1": "neutral", "2": "pos"}})");
  EXPECT_EQ(c.family, models::Family::kBert);
  EXPECT_EQ(c.num_labels, 3);
  EXPECT_EQ(c.hidden, 128);
  auto model = models::build_model(c, kMetaOpts);
  EXPECT_EQ(param_shapes(*model).at("classifier.weight"), (std::vector<int64_t>{3, 128}));
  EXPECT_EQ(models::count_parameters(*model), c.param_count());
}

// Each bad config.json: std::invalid_argument, one line, naming the file.
void expect_bad_config(const std::string& text, const std::string& must_mention) {
  std::string path;
  try {
    resolve_text(text, &path);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find(must_mention), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(ConfigJsonTest, BadConfigsAreOneLineNamingTheFile) {
  expect_bad_config(R"({"model_type": "gpt2", "n_embd": 768,)", "malformed JSON");
  expect_bad_config(R"({"n_embd": 768})", "model_type");
  expect_bad_config(R"({"model_type": "t5", "d_model": 512})", "t5");  // llama/mistral/qwen2 are built
  expect_bad_config(R"({"model_type": "gpt2", "n_embd": 100, "n_head": 12})", "divisible");
  expect_bad_config(R"({"model_type": "gpt2", "n_layer": 12.5})", "n_layer");
  expect_bad_config(R"({"model_type": "gpt2", "n_layer": "12"})", "n_layer");
  expect_bad_config(R"({"model_type": "bert", "num_hidden_layers": 0})", "num_hidden_layers");
  expect_bad_config(R"([1, 2])", "object");
}

TEST(ConfigJsonTest, MissingFileNamesIt) {
  const std::string path = "/nonexistent/dir/config.json";
  try {
    models::resolve_model(path);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardfit
