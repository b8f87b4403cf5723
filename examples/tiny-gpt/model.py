"""A small character-level GPT, torch only, sized to train on a CPU in seconds.

The benchmark and the examples need a model whose step has the shape of real LLM
training (embeddings, causal self-attention, MLPs, layer norms, a cross-entropy over the
vocabulary) so the guard's overhead is measured against realistic work, not against a
single matmul that would flatter or punish it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 96
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(
                f"n_embd ({config.n_embd}) must be a multiple of n_head ({config.n_head})"
            )
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        shape = (batch, time, self.n_head, channels // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        y = functional.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
        out: torch.Tensor = self.proj(y.transpose(1, 2).contiguous().view(batch, time, channels))
        return out


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd),
            nn.GELU(),
            nn.Linear(4 * config.n_embd, config.n_embd),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class TinyGPT(nn.Module):
    """Next-character prediction; ``forward(idx, targets)`` returns the mean loss."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.Sequential(*(Block(config) for _ in range(config.n_layer)))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        time = idx.shape[1]
        if time > self.config.block_size:
            raise ValueError(
                f"sequence of {time} tokens exceeds block_size {self.config.block_size}"
            )
        positions = torch.arange(time, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        logits = self.head(self.ln_f(self.blocks(x)))
        return functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
