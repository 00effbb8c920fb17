#!/usr/bin/python3
"""test_features_util.py: the independent side of test_features.sh. Writes test data (IDX sets,
llm.c token files, logs), reads safetensors files, and checks apex-train's outputs against values
computed here (closed forms and numpy), never by running apex-train's code.

Usage: test_features_util.py COMMAND ARGS...; exits non-zero with a message on a failed check."""
import json
import math
import os
import struct
import sys
import xml.etree.ElementTree as ET

import numpy as np


def fail(msg):
    print("CHECK FAILED: " + msg)
    sys.exit(1)


def write_idx(path, arr, magic=None):
    arr = np.asarray(arr, dtype=np.uint8)
    hdr = struct.pack(">I", magic if magic is not None else 0x0800 | arr.ndim) + b"".join(struct.pack(">I", d) for d in arr.shape)
    with open(path, "wb") as f:
        f.write(hdr + arr.tobytes())


def idx_set(d, n_train, n_test, h, w, classes, seed=0):
    """A learnable set: class c lights a band of rows; MNIST's dotted names, uncompressed."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("t10k", n_test)):
        lab = rng.integers(0, classes, n)
        img = rng.integers(0, 60, (n, h, w))
        band = h // classes
        for i, c in enumerate(lab):
            img[i, c * band:(c + 1) * band, :] += 150
        write_idx(f"{d}/{split}-images.idx3-ubyte", img)
        write_idx(f"{d}/{split}-labels.idx1-ubyte", lab)


def write_bin(path, tokens, magic=20240520, version=1, count=None, extra=b""):
    hdr = np.zeros(256, dtype="<i4")
    hdr[0], hdr[1], hdr[2] = magic, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(hdr.tobytes() + np.asarray(tokens, dtype="<u2").tobytes() + extra)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        assert v["dtype"] == "F32"
        out[k] = np.frombuffer(data[a:b], dtype="<f4").reshape(v["shape"])
    return out, hdr.get("__metadata__", {})


def log_lines(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def cmd_idx(d, n_train, n_test, h, w, classes):
    idx_set(d, int(n_train), int(n_test), int(h), int(w), int(classes))


def cmd_bin(path, kind):
    rng = np.random.default_rng(1)
    toks = rng.integers(0, 300, 2000)
    if kind == "good":
        write_bin(path, toks)
    elif kind == "big":  # a token past GPT-2's vocabulary: vocab = max + 1
        toks[17] = 60000
        write_bin(path, toks)
    elif kind == "magic":
        write_bin(path, toks, magic=20240521)
    elif kind == "version":
        write_bin(path, toks, version=2)
    elif kind == "count":
        write_bin(path, toks, count=2500)
    elif kind == "zero":
        write_bin(path, [], count=0)
    elif kind == "odd":
        write_bin(path, toks, extra=b"\x01")
    elif kind == "header":
        with open(path, "wb") as f:
            f.write(struct.pack("<iii", 20240520, 1, 10))
    else:
        fail("unknown bin kind " + kind)


def gpt2_byte_decoder():
    """GPT-2's bytes_to_unicode (tests/gen_gpt2_tokenizer.py's, which made the test vocabulary), inverted:
    character -> byte."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
    from gen_gpt2_tokenizer import bytes_to_unicode
    return {c: b for b, c in bytes_to_unicode().items()}


def after_sample(path):
    data = open(path, "rb").read()
    mark = b"apex-train: sample:\n"
    if mark not in data:
        fail("%s has no sample" % path)
    return data[data.index(mark) + len(mark):]


def cmd_decode(vocab_path, ids_out, text_out):
    """The sample of ids_out (token ids) decoded with vocab_path equals text_out's sample, byte for byte."""
    vocab = json.load(open(vocab_path, encoding="utf-8"))
    inv = {i: t for t, i in vocab.items()}
    dec = gpt2_byte_decoder()
    ids = [int(x) for x in after_sample(ids_out).split()]
    want = b"".join(bytes(dec[c] for c in inv[i]) for i in ids) + b"\n"
    got = after_sample(text_out)
    if got != want:
        fail("decoded %r, apex-train printed %r" % (want[:80], got[:80]))
    print("%d tokens decode to the %d bytes printed" % (len(ids), len(want)))


def cmd_shape(path, name, *dims):
    t, _ = read_safetensors(path)
    if name not in t:
        fail(f"{path} has no {name}")
    want = [int(x) for x in dims]
    if list(t[name].shape) != want:
        fail(f"{name} is {list(t[name].shape)}, expected {want}")


def cmd_absent(path, name):
    t, _ = read_safetensors(path)
    if name in t:
        fail(f"{path} has {name}")


def cmd_schedule(log, kind, peak, warmup, total):
    """The lr of every step against the closed form (float32 like apex-train's rates)."""
    peak, warmup, total = float(peak), int(warmup), int(total)
    steps = [l for l in log_lines(log) if "lr" in l]
    if not steps:
        fail("no lr in the log")
    for l in steps:
        s = l["step"] - 1
        if s < warmup:
            want = peak * (s + 1) / warmup
        elif kind == "constant":
            want = peak
        else:
            frac = (s - warmup) / (total - warmup)
            if kind == "linear":
                want = peak * (1 - frac if frac < 0.95 else 0.05)
            else:
                want = peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        if abs(l["lr"] - want) > 1e-6 * peak:
            fail(f"step {l['step']}: lr {l['lr']}, the {kind} schedule gives {want}")
    print(f"{len(steps)} learning rates follow {kind} with warmup {warmup}")


def cmd_strip_total(path):
    """Removes lr_schedule_total from a state.safetensors and rewrites its checksum, as apex-train
    wrote checkpoints before the key existed (the checksum: FNV-1a 64 of key=value\\n in order)."""
    import json
    b = open(path, "rb").read()
    n = int.from_bytes(b[:8], "little")
    head = json.loads(b[8:8 + n])
    meta = head["__metadata__"]
    if "lr_schedule_total" not in meta:
        fail(f"{path} has no lr_schedule_total")
    del meta["lr_schedule_total"]
    h = 0xcbf29ce484222325
    for k, v in meta.items():
        if k == "checksum":
            continue
        for c in (k + "=" + v + "\n").encode():
            h = ((h ^ c) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    meta["checksum"] = "%016x" % h
    text = json.dumps(head, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    open(path, "wb").write(len(text).to_bytes(8, "little") + text + b[8 + n:])
    print("lr_schedule_total removed")


def cmd_meta(path, key):
    """Prints a state.safetensors metadata value, or 'absent'."""
    b = open(path, "rb").read()
    meta = json.loads(b[8:8 + int.from_bytes(b[:8], "little")]).get("__metadata__", {})
    print(meta.get(key, "absent"))


def cmd_split(n, batch, fraction):
    """The validation split of n training images, closed form: V = round(F n) (halves up) with F the
    f32 that apex-train records; prints V, the training images left and the steps of an epoch."""
    n, batch = int(n), int(batch)
    v = math.floor(float(np.float32(fraction)) * n + 0.5)
    print(v, n - v, (n - v) // batch)


def cmd_swap_val(src, dst, k):
    """dst: the IDX set of src (MNIST dotted names, uncompressed) with its last k training images and
    labels replaced by others (inverted images, labels shifted by one class)."""
    import os
    import shutil
    k = int(k)
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        shutil.copy(f"{src}/{f}", f"{dst}/{f}")
    img = bytearray(open(f"{src}/train-images.idx3-ubyte", "rb").read())
    lab = bytearray(open(f"{src}/train-labels.idx1-ubyte", "rb").read())
    n, h, w = struct.unpack(">III", bytes(img[4:16]))
    classes = max(lab[8:]) + 1
    for i in range(n - k, n):
        for p in range(16 + i * h * w, 16 + (i + 1) * h * w):
            img[p] = 255 - img[p]
        lab[8 + i] = (lab[8 + i] + 1) % classes
    open(f"{dst}/train-images.idx3-ubyte", "wb").write(img)
    open(f"{dst}/train-labels.idx1-ubyte", "wb").write(lab)
    print(f"last {k} of {n} training images replaced")


def cmd_clip(init, noclip, clip, log_noclip, log_clip, lr, max_norm):
    """SGD without momentum from the same weights w0: w1 = w0 - lr * g * coef. The gradient g, and
    its norm, come from the unclipped run's weights; clipping must scale the update by
    max_norm / (norm + 1e-6)."""
    lr, max_norm = float(lr), float(max_norm)
    w0, _ = read_safetensors(init)
    wn, _ = read_safetensors(noclip)
    wc, _ = read_safetensors(clip)
    g = {k: (w0[k].astype(np.float64) - wn[k]) / lr for k in w0}
    norm = math.sqrt(sum(float((v * v).sum()) for v in g.values()))
    logged = [l for l in log_lines(log_noclip) if "grad_norm" in l][-1]["grad_norm"]
    logged_c = [l for l in log_lines(log_clip) if "grad_norm" in l][-1]["grad_norm"]
    if abs(logged - norm) > 1e-3 * norm:
        fail(f"logged gradient norm {logged}, the weights' update says {norm}")
    if abs(logged_c - logged) > 1e-6 * norm:
        fail(f"the clipped run logged norm {logged_c} before clipping, the unclipped {logged}")
    coef = max_norm / (norm + 1e-6)
    if coef >= 1:
        fail(f"norm {norm} is below --clip-grad-norm {max_norm}: the test clips nothing")
    num = sum(float(((w0[k].astype(np.float64) - wc[k]) * g[k]).sum()) for k in w0)
    den = sum(float((g[k] * g[k]).sum()) for k in w0) * lr
    ratio = num / den
    if abs(ratio - coef) > 1e-3 * coef:
        fail(f"the clipped update is {ratio} of the unclipped one; max_norm / norm = {coef}")
    print(f"gradient norm {norm:.6g} (logged {logged:.6g}); clipped update scaled by {ratio:.6g} = {coef:.6g}")


def cmd_same_losses(a, b, tol):
    """The training losses of two logs, step by step, within a relative tol."""
    la = [l for l in log_lines(a) if "loss" in l]
    lb = [l for l in log_lines(b) if "loss" in l]
    if len(la) != len(lb) or not la:
        fail(f"{len(la)} and {len(lb)} steps")
    worst = 0.0
    for x, y in zip(la, lb):
        d = abs(x["loss"] - y["loss"]) / abs(x["loss"])
        worst = max(worst, d)
        if d > float(tol):
            fail(f"step {x['step']}: loss {x['loss']} vs {y['loss']}")
    print(f"{len(la)} losses agree (worst relative difference {worst:.2e})")


def cmd_log_keys(log, *keys):
    for l in log_lines(log):
        if "loss" in l:
            for k in keys:
                if k not in l:
                    fail(f"step line without {k}: {l}")


def cmd_fake_log(path):
    """A log with known content: 40 steps, skips at 3, 4 and 21, a null loss at 21, scale halving at
    each skip and doubling at 30, evaluations every 10 steps."""
    scale = 65536.0
    with open(path, "w") as f:
        for s in range(1, 41):
            skipped = s in (3, 4, 21)
            if skipped:
                scale /= 2
            if s == 30:
                scale *= 2
            loss = None if s == 21 else 5.0 * math.exp(-s / 15) + 0.5
            f.write(json.dumps({"step": s, "epoch": 1, "loss": loss, "loss_scale": scale, "skipped": 0,
                                "step_skipped": skipped, "lr": 1e-3, "grad_norm": 1.0, "samples_per_s": 1.0,
                                "elapsed_s": s}) + "\n")
            if s % 10 == 0:
                f.write(json.dumps({"step": s, "eval_loss": 5.0 * math.exp(-s / 15) + 0.7, "eval_accuracy": 0.5}) + "\n")


def points(el):
    return [tuple(float(v) for v in p.split(",")) for p in el.get("points").split()]


def cmd_svg(svg, *logs):
    """Every log's curves in the SVG, each point where the axes' ranges put it."""
    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.parse(svg).getroot()
    area = root.find(".//s:rect[@class='plot-area']", ns)
    if area is None:
        fail("no plot area")
    X, Y, W, H = (float(area.get(k)) for k in ("x", "y", "width", "height"))
    x0, x1, y0, y1, s0, s1 = (float(area.get("data-" + k)) for k in ("x-min", "x-max", "y-min", "y-max", "s-min", "s-max"))
    px = lambda x: X + (x - x0) / (x1 - x0) * W
    py = lambda y: Y + (y1 - y) / (y1 - y0) * H
    ps = lambda s: Y + (s1 - s) / (s1 - s0) * H
    moving = any(len(set(l["loss_scale"] for l in log_lines(g) if "loss" in l)) > 1 for g in logs)
    for log in logs:
        name = log.split("/")[-1]
        lines = log_lines(log)
        steps = [l for l in lines if "loss" in l]
        evals = [l for l in lines if "eval_loss" in l]

        def curve(cls, want):
            el = root.find(f".//s:polyline[@class='{cls}'][@data-log='{name}']", ns)
            if el is None:
                fail(f"no {cls} curve for {name}")
            got = points(el)
            if len(got) != len(want):
                fail(f"{cls} of {name}: {len(got)} points, the log has {len(want)}")
            for (gx, gy), (wx, wy) in zip(got, want):
                if abs(gx - wx) > 0.011 or abs(gy - wy) > 0.011:
                    fail(f"{cls} of {name}: point ({gx}, {gy}), expected ({wx:.2f}, {wy:.2f})")
            for gx, gy in got:
                if not (X - 0.01 <= gx <= X + W + 0.01 and Y - 0.01 <= gy <= Y + H + 0.01):
                    fail(f"{cls} of {name}: point ({gx}, {gy}) outside the plot area")

        curve("train-loss", [(px(l["step"]), py(l["loss"])) for l in steps if l["loss"] is not None])
        scales = [l["loss_scale"] for l in steps]
        if moving:
            curve("loss-scale", [(px(l["step"]), ps(math.log2(l["loss_scale"]))) for l in steps])
            # Each run's scale line in its own run's colour.
            sc = root.find(f".//s:polyline[@class='loss-scale'][@data-log='{name}']", ns).get("stroke")
            tc = root.find(f".//s:polyline[@class='train-loss'][@data-log='{name}']", ns).get("stroke")
            if sc != tc:
                fail(f"loss-scale line of {name} in {sc}, its training loss in {tc}")
        elif root.find(f".//s:polyline[@class='loss-scale']", ns) is not None:
            fail("a loss-scale curve although no scale changed")
        # The moving average: the mean of the last w finite losses.
        finite = [l for l in steps if l["loss"] is not None]
        if len(steps) >= 20:
            el = root.find(f".//s:polyline[@class='train-loss-avg'][@data-log='{name}']", ns)
            w = int(el.get("data-window")) if el is not None else 0
            if w != min(100, max(2, len(steps) // 50)):
                fail(f"moving average of {name}: window {w}")
            want = []
            for i, l in enumerate(finite):
                last = finite[max(0, i + 1 - w):i + 1]
                want.append((px(l["step"]), py(sum(x["loss"] for x in last) / len(last))))
            curve("train-loss-avg", want)
        if evals:
            curve("eval-loss", [(px(l["step"]), py(l["eval_loss"])) for l in evals])
        marks = sorted(int(p.get("data-step")) for p in root.findall(".//s:path[@class='skipped']", ns))
        want = sorted(l["step"] for l in steps if l.get("step_skipped"))
        if len(logs) == 1 and marks != want:
            fail(f"skipped marks at {marks}, the log skipped {want}")
        # Axis ranges cover the data.
        if not (x0 <= min(l["step"] for l in steps) and max(l["step"] for l in steps) <= x1):
            fail("the step axis does not cover the log")
    colours = [root.find(f".//s:polyline[@class='train-loss'][@data-log='{g.split('/')[-1]}']", ns).get("stroke") for g in logs]
    if len(logs) <= 8 and len(set(colours)) != len(logs):
        fail(f"{len(logs)} logs drawn in the colours {colours}")
    print(f"{svg}: {len(logs)} log(s), every point in place")


if __name__ == "__main__":
    globals()["cmd_" + sys.argv[1].replace("-", "_")](*sys.argv[2:])
