#!/usr/bin/python3
"""peer_gpt2_memory.py [BUILD_DIR] [NAME...] [--configs B:LEVEL,...] [--small]: the peak resident memory
of a GPT-2 small training step on the CPU, apex against PyTorch in the same run.

For each configuration (default B 1 and 8, T 1024, O0 and O2) two processes, one after the other:
  apex:    BUILD_DIR/bench/bench_gpt2_memory --batch B --opt-level LEVEL --peer-gb X (models.h's
           apex_gpt_create, amp LEVEL with bf16, AdamW; two steps on one fixed batch)
  PyTorch: this script with --child: peer_gpt2.py's nanoGPT model with GPT-2's 50257 tokens (the head
           tied to wte, no dropout), the same two steps with torch.optim.AdamW; O0 in f32, O2 as a
           PyTorch user trains in bf16 (f32 parameters under torch.autocast(cpu, bfloat16))
each reporting its own peak (getrusage ru_maxrss: a peak is per process). apex's line carries the ratio:
    bench gpt2_memory_B1_T1024_O2_peak_rss GB ratio=R peer=PyTorch X GB ...   R = apex / PyTorch
(the issue's target: R <= 1.0 at O2). Skipped, with the reason, without torch; a configuration whose
processes fail (out of memory) says so. --small runs a 2-layer, 64-wide model at T 64 (a check of
this script's logic, not a figure)."""
import argparse
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(args):
    import torch

    sys.path.insert(0, HERE)
    from peer_gpt2 import build_model, make_optimizer

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    T = args.seq
    cfg = dict(vocab=50257, max_t=T, n_layer=2 if args.small else 12, n_embd=64 if args.small else 768, n_head=4 if args.small else 12)
    torch.manual_seed(1234)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model = build_model(torch, cfg)
    opt, _ = make_optimizer(torch, model, "cpu")
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 50257, (args.batch, T + 1), generator=g)
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    t0 = time.time()
    losses = []
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.level == "O2"):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("peak %.0f before %.0f seconds %.2f losses %s torch %s" % (peak, before, time.time() - t0, losses, torch.__version__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("names", nargs="*")
    ap.add_argument("--configs", default="1:O0,1:O2,8:O0,8:O2")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0))
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--level", default="O2")
    args, _ = ap.parse_known_args()
    if args.small:
        args.seq = 64
    if args.child:
        return child(args)
    if args.names and not any(n in "gpt2_memory" or "gpt2_memory" in n for n in args.names):
        return 0
    # Not imported here: a process's peak RSS carries over into the processes it starts (fork copies the
    # parent's resident pages' count, exec keeps the peak), so this process stays small.
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0:
        print("bench gpt2_memory skipped: no torch in %s (run bench/setup_peers.sh)" % sys.executable)
        return 0
    exe = os.path.join(args.build, "bench", "bench_gpt2_memory")
    if not os.access(exe, os.X_OK):
        print("bench gpt2_memory skipped: %s is not built" % exe)
        return 0
    for c in args.configs.split(","):
        B, level = c.split(":")
        common = ["--batch", B, "--seq", str(args.seq)] + (["--threads", str(args.threads)] if args.threads > 0 else [])
        tc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--level", level] + common + (["--small"] if args.small else []),
                            capture_output=True, text=True)
        line = [l for l in tc.stdout.splitlines() if l.startswith("peak ")]
        if tc.returncode != 0 or not line:
            print("bench gpt2_memory_B%s_T%d_%s_peak_rss failed: PyTorch's step: exit %d %s" % (B, args.seq, level, tc.returncode, tc.stderr.strip()[-300:]))
            continue
        f = line[0].split()
        peer_gb = float(f[1]) / 1e9
        print("# PyTorch %s, B=%s T=%d %s: peak RSS %.2f GB (%.2f GB before the model), 2 steps in %s s, losses %s" % (
            f[-1], B, args.seq, "bf16 autocast, f32 parameters" if level == "O2" else "f32", peer_gb, float(f[3]) / 1e9, f[5],
            " ".join(f[7:-2])))
        sys.stdout.flush()
        ac = subprocess.run([exe, "--opt-level", level, "--peer-gb", "%.4f" % peer_gb] + common + (["--small"] if args.small else []),
                            capture_output=True, text=True)
        out = ac.stdout.strip()
        if ac.returncode != 0 or "bench " not in out:
            print("bench gpt2_memory_B%s_T%d_%s_peak_rss failed: apex's step: exit %d %s" % (B, args.seq, level, ac.returncode, (ac.stderr or out)[-300:]))
            continue
        print(out)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
