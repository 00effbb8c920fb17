#!/usr/bin/env python3
"""Writes the oracle of test_gpt_hf.c: a tiny random GPT-2 saved by Hugging Face Transformers as it
saves any GPT2LMHeadModel, and its logits and loss on a fixed batch.

  tests/data/gpt2_hf_tiny.safetensors         GPT2LMHeadModel.save_pretrained's model.safetensors
                                              (n_layer 2, n_embd 32, n_head 4, vocab 300, n_positions 64;
                                              every weight, bias and norm drawn at random from seed 1234,
                                              so that a mixed-up name, split or transpose cannot hide
                                              behind zero biases and unit norms)
  tests/data/gpt2_hf_tiny_logits.safetensors  ids [2, 16] (f32, exact integers), logits [2, 16, 300] and
                                              loss [1]: model(ids, labels=ids) in eval mode, in float64
                                              (the model is run in double, so the oracle's own rounding
                                              is far below the test's bound)

Transformers needs PyTorch; Debian's python3-torch (1.13) works with transformers 4.44:
  /usr/bin/python3 -m venv --system-site-packages /tmp/hfvenv
  /tmp/hfvenv/bin/pip install transformers==4.44.2 safetensors
  /tmp/hfvenv/bin/python tests/gen_gpt2_hf_golden.py
"""
import os
import shutil
import tempfile

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "data")

torch.manual_seed(1234)
cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=300, n_positions=64,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = GPT2LMHeadModel(cfg).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if "ln_" in name and name.endswith("weight"):
            p.copy_(1 + 0.3 * torch.randn_like(p))
        else:
            p.copy_(0.3 * torch.randn_like(p))

tmp = tempfile.mkdtemp()
try:
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.copyfile(os.path.join(tmp, "model.safetensors"), os.path.join(out, "gpt2_hf_tiny.safetensors"))
finally:
    shutil.rmtree(tmp)

g = torch.Generator().manual_seed(99)
ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=g)
m64 = model.double()
with torch.no_grad():
    res = m64(ids, labels=ids)
save_file({"ids": ids.float().contiguous(), "logits": res.logits.float().contiguous(),
           "loss": res.loss.float().reshape(1).contiguous()},
          os.path.join(out, "gpt2_hf_tiny_logits.safetensors"), metadata={"format": "pt"})
print("loss", res.loss.item())
