#!/usr/bin/env python3
"""peer_optim.py BUILD_DIR [NAME...]: apex's fused optimizers against PyTorch (today's, from PyPI: bench/run
runs this script with the Python of .peers/, bench/setup_peers.sh) and DeepSpeed on the same machine and
thread count, in the same bench/run invocation.

For each figure this script times PyTorch's step (best of several) and runs BUILD_DIR/bench/bench_optim
--time NAME for apex's best step time on the same problem (10M parameters in 20 tensors), in ROUNDS
interleaved rounds (peer, apex, peer, apex, ...) so that both see the same moments of a shared machine,
keeps the best of each, and prints
    bench NAME_vs_torch GBS GB/s ratio=R peer=PEER
where GBS is apex's effective GB/s (the byte counts of bench/bench_optim.c) and R = torch time / apex time.

Peers: torch.optim.AdamW(foreach=True); torch.optim.SGD(momentum=0.9, foreach=True); LAMB written with
torch._foreach_* ops (PyTorch has no LAMB; the same update as Apex's FusedLAMB); AdamW(foreach=True) on
f32 master copies of bf16 parameters, with the bf16 gradients widened into the masters' .grad and the
masters copied back into the bf16 parameters every step (what Apex's O2 does around the step).

    bench optim_adamw_f32 GBS GB/s ratio=R peer=deepspeed-cpu-adam
is AdamW on the same 10M f32 parameters against DeepSpeed's DeepSpeedCPUAdam (adamw_mode, its AVX-512
C++ op, built by DeepSpeed on first use into ~/.cache/torch_extensions), the fastest CPU Adam in the
field; R = DeepSpeed time / apex time (target >= 1.0).
"""
import os
import subprocess
import sys
import time

NPARAMS, NTENSORS = 10_000_000, 20
ROUNDS = 3
BYTES = {"optim_adamw_f32": 28, "optim_sgd_momentum_f32": 20, "optim_lamb_f32": 28, "optim_adamw_bf16_master": 28}


def skip(name, why):
    print("bench %s_vs_torch skipped: %s" % (name, why), flush=True)


def best(fn, reps=5, warmup=2, min_seconds=1.0):
    """Best step time over at least `reps` steps and `min_seconds`: bench_best's rule in bench_optim
    --time, so that the peer's minimum is taken over as many chances as apex's."""
    for _ in range(warmup):
        fn()
    t = float("inf")
    start = time.perf_counter()
    k = 0
    while k < reps or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
        k += 1
    return t


def make(torch, dtype=None):
    n = NPARAMS // NTENSORS
    dtype = dtype or torch.float32
    ps = [torch.full((n,), 0.5 + 0.01 * i, dtype=dtype) for i in range(NTENSORS)]
    gs = [torch.full((n,), 1e-3 * (i + 1), dtype=dtype) for i in range(NTENSORS)]
    return ps, gs


def torch_adamw(torch):
    ps, gs = make(torch)
    for p, g in zip(ps, gs):
        p.grad = g
    opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, foreach=True)
    return lambda: opt.step(), "torch-AdamW-foreach"


def torch_sgd(torch):
    ps, gs = make(torch)
    for p, g in zip(ps, gs):
        p.grad = g
    opt = torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=True)
    return lambda: opt.step(), "torch-SGD-momentum-foreach"


def torch_lamb(torch):
    ps, gs = make(torch)
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]
    b1, b2, eps, lr, wd, maxn = 0.9, 0.999, 1e-6, 1e-3, 0.01, 1.0
    state = {"t": 0}

    def step():
        state["t"] += 1
        t = state["t"]
        gnorm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(gs))).item()
        clip = gnorm / maxn if gnorm > maxn else 1.0
        g = torch._foreach_div(gs, clip)
        torch._foreach_mul_(ms, b1)
        torch._foreach_add_(ms, g, alpha=1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, g, g, value=1 - b2)
        den = torch._foreach_sqrt(torch._foreach_div(vs, 1 - b2 ** t))
        torch._foreach_add_(den, eps)
        u = torch._foreach_div(torch._foreach_div(ms, 1 - b1 ** t), den)
        torch._foreach_add_(u, ps, alpha=wd)
        pn, un = torch._foreach_norm(ps), torch._foreach_norm(u)
        ratios = [(lr * float(a) / float(b)) if float(a) and float(b) else lr for a, b in zip(pn, un)]
        for p, x, r in zip(ps, u, ratios):
            p.add_(x, alpha=-r)

    return step, "torch-foreach-LAMB"


def torch_adamw_bf16(torch):
    model, gs = make(torch, torch.bfloat16)
    masters = [p.float() for p in model]
    opt = torch.optim.AdamW(masters, lr=1e-3, weight_decay=0.01, foreach=True)

    def step():
        for m, g in zip(masters, gs):
            m.grad = g.float()
        opt.step()
        for p, m in zip(model, masters):
            p.copy_(m)

    return step, "torch-AdamW-foreach-bf16-O2"


def deepspeed_adamw(torch):
    import logging
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # it warns when it has to guess
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    ps, gs = make(torch)
    for p, g in zip(ps, gs):
        p.grad = g
    opt = DeepSpeedCPUAdam(ps, lr=1e-3, weight_decay=0.01, adamw_mode=True)
    return lambda: opt.step(), "deepspeed-cpu-adam"


PEERS = {"optim_adamw_f32": torch_adamw, "optim_sgd_momentum_f32": torch_sgd, "optim_lamb_f32": torch_lamb,
         "optim_adamw_bf16_master": torch_adamw_bf16}


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    wanted = sys.argv[2:]
    names = [n for n in PEERS if not wanted or any(w in n + "_vs_torch" for w in wanted)]
    if not names:
        return
    try:
        import torch
    except ImportError as e:
        for n in names:
            skip(n, "no PyPI torch (run bench/setup_peers.sh): %s" % e)
        return
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    exe = os.path.join(build, "bench", "bench_optim")

    def apex_time(name):
        out = subprocess.run([exe, "--time", name], capture_output=True, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
        if out.returncode != 0 or not out.stdout.startswith("time "):
            return None, "bench_optim --time failed: %s" % (out.stderr.strip() or out.stdout.strip())
        return float(out.stdout.split()[2]), None

    def interleaved(fn, name):
        """Best peer time and best apex time over ROUNDS alternating rounds; (None, why) if apex fails."""
        peer_s = apex_s = float("inf")
        for _ in range(ROUNDS):
            with torch.no_grad():
                peer_s = min(peer_s, best(fn))
            a, why = apex_time(name)
            if a is None:
                return None, None, why
            apex_s = min(apex_s, a)
        return peer_s, apex_s, None

    for name in names:
        with torch.no_grad():
            fn, peer = PEERS[name](torch)
        torch_s, apex_s, why = interleaved(fn, name)
        del fn
        if apex_s is None:
            skip(name, why)
            continue
        gbs = BYTES[name] * NPARAMS / apex_s / 1e9
        print("bench %s_vs_torch_%dthreads %.3f GB/s ratio=%.3f peer=%s" % (name, threads, gbs, torch_s / apex_s, peer),
              flush=True)
    if "optim_adamw_f32" in names:
        try:
            with torch.no_grad():
                fn, peer = deepspeed_adamw(torch)
                fn()  # builds or loads its C++ op outside the timed rounds
        except Exception as e:  # not installed, or its C++ op does not build here
            print("bench optim_adamw_f32 skipped: peer=deepspeed-cpu-adam did not run (%s)" % str(e).splitlines()[0][:200])
            return
        ds_s, apex_s, why = interleaved(fn, "optim_adamw_f32")
        del fn
        if apex_s is None:
            print("bench optim_adamw_f32 skipped: %s" % why)
            return
        print("bench optim_adamw_f32 %.3f GB/s ratio=%.3f peer=deepspeed-cpu-adam" % (BYTES["optim_adamw_f32"] * NPARAMS / apex_s / 1e9,
                                                                                  ds_s / apex_s), flush=True)


if __name__ == "__main__":
    main()
