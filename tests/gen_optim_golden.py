#!/usr/bin/python3
"""gen_optim_golden.py: writes tests/data/optim_golden.bin, the reference trajectories that
tests/test_optim_golden.c checks apex's optimizers against.

Run with Debian's python3-torch (1.13, CPU): /usr/bin/python3 tests/gen_optim_golden.py

Where the expected values come from:
  * SGD, Adam, AdamW, Adadelta, Adagrad, RMSprop: torch.optim itself, run in float64 (for Adam and
    AdamW, torch.optim.AdamW when the case's adam_w_mode is on, torch.optim.Adam when it is off).
  * AdamP, LAMB, RMSpropTF, NovoGrad, and the Apex-only options of SGD (wd_after_momentum), Adam
    (bias_correction off) and Adagrad (adagrad_w_mode): the plain float64 references below, written
    from the papers' update rules and the authors' reference code (cited at each function), not
    from apex's kernels.

Every case: a few small tensors in one or two parameter groups, 12 steps, per-step learning rates
(a schedule), gradients stored multiplied by a power-of-two loss scale (the test passes it as
grad_scale), and sometimes a parameter without gradient. Initial values and gradients are float32
numbers; the trajectory is computed in float64 from them.

File layout (little-endian):
  "APXOGLD1" u32 ncases
  per case: str name, str kind, u32 ngroups, per group str options ("lr=0.1 momentum=0.9"),
            u32 ntensors, per tensor u32 group u32 ndim u32 dims[ndim],
            u32 nsteps, f32 grad_scale, f32 init[total],
            per step: f32 lr[ngroups], u8 has_grad[ntensors], f32 grad[total] (scaled), f64 expect[total]
  str = u32 length + bytes.
"""
import math
import os
import struct

import torch

torch.set_default_dtype(torch.float64)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "optim_golden.bin")
STEPS = 12
SHAPES = [(4, 5), (7,), (3, 2, 2)]
SCALE = 1024.0


def f32(t):
    return t.to(torch.float32).to(torch.float64)


# ---- independent float64 references ---------------------------------------------------------------

class Ref:
    """Per-parameter state and step counts, like torch.optim; `update(i, p, g, o, st)` does one param."""

    def __init__(self, groups):
        self.groups = groups  # list of (params, options dict)
        self.state = {}

    def step(self):
        self.prepare()
        for params, o in self.groups:
            for p in params:
                if p.grad is None:
                    continue
                st = self.state.setdefault(id(p), {"step": 0})
                st["step"] += 1
                self.update(p, p.grad, o, st)

    def prepare(self):
        pass


class SGDRef(Ref):
    """torch.optim.SGD's rule with Apex FusedSGD's wd_after_momentum (multi_tensor_sgd_kernel.cu)."""

    def update(self, p, g, o, st):
        wd, mom, damp = o.get("weight_decay", 0), o.get("momentum", 0), o.get("dampening", 0)
        after = o.get("wd_after_momentum", 0)
        if wd and not after:
            g = g + wd * p
        if mom:
            if "buf" not in st:
                st["buf"] = g.clone()
            else:
                st["buf"] = mom * st["buf"] + (1 - damp) * g
            g = g + mom * st["buf"] if o.get("nesterov", 0) else st["buf"]
        if wd and after:
            g = g + wd * p
        p.data -= o["lr"] * g


class AdamRef(Ref):
    """Kingma & Ba's Adam (Algorithm 1), eps added after the bias-corrected sqrt as in torch, with
    bias correction optional as in Apex FusedAdam."""

    def update(self, p, g, o, st):
        b1, b2, eps = o.get("beta1", 0.9), o.get("beta2", 0.999), o.get("eps", 1e-8)
        g = g + o.get("weight_decay", 0) * p
        st.setdefault("m", torch.zeros_like(p))
        st.setdefault("v", torch.zeros_like(p))
        st["m"] = b1 * st["m"] + (1 - b1) * g
        st["v"] = b2 * st["v"] + (1 - b2) * g * g
        t = st["step"]
        bc1, bc2 = (1 - b1 ** t, 1 - b2 ** t) if o.get("bias_correction", 1) else (1.0, 1.0)
        p.data -= o["lr"] / bc1 * st["m"] / (st["v"].sqrt() / math.sqrt(bc2) + eps)


class AdagradRef(Ref):
    """Duchi et al.'s Adagrad with Apex FusedAdagrad's adagrad_w_mode (decoupled weight decay):
    p -= lr * (g / (sqrt(h) + eps) + wd * p)."""

    def update(self, p, g, o, st):
        eps, wd = o.get("eps", 1e-10), o.get("weight_decay", 0)
        st.setdefault("h", torch.full_like(p, o.get("initial_accumulator_value", 0)))
        st["h"] = st["h"] + g * g
        p.data -= o["lr"] * (g / (st["h"].sqrt() + eps) + wd * p)


class AdamPRef(Ref):
    """AdamP (Heo et al., ICLR 2021, Algorithm 2 and clovaai/AdamP): Adam's step, projected onto the
    tangent space of the weights when the gradient is nearly orthogonal to them (cosine below
    delta / sqrt(dim), tried per output channel, then for the whole layer); weight decay scaled by
    wd_ratio when projected."""

    def update(self, p, g, o, st):
        b1, b2, eps = o.get("beta1", 0.9), o.get("beta2", 0.999), o.get("eps", 1e-8)
        delta, wd_ratio, wd = o.get("delta", 0.1), o.get("wd_ratio", 0.1), o.get("weight_decay", 0)
        st.setdefault("m", torch.zeros_like(p))
        st.setdefault("v", torch.zeros_like(p))
        st["m"] = b1 * st["m"] + (1 - b1) * g
        st["v"] = b2 * st["v"] + (1 - b2) * g * g
        t = st["step"]
        denom = st["v"].sqrt() / math.sqrt(1 - b2 ** t) + eps
        m = b1 * st["m"] + (1 - b1) * g if o.get("nesterov", 0) else st["m"]
        perturb = m / denom
        ratio = 1.0
        if p.dim() > 1:
            for rows in (p.shape[0], 1):
                P, G, U = p.reshape(rows, -1), g.reshape(rows, -1), perturb.reshape(rows, -1)
                cos = [abs(float(G[r] @ P[r])) / (max(float(G[r].norm()), eps) * max(float(P[r].norm()), eps))
                       for r in range(rows)]
                threshold = delta / math.sqrt(P.shape[1])
                assert abs(max(cos) / threshold - 1) > 0.05, "cosine too close to the threshold for a stable test"
                if max(cos) < threshold:
                    for r in range(rows):
                        pn = P[r] / (P[r].norm() + eps)
                        U[r] -= pn * float(pn @ U[r])
                    perturb = U.reshape(p.shape)
                    ratio = wd_ratio
                    break
        if wd > 0:
            p.data *= 1 - o["lr"] * wd * ratio
        p.data -= o["lr"] / (1 - b1 ** t) * perturb


class LambRef(Ref):
    """LAMB (You et al., ICLR 2020, Algorithm 2) as NVIDIA's FusedLAMB runs it: the gradients of all
    groups clipped to max_grad_norm by their global norm, an Adam-style update (L2 or decoupled
    decay, beta3 = 1 - beta1 with grad averaging), then the layer-wise trust ratio ||p|| / ||u||
    when weight_decay != 0 or use_nvlamb."""

    def prepare(self):
        gs = [p.grad for params, _ in self.groups for p in params if p.grad is not None]
        self.gnorm = math.sqrt(sum(float((g * g).sum()) for g in gs))

    def update(self, p, g, o, st):
        b1, b2, eps, wd = o.get("beta1", 0.9), o.get("beta2", 0.999), o.get("eps", 1e-6), o.get("weight_decay", 0)
        maxn = o.get("max_grad_norm", 1.0)
        if maxn > 0 and self.gnorm > maxn:
            g = g / (self.gnorm / maxn)
        w_mode = o.get("adam_w_mode", 1)
        if not w_mode:
            g = g + wd * p
        b3 = 1 - b1 if o.get("grad_averaging", 1) else 1.0
        st.setdefault("m", torch.zeros_like(p))
        st.setdefault("v", torch.zeros_like(p))
        st["m"] = b1 * st["m"] + b3 * g
        st["v"] = b2 * st["v"] + (1 - b2) * g * g
        t = st["step"]
        bc1, bc2 = (1 - b1 ** t, 1 - b2 ** t) if o.get("bias_correction", 1) else (1.0, 1.0)
        u = (st["m"] / bc1) / ((st["v"] / bc2).sqrt() + eps)
        if w_mode:
            u = u + wd * p
        lr = o["lr"]
        if wd != 0 or o.get("use_nvlamb", 0):
            pn, un = float(p.norm()), float(u.norm())
            if pn != 0 and un != 0:
                lr = lr * pn / un
        p.data -= lr * u


class RMSpropTFRef(Ref):
    """TensorFlow's RMSprop (tf.compat.v1.train.RMSPropOptimizer; timm's RMSpropTF): mean square
    starts at one, eps inside the sqrt, TensorFlow's order of operations, lr folded into the momentum
    accumulator (lr_in_momentum), optional decoupled decay."""

    def update(self, p, g, o, st):
        alpha, eps, wd, mom, lr = o.get("alpha", 0.9), o.get("eps", 1e-10), o.get("weight_decay", 0), \
            o.get("momentum", 0), o["lr"]
        st.setdefault("ms", torch.ones_like(p))
        if wd:
            if o.get("decoupled_decay", 0):
                p.data *= 1 - lr * wd
            else:
                g = g + wd * p
        st["ms"] = st["ms"] + (1 - alpha) * (g * g - st["ms"])
        if o.get("centered", 0):
            st.setdefault("mg", torch.zeros_like(p))
            st["mg"] = st["mg"] + (1 - alpha) * (g - st["mg"])
            avg = (st["ms"] - st["mg"] * st["mg"] + eps).sqrt()
        else:
            avg = (st["ms"] + eps).sqrt()
        if mom > 0:
            st.setdefault("buf", torch.zeros_like(p))
            if o.get("lr_in_momentum", 1):
                st["buf"] = mom * st["buf"] + lr * g / avg
                p.data -= st["buf"]
            else:
                st["buf"] = mom * st["buf"] + g / avg
                p.data -= lr * st["buf"]
        else:
            p.data -= lr * g / avg


class NovoGradRef(Ref):
    """NovoGrad (Ginsburg et al. 2019, Algorithm 1) as NVIDIA's FusedNovoGrad runs it: a per-layer
    second moment kept as a norm, blended as sqrt(b2 v^2 + (1-b2) |g|^2) (L2) or b2 v + (1-b2) |g|
    (inf), starting at the first gradient's norm unless init_zero; bias corrections 1 - b1^t and
    sqrt(1 - b2^t); weight decay outside (default) or inside the first moment."""

    def update(self, p, g, o, st):
        b1, b2, eps, wd, lr = o.get("beta1", 0.9), o.get("beta2", 0.999), o.get("eps", 1e-8), \
            o.get("weight_decay", 0), o["lr"]
        inf = o.get("norm_type", 2) == -1
        n = float(g.abs().max()) if inf else float(g.norm())
        if "v" not in st:
            st["v"] = 0.0 if o.get("init_zero", 0) else n
            st["m"] = torch.zeros_like(p)
        st["v"] = b2 * st["v"] + (1 - b2) * n if inf else math.sqrt(b2 * st["v"] ** 2 + (1 - b2) * n * n)
        t = st["step"]
        bc1, bc2 = (1 - b1 ** t, math.sqrt(1 - b2 ** t)) if o.get("bias_correction", 1) else (1.0, 1.0)
        d = st["v"] / bc2 + eps
        b3 = 1 - b1 if o.get("grad_averaging", 1) else 1.0
        if o.get("reg_inside_moment", 0):
            st["m"] = b1 * st["m"] + b3 * (g / d + wd * p)
            p.data -= lr * st["m"] / bc1
        else:
            st["m"] = b1 * st["m"] + b3 * g
            p.data -= lr * (st["m"] / bc1 / d + wd * p)


# ---- torch.optim as the reference --------------------------------------------------------------------

TORCH = {
    "sgd": lambda groups: torch.optim.SGD(groups, lr=0.1),
    "adam": lambda groups: torch.optim.Adam(groups),
    "adamw": lambda groups: torch.optim.AdamW(groups),
    "adadelta": lambda groups: torch.optim.Adadelta(groups),
    # torch fills the accumulator from the constructor's initial_accumulator_value, not the group's
    "adagrad": lambda groups: torch.optim.Adagrad(
        groups, initial_accumulator_value=groups[0].get("initial_accumulator_value", 0.0)),
    "rmsprop": lambda groups: torch.optim.RMSprop(groups),
}
# apex option names -> torch's
TORCH_NAMES = {"initial_accumulator_value": "initial_accumulator_value"}


def torch_group(params, o):
    g = {"params": params}
    for k, v in o.items():
        if k in ("beta1", "beta2"):
            g["betas"] = (o.get("beta1", 0.9), o.get("beta2", 0.999))
        elif k in ("nesterov", "amsgrad", "centered"):
            g[k] = bool(v)
        elif k == "adam_w_mode":
            pass  # chooses the torch class (torch_kind)
        else:
            g[TORCH_NAMES.get(k, k)] = v
    return g


def torch_kind(kind, groups):
    """Adam and AdamW are one rule with adam_w_mode as the switch: the torch class for the mode asked."""
    if kind not in ("adam", "adamw"):
        return kind
    modes = {bool(o.get("adam_w_mode", kind == "adamw")) for _, o in groups}
    assert len(modes) == 1, "one adam_w_mode for all groups of a torch reference"
    w_mode = modes.pop()
    # torch.optim.AdamW defaults weight_decay to 1e-2, apex to 0: a case must give it
    assert not w_mode or all("weight_decay" in o for _, o in groups), "give weight_decay with adam_w_mode"
    return "adamw" if w_mode else "adam"


class TorchRef:
    def __init__(self, kind, groups):
        self.opt = TORCH[torch_kind(kind, groups)]([torch_group(ps, o) for ps, o in groups])

    def step(self):
        self.opt.step()


REFS = {"sgd": SGDRef, "adam": AdamRef, "adagrad": AdagradRef, "adamp": AdamPRef, "lamb": LambRef,
        "rmsprop_tf": RMSpropTFRef, "novograd": NovoGradRef}


# ---- cases -------------------------------------------------------------------------------------------

# apex's float defaults (include/apex/optim_options.h): the references must use the same float32 values.
DEFAULTS = {
    "adam": "beta1=0.9 beta2=0.999 eps=1e-8", "adamw": "beta1=0.9 beta2=0.999 eps=1e-8",
    "adamp": "beta1=0.9 beta2=0.999 eps=1e-8 delta=0.1 wd_ratio=0.1", "lamb": "beta1=0.9 beta2=0.999 eps=1e-6",
    "novograd": "beta1=0.9 beta2=0.999 eps=1e-8", "adadelta": "rho=0.9 eps=1e-6", "adagrad": "eps=1e-10",
    "rmsprop": "alpha=0.99 eps=1e-8", "rmsprop_tf": "alpha=0.9 eps=1e-10", "sgd": "",
}


def parse_opts(s, kind):
    """Options as apex reads them: apex's defaults, then the case's, as float32 values (so both sides
    use the same hyperparameters)."""
    pairs = (kv.split("=") for kv in (DEFAULTS[kind] + " " + s).split())
    return {k: struct.unpack("<f", struct.pack("<f", float(v)))[0] for k, v in pairs}


def orthogonal(g, p, rows):
    """g with its component along p removed per row (rows = p.shape[0]) or for the whole tensor."""
    G, P = g.reshape(rows, -1).clone(), p.reshape(rows, -1)
    for r in range(rows):
        G[r] -= P[r] * float(G[r] @ P[r]) / float(P[r] @ P[r])
    return G.reshape(g.shape)


def run_case(name, kind, group_opts, tensor_groups, use_torch, seed, missing=(), lr_decay_every=0, ortho=None):
    gen = torch.Generator().manual_seed(seed)
    params = [f32(torch.rand(s, generator=gen, dtype=torch.float64) * 2 - 1) for s in SHAPES]
    init = [p.clone() for p in params]
    opts = [parse_opts(s, kind) for s in group_opts]
    groups = [([p for p, g in zip(params, tensor_groups) if g == k], opts[k]) for k in range(len(group_opts))]
    ref = TorchRef(kind, groups) if use_torch else REFS[kind](groups)
    lrs0 = [o["lr"] for o in opts]
    steps = []
    for t in range(STEPS):
        lrs = [f32(torch.tensor(lr * (0.5 if lr_decay_every and t >= lr_decay_every else 1.0))).item() for lr in lrs0]
        for k, lr in enumerate(lrs):
            groups[k][1]["lr"] = lr
            if use_torch:
                ref.opt.param_groups[k]["lr"] = lr
        has, grads = [], []
        for i, p in enumerate(params):
            g = torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5
            if ortho and ortho[i]:
                g = orthogonal(g, p.detach(), p.shape[0] if ortho[i] == "channel" else 1)
            g = f32(g)
            present = (t, i) not in missing
            p.grad = g.clone() if present else None
            has.append(present)
            grads.append(g if present else torch.zeros_like(g))
        with torch.no_grad():
            ref.step()
        steps.append((lrs, has, grads, [p.detach().clone() for p in params]))
    return dict(name=name, kind=kind, group_opts=group_opts, tensor_groups=tensor_groups, init=init, steps=steps)


def cases():
    miss = {(2, 1), (3, 1), (5, 0), (9, 2)}
    one, two = [0, 0, 0], [0, 0, 1]
    yield run_case("sgd_plain", "sgd", ["lr=0.1"], one, True, 1)
    yield run_case("sgd_momentum_dampening_wd", "sgd", ["lr=0.05 momentum=0.9 dampening=0.1 weight_decay=0.01"], one,
                   True, 2, lr_decay_every=6)
    yield run_case("sgd_nesterov_groups", "sgd", ["lr=0.05 momentum=0.9 nesterov=1 weight_decay=0.001",
                                                 "lr=0.02 momentum=0.5"], two, True, 3)
    yield run_case("sgd_momentum_missing_grads", "sgd", ["lr=0.05 momentum=0.8"], one, True, 4, missing=miss)
    yield run_case("sgd_wd_after_momentum", "sgd", ["lr=0.05 momentum=0.9 weight_decay=0.01 wd_after_momentum=1"],
                   one, False, 5)
    yield run_case("adam_default", "adam", ["lr=0.01"], one, True, 6)
    yield run_case("adam_wd_amsgrad_betas", "adam", ["lr=0.01 beta1=0.8 beta2=0.99 weight_decay=0.01 amsgrad=1"], one,
                   True, 7, lr_decay_every=5)
    yield run_case("adam_groups_missing", "adam", ["lr=0.01 eps=1e-6", "lr=0.003 weight_decay=0.1"], two, True, 8,
                   missing=miss)
    yield run_case("adam_no_bias_correction", "adam", ["lr=0.01 bias_correction=0 weight_decay=0.01"], one, False, 9)
    yield run_case("adamw_wd", "adamw", ["lr=0.01 weight_decay=0.01"], one, True, 10)
    yield run_case("adamw_amsgrad_eps", "adamw", ["lr=0.01 weight_decay=0.1 amsgrad=1 eps=1e-6 beta1=0"], one, True,
                   11, missing=miss)
    yield run_case("adadelta_default", "adadelta", ["lr=1.0"], one, True, 12)
    yield run_case("adadelta_rho_eps_wd", "adadelta", ["lr=0.5 rho=0.8 eps=1e-5 weight_decay=0.01"], one, True, 13,
                   lr_decay_every=4)
    yield run_case("adagrad_default", "adagrad", ["lr=0.1"], one, True, 14)
    yield run_case("adagrad_decay_wd_init", "adagrad",
                   ["lr=0.1 lr_decay=0.01 weight_decay=0.01 initial_accumulator_value=0.1 eps=1e-8"], one, True, 15,
                   missing=miss)
    yield run_case("adagrad_w_mode", "adagrad", ["lr=0.1 weight_decay=0.01 adagrad_w_mode=1"], one, False, 16)
    yield run_case("rmsprop_default", "rmsprop", ["lr=0.01"], one, True, 17)
    yield run_case("rmsprop_centered_momentum_wd", "rmsprop",
                   ["lr=0.01 alpha=0.9 centered=1 momentum=0.9 weight_decay=0.01"], one, True, 18)
    yield run_case("rmsprop_momentum_groups", "rmsprop", ["lr=0.01 momentum=0.5 eps=1e-6", "lr=0.003 centered=1"],
                   two, True, 19, missing=miss)
    ortho = ["channel", None, "layer"]
    yield run_case("adamp_default", "adamp", ["lr=0.01"], one, False, 20, ortho=ortho)
    yield run_case("adamp_nesterov_wd", "adamp", ["lr=0.01 nesterov=1 weight_decay=0.1 wd_ratio=0.2 delta=0.2"], one,
                   False, 21, ortho=ortho)
    yield run_case("adamp_random_grads", "adamp", ["lr=0.01 weight_decay=0.01"], one, False, 22)
    yield run_case("lamb_default", "lamb", ["lr=0.01 weight_decay=0.01"], one, False, 23)
    yield run_case("lamb_l2_nvlamb_groups", "lamb", ["lr=0.01 adam_w_mode=0 use_nvlamb=1 weight_decay=0.01",
                                                     "lr=0.005 use_nvlamb=1"], two, False, 24, missing=miss)
    yield run_case("lamb_clip_noavg_nobc", "lamb",
                   ["lr=0.01 max_grad_norm=0.5 grad_averaging=0 bias_correction=0 weight_decay=0.1"], one, False, 25)
    yield run_case("lamb_no_trust_ratio", "lamb", ["lr=0.01 max_grad_norm=-1"], one, False, 26)
    yield run_case("rmsprop_tf_default", "rmsprop_tf", ["lr=0.01"], one, False, 27)
    yield run_case("rmsprop_tf_centered_momentum", "rmsprop_tf", ["lr=0.01 centered=1 momentum=0.9 weight_decay=0.01"],
                   one, False, 28)
    yield run_case("rmsprop_tf_decoupled_lr_outside", "rmsprop_tf",
                   ["lr=0.01 momentum=0.9 weight_decay=0.01 decoupled_decay=1 lr_in_momentum=0 alpha=0.95"], one,
                   False, 29, missing=miss)
    yield run_case("novograd_default", "novograd", ["lr=0.01"], one, False, 30)
    yield run_case("novograd_inf_init_zero_wd", "novograd", ["lr=0.01 norm_type=-1 init_zero=1 weight_decay=0.01"],
                   one, False, 31)
    yield run_case("novograd_reg_inside_noavg", "novograd",
                   ["lr=0.01 reg_inside_moment=1 grad_averaging=0 weight_decay=0.001 beta1=0.95 beta2=0.98"], one,
                   False, 32, missing=miss)
    # adam_w_mode as an option of either kind (torch.optim.AdamW / Adam as the reference), and the betas
    # and eps of the kinds whose cases above keep the defaults.
    yield run_case("adam_w_mode_on", "adam", ["lr=0.01 weight_decay=0.05 adam_w_mode=1"], one, True, 33)
    yield run_case("adamw_w_mode_off_amsgrad", "adamw", ["lr=0.01 weight_decay=0.05 adam_w_mode=0 amsgrad=1"], one,
                   True, 34, missing=miss)
    yield run_case("adamp_betas_eps", "adamp", ["lr=0.01 beta1=0.8 beta2=0.99 eps=1e-6 weight_decay=0.01"], one,
                   False, 35, ortho=ortho)
    yield run_case("lamb_betas_eps", "lamb", ["lr=0.01 beta1=0.8 beta2=0.99 eps=1e-4 weight_decay=0.01"], one,
                   False, 36)
    yield run_case("rmsprop_tf_eps_alpha", "rmsprop_tf", ["lr=0.01 eps=1e-3 alpha=0.8"], one, False, 37)
    yield run_case("novograd_eps_no_bias_correction", "novograd",
                   ["lr=0.01 eps=1e-3 bias_correction=0 weight_decay=0.01"], one, False, 38)


def put_str(out, s):
    b = s.encode()
    out += struct.pack("<I", len(b)) + b


def main():
    out = bytearray(b"APXOGLD1")
    all_cases = list(cases())
    out += struct.pack("<I", len(all_cases))
    for c in all_cases:
        put_str(out, c["name"])
        put_str(out, c["kind"])
        out += struct.pack("<I", len(c["group_opts"]))
        for s in c["group_opts"]:
            put_str(out, s)
        out += struct.pack("<I", len(SHAPES))
        for grp, shape in zip(c["tensor_groups"], SHAPES):
            out += struct.pack("<II", grp, len(shape)) + struct.pack("<%dI" % len(shape), *shape)
        out += struct.pack("<If", len(c["steps"]), SCALE)
        flat = lambda ts: [x for t in ts for x in t.reshape(-1).tolist()]
        init = flat(c["init"])
        out += struct.pack("<%df" % len(init), *init)
        for lrs, has, grads, params in c["steps"]:
            out += struct.pack("<%df" % len(lrs), *lrs)
            out += struct.pack("<%dB" % len(has), *has)
            g = [x * SCALE for x in flat(grads)]
            out += struct.pack("<%df" % len(g), *g)
            e = flat(params)
            out += struct.pack("<%dd" % len(e), *e)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(out)
    print("wrote %s: %d cases, %d bytes" % (OUT, len(all_cases), len(out)))


if __name__ == "__main__":
    main()
