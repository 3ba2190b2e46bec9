"""Hugging Face `transformers` models for the real-model suite (tests/test_models_hf.py): each built from a tiny
config object with random weights (nothing is downloaded), wrapped in a small module that returns plain tensors,
with dynamic batch and sequence and the attention mask taken from the input (padding at the end of each row, so
the mask matters). `CASES` is the list of `model_exports.ModelCase`s."""
from __future__ import annotations

import numpy as np

import torch
from torch import nn

from model_exports import ModelCase

VOCAB = 97
# (batch, sequence) per size: 1 x 1, odd lengths, a longer one
SIZES = [(1, 1), (2, 7), (3, 12), (1, 30)]


def _ids_and_mask(rng, size):
    """Random token ids (no pad id 0) and a mask with the last third of each row padded (the first row full)."""
    b, t = size
    ids = rng.integers(1, VOCAB, (b, t)).astype(np.int64)
    mask = np.ones((b, t), np.int64)
    for row in range(1, b):
        mask[row, t - (t * row) // (b + 1):] = 0
    return ids, mask


def _text_inputs(rng, size):
    ids, mask = _ids_and_mask(rng, size)
    return {"input_ids": ids, "attention_mask": mask}


def _text_args():
    return (torch.randint(1, VOCAB, (2, 7)), torch.ones(2, 7, dtype=torch.int64))


TEXT_AXES = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}


class LastHidden(nn.Module):
    """An encoder's last_hidden_state as a plain tensor."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class Logits(nn.Module):
    """A language model's logits as a plain tensor (no KV cache returned)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


class Seq2SeqLogits(nn.Module):
    """An encoder-decoder's logits, the decoder fed the input ids shifted (same dynamic batch and sequence)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids,
                          use_cache=False).logits


def _eager(config):
    config._attn_implementation = "eager"      # the plain matmul-softmax attention, not SDPA's fused op
    return config


def make_bert():
    from transformers import BertConfig, BertModel
    config = _eager(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=64))
    return LastHidden(BertModel(config).eval()), _text_args(), ["input_ids", "attention_mask"], TEXT_AXES


def make_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    config = _eager(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                               initializer_range=0.2))     # logits of order 1, not 0.1
    return Logits(GPT2LMHeadModel(config).eval()), _text_args(), ["input_ids", "attention_mask"], TEXT_AXES


def make_t5():
    from transformers import T5Config, T5ForConditionalGeneration
    config = _eager(T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                             num_heads=4, relative_attention_num_buckets=8, decoder_start_token_id=0))
    return Seq2SeqLogits(T5ForConditionalGeneration(config).eval()), _text_args(), ["input_ids", "attention_mask"], \
        TEXT_AXES


def make_distilbert():
    from transformers import DistilBertConfig, DistilBertModel
    config = _eager(DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                     max_position_embeddings=64))
    return LastHidden(DistilBertModel(config).eval()), _text_args(), ["input_ids", "attention_mask"], TEXT_AXES


CASES = [
    ModelCase("bert", make_bert, _text_inputs, SIZES),
    ModelCase("gpt2", make_gpt2, _text_inputs, SIZES),
    ModelCase("t5", make_t5, _text_inputs, SIZES),
    ModelCase("distilbert", make_distilbert, _text_inputs, SIZES),
]
