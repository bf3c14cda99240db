// Wrap policies on fake GPT-2 and BERT module trees with Hugging Face names
// and shapes. Unit counts are worked out by hand below from the per-module
// parameter counts (H = 768):
//   GPT-2 block: ln_1 1,536 | attn.c_attn 1,771,776 | attn.c_proj 590,592 |
//     ln_2 1,536 | mlp.c_fc 2,362,368 | mlp.c_proj 2,360,064 (= 7,087,872);
//     wte 38,597,376, wpe 786,432, ln_f 1,536.
//   BERT layer: query/key/value/attention.output.dense 590,592 each |
//     attention.output.LayerNorm 1,536 | intermediate.dense 2,362,368 |
//     output.dense 2,360,064 | output.LayerNorm 1,536 (= 7,087,872);
//     word_embeddings 23,440,896, position 393,216, token_type 1,536,
//     embeddings.LayerNorm 1,536, pooler.dense 590,592, classifier 1,538.
#include "spec/wrap_policy.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace shardfit::spec {
namespace {

class TreeBuilder {
 public:
  explicit TreeBuilder(const std::string& root_type) {
    modules_.emplace_back();
    modules_[0].type = root_type;
  }
  // Adds `name` under `parent` and returns its index.
  int add(int parent, const std::string& name, const std::string& type, bool is_block = false) {
    ModuleNode m;
    m.path = modules_[parent].path.empty() ? name : modules_[parent].path + "." + name;
    m.type = type;
    m.parent = parent;
    m.is_block = is_block;
    modules_.push_back(std::move(m));
    const int index = static_cast<int>(modules_.size() - 1);
    modules_[parent].children.push_back(index);
    return index;
  }
  void param(int module, const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    modules_[module].params.push_back(
        ParamInfo{modules_[module].path + "." + name, std::move(shape), n});
  }
  int linear(int parent, const std::string& name, int64_t in, int64_t out,
             const std::string& type = "Linear") {
    const int m = add(parent, name, type);
    // nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out].
    param(m, "weight",
          type == "Conv1D" ? std::vector<int64_t>{in, out} : std::vector<int64_t>{out, in});
    param(m, "bias", {out});
    return m;
  }
  int layer_norm(int parent, const std::string& name, int64_t h) {
    const int m = add(parent, name, "LayerNorm");
    param(m, "weight", {h});
    param(m, "bias", {h});
    return m;
  }
  std::vector<ModuleNode> modules() const { return modules_; }

 private:
  std::vector<ModuleNode> modules_;
};

std::vector<ModuleNode> gpt2_modules(int layers, int64_t h, int64_t vocab = 50257,
                                     int64_t positions = 1024) {
  TreeBuilder b("GPT2LMHeadModel");
  const int transformer = b.add(0, "transformer", "GPT2Model");
  b.param(b.add(transformer, "wte", "Embedding"), "weight", {vocab, h});
  b.param(b.add(transformer, "wpe", "Embedding"), "weight", {positions, h});
  const int list = b.add(transformer, "h", "ModuleList");
  for (int i = 0; i < layers; ++i) {
    const int block = b.add(list, std::to_string(i), "GPT2Block", /*is_block=*/true);
    b.layer_norm(block, "ln_1", h);
    const int attn = b.add(block, "attn", "GPT2Attention");
    b.linear(attn, "c_attn", h, 3 * h, "Conv1D");
    b.linear(attn, "c_proj", h, h, "Conv1D");
    b.layer_norm(block, "ln_2", h);
    const int mlp = b.add(block, "mlp", "GPT2MLP");
    b.linear(mlp, "c_fc", h, 4 * h, "Conv1D");
    b.linear(mlp, "c_proj", 4 * h, h, "Conv1D");
  }
  b.layer_norm(transformer, "ln_f", h);
  b.add(0, "lm_head", "Linear");  // weight tied to wte: listed there only
  return b.modules();
}

std::vector<ModuleNode> bert_modules(int layers, int64_t h, int64_t inter, int64_t vocab = 30522) {
  TreeBuilder b("BertForSequenceClassification");
  const int bert = b.add(0, "bert", "BertModel");
  const int emb = b.add(bert, "embeddings", "BertEmbeddings");
  b.param(b.add(emb, "word_embeddings", "Embedding"), "weight", {vocab, h});
  b.param(b.add(emb, "position_embeddings", "Embedding"), "weight", {512, h});
  b.param(b.add(emb, "token_type_embeddings", "Embedding"), "weight", {2, h});
  b.layer_norm(emb, "LayerNorm", h);
  const int encoder = b.add(bert, "encoder", "BertEncoder");
  const int list = b.add(encoder, "layer", "ModuleList");
  for (int i = 0; i < layers; ++i) {
    const int layer = b.add(list, std::to_string(i), "BertLayer", /*is_block=*/true);
    const int attention = b.add(layer, "attention", "BertAttention");
    const int self = b.add(attention, "self", "BertSelfAttention");
    for (const char* name : {"query", "key", "value"}) b.linear(self, name, h, h);
    const int self_out = b.add(attention, "output", "BertSelfOutput");
    b.linear(self_out, "dense", h, h);
    b.layer_norm(self_out, "LayerNorm", h);
    b.linear(b.add(layer, "intermediate", "BertIntermediate"), "dense", h, inter);
    const int out = b.add(layer, "output", "BertOutput");
    b.linear(out, "dense", inter, h);
    b.layer_norm(out, "LayerNorm", h);
  }
  b.linear(b.add(bert, "pooler", "BertPooler"), "dense", h, h);
  b.linear(0, "classifier", h, 2);
  return b.modules();
}

int64_t total_numel(const UnitPartition& p) {
  int64_t n = 0;
  for (const Unit& u : p.units) n += u.numel;
  return n;
}

const Unit* find_unit(const UnitPartition& p, const std::string& name) {
  for (const Unit& u : p.units) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

int module_index(const std::vector<ModuleNode>& modules, const std::string& path) {
  for (size_t i = 0; i < modules.size(); ++i) {
    if (modules[i].path == path) return static_cast<int>(i);
  }
  return -1;
}

UnitPartition wrap(const std::vector<ModuleNode>& modules, const std::string& policy) {
  return wrap_modules(modules, WrapPolicy::parse(policy));
}

TEST(WrapPolicyTest, ParsesPoliciesAndNamesBadText) {
  EXPECT_EQ(WrapPolicy::parse("none").kind, WrapPolicy::Kind::kNone);
  EXPECT_EQ(WrapPolicy::parse("block").kind, WrapPolicy::Kind::kBlock);
  const WrapPolicy size = WrapPolicy::parse("size:2000");
  EXPECT_EQ(size.kind, WrapPolicy::Kind::kSize);
  EXPECT_EQ(size.min_num_params, 2000);
  EXPECT_EQ(size.to_string(), "size:2000");
  for (const char* bad :
       {"", "blocks", "Size:10", "size:", "size:abc", "size:-5", "size:0", "size:10x"}) {
    SCOPED_TRACE(bad);
    try {
      WrapPolicy::parse(bad);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(WrapPolicyTest, ModuleTreeIsABoostGraphInRegistrationOrder) {
  const auto modules = gpt2_modules(2, 8, 16, 4);
  const ModuleTree tree = build_module_tree(modules);
  EXPECT_EQ(boost::num_vertices(tree), modules.size());
  EXPECT_EQ(boost::num_edges(tree), modules.size() - 1);
  auto [e, end] = boost::out_edges(0, tree);
  ASSERT_NE(e, end);
  EXPECT_EQ(modules[boost::target(*e, tree)].path, "transformer");
  EXPECT_EQ(modules[boost::target(*++e, tree)].path, "lm_head");

  auto broken = modules;
  broken[2].parent = 0;  // wte claims the root as parent, transformer lists it
  EXPECT_THROW(build_module_tree(broken), std::invalid_argument);
  EXPECT_THROW(build_module_tree({}), std::invalid_argument);
}

TEST(WrapPolicyTest, Gpt2UnitCounts) {
  const auto modules = gpt2_modules(12, 768);
  int64_t params = 0;
  for (const auto& m : modules)
    for (const auto& p : m.params) params += p.numel;
  ASSERT_EQ(params, 124439808);

  // none: the root holds everything.
  EXPECT_EQ(wrap(modules, "none").units.size(), 1u);
  // block: 12 GPT2Blocks + the root (wte, wpe, ln_f).
  EXPECT_EQ(wrap(modules, "block").units.size(), 13u);

  // size:2000: wte, wpe, and in each block c_attn, attn.c_proj, c_fc,
  // mlp.c_proj (all >= 2000) are units; attn and mlp are then left with 0;
  // the block has ln_1 + ln_2 = 3,072 >= 2000 unwrapped, so it is a unit too:
  // 5 per block. transformer.h is a ModuleList (never wrapped, and holds 0);
  // transformer has only ln_f (1,536) left: not wrapped; lm_head has none.
  // 2 + 12 * 5 + root = 63, the root holding ln_f.
  const UnitPartition s2k = wrap(modules, "size:2000");
  EXPECT_EQ(s2k.units.size(), 63u);
  EXPECT_EQ(s2k.units[0].name, "root");
  EXPECT_EQ(s2k.units[0].numel, 1536);
  EXPECT_EQ(total_numel(s2k), 124439808);
  const Unit* block0 = find_unit(s2k, "transformer.h.0");
  ASSERT_NE(block0, nullptr);
  EXPECT_EQ(block0->numel, 3072);
  ASSERT_EQ(block0->params.size(), 4u);  // flattening order: ln_1 then ln_2
  EXPECT_EQ(block0->params[0].name, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(block0->params[3].name, "transformer.h.0.ln_2.bias");
  EXPECT_EQ(s2k.module_unit[module_index(modules, "transformer.h.0.attn")],
            s2k.module_unit[module_index(modules, "transformer.h.0")]);

  // size:1000000: wte (38.6M) is a unit, wpe (786,432) is not. In each block
  // c_attn (1.77M), c_fc (2.36M), mlp.c_proj (2.36M) are units; attn.c_proj
  // (590,592) is not, so attn keeps 590,592 and the block 1,536 + 590,592 +
  // 1,536 = 593,664 < 1M: not a unit. transformer.h is a ModuleList (12 *
  // 593,664 unwrapped, skipped); transformer then has wpe + h + ln_f =
  // 786,432 + 7,123,968 + 1,536 = 7,911,936 >= 1M: a unit. The root is left
  // with nothing. 1 + 12 * 3 + 1 + root = 39.
  const UnitPartition s1m = wrap(modules, "size:1000000");
  EXPECT_EQ(s1m.units.size(), 39u);
  EXPECT_EQ(s1m.units[0].numel, 0);
  const Unit* transformer = find_unit(s1m, "transformer");
  ASSERT_NE(transformer, nullptr);
  EXPECT_EQ(transformer->numel, 7911936);
  EXPECT_EQ(transformer->params.front().name, "transformer.wpe.weight");
  EXPECT_EQ(transformer->params.back().name, "transformer.ln_f.bias");
  EXPECT_NE(find_unit(s1m, "transformer.h.11.attn.c_attn"), nullptr);
  EXPECT_EQ(find_unit(s1m, "transformer.h.11.attn.c_proj"), nullptr);
  EXPECT_EQ(total_numel(s1m), 124439808);

  for (const char* policy : {"none", "block"})
    EXPECT_EQ(total_numel(wrap(modules, policy)), 124439808);
}

TEST(WrapPolicyTest, BertBaseUnitCounts) {
  const auto modules = bert_modules(12, 768, 3072);
  EXPECT_EQ(wrap(modules, "none").units.size(), 1u);
  // block: 12 BertLayers + the root.
  EXPECT_EQ(wrap(modules, "block").units.size(), 13u);

  // size:2000: word and position embeddings are units; embeddings keeps
  // token_type + LayerNorm = 3,072 >= 2000: a unit. Per layer: query, key,
  // value, attention.output.dense, intermediate.dense, output.dense are units;
  // the two LayerNorms (1,536 each) stay below 2000 in their parents, and
  // reach the BertLayer as 3,072: a unit. 7 per layer. pooler.dense is a
  // unit; the classifier (1,538) stays in the root. 3 + 84 + 1 + root = 89.
  const UnitPartition s2k = wrap(modules, "size:2000");
  EXPECT_EQ(s2k.units.size(), 89u);
  EXPECT_EQ(s2k.units[0].numel, 1538);
  EXPECT_EQ(total_numel(s2k), 109483778);

  // size:1000000: word_embeddings (23.4M) is a unit; embeddings keeps
  // 396,288. Per layer: attention.self (q+k+v = 1,771,776), intermediate.dense
  // and output.dense are units; the layer keeps 592,128 + 1,536 = 593,664.
  // encoder.layer is a ModuleList; encoder (12 * 593,664) is a unit. bert
  // keeps 396,288 + 590,592 (pooler) = 986,880 < 1M: not a unit; the root
  // holds that plus the classifier: 988,418. 1 + 36 + 1 + root = 39.
  const UnitPartition s1m = wrap(modules, "size:1000000");
  EXPECT_EQ(s1m.units.size(), 39u);
  EXPECT_EQ(s1m.units[0].numel, 988418);
  ASSERT_NE(find_unit(s1m, "bert.encoder"), nullptr);
  EXPECT_EQ(find_unit(s1m, "bert.encoder")->numel, 12 * 593664);
  EXPECT_NE(find_unit(s1m, "bert.encoder.layer.0.attention.self"), nullptr);
  EXPECT_EQ(total_numel(s1m), 109483778);

  for (const char* policy : {"none", "block"})
    EXPECT_EQ(total_numel(wrap(modules, policy)), 109483778);
}

TEST(WrapPolicyTest, ThresholdIsInclusiveAsInFsdp) {
  // transformer.h.0 under size:3072 has exactly 3,072 unwrapped (ln_1 + ln_2
  // once everything else is wrapped): FSDP's >= wraps it.
  const auto modules = gpt2_modules(1, 768);
  EXPECT_NE(find_unit(wrap(modules, "size:3072"), "transformer.h.0"), nullptr);
  EXPECT_EQ(find_unit(wrap(modules, "size:3073"), "transformer.h.0"), nullptr);
}

TEST(WrapPolicyTest, UnitsAreInPreOrderAndOwnTheirSubtrees) {
  const auto modules = gpt2_modules(2, 8, 16, 4);
  const UnitPartition p = wrap(modules, "block");
  ASSERT_EQ(p.units.size(), 3u);
  EXPECT_EQ(p.units[0].name, "root");
  EXPECT_EQ(p.units[1].name, "transformer.h.0");
  EXPECT_EQ(p.units[2].name, "transformer.h.1");
  // The root owns everything outside the blocks, wte first.
  EXPECT_EQ(p.units[0].params.front().name, "transformer.wte.weight");
  EXPECT_EQ(p.module_unit[module_index(modules, "lm_head")], 0);
  EXPECT_EQ(p.module_unit[module_index(modules, "transformer.h.1.mlp.c_fc")], 2);
  for (int m : p.units[1].modules) EXPECT_EQ(p.module_unit[m], 1);
}

}  // namespace
}  // namespace shardfit::spec

namespace shardfit::spec {
namespace {

// PyTorch FSDP (1.12/1.13) on Hugging Face's GPT-2 Large (H = 1280, 36
// layers), lm_head borrowing transformer.wte.weight: _recursive_wrap counts
// and flattens each registration, so lm_head (64,328,960 >= min) becomes a
// unit with its own copy of the weight; size_based_auto_wrap_policy at
// 1,000,000 wraps wte, wpe, lm_head and each block's four Conv1Ds (the
// LayerNorms, 2,560 each, stay with the root); at 2,000 every LayerNorm too.
TEST(WrapPolicyTied, FsdpCopiesATiedWeightIntoEachUnitThatRegistersIt) {
  std::vector<ModuleNode> m = gpt2_modules(36, 1280);
  const int lm_head = module_index(m, "lm_head");
  m[lm_head].borrowed_params = {"transformer.wte.weight"};
  const int64_t params = 774030080, wte = 50257LL * 1280;

  const UnitPartition fsdp = wrap_modules(m, WrapPolicy::parse("size:1000000"), TiedParams::kCopiedPerUnit);
  EXPECT_EQ(fsdp.units.size(), 1u + 2 + 36 * 4 + 1);  // root, wte, wpe, the Conv1Ds, lm_head
  ASSERT_NE(find_unit(fsdp, "lm_head"), nullptr);
  EXPECT_EQ(find_unit(fsdp, "lm_head")->numel, wte);
  EXPECT_EQ(find_unit(fsdp, "transformer.wte")->numel, wte);
  EXPECT_EQ(find_unit(fsdp, "root")->numel, 36 * 2 * 2560 + 2560);  // the LayerNorms
  EXPECT_EQ(total_numel(fsdp), params + wte);

  const UnitPartition small = wrap_modules(m, WrapPolicy::parse("size:2000"), TiedParams::kCopiedPerUnit);
  EXPECT_EQ(small.units.size(), 1u + 2 + 36 * 6 + 1 + 1);  // + every ln_1, ln_2 and ln_f
  EXPECT_EQ(find_unit(small, "root")->numel, 0);
  EXPECT_EQ(total_numel(small), params + wte);

  // shardfit's engine keeps the tie: lm_head, wte and everything between
  // them in the root, each parameter once.
  const UnitPartition kept = wrap_modules(m, WrapPolicy::parse("size:1000000"));
  EXPECT_EQ(find_unit(kept, "lm_head"), nullptr);
  EXPECT_EQ(find_unit(kept, "transformer.wte"), nullptr);
  EXPECT_EQ(total_numel(kept), params);
}

// Within one unit a tied weight is flattened once.
TEST(WrapPolicyTied, ATieInsideOneUnitIsFlattenedOnce) {
  std::vector<ModuleNode> m = gpt2_modules(2, 64, 512, 64);
  m[module_index(m, "lm_head")].borrowed_params = {"transformer.wte.weight"};
  const UnitPartition p = wrap_modules(m, WrapPolicy::parse("size:100000000"), TiedParams::kCopiedPerUnit);
  ASSERT_EQ(p.units.size(), 1u);
  int64_t owned = 0;
  for (const auto& x : m)
    for (const auto& q : x.params) owned += q.numel;
  EXPECT_EQ(p.units[0].numel, owned);
}

}  // namespace
}  // namespace shardfit::spec
