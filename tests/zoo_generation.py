"""A GPT-2 style decoder with a KV cache, for the generation tests (tests/test_generation.py): written as torch
users write one (pre-LayerNorm blocks, fused QKV projection, a causal mask from `tril` with the past length as its
diagonal, exact GELU through `erf`, tied embeddings), scriptable, so that it is both

* a decoder *step* (`DecoderStep`): token ids (batch, new) and past keys / values (layers, batch, heads, past,
  head_dim) in, logits and the grown keys / values (past + new) out, exported by either exporter with dynamic
  batch, new and past lengths and driven step by step from Python; and
* a greedy *generation loop* (`GreedyGeneration`, `torch.jit.script`): the prompt, then one token at a time with
  the cache growing inside the loop, exported as an ONNX Loop by the TorchScript exporter.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from model_exports import ModelCase

VOCAB, D, HEADS, LAYERS, MAX_POS = 61, 32, 4, 2, 64
EOS = 14     # a token these weights emit: some prompts stop early (after 1 or 6 tokens), others run to the limit
HEAD_DIM = D // HEADS


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / 1.4142135623730951))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.d, self.heads, self.head_dim = D, HEADS, HEAD_DIM       # attributes: TorchScript reads no globals
        self.scale = 1.0 / math.sqrt(HEAD_DIM)

    def forward(self, x, past_k, past_v):
        b, t = x.shape[0], x.shape[1]
        q, k, v = self.qkv(self.ln1(x)).split(self.d, dim=-1)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = torch.cat([past_k, k.view(b, t, self.heads, self.head_dim).transpose(1, 2)], dim=2)
        v = torch.cat([past_v, v.view(b, t, self.heads, self.head_dim).transpose(1, 2)], dim=2)
        past = past_k.shape[2]
        causal = torch.ones(t, past + t, dtype=torch.bool).tril(diagonal=past)     # new token i sees past + i
        att = (q @ k.transpose(-1, -2)) * self.scale
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, self.d)
        x = x + self.proj(y)
        return x + self.out(gelu_erf(self.fc(self.ln2(x)))), k, v


class DecoderStep(nn.Module):
    """(ids [B, T], past_k, past_v [L, B, H, P, HEAD_DIM]) -> (logits [B, T, VOCAB], keys, values [L, B, H, P+T, .])."""

    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(MAX_POS, D)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(D)

    def forward(self, ids, past_k, past_v):
        past = past_k.shape[3]
        pos = torch.arange(past, past + ids.shape[1], dtype=torch.int64)
        x = self.wte(ids) + self.wpe(pos)
        ks, vs = [], []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, past_k[i], past_v[i])
            ks.append(k)
            vs.append(v)
        return self.ln_f(x) @ self.wte.weight.t(), torch.stack(ks), torch.stack(vs)


class GreedyGeneration(nn.Module):
    """Greedy decoding after the prompt `ids` [B, T] until every row emitted `EOS` or `new_tokens` tokens: the
    prompt in one step with an empty cache, then one token a step, the cache growing by one position each (once
    scripted, an ONNX Loop with a data-dependent trip count carrying tokens and cache)."""

    def __init__(self, new_tokens: int = 8):
        super().__init__()
        self.step = DecoderStep()
        self.new_tokens = new_tokens
        self.layers, self.heads, self.head_dim, self.eos = LAYERS, HEADS, HEAD_DIM, EOS

    def forward(self, ids):
        b = ids.shape[0]
        past_k = torch.zeros(self.layers, b, self.heads, 0, self.head_dim)
        logits, past_k, past_v = self.step(ids, past_k, past_k)
        tok = logits[:, -1].argmax(-1)
        out = tok.unsqueeze(1)
        done = tok == self.eos
        i = 1
        while i < self.new_tokens and not bool(done.all()):
            logits, past_k, past_v = self.step(tok.unsqueeze(1), past_k, past_v)
            tok = logits[:, -1].argmax(-1)
            out = torch.cat([out, tok.unsqueeze(1)], dim=1)
            done = done | (tok == self.eos)
            i += 1
        return out


def init_weights(model: nn.Module, seed: int = 0) -> nn.Module:
    """Weights large enough that logits differ clearly (greedy choices are not near-ties), LayerNorms kept 1 / 0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.eval()


def make_step():
    ids = torch.randint(0, VOCAB, (2, 3))
    past = torch.randn(LAYERS, 2, HEADS, 4, HEAD_DIM)
    axes = {"ids": {0: "batch", 1: "new"}, "past_k": {1: "batch", 3: "past"}, "past_v": {1: "batch", 3: "past"}}
    return init_weights(DecoderStep()), (ids, past, past.clone()), ["ids", "past_k", "past_v"], axes


def make_greedy():
    scripted = torch.jit.script(init_weights(GreedyGeneration()))
    return scripted, (torch.randint(0, VOCAB, (2, 5)),), ["ids"], {"ids": {0: "batch", 1: "prompt"}}


def _prompt(rng, size):
    batch, prompt = size
    return {"ids": rng.integers(0, VOCAB, (batch, prompt)).astype(np.int64)}


def _step_inputs(rng, size):
    """New tokens and a random past of `past` positions (0: the first step, the cache empty)."""
    batch, new, past = size
    cache = [rng.standard_normal((LAYERS, batch, HEADS, past, HEAD_DIM)).astype(np.float32) for _ in range(2)]
    return {"ids": rng.integers(0, VOCAB, (batch, new)).astype(np.int64), "past_k": cache[0], "past_v": cache[1]}


# the same two models as `ModelCase`s, one call each (the step with a given past), for the benchmark table
# (benchmarks/bench_onnx_models.py); tests/test_generation.py checks them step by step and token by token
CASES = [
    ModelCase("gpt2_style_greedy_loop", make_greedy, _prompt, [(1, 1), (2, 5), (3, 9), (4, 2)],
              exporters=("torchscript",)),                                          # torch.jit.script
    ModelCase("gpt2_style_kv_cache_step", make_step, _step_inputs, [(1, 1, 0), (2, 4, 3), (3, 1, 7), (1, 12, 1)]),
]
