#!/usr/bin/env python3
"""The live half of test_gpt_hf.c: loads the directory apex wrote (apex_gpt_save_hf / apex-train
export) with Transformers' GPT2LMHeadModel.from_pretrained, runs it on the ids in CASE and compares
its logits and loss with apex's (CASE: a safetensors file with ids [B, T], logits [B * T, V] and loss
[1], written by the test). Prints one PASS or FAIL line with the numbers; exit 0 on PASS.
usage: gpt2_hf_live.py DIR CASE"""
import sys

import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel

d, case = sys.argv[1], sys.argv[2]
c = load_file(case)
ids = c["ids"].long()
model, info = GPT2LMHeadModel.from_pretrained(d, output_loading_info=True)
model.eval()
# Every weight must come from the file: a missing one would be initialised at random.
missing = [k for k in info["missing_keys"] if not k.endswith((".attn.bias", ".attn.masked_bias", "lm_head.weight"))]
if missing or info["unexpected_keys"] or info.get("mismatched_keys"):
    print("FAIL: from_pretrained: missing %s, unexpected %s, mismatched %s"
          % (missing, info["unexpected_keys"], info.get("mismatched_keys")))
    sys.exit(1)
with torch.no_grad():
    out = model(ids, labels=ids)
logits = out.logits.reshape(-1, out.logits.shape[-1])
diff = (logits - c["logits"]).abs().max().item()
scale = c["logits"].abs().max().item()
loss_hf, loss_apex = out.loss.item(), c["loss"].item()
ok = diff <= 1e-4 * max(1.0, scale) and abs(loss_hf - loss_apex) <= 1e-5 * max(1.0, abs(loss_apex))
print("%s: Transformers loss %.6f, apex loss %.6f; logits max |diff| %.2e (scale %.2f)"
      % ("PASS" if ok else "FAIL", loss_hf, loss_apex, diff, scale))
sys.exit(0 if ok else 1)
