"""Models written in plain PyTorch, as a user of PyTorch writes them, for
the PyTorch-stack checks (issue 12): traced by pytorch/trace_recorder.py,
trained by pytorch/validate.py under PyTorch's own DDP and
ZeroRedundancyOptimizer. Nothing here is shardfit's engine.

Each factory takes a Hugging Face-style config dict and returns a module
whose forward(idx) returns the loss of predicting idx shifted by one.

    gpt2   Hugging Face GPT-2's names and shapes (Conv1D weights in x out,
           tied output embedding, dropout 0.1, tanh GELU, eager attention
           with a boolean causal mask), as scripts/fsdp_reference.py's
           MinimalGPT2 — which builds its model from here.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# The shapes of shardfit's built-in test sizes (`shardfit models`).
CONFIGS = {
    "gpt2-tiny": dict(family="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128),
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


FAMILIES = {"gpt2": GPT2LMHead}


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
