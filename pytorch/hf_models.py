"""transformers' own models for the recorder: `--model hf:<Architecture>
--config <config.json or a model directory>` builds the architecture's class
from the config (random weights on the meta device: nothing is downloaded)
and trains it as a causal-LM script does,

    outputs = model(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False)

the loss first in what it returns (outputs.loss), the logits held with it.
The attention mask is the tokenizer's all-ones one. `hf:` alone takes the
config's own `architectures[0]`.

Attention is the config's `attn_implementation` when it names one, else
eager. transformers 5.17 decides two things from a tensor's values, which
the meta device cannot give: whether position ids pack several sequences
(masking_utils.find_packed_sequence_indices, skipped when a mask is given)
and, under sdpa, whether an all-ones mask may be dropped for a causal kernel
(masking_utils' sdpa_mask): sdpa is refused in one line until the recorder
decides it as a real run would."""
import json
import os


class BadConfig(Exception):
    pass


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


def architecture(arch, config):
    import transformers
    name = arch or (config.architectures or [None])[0]
    if not name:
        raise BadConfig("--model hf: the config names no architectures; give hf:<ArchitectureName>")
    cls = getattr(transformers, name, None)
    if cls is None or not isinstance(cls, type):
        raise BadConfig("--model hf:%s: transformers %s has no such class" % (name, transformers.__version__))
    return cls


def factory(arch, config_path):
    """The recorder's model factory, input function and the model's name
    (its architecture) for hf:<arch>."""
    config = load_config(config_path)
    attn = getattr(config, "_attn_implementation", None) or "eager"
    if attn != "eager":
        raise BadConfig("--config %s: attn_implementation %s is not traced yet (transformers decides from the "
                        "mask's values whether to drop it, which the meta device cannot give); eager is" %
                        (config_path, attn))
    config._attn_implementation = "eager"
    cls = architecture(arch, config)

    class Training(cls):
        """The architecture, called as a causal-LM training loop calls it."""

        def forward(self, input_ids, attention_mask):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids,
                                   use_cache=False)

    Training.__name__ = cls.__name__

    def build():
        model = Training(config)
        blocks = set(getattr(model, "_no_split_modules", None) or [])
        found = [type(m) for m in model.modules() if type(m).__name__ in blocks]
        if found:
            model.block_class = found[0]
        return model

    def inputs(batch, seq_len, device):
        import torch
        ids = torch.randint(0, config.vocab_size, (batch, seq_len), device=device)
        return ids, torch.ones(batch, seq_len, dtype=torch.long, device=device)

    return build, inputs, cls.__name__
