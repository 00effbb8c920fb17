#!/usr/bin/python3
"""peer_gpt2.py [BUILD_DIR] [NAME...] [options]: GPT-2 small training, apex against PyTorch on the same GPU.

apex's figure comes from BUILD_DIR/bench/bench_gpt2_stack, the library's GPT-2 (apex_gpt_create, autograd,
amp O2-bf16, AdamW), or from --apex-tokens-per-s when the caller has it already; PyTorch trains the same model nanoGPT's way on the same problem:
  GPT-2 small (12 layers, 768 wide, 12 heads, vocabulary padded to 50304, lm_head tied to wte, GELU in
  the tanh form, F.scaled_dot_product_attention(is_causal=True), no dropout), B = 8 sequences of
  T = 1024 tokens, one fixed batch of synthetic tokens repeated, AdamW(fused=True) with lr 3e-4, betas
  (0.9, 0.95), eps 1e-8, weight decay 0.1 on the 2-D weights only, no gradient clipping (apex's loop
  clips neither), f32 parameters under torch.autocast(bfloat16);
  mode eager: as written; mode compile: torch.compile(model) (its compilation happens in the warm-up and
  is not timed; --compile-timeout bounds it).
Timing as apex's: 3 warm-up steps, 10 steps between two synchronisations, host clock. MFU with nanoGPT's
estimate_mfu, 6 N + 12 L C T FLOPs a token (N = parameters without wpe) over the dense bf16 peak
(989.5 TFLOP/s for an H100 SXM or H200, 756 for an H100 PCIe). Prints, for each mode,
    bench gpt2_small_bf16_vs_torch_MODE APEX_TOKENS_PER_S tokens/s ratio=R peer=...   R = apex / torch
(the targets: R >= 1.4 against eager, R >= 1.0 against compile), and the losses by step.
Skipped, with the reason, without torch or a GPU. --tiny --device cpu runs a 2-layer model on the CPU
to check this script's logic where there is no GPU (no ratio then: apex has no CPU figure).
"""
import argparse
import math
import signal
import subprocess
import sys
import time

REAL_VOCAB = 50257


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build", nargs="?", default="build")
    p.add_argument("names", nargs="*")
    p.add_argument("--apex-tokens-per-s", type=float, default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="2 layers, 64 wide, 4 heads, vocabulary 96, B=2, T=16")
    p.add_argument("--compile-timeout", type=int, default=420, help="seconds allowed for torch.compile's warm-up")
    return p.parse_args()


def peak_flops(name):
    if "H100" in name and "PCIe" in name:
        return 756e12
    if "H100" in name or "H200" in name:
        return 989.5e12
    return 0.0


def build_model(torch, cfg):
    nn, F = torch.nn, torch.nn.functional
    V, maxT, L, C, H = cfg["vocab"], cfg["max_t"], cfg["n_layer"], cfg["n_embd"], cfg["n_head"]
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    def attention(q, k, v):
        if sdpa is not None:
            return sdpa(q, k, v, is_causal=True)
        # torch < 2.0 (this script's CPU check on old installs): the same math by hand
        T = q.size(-2)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = attention(q, k, v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.c_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(maxT, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, V, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            for name, p in self.named_parameters():  # nanoGPT's initialisation
                if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
                elif p.dim() == 2:
                    nn.init.normal_(p, 0.0, 0.02)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)
                else:
                    nn.init.ones_(p)

        def forward(self, idx, targets):
            T = idx.size(1)
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for b in self.h:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT()


def make_optimizer(torch, model, device, lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8):
    """nanoGPT's AdamW (the GPT-2 benchmarks' defaults); gpt2_loss_parity.py passes the values apex trained with."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    kw = dict(lr=lr, betas=betas, eps=eps)
    if device == "cuda":
        try:
            return torch.optim.AdamW(groups, fused=True, **kw), "AdamW(fused=True)"
        except (TypeError, RuntimeError):
            pass
    return torch.optim.AdamW(groups, **kw), "AdamW"


class CompileTimeout(Exception):
    pass


def run_mode(torch, cfg, mode, args):
    """Trains a fresh model for warmup + steps steps; returns (tokens/s, losses, optimizer name)."""
    dev = args.device
    torch.manual_seed(1234)
    model = build_model(torch, cfg).to(dev)
    opt, opt_name = make_optimizer(torch, model, dev)
    step_model = model
    if mode == "compile":
        step_model = torch.compile(model)
    g = torch.Generator().manual_seed(42)
    data = torch.randint(0, min(REAL_VOCAB, cfg["vocab"]), (args.batch, args.seq + 1), generator=g).to(dev)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    losses = []

    def step():
        with torch.autocast(device_type=dev, dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    if mode == "compile" and args.compile_timeout > 0:
        def on_alarm(signum, frame):
            raise CompileTimeout()
        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(args.compile_timeout)
    try:
        for _ in range(args.warmup):
            step()
        sync()
    finally:
        signal.alarm(0)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = time.perf_counter() - t0
    return args.batch * args.seq * args.steps / seconds, [float(v) for v in losses], opt_name


def apex_tokens_per_s(args):
    """apex's tokens/s from bench_gpt2_stack (the library's GPT-2), or (None, why)."""
    if args.apex_tokens_per_s:
        return args.apex_tokens_per_s, None
    exe = args.build + "/bench/bench_gpt2_stack"
    try:
        out = subprocess.run([exe, "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
                              "--warmup", str(args.warmup)], capture_output=True, text=True)
    except OSError as e:
        return None, "cannot run %s: %s" % (exe, e)
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) >= 3 and f[0] == "bench" and f[1] == "gpt2_stack_bf16_tokens_per_s":
            return float(f[2]), None
    last = (out.stdout.strip().splitlines() or [""])[-1]
    return None, "bench_gpt2_stack gave no figure: " + (last or out.stderr.strip()[-300:])


def main():
    args = parse()
    name = "gpt2_small_bf16"
    if args.names and not any(n in name + "_vs_torch_eager_compile" for n in args.names):
        return
    modes = [m for m in args.modes.split(",") if m]
    cfg = dict(vocab=50304, max_t=1024, n_layer=12, n_embd=768, n_head=12)
    if args.tiny:
        cfg = dict(vocab=96, max_t=24, n_layer=2, n_embd=64, n_head=4)
        args.batch, args.seq = min(args.batch, 2), min(args.seq, 16)
        name = "gpt2_tiny_bf16"
    try:
        import torch
    except ImportError as e:
        for m in modes:
            print("bench %s_vs_torch_%s skipped: no torch (%s)" % (name, m, e), flush=True)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        for m in modes:
            print("bench %s_vs_torch_%s skipped: torch sees no GPU" % (name, m), flush=True)
        return
    if args.device == "cuda" or args.apex_tokens_per_s:
        apex_tps, why = apex_tokens_per_s(args)
    else:
        apex_tps, why = None, "no apex figure on the CPU"
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # nanoGPT's settings (autocast's GEMMs are bf16 anyway)
        torch.backends.cudnn.allow_tf32 = True
        dev_name = torch.cuda.get_device_name()
    else:
        dev_name = "cpu"
    n_params = sum(p.numel() for p in build_model(torch, cfg).parameters())  # tied wte counted once
    n_mfu = n_params - cfg["max_t"] * cfg["n_embd"]
    flops_per_token = 6 * n_mfu + 12 * cfg["n_layer"] * cfg["n_embd"] * args.seq
    peak = peak_flops(dev_name)
    print("# peer_gpt2 on %s: torch %s, %.2fM parameters (%.2fM in the MFU estimate), B=%d T=%d, apex %s" % (
        dev_name, torch.__version__, n_params / 1e6, n_mfu / 1e6, args.batch, args.seq,
        "%.0f tokens/s" % apex_tps if apex_tps else "skipped: " + str(why)), flush=True)
    for mode in modes:
        figure = "%s_vs_torch_%s" % (name, mode)
        if mode == "compile" and not hasattr(torch, "compile"):
            print("bench %s skipped: torch %s has no torch.compile" % (figure, torch.__version__), flush=True)
            continue
        try:
            tps, losses, opt_name = run_mode(torch, cfg, mode, args)
        except CompileTimeout:
            print("bench %s skipped: torch.compile's warm-up took more than %d s" % (figure, args.compile_timeout), flush=True)
            continue
        except Exception as e:  # one mode's failure must not hide the other's figure
            print("bench %s skipped: %s: %s" % (figure, type(e).__name__, str(e).splitlines()[0] if str(e) else ""), flush=True)
            continue
        finally:
            if args.device == "cuda":
                torch.cuda.empty_cache()
        mfu = "MFU %.1f%%" % (100 * flops_per_token * tps / peak) if peak else "MFU n/a"
        print("# torch %s: %.0f tokens/s, %.1f ms/step, %s; loss by step: %s" % (
            mode, tps, 1e3 * args.batch * args.seq / tps, mfu, " ".join("%.4f" % v for v in losses)), flush=True)
        peer = "%s, autocast(bf16) over f32 params, %s (%.0f tokens/s, %s)" % (
            "torch eager" if mode == "eager" else "torch.compile", opt_name, tps, mfu)
        if apex_tps:
            print("bench %s %.1f tokens/s ratio=%.3f peer=%s" % (figure, apex_tps, apex_tps / tps, peer), flush=True)
        else:
            print("bench %s skipped: %s; peer=%s" % (figure, why, peer), flush=True)


if __name__ == "__main__":
    main()
