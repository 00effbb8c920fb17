#!/usr/bin/env python3
"""peer_nn.py: the PyTorch peer of bench/bench_nn.c and bench/bench_contention.c.

Those programs run `PY peer_nn.py --measure MODEL MODE` themselves, with PY the Python of today's
PyTorch from PyPI (bench/setup_peers.sh installs it into .peers/), and print the bench lines with
both figures, so that apex and PyTorch are measured in the same invocation, on the same threads,
model and batch. Called by bench/run (with the build dir as argument) it only says whether it can
run: "skipped: no PyPI torch" when torch does not import.

--measure MODEL MODE [THREADS] prints one number: the best training-step rate in samples/s (tokens/s
for the GPTs) of the model bench/bench_models.h describes (mlp, cnn, gpt_c256, gpt_c768), with
cross-entropy and AdamW (foreach, lr 1e-3, weight decay 1e-2) on THREADS threads (default
OMP_NUM_THREADS, else 2). --serve answers such requests from stdin for bench_scaling (see serve()):
  f32       eager f32;
  autocast  eager under torch.autocast("cpu", dtype=torch.bfloat16) (forward and loss; backward
            follows autocast's dtypes, AdamW on the f32 parameters), as PyTorch's CPU mixed precision;
  compile   torch.compile of the model (forward and, through AOTAutograd, backward) in f32, AdamW eager.
It prints nothing (exit 1) when the mode cannot run here.
"""
import math
import os
import sys
import time

GPT = {"gpt_c256": (4, 256), "gpt_c768": (12, 768)}
SEQ, VOCAB, HEAD_DIM, GPT_BATCH, IMG_BATCH = 256, 256, 64, 4, 128


def gpt(nn, F, torch, n_layer, dim):
    class Block(nn.Module):
        # apex_transformer_block: x + attn(ln1(x)); x + proj(gelu_tanh(fc(ln2(x))))
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
            self.fc, self.proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
            self.heads = dim // HEAD_DIM

        def forward(self, x):
            B, T, C = x.shape
            h = self.ln1(x)
            q, k, v = (m(h).view(B, T, self.heads, HEAD_DIM).transpose(1, 2) for m in (self.q, self.k, self.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            x = x + self.o(a)
            return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, dim), nn.Embedding(SEQ, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(dim)
            self.register_buffer("pos", torch.arange(SEQ), persistent=False)

        def forward(self, ids):
            h = self.wte(ids) + self.wpe(self.pos)
            for b in self.blocks:
                h = b(h)
            return (self.ln_f(h) @ self.wte.weight.t()).view(-1, VOCAB)  # tied output

    return GPT()


def build(name, torch, nn, F):
    if name in GPT:
        net = gpt(nn, F, torch, *GPT[name])
        ids = torch.tensor([(i * 37 + i // 7) % VOCAB for i in range(GPT_BATCH * SEQ)])
        return net, ids.view(GPT_BATCH, SEQ), torch.roll(ids, -1), GPT_BATCH * SEQ
    if name == "mlp":
        net, shape = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)), (784,)
    else:
        net, shape = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)), (1, 28, 28)
    return net, torch.randn(IMG_BATCH, *shape), torch.arange(IMG_BATCH) * 7 % 10, IMG_BATCH


def make_step(name, mode):
    """The training step of model `name` in `mode`, warmed up, and the samples it trains."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.manual_seed(0)
    net, x, y, samples = build(name, torch, nn, F)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-2, foreach=True)
    fwd = torch.compile(net) if mode == "compile" else net

    def step():
        opt.zero_grad(set_to_none=False)
        if mode == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(fwd(x), y)
        else:
            loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()

    for _ in range(1 if name in GPT else 3):
        step()
    return step, samples


def best_rate(step, samples, min_reps, seconds):
    best, start, reps = math.inf, time.perf_counter(), 0
    while reps < min_reps or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return samples / best


def measure(name, mode, threads):
    import torch
    torch.set_num_threads(threads)
    step, samples = make_step(name, mode)
    big = name in GPT
    print("%.3f" % best_rate(step, samples, 2 if big else 5, 0.0 if big else 1.0), flush=True)


def serve():
    """bench_scaling's peer: one process for a whole run. Each stdin line `MODEL MODE THREADS SECONDS`
    gets one stdout line, the best step rate over at least SECONDS (one step at least for the GPTs,
    three for the others) on THREADS threads, or 0 when the mode cannot run. Models are built and
    warmed once, on their first request."""
    import torch
    steps = {}
    for line in sys.stdin:
        try:
            name, mode, threads, seconds = line.split()
            torch.set_num_threads(int(threads))
            if (name, mode) not in steps:
                steps[name, mode] = make_step(name, mode)
            step, samples = steps[name, mode]
            rate = best_rate(step, samples, 1 if name in GPT else 3, float(seconds))
        except Exception as e:  # noqa: BLE001 - any failure is "this mode cannot run here"
            print("peer_nn --serve: %s %s" % (line.strip(), e), file=sys.stderr)
            rate = 0.0
        print("%.3f" % rate, flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--measure":
        measure(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) >= 5 else int(os.environ.get("OMP_NUM_THREADS", "2")))
    elif len(sys.argv) >= 2 and sys.argv[1] == "--serve":
        serve()
    else:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("bench peer_nn skipped: no PyPI torch (run bench/setup_peers.sh)")
