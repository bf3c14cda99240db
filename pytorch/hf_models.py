"""transformers' own models for the recorder: `--model hf:<Architecture>
--config <config.json or a model directory>` builds the architecture's class
from the config (random weights on the meta device: nothing is downloaded)
and trains it as a causal-LM script does,

    outputs = model(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False)

the loss first in what it returns (outputs.loss), the logits held with it.
The attention mask is the tokenizer's all-ones one. `hf:` alone takes the
config's own `architectures[0]`.

Attention is the config's `attn_implementation` when it names one (eager or
sdpa), else the recorder's --attention (default eager; transformers 5.17
itself runs sdpa there for every class that has it, which `shardfit plan`
traces where the target's kernel is imitated). Under sdpa transformers 5.17 decides from the mask's
values whether to build it at all (masking_utils.sdpa_mask): an all-ones
mask is dropped, and attention runs with is_causal=True (a causal model) or
no mask (a bidirectional one), which a meta tensor cannot answer. The mask
here is all ones, so mask_values_known() answers as the real run does: it
runs the same ops on the meta mask (their few bytes are in the trace) and
returns the value the real mask gives. Whether position ids pack several
sequences (find_packed_sequence_indices) is asked only when no mask is
given, which never happens here."""
import contextlib
import json
import os


ATTENTIONS = ("eager", "sdpa")
# transformers 5.17's experts kernels (integrations/moe.py) whose shapes
# follow the batch's, not the router's values: grouped_mm (transformers'
# default, experts_implementation unset) sorts the tokens' top-k copies by
# expert and runs one grouped matmul per projection over all of them
# (cpu_grouped_mm.py: CPU targets only); batched_mm gathers each token's
# top-k experts' weights and runs one bmm per projection. The eager kernel
# loops over the experts the router chose (torch.where on its values).
TRACEABLE_EXPERTS = ("grouped_mm", "batched_mm")


class BadConfig(Exception):
    pass


@contextlib.contextmanager
def mask_values_known():
    """Inside, masking_utils' two value tests of a meta mask answer what the
    all-ones mask of a real run answers (transformers 5.17 masking_utils.py):
    fast_all (`tensor.sum() == tensor.numel()`, _ignore_causal_mask_sdpa) and
    `padding_mask.all()` (_ignore_bidirectional_mask_sdpa). Their ops still
    run on the meta tensor, so the trace holds the scalars the real test
    allocates and frees; only the Python truth value is supplied."""
    from transformers import masking_utils as mu
    fast_all, ignore_bidirectional = mu.fast_all, mu._ignore_bidirectional_mask_sdpa

    def known_fast_all(tensor):
        result = fast_all(tensor)
        return True if result.is_meta else result

    def known_ignore_bidirectional(padding_mask, kv_length, local_attention_size=None):
        if padding_mask is not None and padding_mask.is_meta:
            padding_mask.all()  # the real test's bool scalar, freed as the test returns
            padding_mask = None  # all ones: the same answer as no padding
        return ignore_bidirectional(padding_mask, kv_length, local_attention_size)

    mu.fast_all, mu._ignore_bidirectional_mask_sdpa = known_fast_all, known_ignore_bidirectional
    try:
        yield
    finally:
        mu.fast_all, mu._ignore_bidirectional_mask_sdpa = fast_all, ignore_bidirectional


def load_config(path):
    import transformers
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path) as f:
            fields = json.load(f)
    except (OSError, ValueError) as e:
        raise BadConfig("--config %s: cannot be read as JSON (%s)" % (path, e))
    if not isinstance(fields, dict) or "model_type" not in fields:
        raise BadConfig("--config %s: no model_type (a transformers config.json names it)" % path)
    try:
        return transformers.AutoConfig.for_model(**fields)
    except (ValueError, KeyError, TypeError) as e:
        raise BadConfig("--config %s: transformers cannot build its config (%s)" % (path, e))


def default_experts(cls):
    """The experts kernel transformers 5.17 gives `cls` when the config names
    none (PreTrainedModel.get_correct_experts_implementation): grouped_mm
    where the class lets it be set, else eager."""
    can_set = getattr(cls, "_can_set_experts_implementation", None)
    return "grouped_mm" if can_set is not None and can_set() else "eager"


def architecture(arch, config):
    import transformers
    name = arch or (config.architectures or [None])[0]
    if not name:
        raise BadConfig("--model hf: the config names no architectures; give hf:<ArchitectureName>")
    cls = getattr(transformers, name, None)
    if cls is None or not isinstance(cls, type):
        raise BadConfig("--model hf:%s: transformers %s has no such class" % (name, transformers.__version__))
    return cls


def factory(arch, config_path, target_cuda=False, attention=None):
    """The recorder's model factory, input function and the model's name
    (its architecture) for hf:<arch>. sdpa takes the target's kernel: the
    CPU's flash kernel (cpu_flash_attention.py), or on CUDA cuDNN's, which
    2.11 runs for bf16 and fp16 (cuda_attention.py); CUDA's fp32 sdpa runs
    the memory-efficient kernel, not imitated, so such a model has no fp32
    traces (the built model's `fp32_not_traced` says why). `attention`: the
    attention where the config names none (None: eager)."""
    config = load_config(config_path)
    named = getattr(config, "_attn_implementation", None)
    if named and attention and named != attention:
        raise BadConfig("--attention %s: --config %s names attn_implementation %s" % (attention, config_path, named))
    attn = named or attention or "eager"
    if attn not in ATTENTIONS:
        raise BadConfig("--config %s: attn_implementation %s is not traced (%s are)" %
                        (config_path, attn, " and ".join(ATTENTIONS)))
    config._attn_implementation = attn
    cls = architecture(arch, config)
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    kernel = getattr(config, "_experts_implementation", None) or default_experts(cls)
    if experts and kernel not in TRACEABLE_EXPERTS:
        # transformers' eager experts loop over the experts a batch's tokens
        # were routed to (torch.nonzero, torch.where on the router's choice):
        # shapes from values, which the meta device cannot give.
        raise BadConfig("--config %s: %d experts run by %s, whose shapes follow the router's values; set "
                        "\"experts_implementation\" to grouped_mm (transformers' default where the class allows it) "
                        "or batched_mm to trace them" %
                        (config_path, experts, kernel))
    if experts and kernel == "grouped_mm" and target_cuda:
        raise BadConfig("--config %s: experts by grouped_mm are traced for --target cpu only (CUDA's grouped "
                        "kernel is not imitated); set \"experts_implementation\": \"batched_mm\" for CUDA" %
                        config_path)
    if experts:
        # The kernel asked for by name: transformers then checks the
        # architecture's class (the parent of Training below) allows it.
        config._experts_implementation = kernel

    class Training(cls):
        """The architecture, called as a causal-LM training loop calls it."""

        def forward(self, input_ids, attention_mask):
            with mask_values_known():
                return super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids,
                                       use_cache=False)

    Training.__name__ = cls.__name__

    def build():
        model = Training(config)
        # The block is the most repeated of the classes transformers keeps
        # whole (_no_split_modules): BertLayer, not BertEmbeddings.
        blocks = set(getattr(model, "_no_split_modules", None) or [])
        found = [type(m) for m in model.modules() if type(m).__name__ in blocks]
        if found:
            model.block_class = max(found, key=found.count)
        if attn == "sdpa" and target_cuda:
            model.fp32_not_traced = ("attn_implementation sdpa in fp32 on CUDA runs the memory-efficient kernel, "
                                     "which is not imitated (bf16 and fp16 run cuDNN's, traced; eager attention "
                                     "traces fp32 too)")
        return model

    def inputs(batch, seq_len, device):
        import torch
        ids = torch.randint(0, config.vocab_size, (batch, seq_len), device=device)
        return ids, torch.ones(batch, seq_len, dtype=torch.long, device=device)

    return build, inputs, cls.__name__
