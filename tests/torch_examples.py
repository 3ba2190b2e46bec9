"""The bundled examples (examples/*.py) written as torch `nn.Module`s, with the examples' own weights, their control
flow as torch's higher-order ops (`torch.cond`, `while_loop`, `scan`, `map`), for tests/test_from_torch.py."""
from __future__ import annotations

import numpy as np
import torch
from torch._higher_order_ops.map import map as torch_map
from torch._higher_order_ops.scan import scan as torch_scan
from torch._higher_order_ops.while_loop import while_loop as torch_while_loop

from dyntvm.examples import branchy, decoder, detection, lstm, transformer

T = torch.from_numpy


class LSTM(torch.nn.Module):
    """examples/lstm.py: a scan over T of the fused-gate LSTM cell."""

    def __init__(self):
        super().__init__()
        self.W, self.U, self.b = (torch.nn.Parameter(T(a.copy())) for a in (lstm.W, lstm.U, lstm.b))

    def forward(self, xs, h0, c0):
        def step(carry, x):
            h, c = carry
            i, f, g, o = torch.chunk(x @ self.W + h @ self.U + self.b, 4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            return (h, c), h.clone()
        (h, _c), hs = torch_scan(step, (h0, c0), xs)
        return hs, h


class Branchy(torch.nn.Module):
    """examples/branchy.py: a per-row cond inside map, then heads of different widths by nested conds."""

    def __init__(self):
        super().__init__()
        for name in ("W_pos", "W_neg", "W_wide", "W_narrow", "W_mid", "W_small", "b_wide"):
            self.register_buffer(name, T(getattr(branchy, name).copy()))

    def forward(self, x):
        def route_row(row):
            return torch.cond(row.sum() > 0, lambda r: torch.relu(r @ self.W_pos),
                              lambda r: torch.tanh(r @ self.W_neg), (row,))
        h = torch_map(route_row, x)
        m = x.mean()

        def default(h):
            return torch.cond(h.abs().max() > 1.0, lambda h: torch.sigmoid(h @ self.W_mid), lambda h: h @ self.W_small,
                              (h,))

        def not_wide(h):
            return torch.cond(m < -0.5, lambda h: torch.tanh(h @ self.W_narrow), default, (h,))
        y = torch.cond(m > 0.5, lambda h: torch.relu(h @ self.W_wide + self.b_wide), not_wide, (h,))
        return y, y.sum(dim=1)


class Detection(torch.nn.Module):
    """examples/detection.py: boolean indexing, nonzero, an MLP on the kept rows, topk of min(K, 5)."""

    def __init__(self):
        super().__init__()
        for name in ("W1", "b1", "W2", "b2"):
            self.register_buffer(name, T(getattr(detection, name).copy()))

    def forward(self, scores, boxes):
        best = scores.max(dim=1).values
        keep = best > detection.THRESHOLD
        boxes, scores, best = boxes[keep], scores[keep], best[keep]
        kept_index = torch.nonzero(keep)[:, 0]
        feats = torch.cat([scores, boxes], dim=1)
        boxes = boxes + torch.relu(feats @ self.W1 + self.b1) @ self.W2 + self.b2
        x1, y1, x2, y2 = boxes.split(1, dim=1)
        areas = (torch.relu(x2 - x1) * torch.relu(y2 - y1)).reshape(-1)
        classes = scores.argmax(dim=1)
        top_scores, top_index = torch.topk(best, min(best.shape[0], detection.TOP))
        return boxes, best, classes, areas, kept_index, top_scores, top_index


class Transformer(torch.nn.Module):
    """examples/transformer.py: one post-norm encoder layer, symbolic B and S."""

    def __init__(self):
        super().__init__()
        for name in ("W_qkv", "b_qkv", "W_o", "b_o", "W_1", "b_1", "W_2", "b_2", "ln1_g", "ln1_b", "ln2_g", "ln2_b"):
            self.register_buffer(name, T(getattr(transformer, name).copy()))

    def forward(self, x, mask):
        B, S = x.shape[0], x.shape[1]
        H, Dh = transformer.HEADS, transformer.D_HEAD

        def heads(t):
            return t.reshape(B, S, H, Dh).permute(0, 2, 1, 3)
        q, k, v = (heads(t) for t in (x @ self.W_qkv + self.b_qkv).chunk(3, dim=-1))
        scores = q @ k.transpose(-1, -2) * Dh ** -0.5 + mask.reshape(B, 1, 1, S)
        attn = (torch.softmax(scores, dim=-1) @ v).permute(0, 2, 1, 3).reshape(B, S, -1)
        D = transformer.D_MODEL
        x = torch.nn.functional.layer_norm(x + attn @ self.W_o + self.b_o, (D,), self.ln1_g, self.ln1_b)
        ff = torch.nn.functional.gelu(x @ self.W_1 + self.b_1) @ self.W_2 + self.b_2
        return torch.nn.functional.layer_norm(x + ff, (D,), self.ln2_g, self.ln2_b)


class Decoder(torch.nn.Module):
    """examples/decoder.py as torch.export takes it: its `while_loop` needs loop values of fixed shape, so the
    growing token sequence is a fixed buffer of MAX_LEN tokens plus a length (dyntvm's `F.while_loop` grows it)."""

    MAX_LEN = 48

    def __init__(self):
        super().__init__()
        for name in ("E", "Wx", "Wh", "bx", "bh", "Wout", "bout", "END_ONEHOT"):
            self.register_buffer(name, T(getattr(decoder, name).copy()))

    def gru(self, token, h):
        x = self.E[token.reshape(1)]
        xr, xz, xn = (x @ self.Wx + self.bx).chunk(3, dim=-1)
        hr, hz, hn = (h @ self.Wh + self.bh).chunk(3, dim=-1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        return (1.0 - z) * torch.tanh(xn + r * hn) + z * h

    def forward(self, prompt, max_steps):
        def encode(carry, tok):
            h, _last = carry
            return (self.gru(tok, h), tok.clone()), tok.clone()
        (h, last), _ = torch_scan(encode, (torch.zeros(1, decoder.HIDDEN), torch.tensor(decoder.BOS)), prompt)
        P = prompt.shape[0]
        buf = torch.cat([prompt, torch.zeros(self.MAX_LEN, dtype=torch.int64)])[:self.MAX_LEN]
        n = torch.tensor(P)

        def not_done(buf, n, steps, h, last):
            return (last != decoder.END) & (steps < max_steps) & (n < self.MAX_LEN)

        def step(buf, n, steps, h, last):
            h = self.gru(last, h)
            logits = (h @ self.Wout).reshape(-1) + self.bout + n.to(torch.float32) * self.END_ONEHOT
            nxt = logits.argmax()
            buf = torch.where(torch.arange(self.MAX_LEN) == n, nxt, buf)
            return buf, n + 1, steps + 1, h, nxt
        buf, n, _steps, _h, _last = torch_while_loop(not_done, step, (buf, n, torch.tensor(0), h, last))
        return buf, n


def decoder_reference(prompt: np.ndarray, max_steps: int):
    """(token buffer, length) the torch Decoder returns, from the dyntvm example run eagerly (tokens beyond
    MAX_LEN are cut, as the buffer holds MAX_LEN)."""
    tokens, _ = decoder.decoder(prompt, np.asarray(max_steps, np.int64))
    tokens = tokens[:Decoder.MAX_LEN]
    buf = np.zeros(Decoder.MAX_LEN, np.int64)
    buf[:len(tokens)] = tokens
    return buf, len(tokens)
