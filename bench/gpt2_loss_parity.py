#!/usr/bin/python3
"""gpt2_loss_parity.py [options]: apex's GPT-2 and PyTorch's, from the same weights on the same batch, must give
the same losses step by step.

apex's half is bench/gpt2_loss_dump (run by this script with --apex BIN, or run before and named by --from DIR):
a C program on the library's public API alone (apex_gpt_create, apex_gpt_loss, amp, AdamW), it writes the model's
initial parameters (f32, under apex's names, a linear's weight [out, in]), the batch and the run's settings into a
directory, trains N steps (13) and writes its loss at each step. This script loads those
parameters into bench/peer_gpt2.py's model (the one PyTorch model of the benchmarks), trains the same N steps on the
same batch with the same AdamW (peer_gpt2.make_optimizer: betas 0.9/0.95, eps 1e-8, weight decay on the 2-D weights,
fused on a GPU) and compares:
    step i: apex L_a torch L_t rel d                    d = |L_a - L_t| / L_t
    bench gpt2_small_bf16_loss_parity MAXREL max_rel ratio=R peer=...   MAXREL = max over the steps of d,
                                                        R = L_a / L_t at the last step
    PASS (or FAIL) gpt2_small_bf16_loss_parity: ...     against --tol (0.01: 1%)
What is compared in bf16 (the default): apex runs amp O2 with bf16: bf16 parameters and activations with f32
master weights and moments in the optimizer (Apex's O2), the masters being what PyTorch's f32 parameters start from, PyTorch keeps f32 parameters and runs the forward under
torch.autocast(bfloat16) (nanoGPT's way). The two round differently (apex's GEMM outputs and residual stream are
bf16; autocast's products are bf16 but its layer norms, softmax and residual adds are f32), so the losses differ by
rounding, about 0.1%, which 13 steps of AdamW on a repeated batch do not grow past 1%. --f32 compares f32 with f32
(no autocast, TF32 off), where the difference is summation order only.

Options: --apex BIN (gpt2_loss_dump to run) or --from DIR (its files, already written); --out DIR (where BIN
writes; a temporary directory, removed afterwards, by default); --device cuda|cpu (cuda); --tiny (2 layers,
64 wide, vocabulary 96, B=2, T=16); --f32; --steps N (13); --tol X (0.01). With --device cpu --tiny apex runs on
its CPU kernels and PyTorch on the CPU: the whole check where there is no GPU (tests/CMakeLists.txt's
test_gpt2_loss_parity, in f32). Exit status 0 on PASS, 1 on FAIL or an error, 77 (skipped, with the reason) without
torch, without a GPU for --device cuda, or when gpt2_loss_dump skips.
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_gpt2  # noqa: E402  the model and the optimizer, defined once

SKIP = 77

# apex's names (apex_model_param's, as gpt2_loss_dump writes them) -> peer_gpt2.build_model's; both store a linear's
# weight [out, in]. apex keeps the attention's q, k and v as three linears: torch's c_attn is their rows stacked q|k|v.
LAYER_NAMES = {"ln1.weight": "ln_1.weight", "ln1.bias": "ln_1.bias", "attn.proj.weight": "c_proj.weight",
               "attn.proj.bias": "c_proj.bias", "ln2.weight": "ln_2.weight", "ln2.bias": "ln_2.bias",
               "fc.weight": "c_fc.weight", "fc.bias": "c_fc.bias", "proj.weight": "mlp_proj.weight",
               "proj.bias": "mlp_proj.bias"}
TOP_NAMES = {"wte.weight": "wte.weight", "wpe.weight": "wpe.weight", "ln_f.weight": "ln_f.weight",
             "ln_f.bias": "ln_f.bias"}
QKV = re.compile(r"^h(\d+)\.attn\.([qkv])\.(weight|bias)$")


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--apex", help="the gpt2_loss_dump binary to run")
    src.add_argument("--from", dest="from_dir", help="a directory gpt2_loss_dump wrote")
    p.add_argument("--out", help="where gpt2_loss_dump writes (default: a temporary directory)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--f32", action="store_true")
    p.add_argument("--steps", type=int, default=13)
    p.add_argument("--tol", type=float, default=0.01)
    return p.parse_args()


def torch_name(apex_name):
    """torch's name for an apex parameter; for q, k and v, (c_attn's name, which third)."""
    if apex_name in TOP_NAMES:
        return TOP_NAMES[apex_name]
    m = QKV.match(apex_name)
    if m:
        return ("h.%s.c_attn.%s" % (m.group(1), m.group(3)), "qkv".index(m.group(2)))
    block, rest = apex_name.split(".", 1)
    if not block.startswith("h") or rest not in LAYER_NAMES:
        raise ValueError("gpt2_loss_dump wrote %s, which this script cannot place" % apex_name)
    return "h.%s.%s" % (block[1:], LAYER_NAMES[rest])


def read_safetensors(path):
    """{name: (dtype, shape, bytes)}, metadata: the format read by hand (the safetensors package may be absent)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], body[b:e])
    return out, meta


def run_apex(args, out_dir):
    cmd = [args.apex, "--out", out_dir, "--steps", str(args.steps), "--device", args.device]
    cmd += ["--tiny"] if args.tiny else []
    cmd += ["--f32"] if args.f32 else []
    r = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    return r.returncode


def train_torch(torch, tensors, meta, batch_bytes, device):
    cfg = {k: int(meta[k]) for k in ("vocab", "max_t", "n_layer", "n_embd", "n_head")}
    B, T, steps = int(meta["batch"]), int(meta["seq"]), int(meta["steps"])
    bf16 = meta["dtype"] == "bf16"
    model = peer_gpt2.build_model(torch, cfg)
    params = dict(model.named_parameters())  # the tied lm_head is wte: named once
    loaded = {}  # torch name -> the parts of it set (c_attn: its thirds)
    with torch.no_grad():
        for name, (dtype, shape, raw) in tensors.items():
            if dtype != "F32":
                raise ValueError("%s is %s; gpt2_loss_dump writes F32" % (name, dtype))
            tn = torch_name(name)
            tn, third = tn if isinstance(tn, tuple) else (tn, None)
            p = params[tn]
            dst = p if third is None else p.narrow(0, third * (p.shape[0] // 3), p.shape[0] // 3)
            v = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(*shape)
            if tuple(dst.shape) != tuple(v.shape):
                raise ValueError("%s: apex's shape %s, torch's %s" % (name, list(v.shape), list(dst.shape)))
            dst.copy_(v)
            loaded.setdefault(tn, set()).add(third)
    missing = sorted(n for n in params if n not in loaded or ("c_attn" in n and loaded[n] != {0, 1, 2}))
    if missing:
        raise ValueError("no apex value for torch's %s" % ", ".join(missing))
    model = model.to(device)
    opt, opt_name = peer_gpt2.make_optimizer(torch, model, device, lr=float(meta["lr"]),
                                             weight_decay=float(meta["weight_decay"]),
                                             betas=(float(meta["beta1"]), float(meta["beta2"])), eps=float(meta["eps"]))
    ids = torch.frombuffer(bytearray(batch_bytes), dtype=torch.int64)
    if ids.numel() != 2 * B * T:
        raise ValueError("batch.i64 holds %d ids, %d expected (B=%d T=%d)" % (ids.numel(), 2 * B * T, B, T))
    x, y = ids[:B * T].view(B, T).to(device), ids[B * T:].view(B, T).to(device)
    losses = []
    for _ in range(steps):
        if bf16:
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = model(x, y)
        else:
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    return losses, opt_name, cfg, B, T


def main():
    args = parse()
    size = "tiny" if args.tiny else "small"
    figure = "gpt2_%s_%s_loss_parity" % (size, "f32" if args.f32 else "bf16")
    try:
        import torch
    except ImportError as e:
        print("bench %s skipped: no torch (%s)" % (figure, e), flush=True)
        return SKIP
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench %s skipped: torch sees no GPU" % figure, flush=True)
        return SKIP
    tmp = None
    d = args.from_dir
    if args.apex:
        d = args.out or tempfile.mkdtemp(prefix="apex_gpt2_loss_parity_")
        tmp = None if args.out else d
    try:
        if args.apex:
            rc = run_apex(args, d)
            if rc == SKIP:
                print("bench %s skipped: gpt2_loss_dump skipped" % figure, flush=True)
                return SKIP
            if rc != 0:
                print("FAIL %s: gpt2_loss_dump exited with %d" % (figure, rc), flush=True)
                return 1
        tensors, meta = read_safetensors(os.path.join(d, "init.safetensors"))
        shape = (int(meta["n_layer"]), int(meta["n_embd"]), int(meta["vocab"]))
        size = {(12, 768, 50304): "small", (2, 64, 96): "tiny"}.get(shape, "custom")
        figure = "gpt2_%s_%s_loss_parity" % (size, meta["dtype"])
        with open(os.path.join(d, "batch.i64"), "rb") as f:
            batch = f.read()
        with open(os.path.join(d, "apex_losses.txt")) as f:
            apex_losses = [float(v) for v in f.read().split()]
        if args.device == "cuda":
            # f32 against f32 means no TF32 on either side's products; under autocast the products are bf16 anyway
            torch.backends.cuda.matmul.allow_tf32 = meta["dtype"] == "bf16"
            torch.backends.cudnn.allow_tf32 = meta["dtype"] == "bf16"
        torch.manual_seed(0)  # build_model draws an initialisation that the loaded values replace
        torch_losses, opt_name, cfg, B, T = train_torch(torch, tensors, meta, batch, args.device)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    dev_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    how = ("apex bf16 parameters with f32 masters; torch f32 parameters under autocast(bf16)" if meta["dtype"] == "bf16"
           else "f32 on both sides")
    print("# gpt2_loss_parity on %s: torch %s, %d layers, %d wide, %d heads, vocabulary %d, B=%d T=%d, %d steps, %s, "
          "apex on the %s, torch %s" % (dev_name, torch.__version__, cfg["n_layer"], cfg["n_embd"], cfg["n_head"],
                                         cfg["vocab"], B, T, len(torch_losses), how, meta["device"], opt_name), flush=True)
    if len(apex_losses) != len(torch_losses):
        print("FAIL %s: apex wrote %d losses, torch trained %d steps" % (figure, len(apex_losses), len(torch_losses)))
        return 1
    rels = []
    for i, (a, t) in enumerate(zip(apex_losses, torch_losses)):
        rels.append(abs(a - t) / abs(t) if t != 0 else float("inf"))
        print("step %d: apex %.6f torch %.6f rel %.2e" % (i, a, t, rels[-1]))
    worst = float("nan") if any(r != r for r in rels) else max(rels)  # a NaN loss fails below
    ratio = apex_losses[-1] / torch_losses[-1] if torch_losses[-1] else float("nan")
    print("bench %s %.3e max_rel ratio=%.4f peer=torch-eager (%s, %s; ratio = apex / torch loss at the last step)" % (
        figure, worst, ratio, "autocast(bf16) over f32 params" if meta["dtype"] == "bf16" else "f32", opt_name))
    ok = worst <= args.tol
    print("%s %s: max over %d steps of |L_apex - L_torch| / L_torch = %.3e %s %.3g (losses %.4f -> %.4f apex, "
          "%.4f -> %.4f torch)" % ("PASS" if ok else "FAIL", figure, len(torch_losses), worst, "<=" if ok else ">",
                                   args.tol, apex_losses[0], apex_losses[-1], torch_losses[0], torch_losses[-1]),
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
