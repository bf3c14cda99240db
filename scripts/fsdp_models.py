"""The models scripts/fsdp_reference.py measures, built as transformers
builds them from a config (random weights, nothing downloaded): GPT-2 at the
reference scenario's sizes and today's decoder-only models at their Hub
configs' shapes, each checked against its parameter count."""
import os
import sys

# Hugging Face GPT-2 shapes; the parameter counts are SPEC's (tied output
# embedding), checked after building.
GPT2 = {
    "gpt2": dict(n_embd=768, n_layer=12, n_head=12, params=124_439_808),
    "gpt2-medium": dict(n_embd=1024, n_layer=24, n_head=16, params=354_823_168),
    "gpt2-large": dict(n_embd=1280, n_layer=36, n_head=20, params=774_030_080),
    "gpt2-xl": dict(n_embd=1600, n_layer=48, n_head=25, params=1_557_611_200),
    "gpt2-tiny": dict(n_embd=64, n_layer=2, n_head=4, params=None),
}
VOCAB, POSITIONS = 50257, 1024

# Decoder-only models of today, as transformers builds them from their Hub
# config.json (values copied from meta-llama/Llama-3.2-1B's and
# Qwen/Qwen2.5-1.5B's config.json; random weights, nothing downloaded). The
# parameter counts are those configs' (tied embeddings), checked after
# building. "-tiny" shapes exist to exercise the code on a CPU.
DECODERS = {
    "llama-3.2-1b": ("LlamaConfig", "LlamaForCausalLM", "LlamaDecoderLayer", 1_235_814_400, dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling=dict(factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
                          original_max_position_embeddings=8192, rope_type="llama3"))),
    "qwen2.5-1.5b": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2DecoderLayer", 1_543_714_304, dict(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
        rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1000000.0)),
    "llama-tiny": ("LlamaConfig", "LlamaForCausalLM", "LlamaDecoderLayer", None, dict(
        vocab_size=1000, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)),
}
MODELS = sorted(GPT2) + sorted(DECODERS)


def vocab_of(name):
    return DECODERS[name][4]["vocab_size"] if name in DECODERS else VOCAB


def build_model(torch, name, device, prefer_transformers=True, attn="eager"):
    """The model on `device`, training mode. Returns (model, impl, loss_fn,
    block_class, expected parameter count or None)."""
    def loss_fn(m, x):
        return m(input_ids=x, labels=x).loss
    if name in DECODERS:
        import transformers
        config_cls, model_cls, block_name, params, fields = DECODERS[name]
        cfg = getattr(transformers, config_cls)(use_cache=False, attn_implementation=attn, **fields)
        block_class = getattr(__import__(getattr(transformers, model_cls).__module__, fromlist=[block_name]), block_name)
        with torch.device(device):
            model = getattr(transformers, model_cls)(cfg)
        model.train()
        return (model, "transformers %s %s (%s attention)" % (transformers.__version__, model_cls, attn),
                loss_fn, block_class, params)
    shape = GPT2[name]
    if prefer_transformers:
        try:
            import transformers  # noqa: F401
            from transformers import GPT2Config, GPT2LMHeadModel
            from transformers.models.gpt2.modeling_gpt2 import GPT2Block
            # eager: the 2022 write-up's attention (probabilities materialised).
            cfg = GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=shape["n_embd"],
                             n_layer=shape["n_layer"], n_head=shape["n_head"], use_cache=False,
                             attn_implementation=attn)
            cfg._attn_implementation = attn
            with torch.device(device):
                model = GPT2LMHeadModel(cfg)
            model.train()
            return (model, "transformers %s GPT2LMHeadModel (%s attention)" % (transformers.__version__, attn),
                    loss_fn, GPT2Block, shape["params"])
        except ImportError:
            pass
    if attn != "eager":
        raise NotImplementedError("the plain-torch GPT-2 has eager attention only")
    model = MinimalGPT2(torch, shape).to(device)
    model.train()

    def minimal_loss(m, x):
        return m(x)
    return (model, "minimal plain-torch GPT-2 (eager attention, HF names and shapes)", minimal_loss,
            model.block_class, shape["params"])


def MinimalGPT2(torch, shape):
    """GPT-2 with Hugging Face's parameter names and shapes (Conv1D weights
    are in x out), tied output embedding, dropout 0.1, eager attention:
    pytorch/models.py's GPT2LMHead (the one writing of it, also what
    `plan --stack pytorch` traces), at this module's VOCAB and POSITIONS."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pytorch"))
    import models
    return models.GPT2LMHead(dict(n_embd=shape["n_embd"], n_layer=shape["n_layer"], n_head=shape["n_head"],
                                  vocab_size=VOCAB, n_positions=POSITIONS))


def count_params(model):
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n
