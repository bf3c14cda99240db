"""Models written in plain PyTorch, as a user of PyTorch writes them, for
the PyTorch-stack checks: traced by pytorch/trace_recorder.py,
trained by pytorch/validate.py under PyTorch's own DDP and
ZeroRedundancyOptimizer. Nothing here is shardfit's engine.

Each factory takes a Hugging Face-style config dict and returns a module
whose forward(idx) returns the loss of predicting idx shifted by one.

    gpt2   Hugging Face GPT-2's names and shapes (Conv1D weights in x out,
           tied output embedding, dropout 0.1, tanh GELU, eager attention
           with a boolean causal mask); scripts/fsdp_reference.py's
           MinimalGPT2 (PyTorch's DDP/FSDP on a GPU, and ddp_reference.py's
           throughput runs) builds this one.
    bert   Hugging Face BertForMaskedLM's names and shapes (word, position
           and token-type embeddings, post-LayerNorm encoder layers with erf
           GELU, the MLM head's transform and a decoder tied to the word
           embeddings); the loss is the masked-LM cross-entropy with every
           position a target (the input's token ids).
    llama  Hugging Face LlamaForCausalLM's names and shapes (RMSNorm, rotary
           embeddings, SwiGLU, grouped-query attention with keys and values
           repeated for eager attention, untied lm_head), written as its
           eager path computes; the rotary frequencies are computed in
           forward instead of kept in a buffer (a model with buffers is not
           planned by --stack pytorch yet).
    gpt2-hf2022  Hugging Face transformers' GPT2LMHeadModel as it trained in
           the 2022 write-up (../shared/reference/), op for op: written from
           reading transformers' modeling_gpt2.py of v4.21-v4.24 (July to
           November 2022), not copied. Each attention keeps the causal mask
           as a buffer (`attn.bias`, uint8, n_positions x n_positions, made
           bool for every forward) and `attn.masked_bias` (a 0-dim fp32
           buffer the forward no longer reads); the scores are divided by a
           0-dim tensor and masked with torch.where against another; the MLP's
           gelu_new is its five element-wise ops; the loss takes the logits
           of every position, then the shifted `.contiguous()` copies and
           CrossEntropyLoss. The only model here with buffers: DDP broadcasts
           them before every forward (broadcast_buffers=True), and
           `plan --stack pytorch` charges that.

The others keep no buffers: what a module holds is its parameters.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# The shapes of shardfit's built-in test sizes (`shardfit models`).
CONFIGS = {
    "gpt2-tiny": dict(family="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128),
    # gpt2-tiny with a 4096-token vocabulary: 370,432 parameters, 1.5 MB, more than DDP's 1 MiB
    # first bucket, so that the buckets it rebuilds at a small bucket_cap_mb are several.
    "gpt2-tiny-wide": dict(family="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=4096, n_positions=128),
    # bert-tiny's shapes (hidden 64, 2 layers, 4 heads, intermediate 256; 145,984 parameters: no pooler).
    "bert-tiny": dict(family="bert", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=256, vocab_size=512, max_position_embeddings=128, type_vocab_size=2,
                      layer_norm_eps=1e-12),
    # models/configs/llama-tiny.json's shapes (GQA 2:1, untied head), default rope.
    "llama-tiny": dict(family="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, intermediate_size=176, vocab_size=512,
                       rms_norm_eps=1e-5, rope_theta=500000.0),
    # llama-tiny with its keys and values repeated by repeat_interleave(int), as some GQA code
    # writes it. 1.13's meta device refuses it ("cannot repeat_interleave a meta tensor without
    # output_size"); 2.x's runs it, and the trace is the CPU step's to the byte (trace_test.py).
    "llama-tiny-ri": dict(family="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, intermediate_size=176, vocab_size=512,
                          rms_norm_eps=1e-5, rope_theta=500000.0, kv_repeat="repeat_interleave"),
    # gpt2-tiny's shapes in the 2022 model (its mask buffers at n_positions 128).
    "gpt2-hf2022-tiny": dict(family="gpt2-hf2022", n_embd=64, n_layer=2, n_head=4, vocab_size=512,
                             n_positions=128),
    # The reference scenario's models (Hugging Face's gpt2-large and gpt2-xl config.json):
    # 774,030,080 and 1,557,611,200 parameters.
    "gpt2-large-hf2022": dict(family="gpt2-hf2022", n_embd=1280, n_layer=36, n_head=20, vocab_size=50257,
                              n_positions=1024),
    "gpt2-xl-hf2022": dict(family="gpt2-hf2022", n_embd=1600, n_layer=48, n_head=25, vocab_size=50257,
                           n_positions=1024),
}


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: a linear layer whose weight is in x out."""

    def __init__(self, nx, nf):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf).normal_(0, 0.02))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).view(*x.shape[:-1], -1)


class GPT2Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.d, self.heads = d, heads
        self.c_attn, self.c_proj = Conv1D(d, 3 * d), Conv1D(d, d)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.1), nn.Dropout(0.1)

    def forward(self, x):
        B, T, _ = x.shape
        d, H = self.d, self.heads
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // H)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        w = w.masked_fill(~mask, torch.finfo(w.dtype).min)
        w = self.attn_dropout(F.softmax(w, dim=-1))
        y = torch.matmul(w, v).transpose(1, 2).reshape(B, T, d)
        return self.resid_dropout(self.c_proj(y))


class GPT2MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc, self.c_proj, self.dropout = Conv1D(d, 4 * d), Conv1D(4 * d, d), nn.Dropout(0.1)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class GPT2Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), GPT2Attention(d, heads)
        self.ln_2, self.mlp = nn.LayerNorm(d), GPT2MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["n_embd"]
        self.wte, self.wpe = nn.Embedding(cfg["vocab_size"], d), nn.Embedding(cfg["n_positions"], d)
        nn.init.normal_(self.wte.weight, 0, 0.02)
        nn.init.normal_(self.wpe.weight, 0, 0.01)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList(GPT2Block(d, cfg["n_head"]) for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(d)


class GPT2LMHead(nn.Module):
    block_class = GPT2Block

    def __init__(self, cfg):
        super().__init__()
        self.vocab = cfg["vocab_size"]
        self.transformer = GPT2Transformer(cfg)

    def forward(self, idx):
        t = self.transformer
        pos = torch.arange(idx.size(1), device=idx.device)
        x = t.drop(t.wte(idx) + t.wpe(pos))
        for block in t.h:
            x = block(x)
        logits = F.linear(t.ln_f(x), t.wte.weight)  # tied output embedding
        return F.cross_entropy(logits[:, :-1].reshape(-1, self.vocab).float(), idx[:, 1:].reshape(-1))


class BertSelfAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = (m(x).view(B, T, self.heads, d // self.heads).transpose(1, 2)
                   for m in (self.query, self.key, self.value))
        w = F.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // self.heads), dim=-1)
        return torch.matmul(self.dropout(w), v).transpose(1, 2).reshape(B, T, d)


class BertDenseNorm(nn.Module):
    """BertSelfOutput / BertOutput: dense, dropout, residual, LayerNorm."""

    def __init__(self, d_in, d, eps):
        super().__init__()
        self.dense, self.LayerNorm, self.dropout = nn.Linear(d_in, d), nn.LayerNorm(d, eps=eps), nn.Dropout(0.1)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["hidden_size"]
        self.self = BertSelfAttention(d, cfg["num_attention_heads"])
        self.output = BertDenseNorm(d, d, cfg["layer_norm_eps"])

    def forward(self, x):
        return self.output(self.self(x), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.dense = nn.Linear(cfg["hidden_size"], cfg["intermediate_size"])

    def forward(self, x):
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention, self.intermediate = BertAttention(cfg), BertIntermediate(cfg)
        self.output = BertDenseNorm(cfg["intermediate_size"], cfg["hidden_size"], cfg["layer_norm_eps"])

    def forward(self, x):
        a = self.attention(x)
        return self.output(self.intermediate(a), a)


class BertEmbeddings(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["hidden_size"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], d)
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], d)
        self.token_type_embeddings = nn.Embedding(cfg["type_vocab_size"], d)
        self.LayerNorm, self.dropout = nn.LayerNorm(d, eps=cfg["layer_norm_eps"]), nn.Dropout(0.1)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        types = torch.zeros_like(idx)
        x = self.word_embeddings(idx) + self.token_type_embeddings(types) + self.position_embeddings(pos)
        return self.dropout(self.LayerNorm(x))


class BertModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg["num_hidden_layers"]))


class BertLMHead(nn.Module):
    """cls.predictions: transform (dense, GELU, LayerNorm), then the decoder
    tied to the word embeddings, with its own bias."""

    def __init__(self, cfg):
        super().__init__()
        d = cfg["hidden_size"]
        self.transform = nn.Module()
        self.transform.dense = nn.Linear(d, d)
        self.transform.LayerNorm = nn.LayerNorm(d, eps=cfg["layer_norm_eps"])
        self.bias = nn.Parameter(torch.zeros(cfg["vocab_size"]))

    def forward(self, x, weight):
        x = self.transform.LayerNorm(F.gelu(self.transform.dense(x)))
        return F.linear(x, weight, self.bias)


class BertForMaskedLM(nn.Module):
    block_class = BertLayer

    def __init__(self, cfg):
        super().__init__()
        self.vocab = cfg["vocab_size"]
        self.bert = BertModel(cfg)
        self.cls = nn.Module()
        self.cls.predictions = BertLMHead(cfg)

    def forward(self, idx):
        x = self.bert.embeddings(idx)
        for layer in self.bert.encoder.layer:
            x = layer(x)
        logits = self.cls.predictions(x, self.bert.embeddings.word_embeddings.weight)
        return F.cross_entropy(logits.view(-1, self.vocab), idx.view(-1))


class LlamaRMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, self.heads, self.kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim", d // self.heads)
        self.q_proj = nn.Linear(d, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, d, bias=False)
        self.kv_repeat = cfg.get("kv_repeat", "expand")

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads  # keys and values repeated, as eager attention does
        if self.kv_repeat == "repeat_interleave":
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        else:
            k = k[:, :, None].expand(B, self.kv_heads, rep, T, self.head_dim).reshape(B, self.heads, T, self.head_dim)
            v = v[:, :, None].expand(B, self.kv_heads, rep, T, self.head_dim).reshape(B, self.heads, T, self.head_dim)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        mask = torch.full((T, T), torch.finfo(w.dtype).min, device=x.device).triu(1)
        w = F.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        y = torch.matmul(w, v).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, i = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj, self.up_proj = nn.Linear(d, i, bias=False), nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn, self.mlp = LlamaAttention(cfg), LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = LlamaRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = LlamaRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class LlamaForCausalLM(nn.Module):
    block_class = LlamaDecoderLayer

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def rotary(self, T, device):
        """cos and sin of the default rope (theta) for positions 0..T-1, [T, head_dim]."""
        dim = self.cfg.get("head_dim", self.cfg["hidden_size"] // self.cfg["num_attention_heads"])
        inv_freq = 1.0 / (self.cfg["rope_theta"] ** (torch.arange(0, dim, 2, device=device).float() / dim))
        freqs = torch.outer(torch.arange(T, device=device).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, idx):
        m = self.model
        cos, sin = self.rotary(idx.size(1), idx.device)
        x = m.embed_tokens(idx)
        for layer in m.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(m.norm(x)).float()
        V = self.cfg["vocab_size"]
        return F.cross_entropy(logits[:, :-1].reshape(-1, V), idx[:, 1:].reshape(-1))


def gelu_new(x):
    """transformers' NewGELUActivation (activations.py): the tanh GELU as
    five element-wise ops, each its own tensor (what 2022's GPT-2 ran)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class HF2022Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, P = cfg["n_embd"], cfg["n_positions"]
        self.register_buffer("bias", torch.tril(torch.ones((P, P), dtype=torch.uint8)).view(1, 1, P, P))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.heads, self.head_dim = cfg["n_head"], d // cfg["n_head"]
        self.c_attn, self.c_proj = Conv1D(d, 3 * d), Conv1D(d, d)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.1), nn.Dropout(0.1)

    def split_heads(self, t):
        return t.view(t.size()[:-1] + (self.heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, x):
        """(output, present): present is (key, value), what use_cache returns."""
        q, k, v = self.c_attn(x).split(self.heads * self.head_dim, dim=2)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.tensor(v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        T = q.size(-2)
        causal_mask = self.bias[:, :, 0:T, :T].to(torch.bool)
        mask_value = torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype).to(w.device)
        w = torch.where(causal_mask, w, mask_value)
        w = nn.functional.softmax(w, dim=-1)
        w = w.type(v.dtype)
        w = self.attn_dropout(w)
        y = torch.matmul(w, v)
        y = y.permute(0, 2, 1, 3).contiguous()
        y = y.view(y.size()[:-2] + (self.heads * self.head_dim,))
        return self.resid_dropout(self.c_proj(y)), (k, v)


class HF2022MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc, self.c_proj, self.dropout = Conv1D(d, 4 * d), Conv1D(4 * d, d), nn.Dropout(0.1)

    def forward(self, x):
        return self.dropout(self.c_proj(gelu_new(self.c_fc(x))))


class HF2022Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["n_embd"]
        self.ln_1, self.attn = nn.LayerNorm(d, eps=1e-5), HF2022Attention(cfg)
        self.ln_2, self.mlp = nn.LayerNorm(d, eps=1e-5), HF2022MLP(d)

    def forward(self, x):
        """(hidden states, present)."""
        a, present = self.attn(self.ln_1(x))
        x = a + x
        return x + self.mlp(self.ln_2(x)), present


class HF2022Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["n_embd"]
        self.wte, self.wpe = nn.Embedding(cfg["vocab_size"], d), nn.Embedding(cfg["n_positions"], d)
        nn.init.normal_(self.wte.weight, 0, 0.02)  # _init_weights: initializer_range 0.02
        nn.init.normal_(self.wpe.weight, 0, 0.02)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList(HF2022Block(cfg) for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)


class HF2022GPT2LMHeadModel(nn.Module):
    """forward(input_ids, labels=None) -> (loss, logits, presents), what
    GPT2LMHeadModel returns with return_dict=False and the config's
    use_cache=True (presents: every layer's (key, value)); a loop holding it
    (run_clm_no_trainer.py's `outputs = model(**batch)`) keeps the logits
    and every layer's keys and values until its next forward returns.
    use_cache False (Hugging Face turns it off under gradient checkpointing:
    pytorch/validate.py --ckpt and the recorder's checkpointed traces do):
    presents None. labels default to the ids (run_clm's labels are a copy of
    them: pass it to count its bytes)."""
    block_class = HF2022Block
    use_cache = True

    def __init__(self, cfg):
        super().__init__()
        self.transformer = HF2022Transformer(cfg)
        self.lm_head = nn.Linear(cfg["n_embd"], cfg["vocab_size"], bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tie_weights()

    def forward(self, input_ids, labels=None):
        t = self.transformer
        T = input_ids.size(-1)
        position_ids = torch.arange(0, T, dtype=torch.long, device=input_ids.device).unsqueeze(0).view(-1, T)
        x = t.drop(t.wte(input_ids) + t.wpe(position_ids))
        presents = () if self.use_cache else None
        for block in t.h:
            x, present = block(x)
            if self.use_cache:
                presents = presents + (present,)
        x = t.ln_f(x)
        lm_logits = self.lm_head(x)
        labels = input_ids if labels is None else labels
        shift_logits = lm_logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        loss = nn.CrossEntropyLoss()(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))
        return (loss, lm_logits, presents)


FAMILIES = {"gpt2": GPT2LMHead, "gpt2-hf2022": HF2022GPT2LMHeadModel, "bert": BertForMaskedLM, "llama": LlamaForCausalLM}


def build(name_or_cfg):
    """The model for a name in CONFIGS or a config dict (with "family")."""
    cfg = CONFIGS[name_or_cfg] if isinstance(name_or_cfg, str) else name_or_cfg
    return FAMILIES[cfg["family"]](cfg)


def vocab_size(name_or_cfg):
    cfg = CONFIGS[name_or_cfg] if isinstance(name_or_cfg, str) else name_or_cfg
    return cfg["vocab_size"]


def token_input(vocab):
    """The input factory of a causal LM: (batch, seq_len, device) -> token ids."""
    def make(batch, seq_len, device):
        return torch.randint(0, vocab, (batch, seq_len), device=device)
    return make
