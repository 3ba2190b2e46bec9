import torch, torch.nn as nn, torch.nn.functional as Fn

class SmallCNN(nn.Module):
    """torchvision-style: conv-bn-relu stem, a basic residual block, stride-2 downsample, avgpool, fc."""
    def __init__(s, c=8, classes=10):
        super().__init__()
        s.stem = nn.Sequential(nn.Conv2d(3, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        s.b1 = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                             nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))
        s.down = nn.Sequential(nn.Conv2d(c, 2 * c, 3, 2, 1), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        s.fc = nn.Linear(2 * c, classes)
    def forward(s, x):
        x = s.stem(x)
        x = Fn.relu(x + s.b1(x))
        x = s.down(x)
        x = Fn.adaptive_avg_pool2d(x, 1).flatten(1)
        return s.fc(x)

class Encoder(nn.Module):
    """BERT-style: embeddings, attention mask from the input ids (pad id 0), 1 layer."""
    def __init__(s, vocab=50, d=16, heads=2):
        super().__init__()
        s.emb = nn.Embedding(vocab, d); s.pos = nn.Embedding(64, d)
        s.h = heads; s.qkv = nn.Linear(d, 3 * d); s.o = nn.Linear(d, d)
        s.ln1 = nn.LayerNorm(d); s.ff = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d)); s.ln2 = nn.LayerNorm(d)
    def forward(s, ids):
        B, T = ids.shape
        pos = torch.arange(T).unsqueeze(0)
        x = s.emb(ids) + s.pos(pos)
        mask = (ids != 0)[:, None, None, :]
        q, k, v = s.qkv(x).chunk(3, -1)
        sh = lambda t: t.reshape(B, T, s.h, -1).transpose(1, 2)
        q, k, v = sh(q), sh(k), sh(v)
        att = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        att = att.masked_fill(~mask, -1e9).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, -1)
        x = s.ln1(x + s.o(y))
        return s.ln2(x + s.ff(x))


class GRUStep(nn.Module):
    """One GRU-style decoder step written with `.chunk` (as hand-written decoders are)."""
    def __init__(s, vocab=20, d=16):
        super().__init__()
        s.emb = nn.Embedding(vocab, d); s.wi = nn.Linear(d, 3 * d); s.wh = nn.Linear(d, 3 * d); s.out = nn.Linear(d, vocab)
    def forward(s, tok, h):
        gi = s.wi(s.emb(tok)); gh = s.wh(h)
        ir, iz, inn = gi.chunk(3, -1)
        hr, hz, hn = gh.chunk(3, -1)
        r = torch.sigmoid(ir + hr); z = torch.sigmoid(iz + hz)
        n = torch.tanh(inn + r * hn)
        h = (1 - z) * n + z * h
        return s.out(h), h


class GreedyDecoder(nn.Module):
    """Greedy decoding: steps until every sequence emitted EOS (token 1) or max_len; data-dependent trip count."""
    def __init__(s, max_len: int = 12):
        super().__init__()
        s.step = GRUStep()
        s.max_len = max_len
    def forward(s, h):
        max_len = s.max_len
        B = h.shape[0]
        tok = torch.zeros(B, dtype=torch.long)
        out = torch.zeros(B, 0, dtype=torch.long)
        done = torch.zeros(B, dtype=torch.bool)
        i = 0
        while i < max_len and not bool(done.all()):
            logits, h = s.step(tok, h)
            tok = logits.argmax(-1)
            out = torch.cat([out, tok.unsqueeze(1)], 1)
            done = done | (tok == 1)
            i += 1
        return out
