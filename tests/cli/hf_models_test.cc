// Hugging Face models as they are: `--model DIR` reads DIR/config.json,
// `architectures` decides the head and an unknown one is refused,
// tie_word_embeddings is honoured both ways, memory-relevant keys shardfit
// does not build are refused naming the key, `shardfit models FILE|DIR`
// describes a config, and `run --export` writes config.json beside the
// safetensors file.
#include <nlohmann/json.hpp>

#include "tests/cli/cli_harness.h"

namespace shardfit::cli_test {
namespace {

using nlohmann::json;

// A model directory with `config` as its config.json.
std::string model_dir(const json& config) {
  const std::string dir = temp_path("model");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(2);
  return dir;
}

json describe(const std::string& dir) {
  const Result r = shardfit({"models", dir, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? json::parse(r.out) : json();
}

// openai-community/gpt2's config.json (abridged: the keys that matter).
json gpt2_small() {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"n_embd", 768},
          {"n_layer", 12},
          {"n_head", 12},
          {"n_positions", 1024},
          {"vocab_size", 50257},
          {"activation_function", "gelu_new"},
          {"use_cache", true},
          {"torch_dtype", "float32"}};
}

TEST(HfModels, ADirectoryIsReadThroughItsConfigJson) {
  const std::string dir = model_dir(gpt2_small());
  const json d = describe(dir);
  EXPECT_EQ(d["params"], 124439808);
  EXPECT_EQ(d["architecture"], "GPT2LMHeadModel");
  EXPECT_EQ(d["block_class"], "GPT2Block");
  EXPECT_TRUE(d["tie_word_embeddings"].get<bool>());
  const Result table = shardfit({"models", dir + "/config.json"});
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("124439808"), std::string::npos) << table.out;
  std::filesystem::remove_all(dir);
}

TEST(HfModels, TieWordEmbeddingsIsHonouredBothWays) {
  json untied = gpt2_small();
  untied["tie_word_embeddings"] = false;
  std::string dir = model_dir(untied);
  EXPECT_EQ(describe(dir)["params"], 163037184);  // Hugging Face: 163.0 M, lm_head of its own
  std::filesystem::remove_all(dir);
  json tied = gpt2_small();
  tied["tie_word_embeddings"] = true;
  dir = model_dir(tied);
  EXPECT_EQ(describe(dir)["params"], 124439808);
  std::filesystem::remove_all(dir);
}

TEST(HfModels, ArchitecturesDecideTheHeadAndUnknownOnesAreRefused) {
  json bert = {{"architectures", {"BertForSequenceClassification"}},
               {"model_type", "bert"},
               {"id2label", {{"0", "neg"}, {"1", "neutral"}, {"2", "pos"}}}};
  std::string dir = model_dir(bert);
  EXPECT_EQ(describe(dir)["num_labels"], 3);  // from id2label
  std::filesystem::remove_all(dir);

  bert["architectures"] = {"BertForTokenClassification"};
  dir = model_dir(bert);
  expect_bad_input({"models", dir}, "architectures 'BertForTokenClassification'");
  expect_bad_input({"plan", "--model", dir, "--device", "cpu"}, "BertForTokenClassification");
  std::filesystem::remove_all(dir);

  json gpt2 = gpt2_small();
  gpt2["architectures"] = {"BertForSequenceClassification"};  // another family's class
  dir = model_dir(gpt2);
  expect_bad_input({"models", dir}, "not supported for model_type gpt2");
  std::filesystem::remove_all(dir);
}

json bert_tiny(const std::string& architecture) {
  return {{"architectures", {architecture}},
          {"model_type", "bert"},
          {"hidden_size", 64},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"intermediate_size", 256},
          {"vocab_size", 512},
          {"max_position_embeddings", 128}};
}

TEST(HfModels, BertForMaskedLMHasTheVocabularyWideTiedHead) {
  // google-bert/bert-base-uncased as BertForMaskedLM: 109,514,298 parameters
  // in transformers (no pooler; cls.predictions transform + bias; decoder tied).
  std::string dir = model_dir({{"architectures", {"BertForMaskedLM"}}, {"model_type", "bert"}});
  json d = describe(dir);
  EXPECT_EQ(d["params"], 109514298);
  EXPECT_EQ(d["architecture"], "BertForMaskedLM");
  std::filesystem::remove_all(dir);
  dir = model_dir({{"architectures", {"BertForMaskedLM"}},
                   {"model_type", "bert"},
                   {"tie_word_embeddings", false}});
  EXPECT_EQ(describe(dir)["params"], 109514298 + 30522 * 768);
  std::filesystem::remove_all(dir);

  // It trains, and its memory (the [b, s, vocab] logits) is predicted to the byte.
  dir = model_dir(bert_tiny("BertForMaskedLM"));
  const std::string out = temp_path("mlm.json");
  const Result r = shardfit(
      {"run", "--model", dir, "--seq-len", "32", "--batch", "4", "--steps", "3", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json rep = json::parse(read_file(out));
  EXPECT_EQ(rep["model"]["params"], describe(dir)["params"]);
  EXPECT_EQ(rep["ranks"][0]["peak_error_pct"].get<double>(), 0.0) << rep["ranks"][0].dump();
  // Against the 2-label classifier of the same body, the MLM head's logits cost more.
  const std::string dir2 = model_dir(bert_tiny("BertForSequenceClassification"));
  const Result r2 = shardfit(
      {"run", "--model", dir2, "--seq-len", "32", "--batch", "4", "--steps", "3", "--out", out});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  const json rep2 = json::parse(read_file(out));
  EXPECT_GT(rep["ranks"][0]["measured"]["peak_allocated_bytes"].get<int64_t>(),
            rep2["ranks"][0]["measured"]["peak_allocated_bytes"].get<int64_t>());
  std::remove(out.c_str());
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir2);
}

TEST(HfModels, MemoryRelevantKeysNotBuiltAreRefusedNamingTheKey) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"model_type", "gpt2"}, {"add_cross_attention", true}}, "'add_cross_attention'"},
      {{{"model_type", "gpt2"}, {"reorder_and_upcast_attn", true}}, "'reorder_and_upcast_attn'"},
      {{{"model_type", "bert"}, {"position_embedding_type", "relative_key"}},
       "'position_embedding_type'"},
      {{{"model_type", "bert"}, {"num_labels", 5}, {"id2label", {{"0", "a"}, {"1", "b"}}}},
       "'num_labels'"},
      {{{"model_type", "gpt2"}, {"tie_word_embeddings", "no"}}, "'tie_word_embeddings'"},
  };
  for (const auto& [config, key] : cases) {
    const std::string dir = model_dir(config);
    expect_bad_input({"models", dir}, key);
    std::filesystem::remove_all(dir);
  }
  // Keys that do not change memory are accepted as they are.
  const std::string dir = model_dir({{"model_type", "bert"},
                                     {"position_embedding_type", "absolute"},
                                     {"use_cache", true},
                                     {"pad_token_id", 0}});
  EXPECT_EQ(describe(dir)["params"], 109483778);
  std::filesystem::remove_all(dir);
}

TEST(HfModels, ExportWritesConfigJsonBesideTheSafetensors) {
  const std::string dir = model_dir({{"architectures", {"GPT2LMHeadModel"}},
                                     {"model_type", "gpt2"},
                                     {"n_embd", 32},
                                     {"n_layer", 1},
                                     {"n_head", 2},
                                     {"vocab_size", 256},
                                     {"n_positions", 16},
                                     {"tie_word_embeddings", false}});
  const std::string out = temp_path("export");
  std::filesystem::create_directories(out);
  const Result r = shardfit({"run", "--model", dir, "--steps", "1", "--save", out + "/ckpt",
                             "--export", out + "/model.safetensors"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(std::filesystem::exists(out + "/model.safetensors"));
  const json config = json::parse(read_file(out + "/config.json"));
  EXPECT_EQ(config["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["n_embd"], 32);
  EXPECT_FALSE(config["tie_word_embeddings"].get<bool>());
  // The pair is a model directory shardfit (and transformers) reads back as the same model.
  const json again = describe(out);
  EXPECT_EQ(again["params"], describe(dir)["params"]);
  // The untied lm_head is in the file: its header names it.
  EXPECT_NE(read_file(out + "/model.safetensors").find("lm_head.weight"), std::string::npos);
  std::filesystem::remove_all(out);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardfit::cli_test
