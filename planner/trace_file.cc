#include "planner/trace_file.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "spec/json_fields.h"

namespace shardfit::planner {
namespace {

using nlohmann::json;
using spec::FieldReader;

const char* kKinds[] = {"alloc", "free", "begin", "end"};
const char* kPhases[] = {"forward", "backward", "recompute"};

template <size_t N>
int index_of(const char* const (&names)[N], const std::string& s) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<int>(i);
  return -1;
}

json module_to_json(const ModuleNode& m) {
  json params = json::array();
  for (const auto& p : m.params) params.push_back({{"name", p.name}, {"shape", p.shape}, {"numel", p.numel}});
  json out = {{"path", m.path},   {"type", m.type},         {"parent", m.parent}, {"children", m.children},
              {"params", params}, {"is_block", m.is_block}, {"borrowed_params", m.borrowed_params}};
  if (!m.buffers.empty()) {
    json buffers = json::array();
    for (const auto& b : m.buffers)
      buffers.push_back({{"name", b.name}, {"shape", b.shape}, {"dtype", b.dtype}, {"bytes", b.bytes}});
    out["buffers"] = buffers;
  }
  return out;
}

// numel of `shape`, or -1 past int64.
int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t product = 1;
  for (int64_t d : shape) product = d == 0 ? 0 : (product < 0 || product > INT64_MAX / d ? -1 : product * d);
  return product;
}

std::vector<std::string> strings(const FieldReader& r, const std::string& key) {
  const json& v = r.need(key);
  if (!v.is_array()) r.fail(key, "must be a list");
  std::vector<std::string> out;
  for (const auto& e : v) {
    if (!e.is_string()) r.fail(key, "must be a list of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::vector<int64_t> integers(const FieldReader& r, const std::string& key, int64_t min_value) {
  const json& v = r.need(key);
  if (!v.is_array()) r.fail(key, "must be a list");
  std::vector<int64_t> out;
  for (const auto& e : v) {
    if (!e.is_number_integer() || e.get<int64_t>() < min_value)
      r.fail(key, "must be a list of whole numbers >= " + std::to_string(min_value));
    out.push_back(e.get<int64_t>());
  }
  return out;
}

// Calls `f` with a reader of each entry of the list at `key` (one line naming
// the field when it is not a list).
template <typename F>
void for_each_entry(const FieldReader& r, const std::string& key, const std::string& origin, F f) {
  const json& list = r.need(key);
  if (!list.is_array()) r.fail(key, "must be a list");
  for (size_t j = 0; j < list.size(); ++j) f(FieldReader(list[j], r.field(key) + "[" + std::to_string(j) + "]", origin));
}

std::vector<ModuleNode> modules_from(const json& list, const std::string& path, const std::string& origin) {
  if (!list.is_array() || list.empty())
    throw std::invalid_argument(origin + ": field '" + path + "' must be a non-empty list");
  std::vector<ModuleNode> out;
  const int64_t n = static_cast<int64_t>(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    FieldReader r(list[i], path + "[" + std::to_string(i) + "]", origin);
    ModuleNode m;
    m.path = r.text("path");
    m.type = r.text("type");
    const json& parent = r.need("parent");
    if (!parent.is_number_integer() || parent.get<int64_t>() < -1 || parent.get<int64_t>() >= n ||
        (i == 0) != (parent.get<int64_t>() == -1))
      r.fail("parent", "must be -1 for the first module (the root) and another module's index for the rest");
    m.parent = parent.get<int>();
    for (int64_t c : integers(r, "children", 1)) {
      if (c >= n) r.fail("children", "names module " + std::to_string(c) + " of " + std::to_string(n));
      m.children.push_back(static_cast<int>(c));
    }
    for_each_entry(r, "params", origin, [&](const FieldReader& pr) {
      ParamInfo p;
      p.name = pr.text("name");
      p.shape = integers(pr, "shape", 0);
      p.numel = pr.integer("numel", 0);
      if (shape_numel(p.shape) != p.numel) pr.fail("numel", "is not the product of its shape");
      m.params.push_back(std::move(p));
    });
    if (r.has("buffers")) {
      for_each_entry(r, "buffers", origin, [&](const FieldReader& br) {
        BufferInfo b;
        b.name = br.text("name");
        b.shape = integers(br, "shape", 0);
        b.dtype = br.text("dtype");
        const int64_t size = spec::dtype_element_size(b.dtype);
        if (size == 0) br.fail("dtype", "'" + b.dtype + "' is not a dtype shardfit knows (float32, uint8, ...)");
        b.bytes = br.integer("bytes", 0);
        const int64_t numel = shape_numel(b.shape);
        if (numel < 0 || numel > INT64_MAX / size || numel * size != b.bytes)
          br.fail("bytes", "is not its shape's elements times the dtype's size");
        m.buffers.push_back(std::move(b));
      });
    }
    m.is_block = r.boolean("is_block");
    if (r.has("borrowed_params")) m.borrowed_params = strings(r, "borrowed_params");
    // A tied parameter is owned by the module that registered it first, so
    // its owner comes earlier; a name no earlier module owns would tie nothing.
    for (const std::string& name : m.borrowed_params)
      if (!spec::param_owner(out, name).param)
        r.fail("borrowed_params", "names '" + name + "', which no earlier module owns");
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

const char* dtype_name(DType d) { return d == DType::kF32 ? "fp32" : d == DType::kF16 ? "fp16" : "bf16"; }

std::vector<int64_t> TraceFile::param_numels() const {
  std::vector<int64_t> out;
  for (const auto& m : modules)
    for (const auto& p : m.params) out.push_back(p.numel);
  return out;
}

std::string TraceFile::block_class() const {
  for (const auto& m : modules)
    if (m.is_block) return m.type;
  return "";
}

std::vector<BufferInfo> TraceFile::buffers() const {
  std::vector<BufferInfo> out;
  for (const auto& m : modules) out.insert(out.end(), m.buffers.begin(), m.buffers.end());
  return out;
}

int64_t TraceFile::param_count() const {
  int64_t n = 0;
  for (const auto& m : modules)
    for (const auto& p : m.params) n += p.numel;
  return n;
}

const ModelTrace* TraceFile::find(DType dtype, const std::vector<int>& recompute, int64_t batch,
                                  bool grads_at_start, bool reentrant, bool autocast) const {
  std::vector<int> want = recompute;
  std::sort(want.begin(), want.end());
  for (const auto& t : traces)
    if (t.compute_dtype == dtype && t.batch == batch && t.recompute_modules == want &&
        t.grads_at_start == grads_at_start && t.recompute_reentrant == (reentrant && !want.empty()) &&
        t.autocast == autocast)
      return &t;
  return nullptr;
}

std::vector<std::vector<int>> TraceFile::recompute_sets() const {
  std::set<std::vector<int>> sets;
  for (const auto& t : traces) sets.insert(t.recompute_modules);
  return {sets.begin(), sets.end()};
}

std::vector<DType> TraceFile::dtypes() const {
  std::set<DType> set;
  for (const auto& t : traces)
    if (!t.autocast) set.insert(t.compute_dtype);
  return {set.begin(), set.end()};
}

namespace {

json events_to_json(const ModelTrace& t) {
  json events = json::array();
  for (const auto& e : t.events)
    events.push_back({kKinds[e.kind], kPhases[static_cast<int>(e.phase)], e.module, e.tensor, e.bytes, e.op});
  return events;
}

// A trace's events: [kind, phase, module, tensor, bytes, op], each checked
// (modules and ops the file has, storages allocated once and freed live).
void events_from(const FieldReader& r, size_t modules, ModelTrace* t) {
  const json& events = r.need("events");
  if (!events.is_array()) r.fail("events", "must be a list");
  std::unordered_set<int64_t> live;
  for (size_t k = 0; k < events.size(); ++k) {
    const json& e = events[k];
    auto bad = [&](const std::string& what) { r.fail_at(r.field("events") + "[" + std::to_string(k) + "]", what); };
    if (!e.is_array() || e.size() != 6 || !e[0].is_string() || !e[1].is_string())
      bad("must be [kind, phase, module, tensor, bytes, op]");
    for (size_t x = 2; x < 6; ++x)
      if (!e[x].is_number_integer()) bad("must be [kind, phase, module, tensor, bytes, op] with whole numbers");
    MemEvent ev;
    const int kind = index_of(kKinds, e[0].get<std::string>());
    const int phase = index_of(kPhases, e[1].get<std::string>());
    if (kind < 0) bad("kind must be alloc, free, begin or end");
    if (phase < 0) bad("phase must be forward, backward or recompute");
    ev.kind = static_cast<MemEvent::Kind>(kind);
    ev.phase = static_cast<Phase>(phase);
    const int64_t module = e[2].get<int64_t>(), op = e[5].get<int64_t>();
    if (module < 0 || module >= static_cast<int64_t>(modules)) bad("names a module the file lacks");
    if (op < -1 || op >= static_cast<int64_t>(t->op_names.size())) bad("names an op the trace lacks");
    ev.module = static_cast<int>(module);
    ev.op = static_cast<int>(op);
    ev.tensor = e[3].get<int64_t>();
    ev.bytes = e[4].get<int64_t>();
    if (ev.kind == MemEvent::kAlloc) {
      if (ev.bytes < 0) bad("allocates a negative size");
      // 1 TiB: more than any tensor of a traced batch of 1 or 2; a larger
      // size would only overflow once the planner scales it with the batch.
      if (ev.bytes > (int64_t{1} << 40)) bad("allocates " + std::to_string(ev.bytes) + " bytes, above 2^40 (1 TiB)");
      if (!live.insert(ev.tensor).second) bad("allocates storage " + std::to_string(ev.tensor) + " twice");
    } else if (ev.kind == MemEvent::kFree) {
      if (live.erase(ev.tensor) == 0) bad("frees storage " + std::to_string(ev.tensor) + ", which is not live");
    }
    t->events.push_back(ev);
  }
}

json work_to_json(const PhaseWork& w) {
  json gemms = json::array(), kernels = json::array();
  for (const auto& g : w.gemms) gemms.push_back({g.count, g.m, g.n, g.k});
  for (const auto& k : w.kernels) kernels.push_back({k.op, k.calls, k.bytes});
  return {{"gemms", gemms}, {"kernels", kernels}, {"nodes", w.nodes}};
}

// [[a, b, ...], ...]: each entry a list of `width`, checked by `ok`.
template <typename Ok>
const json& rows(const FieldReader& r, const std::string& key, size_t width, const std::string& what, Ok ok) {
  const json& v = r.need(key);
  if (!v.is_array()) r.fail(key, "must be a list of " + what);
  for (const auto& row : v)
    if (!row.is_array() || row.size() != width || !ok(row)) r.fail(key, "must be a list of " + what);
  return v;
}

// One phase's "work" (optional: files written before the field have none,
// and the time model then counts FLOPs alone).
PhaseWork work_from(const FieldReader& r) {
  PhaseWork w;
  w.nodes = r.integer("nodes", 0);
  auto whole = [](const json& d) { return d.is_number_integer() && d.get<int64_t>() >= 0; };
  for (const auto& g : rows(r, "gemms", 4, "[count, m, n, k] of whole numbers >= 0", [&](const json& row) {
         return whole(row[0]) && whole(row[1]) && whole(row[2]) && whole(row[3]);
       }))
    w.gemms.push_back({g[0].get<int64_t>(), g[1].get<int64_t>(), g[2].get<int64_t>(), g[3].get<int64_t>()});
  for (const auto& k : rows(r, "kernels", 3, "[op, calls, bytes]", [&](const json& row) {
         return row[0].is_string() && whole(row[1]) && row[2].is_number() && row[2].get<double>() >= 0;
       })) {
    if (!w.kernels.empty() && k[0].get<std::string>() <= w.kernels.back().op)
      r.fail("kernels", "must be sorted by op, each op once");
    w.kernels.push_back({k[0].get<std::string>(), k[1].get<int64_t>(), k[2].get<double>()});
  }
  return w;
}

}  // namespace

std::string trace_file_json(const TraceFile& f) {
  json modules = json::array();
  for (const auto& m : f.modules) modules.push_back(module_to_json(m));
  json traces = json::array();
  for (const auto& t : f.traces) {
    traces.push_back({{"batch", t.batch},
                      {"dtype", dtype_name(t.compute_dtype)},
                      {"recompute", t.recompute_modules},
                      {"grads", t.grads_at_start ? "accumulate" : "none"},
                      {"forward_flops", t.forward_flops},
                      {"backward_flops", t.backward_flops},
                      {"op_names", t.op_names},
                      {"events", events_to_json(t)}});
    if (!t.kept_outputs.empty()) traces.back()["kept_outputs"] = t.kept_outputs;
    if (!t.output_tensor_bytes.empty()) traces.back()["output_tensors"] = t.output_tensor_bytes;
    if (t.recompute_reentrant) traces.back()["checkpoint"] = "reentrant";
    if (t.autocast) traces.back()["autocast"] = true;
    if (!t.forward_work.empty() || !t.backward_work.empty())
      traces.back()["work"] = {{"forward", work_to_json(t.forward_work)},
                               {"backward", work_to_json(t.backward_work)}};
  }
  json out = {{"schema", kTraceSchema},
              {"model", {{"name", f.model_name}, {"factory", f.factory}, {"input", f.input},
                         {"params", f.param_count()}}},
              {"seq_len", f.seq_len},
              {"target", f.target_cuda ? "cuda" : "cpu"},
              {"modules", modules},
              {"traces", traces}};
  if (!f.torch_version.empty()) out["torch"] = f.torch_version;
  if (f.block_input_casts >= 0) out["block_input_casts"] = f.block_input_casts;
  if (!f.optimizer_steps.empty()) {
    // One optimizer trace: its op names and events.
    auto step_json = [](const ModelTrace& t) { return json{{"op_names", t.op_names}, {"events", events_to_json(t)}}; };
    auto steps_json = [&](auto first, auto last) {
      json steps = json::array();
      for (auto it = first; it != last; ++it) steps.push_back(step_json(*it));
      return steps;
    };
    out["optimizer"] = {{"name", f.optimizer},
                        {"steps", steps_json(f.optimizer_steps.begin(), f.optimizer_steps.end())}};
    if (!f.optimizer_zero_grad.events.empty()) out["optimizer"]["zero_grad"] = step_json(f.optimizer_zero_grad);
    if (!f.optimizer_param_steps.empty()) {
      json per_param = json::array();
      for (auto it = f.optimizer_param_steps.begin(); it + 1 < f.optimizer_param_steps.end(); it += 2)
        per_param.push_back(steps_json(it, it + 2));
      out["optimizer"]["per_param"] = per_param;
    }
    if (!f.optimizer_foreach_steps.empty())
      out["optimizer"]["foreach_steps"] =
          steps_json(f.optimizer_foreach_steps.begin(), f.optimizer_foreach_steps.end());
    if (!f.optimizer_fused_steps.empty())
      out["optimizer"]["fused_steps"] = steps_json(f.optimizer_fused_steps.begin(), f.optimizer_fused_steps.end());
  }
  return out.dump() + "\n";
}

std::vector<ModuleNode> parse_module_table(const std::string& text, const std::string& origin) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw std::invalid_argument(origin + ": not JSON");
  return modules_from(j, "modules", origin);
}

TraceFile parse_trace_file(const std::string& text, const std::string& origin) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw std::invalid_argument(origin + ": not JSON (a shardfit.trace/1 file)");
  FieldReader top(j, "", origin);
  const std::string schema = top.text("schema");
  if (schema != kTraceSchema)
    top.fail("schema", "is '" + schema + "': this shardfit reads " + kTraceSchema +
                           " (record the trace again with this version's pytorch/trace_recorder.py)");
  TraceFile f;
  const FieldReader model = top.object("model");
  f.model_name = model.text("name");
  if (model.has("factory")) f.factory = model.text("factory");
  if (model.has("input")) f.input = model.text("input");
  f.seq_len = top.integer("seq_len", 1);
  if (top.has("torch")) f.torch_version = top.text("torch");
  if (top.has("block_input_casts")) f.block_input_casts = top.integer("block_input_casts", 0);
  const std::string target = top.text("target");
  if (target != "cpu" && target != "cuda") top.fail("target", "must be \"cpu\" or \"cuda\"");
  f.target_cuda = target == "cuda";
  f.modules = modules_from(top.need("modules"), "modules", origin);
  if (model.has("params") && model.integer("params", 0) != f.param_count())
    model.fail("params", "is not the sum of the modules' parameters (" + std::to_string(f.param_count()) + ")");
  const json& traces = top.need("traces");
  if (!traces.is_array() || traces.empty()) top.fail("traces", "must be a non-empty list");
  for (size_t i = 0; i < traces.size(); ++i) {
    FieldReader r(traces[i], "traces[" + std::to_string(i) + "]", origin);
    ModelTrace t;
    t.model_name = f.model_name;
    t.seq_len = f.seq_len;
    t.batch = r.integer("batch", 1);
    const std::string dtype = r.text("dtype");
    if (dtype == "fp32")
      t.compute_dtype = DType::kF32;
    else if (dtype == "bf16")
      t.compute_dtype = DType::kBF16;
    else if (dtype == "fp16")
      t.compute_dtype = DType::kF16;
    else
      r.fail("dtype", "is '" + dtype + "': must be fp32, bf16 or fp16");
    for (int64_t m : integers(r, "recompute", 1)) {
      if (m >= static_cast<int64_t>(f.modules.size())) r.fail("recompute", "names a module the file lacks");
      t.recompute_modules.push_back(static_cast<int>(m));
    }
    std::sort(t.recompute_modules.begin(), t.recompute_modules.end());
    t.forward_flops = r.number("forward_flops");
    t.backward_flops = r.number("backward_flops");
    t.op_names = strings(r, "op_names");
    events_from(r, f.modules.size(), &t);
    if (r.has("grads")) {
      const std::string grads = r.text("grads");
      if (grads != "accumulate" && grads != "none") r.fail("grads", "must be \"accumulate\" or \"none\"");
      t.grads_at_start = grads == "accumulate";
    }
    if (r.has("kept_outputs")) {
      std::unordered_map<int64_t, int> state;  // 1 allocated, 2 freed
      for (const auto& e : t.events)
        if (e.kind == MemEvent::kAlloc || e.kind == MemEvent::kFree) state[e.tensor] = e.kind == MemEvent::kAlloc ? 1 : 2;
      t.kept_outputs = integers(r, "kept_outputs", 0);
      for (int64_t id : t.kept_outputs)
        if (state[id] != 1) r.fail("kept_outputs", "names storage " + std::to_string(id) + ", not one the trace allocates "
                                                   "and leaves live");
    }
    if (r.has("work")) {
      const FieldReader w = r.object("work");
      t.forward_work = work_from(w.object("forward"));
      t.backward_work = work_from(w.object("backward"));
    }
    if (r.has("output_tensors")) t.output_tensor_bytes = integers(r, "output_tensors", 0);
    if (r.has("checkpoint")) {
      const std::string kind = r.text("checkpoint");
      if (kind != "reentrant" && kind != "non_reentrant") r.fail("checkpoint", "must be reentrant or non_reentrant");
      if (t.recompute_modules.empty()) r.fail("checkpoint", "is given for a trace that recomputes nothing");
      t.recompute_reentrant = kind == "reentrant";
    }
    if (r.has("autocast")) {
      const json& a = r.need("autocast");
      if (!a.is_boolean()) r.fail("autocast", "must be true or false");
      t.autocast = a.get<bool>();
      if (t.autocast && t.compute_dtype == DType::kF32) r.fail("autocast", "is given for an fp32 trace");
    }
    if (f.find(t.compute_dtype, t.recompute_modules, t.batch, t.grads_at_start, t.recompute_reentrant, t.autocast))
      r.fail("batch", "repeats a trace already in the file (same batch, dtype, autocast, recompute, checkpoint and "
                      "grads)");
    f.traces.push_back(std::move(t));
  }
  if (top.has("optimizer")) {
    const FieldReader opt = top.object("optimizer");
    f.optimizer = opt.text("name");
    // `key`: a list of two steps (the first, a later one), each op names and events.
    auto two_steps = [&](const std::string& key, std::vector<ModelTrace>* out) {
      const json& steps = opt.need(key);
      if (!steps.is_array() || steps.size() != 2) opt.fail(key, "must be a list of two steps (the first, a later one)");
      for (size_t i = 0; i < steps.size(); ++i) {
        FieldReader r(steps[i], opt.field(key) + "[" + std::to_string(i) + "]", origin);
        ModelTrace t;
        t.model_name = f.model_name;
        t.op_names = strings(r, "op_names");
        events_from(r, f.modules.size(), &t);
        out->push_back(std::move(t));
      }
    };
    two_steps("steps", &f.optimizer_steps);
    if (opt.has("zero_grad")) {
      FieldReader r = opt.object("zero_grad");
      f.optimizer_zero_grad.op_names = strings(r, "op_names");
      events_from(r, f.modules.size(), &f.optimizer_zero_grad);
    }
    if (opt.has("foreach_steps")) two_steps("foreach_steps", &f.optimizer_foreach_steps);
    if (opt.has("fused_steps")) two_steps("fused_steps", &f.optimizer_fused_steps);
    if (opt.has("per_param")) {
      const json& per = opt.need("per_param");
      if (!per.is_array() || per.size() != f.param_numels().size())
        opt.fail("per_param", "must be a list with one entry per parameter (" +
                                  std::to_string(f.param_numels().size()) + ")");
      for (size_t i = 0; i < per.size(); ++i) {
        const std::string at = opt.field("per_param") + "[" + std::to_string(i) + "]";
        if (!per[i].is_array() || per[i].size() != 2)
          throw std::invalid_argument(origin + ": field '" + at + "' must be a list of two steps");
        for (size_t k = 0; k < 2; ++k) {
          FieldReader r(per[i][k], at + "[" + std::to_string(k) + "]", origin);
          ModelTrace t;
          t.op_names = strings(r, "op_names");
          events_from(r, f.modules.size(), &t);
          f.optimizer_param_steps.push_back(std::move(t));
        }
      }
    }
  }
  return f;
}

TraceFile read_trace_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("--trace " + path + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_trace_file(text.str(), "--trace " + path);
}

}  // namespace shardfit::planner
