"""The expert tier: long, exact procedures where one slipped detail changes the answer.

Each family states a whole procedure (a training micro-loop, CTC, Viterbi, NMS, nucleus sampling,
grouped-query attention with a KV cache, beam search, ...) or a quantity whose textbook formula
loses it in floating point, and its generator puts the edge cases the instruction rules on (ties,
padding, empty segments, an IoU exactly at the threshold, missing observations, extreme tails)
into every draw, so they are tested on every seed, not by luck. Integer answers come from
integer-valued or well-separated scores (the samplers redraw near-ties), so no rounding order can
flip them; long recurrences whose float32 rounding a correct solver could not match run in float64.
As in the other tiers, the reference runs like a model's cell and `independent` is a second
formulation for the tolerance gate.
"""

import math

import torch

from ptenv.tasks.families import Family, away_from_zero, dyadic, normal, pick, randint, uniform

# --- samplers ------------------------------------------------------------------------------------


def _accumulated_adamw(g):
    o, d, steps = randint(g, 1, 2), randint(g, 2, 4), randint(g, 3, 5)
    while True:  # unequal micro-batches, so "mean over the micro-batch, divided by their count" matters
        sizes = [randint(g, 1, 4) for _ in range(randint(g, 2, 3))]
        if len(set(sizes)) > 1:
            break
    n = sum(sizes)
    inputs = {"W": normal(g, o, d, scale=0.5), "b": normal(g, o, scale=0.5),
              "X": normal(g, steps, n, d), "Y": normal(g, steps, n, o)}
    # max_norm below the first step's accumulated gradient norm, so clipping acts at least there.
    W, b, X, Y = (inputs[k].double() for k in ("W", "b", "X", "Y"))
    grads = [torch.zeros_like(W), torch.zeros_like(b)]
    for xb, yb in zip(X[0].split(sizes), Y[0].split(sizes)):
        r = xb @ W.T + b - yb
        grads[0] += 2 * r.T @ xb / r.numel() / len(sizes)
        grads[1] += 2 * r.sum(0) / r.numel() / len(sizes)
    norm = math.sqrt(sum(float((t ** 2).sum()) for t in grads))
    params = {"steps": steps, "warmup": randint(g, 1, 2), "lr": pick(g, ["0.1", "0.05"]),
              "lr_min": pick(g, ["0.001", "0.01"]), "beta1": pick(g, ["0.9", "0.8"]),
              "beta2": pick(g, ["0.999", "0.99"]), "eps": pick(g, ["1e-8", "1e-6"]), "wd": pick(g, ["0.01", "0.1"]),
              "max_norm": f"{max(0.05, round(0.6 * norm, 2)):.2f}", "sizes": repr(sizes),
              "sizes_text": ", ".join(map(str, sizes[:-1])) + f" and {sizes[-1]}", "count": len(sizes)}
    return params, inputs


def _ctc(g):
    b, c = 3, randint(g, 4, 6)
    t = randint(g, 7, 9)
    targets = torch.full((b, 4), -1, dtype=torch.int64)
    input_lengths = torch.tensor([t, randint(g, 5, t - 1), t])  # one sequence is padded in time
    target_lengths = torch.tensor([randint(g, 2, 4), randint(g, 2, 3), randint(g, 0, 2)])
    for i in range(b):
        n = int(target_lengths[i])
        while True:
            seq = torch.randint(1, c, (n,), generator=g)
            repeats = int((seq[1:] == seq[:-1]).sum()) if n > 1 else 0
            if i != 0 or repeats > 0:  # the first target always repeats a label back to back
                break
        targets[i, :n] = seq  # feasible: at most 4 labels and 3 repeats in at least 7 frames, 3 and 2 in 5
    inputs = {"logits": normal(g, b, t, c, scale=1.5), "targets": targets, "input_lengths": input_lengths,
              "target_lengths": target_lengths}
    return {}, inputs


def _viterbi(g):
    b, s, t = randint(g, 2, 3), randint(g, 3, 4), randint(g, 5, 7)
    lengths = torch.randint(2, t + 1, (b,), generator=g)
    lengths[0], lengths[1] = t, randint(g, 2, t - 1)  # one full sequence and one padded one

    def ints(*shape):  # small integers: ties are common
        return torch.randint(-3, 2, shape, generator=g).float()

    return {}, {"start": ints(b, s), "trans": ints(s, s), "emit": ints(b, t, s), "lengths": lengths}


def _nms(g):
    thr = pick(g, ["0.5", "0.25"])
    n = randint(g, 9, 12)
    xy = torch.randint(0, 10, (n, 2), generator=g)
    wh = torch.randint(2, 7, (n, 2), generator=g)
    boxes = torch.cat([xy, xy + wh], 1)
    scores = torch.randint(1, 8, (n,), generator=g).float() / 8  # multiples of 1/8: equal scores are common
    classes = torch.randint(0, 2, (n,), generator=g)
    i, j, k, m, e = torch.randperm(n, generator=g)[:5].tolist()
    # i and j: the same class, IoU exactly the threshold (j inside i), i the unique top score.
    x0, y0 = xy[i].tolist()
    boxes[i] = torch.tensor([x0, y0, x0 + 2, y0 + 2] if thr == "0.5" else [x0, y0, x0 + 4, y0 + 2])
    boxes[j] = torch.tensor([x0, y0, x0 + 2, y0 + 1] if thr == "0.5" else [x0 + 1, y0, x0 + 3, y0 + 1])
    scores[i], scores[j], classes[j] = 1.0, 0.875, classes[i]
    # k and m: the same class and score, heavily overlapping, so the lower index wins the tie.
    xk, yk = xy[k].tolist()
    boxes[k], boxes[m] = torch.tensor([xk, yk, xk + 6, yk + 6]), torch.tensor([xk + 1, yk, xk + 7, yk + 6])
    scores[m], classes[m] = scores[k], classes[k]
    # e: a copy of k in the other class, which k must not suppress.
    boxes[e], classes[e] = boxes[k], 1 - classes[k]
    scores[e] = scores[k] - 0.125 if scores[k] > 0.125 else 0.125
    return {"thr": thr}, {"boxes": boxes.float(), "scores": scores, "classes": classes}


def _nucleus(g):
    b, v = 4, randint(g, 8, 11)
    temp, k, p = pick(g, ["0.7", "1.3"]), randint(g, 4, 6), pick(g, ["0.8", "0.9"])
    for _ in range(1000):
        logits = normal(g, b, v, scale=1.5)
        logits[0, randint(g, 0, v - 1)] += 8.0  # one peaked row: the nucleus is a single token
        logits[1] = normal(g, v, scale=0.2)  # one flat row: top-k binds before top-p
        u = uniform(g, 0.02, 0.98, b)
        probs = torch.softmax(logits.double() / float(temp), -1)
        tokens, gap = _nucleus_walk(probs, u.double(), k, float(p))
        # The family's shortcuts (greedy; no filter, top-k only, top-p only) must each miss a row.
        shortcuts = [probs.argmax(-1).tolist()] + [
            _nucleus_walk(probs, u.double(), kk, pp)[0] for kk, pp in ((v, 1.0), (k, 1.0), (v, float(p)))]
        if gap > 1e-4 and tokens not in shortcuts:
            return {"temp": temp, "k": k, "p": p}, {"logits": logits, "u": u}
    raise AssertionError("no draw with clear margins")


def _nucleus_walk(probs, u, k, p):
    """The sampling procedure in float64: each row's token, and the smallest distance of a cumulative
    sum it compares from p or u (a margin, so float32 answers take the same branches)."""
    tokens, gap = [], 1.0
    for row, ub in zip(probs, u):
        sorted_p, order = torch.sort(row, descending=True, stable=True)
        c = (sorted_p[:k] / sorted_p[:k].sum()).cumsum(0)
        gap = min(gap, float((c[:-1] - p).abs().min()))
        n = min(int((c < p).sum()) + 1, k)
        kept = order[:n].sort().values
        cr = (row[kept] / row[kept].sum()).cumsum(0)
        gap = min(gap, float((cr - ub).abs().min()))
        tokens.append(int(kept[min(int((cr <= ub).sum()), n - 1)]))
    return tokens, gap


def _gqa(g):
    b, hkv, group, dh = 2, 2, randint(g, 2, 3), pick(g, [4, 6])  # two kv-heads: the grouping matters
    hq, e, p, tn = hkv * group, randint(g, 6, 8), randint(g, 3, 5), randint(g, 2, 3)
    pad = torch.tensor([0, randint(g, 1, p - 1)])  # element 1 has left padding in its cache
    inputs = {"x": normal(g, b, tn, e), "k_cache": normal(g, b, hkv, p, dh), "v_cache": normal(g, b, hkv, p, dh),
              "pad": pad, "wq": normal(g, hq * dh, e, scale=0.4), "wk": normal(g, hkv * dh, e, scale=0.4),
              "wv": normal(g, hkv * dh, e, scale=0.4),
              # small, as multihead_causal_attention's: no output cancels to near 0 from large terms
              "wo": normal(g, e, hq * dh, scale=0.02)}
    return {"hq": hq, "hkv": hkv, "group": group, "dh": dh, "half": dh // 2,
            "base": pick(g, ["10000.0", "500.0"])}, inputs


def _components(g):
    b, h, w = 2, randint(g, 6, 8), randint(g, 6, 8)
    grid = (torch.rand(b, h, w, generator=g) < 0.4).long()
    # A U whose arms are first met apart, a diagonal-only link, and a separate single cell.
    r, c = randint(g, 0, h - 4), randint(g, 0, w - 4)
    grid[0, r:r + 4, c:c + 4] = 0
    grid[0, r:r + 3, c] = 1
    grid[0, r:r + 3, c + 2] = 1
    grid[0, r + 2, c + 1] = 1
    r, c = randint(g, 0, h - 3), randint(g, 0, w - 3)
    grid[1, r:r + 3, c:c + 3] = 0
    grid[1, r, c] = grid[1, r + 1, c + 1] = 1
    return {}, {"grid": grid}


def _gram(a: torch.Tensor) -> torch.Tensor:
    """a @ a.T, each element the correctly rounded sum of its products (math.fsum): a matmul's
    last bits depend on the CPU's kernel (issue 24), and these are inputs, so part of the row."""
    rows = a.tolist()
    return torch.tensor([[math.fsum(x * y for x, y in zip(u, v)) for v in rows] for u in rows], dtype=torch.float64)


def _kalman(g):
    n, m, t = 2 * randint(g, 1, 2), randint(g, 1, 2), randint(g, 6, 8)
    dt = pick(g, [0.5, 1.0])
    half = n // 2
    F = torch.eye(n, dtype=torch.float64)
    F[:half, half:] = dt * torch.eye(half, dtype=torch.float64)  # position += dt * velocity
    H = normal(g, m, n, scale=0.7, dtype=torch.float64)
    a = normal(g, n, n, scale=0.3, dtype=torch.float64)
    Q = _gram(a) + 0.05 * torch.eye(n, dtype=torch.float64)
    rr = normal(g, m, m, scale=0.3, dtype=torch.float64)
    R = _gram(rr) + 0.2 * torch.eye(m, dtype=torch.float64)
    z = normal(g, t, m, scale=2.0, dtype=torch.float64)
    missing = torch.randperm(t - 1, generator=g)[:2] + 1
    z[missing] = float("nan")  # two observations are missing, never the first
    inputs = {"F": F, "H": H, "Q": Q, "R": R, "x0": normal(g, n, dtype=torch.float64),
              "P0": torch.eye(n, dtype=torch.float64) * pick(g, [1.0, 4.0]), "z": z}
    return {}, inputs


def _segment_variance(g):
    n, s = randint(g, 13, 16), randint(g, 5, 6)
    offset = pick(g, [2.5e4, 6.1e4, 1.3e5])
    seg = torch.cat([torch.tensor([0]), torch.arange(2, s).repeat(3), torch.randint(2, s, (n,), generator=g)])[:n]
    # segment 0 has one element, segment 1 none, and the others three or more
    seg = seg[torch.randperm(n, generator=g)]
    # A spread of some 40 float32 steps about a large offset: float32 sums lose the variance, and (with
    # every segment of three or more elements) the answer is not a float16 value.
    x = (offset + normal(g, n, scale=2e-6 * offset, dtype=torch.float64)).float()
    return {"s": s}, {"x": x, "w": uniform(g, 0.5, 2.0, n), "seg": seg}


def _censored(g):
    n = randint(g, 9, 12)
    kind = torch.randint(0, 3, (n,), generator=g)
    kind[:4] = torch.tensor([0, 1, 2, 2])
    eta = normal(g, n, scale=1.0, dtype=torch.float64)
    lo = uniform(g, 0.2, 3.0, n, dtype=torch.float64)
    hi = lo + uniform(g, 0.1, 2.0, n, dtype=torch.float64)
    # Row 2: a tiny interval (rate * width about 1e-6); row 3: far in the tail (rate * lo over 1000, where
    # exp(-rate * lo) underflows even in float64).
    hi[2] = lo[2] * (1 + uniform(g, 1e-6, 5e-6, 1, dtype=torch.float64))
    eta[3], lo[3] = uniform(g, 6.6, 7.0, 1, dtype=torch.float64), uniform(g, 2.0, 3.0, 1, dtype=torch.float64)
    hi[3] = lo[3] + uniform(g, 0.001, 0.02, 1, dtype=torch.float64)
    order = torch.randperm(n, generator=g)
    hi = torch.where(kind == 2, hi, lo)
    return {}, {"eta": eta[order].float(), "lo": lo[order].float(), "hi": hi[order].float(), "kind": kind[order]}


def _beam(g):
    b, v, k, length = 2, randint(g, 4, 5), randint(g, 2, 3), randint(g, 4, 5)
    eos, alpha = randint(g, 0, v - 1), pick(g, ["0.6", "1.0"])
    for _ in range(1000):
        raw = normal(g, b, v + 1, v, scale=1.2)
        raw[:, 1:, eos] += 0.7  # the end token is likely enough that hypotheses finish early,
        raw[:, 0, eos] -= 2.0  # but seldom as the very first token
        logp = torch.log_softmax(raw, -1)
        start, table = logp[:, 0], logp[:, 1:]
        gap, early = _beam_margin(start.double(), table.double(), k, length, eos, float(alpha))
        if gap > 1e-3 and early:
            return {"k": k, "L": length, "eos": eos, "alpha": alpha}, {"start": start.contiguous(),
                                                                     "logp": table.contiguous()}
    raise AssertionError("no draw with clear margins")


def _beam_margin(start, table, k, length, eos, alpha):
    """The smallest score gap the search decides on (float64), and whether some hypothesis ends early."""
    gap, early = float("inf"), False
    for b in range(start.shape[0]):
        beam, finished = [((), 0.0)], []
        for step in range(length):
            cands = [(toks + (t,), s + float((start[b] if not toks else table[b, toks[-1]])[t]))
                     for toks, s in beam for t in range(start.shape[1])]
            cands.sort(key=lambda c: -c[1])
            if len(cands) > k:
                gap = min(gap, cands[k - 1][1] - cands[k][1])
            top = cands[:k]
            finished += [c for c in top if c[0][-1] == eos]
            early |= any(c[0][-1] == eos for c in top) and step < length - 1
            beam = [c for c in top if c[0][-1] != eos]
            if not beam:
                break
        scores = sorted((s / len(toks) ** alpha for toks, s in finished + beam), reverse=True)
        if len(scores) > 1:
            gap = min(gap, scores[0] - scores[1])
    return gap, early


def _lr_finder(g):
    d, bs, nb = randint(g, 2, 4), randint(g, 3, 5), randint(g, 2, 3)
    params = {"lr0": pick(g, ["0.001", "0.0005"]), "factor": pick(g, ["1.3", "1.5"]),
              "beta": pick(g, ["0.9", "0.8"]), "max_steps": 60}
    inputs = {"w0": normal(g, d, dtype=torch.float64), "x": normal(g, nb, bs, d, dtype=torch.float64),
              "y": normal(g, nb, bs, dtype=torch.float64)}
    return params, inputs


def _batch_norm_cma(g):
    c = randint(g, 2, 3)
    shift, scale = normal(g, c, scale=2.0), uniform(g, 0.5, 2.0, c)

    def batch(n):
        # Values of a column on a grid of scale / 4: two that differ do so by at least that, so no
        # batch variance is a tiny difference of large numbers (float32's cancellation).
        return dyadic(g, n, c) * scale + shift

    inputs = {"a": batch(2), "b": batch(randint(g, 3, 5)), "c": batch(randint(g, 3, 5)), "e": batch(randint(g, 2, 3)),
              "gamma": uniform(g, 0.5, 1.5, c), "beta": away_from_zero(g, c)}
    return {"eps": pick(g, ["1e-5", "1e-3"])}, inputs


def _grid_sample(g):
    b, c, h, w = 1, randint(g, 1, 2), randint(g, 3, 5), randint(g, 3, 5)
    ho, wo = randint(g, 2, 3), randint(g, 3, 4)
    grid = uniform(g, -1.3, 1.3, b, ho, wo, 2)
    corners = pick(g, [False, True])
    # One sample point exactly on a pixel centre, one beyond the left edge, one beyond the bottom.
    px, py = randint(g, 0, w - 1), randint(g, 0, h - 1)
    to_norm = (lambda i, n: 2 * i / (n - 1) - 1) if corners else (lambda i, n: (2 * i + 1) / n - 1)
    grid[0, 0, 0] = torch.tensor([to_norm(px, w), to_norm(py, h)])
    grid[0, 0, 1, 0] = -1.25
    grid[0, -1, -1, 1] = 1.2
    return {"corners": corners, "xmap": "(gx + 1) / 2 * (W - 1)" if corners else "((gx + 1) * W - 1) / 2",
            "ymap": "(gy + 1) / 2 * (H - 1)" if corners else "((gy + 1) * H - 1) / 2"}, \
        {"img": normal(g, b, c, h, w), "grid": grid}


def _reflect_conv(g):
    groups, cin_g, cout_g = randint(g, 1, 2), randint(g, 1, 2), randint(g, 1, 2)
    kh, kw = randint(g, 2, 3), randint(g, 2, 3)
    h, w = randint(g, 5, 7), randint(g, 5, 7)
    params = {"groups": groups, "sh": randint(g, 1, 2), "sw": randint(g, 1, 2), "dil": randint(g, 1, 2),
              "pt": randint(g, 0, 2), "pb": randint(g, 1, 2), "pl": randint(g, 1, 2), "pr": randint(g, 0, 2)}
    # Small weights and biases: an output that cancels to near 0 is a sum of terms small enough that
    # their float32 rounding stays well inside the grader's absolute tolerance.
    inputs = {"x": normal(g, 1, groups * cin_g, h, w), "w": normal(g, groups * cout_g, cin_g, kh, kw, scale=0.05),
              "bias": normal(g, groups * cout_g, scale=0.1)}
    return params, inputs


# --- families ------------------------------------------------------------------------------------

_SCHEDULE = ("$lr * (t + 1) / $warmup if t < $warmup else "
             "$lr_min + 0.5 * ($lr - $lr_min) * (1 + math.cos(math.pi * (t - $warmup) / ($steps - $warmup)))")

# torch's AdamW with the schedule; `backward` accumulates step t's gradients.
_ADAMW_LOOP = ("import math\n"
               "W, b = torch.nn.Parameter(W.clone()), torch.nn.Parameter(b.clone())\n"
               "opt = torch.optim.AdamW([{{'params': [W], 'weight_decay': $wd}}, {{'params': [b], 'weight_decay': 0.0}}],\n"
               "                        lr=$lr, betas=($beta1, $beta2), eps=$eps)\n"
               "for t in range($steps):\n"
               f"    lr_t = {_SCHEDULE}\n"
               "    for group in opt.param_groups:\n"
               "        group['lr'] = lr_t\n"
               "    opt.zero_grad()\n"
               "    {backward}\n"
               "    torch.nn.utils.clip_grad_norm_([W, b], $max_norm)\n"
               "    opt.step()\n"
               "result = torch.cat([W.detach().flatten(), b.detach()])\n")

# Wrong procedures for top-k/top-p sampling: `sample` draws from the tokens `keep` marks, as step (4) does.
_SAMPLE = ("def sample(keep):\n"
           "    probs = torch.softmax(logits / $temp, -1)\n"
           "    out = []\n"
           "    for b in range(len(probs)):\n"
           "        tokens = torch.nonzero(keep[b]).flatten()\n"
           "        r = probs[b, tokens] / probs[b, tokens].sum()\n"
           "        out.append(tokens[min(int((r.cumsum(0) <= u[b]).sum()), len(tokens) - 1)])\n"
           "    return torch.stack(out)\n"
           "ranked = torch.sort(logits, dim=-1, descending=True, stable=True).indices\n"
           "def first(n):\n"
           "    return torch.zeros_like(logits, dtype=torch.bool).scatter_(1, ranked[:, :n], True)\n")
_NUCLEUS_SHORTCUTS = {
    "greedy": "result = logits.argmax(-1)\n",
    "no_filter": _SAMPLE + "result = sample(torch.ones_like(logits, dtype=torch.bool))\n",
    "top_k_only": _SAMPLE + "result = sample(first($k))\n",
    "top_p_only": _SAMPLE + "c = torch.softmax(logits / $temp, -1).sort(dim=-1, descending=True, stable=True).values.cumsum(-1)\n"
                  "result = sample(torch.stack([first(int((row < $p).sum()) + 1)[b] for b, row in enumerate(c)]))\n",
}

FAMILIES = [
    Family("optim/accumulated_adamw_clip_schedule",
           "Train the linear model `pred = X[s] @ W.T + b` for $steps optimiser steps s = 0, 1, ..., $steps - 1; "
           "step s uses the batch `X[s]`, `Y[s]` only. Gradient accumulation: the batch's rows are split, in "
           "order, into $count micro-batches of $sizes_text rows; each micro-batch's loss is the mean of "
           "`(pred - Y[s]) ** 2` over all of its elements (its rows x outputs), divided by $count (the number of "
           "micro-batches), and the gradients of these losses are summed. Clipping: let `n` be the Euclidean "
           "norm of all the accumulated gradient entries of `W` and `b` together and `c = $max_norm / (n + 1e-6)`; "
           "if `c < 1`, multiply both gradients by `c`. Learning rate of step s: `$lr * (s + 1) / $warmup` while "
           "`s < $warmup`, and afterwards `$lr_min + 0.5 * ($lr - $lr_min) * (1 + cos(pi * (s - $warmup) / "
           "($steps - $warmup)))`. Update (AdamW, with `m` and `v` starting at zero for each parameter, `t = s + 1`, "
           "`g` its clipped gradient and `lr` the step's rate): first decoupled weight decay `W = W - lr * $wd * W` "
           "(for `W` only: `b` gets no weight decay), then for each of `W` and `b`: "
           "`m = $beta1 * m + (1 - $beta1) * g`, `v = $beta2 * v + (1 - $beta2) * g ** 2`, "
           "`p = p - lr * (m / (1 - $beta1 ** t)) / (sqrt(v / (1 - $beta2 ** t)) + $eps)`. "
           "`result` is `W` flattened row by row followed by `b`, after the last step.",
           _accumulated_adamw,
           _ADAMW_LOOP.format(backward="for xb, yb in zip(X[t].split($sizes), Y[t].split($sizes)):\n"
                                       "        (((xb @ W.T + b - yb) ** 2).mean() / $count).backward()"),
           "import math\n"
           "params = [W.clone(), b.clone()]\n"
           "m = [torch.zeros_like(p) for p in params]\n"
           "v = [torch.zeros_like(p) for p in params]\n"
           "for t in range($steps):\n"
           f"    lr_t = {_SCHEDULE}\n"
           "    grads = [torch.zeros_like(p) for p in params]\n"
           "    for xb, yb in zip(X[t].split($sizes), Y[t].split($sizes)):\n"
           "        r = xb @ params[0].T + params[1] - yb\n"
           "        grads[0] += 2 * r.T @ xb / r.numel() / $count\n"
           "        grads[1] += 2 * r.sum(0) / r.numel() / $count\n"
           "    n = torch.sqrt(sum((gr ** 2).sum() for gr in grads))\n"
           "    c = $max_norm / (n + 1e-6)\n"
           "    if c < 1:\n"
           "        grads = [gr * c for gr in grads]\n"
           "    params[0] = params[0] - lr_t * $wd * params[0]\n"
           "    for i in range(2):\n"
           "        m[i] = $beta1 * m[i] + (1 - $beta1) * grads[i]\n"
           "        v[i] = $beta2 * v[i] + (1 - $beta2) * grads[i] ** 2\n"
           "        params[i] = params[i] - lr_t * (m[i] / (1 - $beta1 ** (t + 1))) / "
           "((v[i] / (1 - $beta2 ** (t + 1))).sqrt() + $eps)\n"
           "result = torch.cat([params[0].flatten(), params[1]])\n",
           shortcuts={"whole_batch_mean": _ADAMW_LOOP.format(backward="((X[t] @ W.T + b - Y[t]) ** 2).mean().backward()")}),
    Family("losses/ctc_negative_log_likelihood",
           "Connectionist temporal classification. Class 0 is the blank. Sequence `b` has "
           "`input_lengths[b]` frames (the later frames of `logits[b]` are padding and play no part), and frame `t` "
           "gives each class the probability softmax over classes of `logits[b, t]`. Its target is "
           "`targets[b, :target_lengths[b]]` (the entries after it are padding, -1; a target may be empty). "
           "An alignment assigns one class to each of the sequence's frames; it produces the target when merging "
           "every run of equal consecutive classes into one and then deleting the blanks leaves exactly the target. "
           "The probability of an alignment is the product of its frames' probabilities. `result[b]` is minus the "
           "natural log of the sum of the probabilities of all alignments that produce the target.",
           _ctc,
           "log_probs = torch.log_softmax(logits, -1).transpose(0, 1)\n"
           "flat = torch.cat([targets[i, :n] for i, n in enumerate(target_lengths.tolist())])\n"
           "result = torch.nn.functional.ctc_loss(log_probs, flat, input_lengths, target_lengths, blank=0,\n"
           "                                      reduction='none')\n",
           "out = []\n"
           "for i in range(logits.shape[0]):\n"
           "    lp = torch.log_softmax(logits[i, :int(input_lengths[i])], -1)\n"
           "    tgt = targets[i, :int(target_lengths[i])].tolist()\n"
           "    ext = [0]\n"
           "    for c in tgt:\n"
           "        ext += [c, 0]\n"
           "    ninf = torch.tensor(float('-inf'), dtype=lp.dtype)\n"
           "    alpha = [lp[0, 0]] + [lp[0, ext[1]] if len(ext) > 1 else ninf] + [ninf] * (len(ext) - 2)\n"
           "    alpha = alpha[:len(ext)]\n"
           "    for t in range(1, lp.shape[0]):\n"
           "        new = []\n"
           "        for s in range(len(ext)):\n"
           "            terms = [alpha[s]] + ([alpha[s - 1]] if s >= 1 else [])\n"
           "            if s >= 2 and ext[s] != 0 and ext[s] != ext[s - 2]:\n"
           "                terms.append(alpha[s - 2])\n"
           "            new.append(torch.logsumexp(torch.stack(terms), 0) + lp[t, ext[s]])\n"
           "        alpha = new\n"
           "    out.append(-torch.logsumexp(torch.stack(alpha[-2:] if len(ext) > 1 else alpha[-1:]), 0))\n"
           "result = torch.stack(out)\n"),
    Family("tensor_ops/viterbi_ties_and_padding",
           "Viterbi decoding of each sequence `b` over the S states (S = `trans.shape[0]`; all scores are whole "
           "numbers, so sums are exact), using only its first `lengths[b]` steps. With "
           "`delta[0][j] = start[b, j] + emit[b, 0, j]`, for each later step t: "
           "`delta[t][j] = max over i of (delta[t-1][i] + trans[i, j]) + emit[b, t, j]` (`trans[i, j]` scores "
           "moving from state i to state j), and the back-pointer of (t, j) is the smallest i that attains that "
           "maximum. The last state is the smallest j that maximises `delta[lengths[b] - 1][j]`; the path is "
           "recovered by following back-pointers from it. `result[b, t]` is the path's state at step t for "
           "`t < lengths[b]` and -1 after that.",
           _viterbi,
           "B, T, S = emit.shape\n"
           "result = torch.full((B, T), -1, dtype=torch.int64)\n"
           "for b in range(B):\n"
           "    n = int(lengths[b])\n"
           "    delta, back = start[b] + emit[b, 0], []\n"
           "    for t in range(1, n):\n"
           "        cand = delta[:, None] + trans\n"
           "        arg = cand.argmax(0)\n"
           "        back.append(arg)\n"
           "        delta = cand.gather(0, arg[None])[0] + emit[b, t]\n"
           "    state = int(delta.argmax())\n"
           "    path = [state]\n"
           "    for arg in reversed(back):\n"
           "        state = int(arg[state])\n"
           "        path.append(state)\n"
           "    result[b, :n] = torch.tensor(path[::-1])\n",
           "B, T, S = emit.shape\n"
           "rows = []\n"
           "for b in range(B):\n"
           "    n = int(lengths[b])\n"
           "    delta = [float(start[b, j] + emit[b, 0, j]) for j in range(S)]\n"
           "    backs = []\n"
           "    for t in range(1, n):\n"
           "        new, ptr = [], []\n"
           "        for j in range(S):\n"
           "            best, arg = None, None\n"
           "            for i in range(S):\n"
           "                value = delta[i] + float(trans[i, j])\n"
           "                if best is None or value > best:\n"
           "                    best, arg = value, i\n"
           "            new.append(best + float(emit[b, t, j]))\n"
           "            ptr.append(arg)\n"
           "        delta = new\n"
           "        backs.append(ptr)\n"
           "    state = max(range(S), key=lambda j: (delta[j], -j))\n"
           "    path = [state]\n"
           "    for ptr in reversed(backs):\n"
           "        state = ptr[state]\n"
           "        path.append(state)\n"
           "    rows.append(path[::-1] + [-1] * (T - n))\n"
           "result = torch.tensor(rows)\n"),
    Family("tensor_ops/class_aware_nms",
           "Non-maximum suppression per class. Box `i` is `boxes[i] = (x1, y1, x2, y2)` with `x1 < x2` and "
           "`y1 < y2`, its area `(x2 - x1) * (y2 - y1)`; the intersection of two boxes has width "
           "`max(0, min(x2) - max(x1))` and height `max(0, min(y2) - max(y1))`, and their IoU is the intersection's "
           "area divided by (the sum of their areas minus the intersection's area). Visit the boxes in order of "
           "decreasing `scores`, equal scores in increasing index order. A visited box is kept unless a box "
           "already kept has the same `classes` value and an IoU with it strictly greater than $thr (an IoU of "
           "exactly $thr does not suppress). `result` holds the indices of the kept boxes in the order they were "
           "kept.",
           _nms,
           "order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))\n"
           "def iou(a, b):\n"
           "    iw = (torch.minimum(a[2], b[2]) - torch.maximum(a[0], b[0])).clamp(min=0)\n"
           "    ih = (torch.minimum(a[3], b[3]) - torch.maximum(a[1], b[1])).clamp(min=0)\n"
           "    inter = iw * ih\n"
           "    area = lambda r: (r[2] - r[0]) * (r[3] - r[1])\n"
           "    return inter / (area(a) + area(b) - inter)\n"
           "kept = []\n"
           "for i in order:\n"
           "    if all(classes[j] != classes[i] or iou(boxes[j], boxes[i]) <= $thr for j in kept):\n"
           "        kept.append(i)\n"
           "result = torch.tensor(kept, dtype=torch.int64)\n",
           "x1, y1, x2, y2 = boxes.double().unbind(1)\n"
           "area = (x2 - x1) * (y2 - y1)\n"
           "iw = (torch.minimum(x2[:, None], x2[None]) - torch.maximum(x1[:, None], x1[None])).clamp(min=0)\n"
           "ih = (torch.minimum(y2[:, None], y2[None]) - torch.maximum(y1[:, None], y1[None])).clamp(min=0)\n"
           "inter = iw * ih\n"
           "suppress = (inter / (area[:, None] + area[None] - inter) > $thr) & (classes[:, None] == classes[None])\n"
           "order = torch.sort(-scores, stable=True).indices\n"
           "alive = torch.ones(len(scores), dtype=torch.bool)\n"
           "kept = []\n"
           "for i in order.tolist():\n"
           "    if alive[i]:\n"
           "        kept.append(i)\n"
           "        alive &= ~suppress[i]\n"
           "result = torch.tensor(kept)\n",
           shortcuts={"suppress_at_threshold":
               "x1, y1, x2, y2 = boxes.unbind(1)\n"
               "area = (x2 - x1) * (y2 - y1)\n"
               "iw = (torch.minimum(x2[:, None], x2[None]) - torch.maximum(x1[:, None], x1[None])).clamp(min=0)\n"
               "ih = (torch.minimum(y2[:, None], y2[None]) - torch.maximum(y1[:, None], y1[None])).clamp(min=0)\n"
               "iou = iw * ih / (area[:, None] + area[None] - iw * ih)\n"
               "suppress = (iou >= $thr) & (classes[:, None] == classes[None])\n"
               "alive, kept = torch.ones(len(scores), dtype=torch.bool), []\n"
               "for i in torch.sort(-scores, stable=True).indices.tolist():\n"
               "    if alive[i]:\n        kept.append(i)\n        alive &= ~suppress[i]\n"
               "result = torch.tensor(kept)\n"}),
    Family("tensor_ops/top_k_top_p_sampling",
           "Sample one token per row of `logits` (batch, vocabulary) from the uniform draw `u[b]`: "
           "(1) `probs = softmax(logits[b] / $temp)`; (2) rank the tokens by decreasing `probs` (equal "
           "probabilities: lower token index first) and keep the first $k; (3) renormalise the kept tokens' "
           "probabilities to sum to 1 and, walking the ranking, keep the shortest prefix whose renormalised "
           "probabilities sum to at least $p; (4) renormalise the `probs` of the tokens left to sum to 1, list those "
           "tokens in increasing token index, and take the first token at which the running sum of their "
           "renormalised probabilities exceeds `u[b]`. `result[b]` is that token's index.",
           _nucleus,
           "probs = torch.softmax(logits / $temp, -1)\n"
           "out = []\n"
           "for b in range(len(probs)):\n"
           "    sorted_p, order = torch.sort(probs[b], descending=True, stable=True)\n"
           "    q = sorted_p[:$k] / sorted_p[:$k].sum()\n"
           "    n = min(int((q.cumsum(0) < $p).sum()) + 1, $k)\n"
           "    tokens = order[:n].sort().values\n"
           "    r = probs[b, tokens] / probs[b, tokens].sum()\n"
           "    out.append(tokens[min(int((r.cumsum(0) <= u[b]).sum()), n - 1)])\n"
           "result = torch.stack(out)\n",
           "import math\n"
           "rows = []\n"
           "for b in range(logits.shape[0]):\n"
           "    z = (logits[b].double() / $temp).tolist()\n"
           "    top = max(z)\n"
           "    e = [math.exp(v - top) for v in z]\n"
           "    ranked = sorted(range(len(e)), key=lambda i: (-e[i], i))[:$k]\n"
           "    total, acc, keep = sum(e[i] for i in ranked), 0.0, []\n"
           "    for i in ranked:\n"
           "        keep.append(i)\n"
           "        acc += e[i] / total\n"
           "        if acc >= $p:\n"
           "            break\n"
           "    keep.sort()\n"
           "    total, acc = sum(e[i] for i in keep), 0.0\n"
           "    choice = keep[-1]\n"
           "    for i in keep:\n"
           "        acc += e[i] / total\n"
           "        if acc > float(u[b]):\n"
           "            choice = i\n"
           "            break\n"
           "    rows.append(choice)\n"
           "result = torch.tensor(rows)\n",
           shortcuts=_NUCLEUS_SHORTCUTS),
    Family("nn_modules/gqa_rope_kv_cache",
           "One decoding step of grouped-query attention with a key/value cache. `x` (batch, T, E) holds T new "
           "tokens; the cache holds P earlier positions per batch element, `k_cache` and `v_cache` (batch, $hkv "
           "kv-heads, P, $dh), whose keys are already rotated. New token i has position `P + i`. Projections "
           "(no biases): `q = x @ wq.T` gives $hq query heads, `k = x @ wk.T` and `v = x @ wv.T` give $hkv kv-heads; "
           "head h of each is its features `h*$dh` to `h*$dh + $dh - 1`. Rotary embedding of the new `q` and `k` "
           "(per head, not `v`): with `a` the head's first $half features and `c` its last $half, feature j of "
           "each half turns by the angle `position * $base ** (-2j / $dh)`: the new first half is "
           "`a * cos - c * sin` and the new second half `a * sin + c * cos`. Query head h uses kv-head "
           "`h // $group`; its keys and values are the cache's P positions followed by the new tokens. For batch "
           "element b, new token i may attend to cache position p only if `p >= pad[b]` (the first `pad[b]` cache "
           "slots are left padding) and to new token j only if `j <= i`. Attention weights are the softmax over "
           "the allowed positions of `q . k / sqrt($dh)`; each head's output is the weighted sum of the values; "
           "the heads are concatenated in head order along the features and `result = concat @ wo.T`, shape "
           "(batch, T, E).",
           _gqa,
           "B, T, E = x.shape\n"
           "P = k_cache.shape[2]\n"
           "def rope(t):\n"
           "    pos = torch.arange(P, P + T).to(t.dtype)\n"
           "    angle = pos[:, None] * $base ** (-2 * torch.arange($half).to(t.dtype) / $dh)\n"
           "    a, c = t[..., :$half], t[..., $half:]\n"
           "    return torch.cat([a * angle.cos() - c * angle.sin(), a * angle.sin() + c * angle.cos()], -1)\n"
           "heads = lambda m, n: (x @ m.T).reshape(B, T, n, $dh).transpose(1, 2)\n"
           "q, k, v = rope(heads(wq, $hq)), rope(heads(wk, $hkv)), heads(wv, $hkv)\n"
           "keys = torch.cat([k_cache, k], 2).repeat_interleave($group, 1)\n"
           "values = torch.cat([v_cache, v], 2).repeat_interleave($group, 1)\n"
           "scores = q @ keys.transpose(-1, -2) / $dh ** 0.5\n"
           "cache_ok = (torch.arange(P)[None, :] >= pad[:, None])[:, None, :].expand(B, T, P)\n"
           "causal = torch.ones(T, T, dtype=torch.bool).tril()[None].expand(B, T, T)\n"
           "allowed = torch.cat([cache_ok, causal], -1)[:, None]\n"
           "weights = torch.softmax(scores.masked_fill(~allowed, float('-inf')), -1)\n"
           "result = (weights @ values).transpose(1, 2).reshape(B, T, $hq * $dh) @ wo.T\n",
           "import math\n"
           "B, T, E = x.shape\n"
           "P = k_cache.shape[2]\n"
           "def rope(t):\n"
           "    angle = torch.arange(P, P + T).double()[:, None] * $base ** (-torch.arange(0, $dh, 2).double() / $dh)\n"
           "    z = torch.complex(t[..., :$half].double(), t[..., $half:].double())\n"
           "    z = z * torch.polar(torch.ones_like(angle), angle)\n"
           "    return torch.cat([z.real, z.imag], -1).to(t.dtype)\n"
           "q = rope((x @ wq.T).view(B, T, $hq, $dh).permute(0, 2, 1, 3))\n"
           "k = rope((x @ wk.T).view(B, T, $hkv, $dh).permute(0, 2, 1, 3))\n"
           "v = (x @ wv.T).view(B, T, $hkv, $dh).permute(0, 2, 1, 3)\n"
           "out = torch.zeros(B, T, $hq, $dh, dtype=x.dtype)\n"
           "for b in range(B):\n"
           "    for h in range($hq):\n"
           "        kv = h // $group\n"
           "        keys = torch.cat([k_cache[b, kv, int(pad[b]):], k[b, kv]])\n"
           "        values = torch.cat([v_cache[b, kv, int(pad[b]):], v[b, kv]])\n"
           "        visible = P - int(pad[b])\n"
           "        for i in range(T):\n"
           "            s = keys[:visible + i + 1] @ q[b, h, i] / math.sqrt($dh)\n"
           "            out[b, i, h] = torch.softmax(s, 0) @ values[:visible + i + 1]\n"
           "result = out.reshape(B, T, $hq * $dh) @ wo.T\n",
           shortcuts={"heads_tiled_not_grouped":
               "B, T, E = x.shape\n"
               "P = k_cache.shape[2]\n"
               "def rope(t):\n"
               "    angle = torch.arange(P, P + T)[:, None] * $base ** (-2 * torch.arange($half) / $dh)\n"
               "    a, c = t[..., :$half], t[..., $half:]\n"
               "    return torch.cat([a * angle.cos() - c * angle.sin(), a * angle.sin() + c * angle.cos()], -1)\n"
               "heads = lambda m, n: (x @ m.T).reshape(B, T, n, $dh).transpose(1, 2)\n"
               "q, k, v = rope(heads(wq, $hq)), rope(heads(wk, $hkv)), heads(wv, $hkv)\n"
               "keys = torch.cat([k_cache, k], 2).repeat(1, $group, 1, 1)\n"
               "values = torch.cat([v_cache, v], 2).repeat(1, $group, 1, 1)\n"
               "scores = q @ keys.transpose(-1, -2) / $dh ** 0.5\n"
               "cache_ok = (torch.arange(P)[None, :] >= pad[:, None])[:, None, :].expand(B, T, P)\n"
               "causal = torch.ones(T, T, dtype=torch.bool).tril()[None].expand(B, T, T)\n"
               "allowed = torch.cat([cache_ok, causal], -1)[:, None]\n"
               "weights = torch.softmax(scores.masked_fill(~allowed, float('-inf')), -1)\n"
               "result = (weights @ values).transpose(1, 2).reshape(B, T, $hq * $dh) @ wo.T\n"},
           float64_margin=True),
    Family("tensor_ops/connected_components_8",
           "Label the connected components of the foreground (the 1s) of each image `grid[b]` (0 is background). "
           "Two foreground cells are connected when they are neighbours in any of the 8 directions (diagonals "
           "included), and connection is transitive. In each image separately, number the components 1, 2, ... "
           "in the order in which their first cell is met scanning the image row by row, top to bottom, each row "
           "left to right. `result[b, r, c]` is the number of the component holding cell (r, c), and 0 for "
           "background.",
           _components,
           "B, H, W = grid.shape\n"
           "result = torch.zeros_like(grid)\n"
           "for b in range(B):\n"
           "    count = 0\n"
           "    for r in range(H):\n"
           "        for c in range(W):\n"
           "            if grid[b, r, c] == 1 and result[b, r, c] == 0:\n"
           "                count += 1\n"
           "                result[b, r, c] = count\n"
           "                stack = [(r, c)]\n"
           "                while stack:\n"
           "                    i, j = stack.pop()\n"
           "                    for di in (-1, 0, 1):\n"
           "                        for dj in (-1, 0, 1):\n"
           "                            a, e = i + di, j + dj\n"
           "                            if 0 <= a < H and 0 <= e < W and grid[b, a, e] == 1 and result[b, a, e] == 0:\n"
           "                                result[b, a, e] = count\n"
           "                                stack.append((a, e))\n",
           "B, H, W = grid.shape\n"
           "big = float(H * W + 1)\n"
           "fg = grid == 1\n"
           "lab = torch.where(fg, torch.arange(1, H * W + 1).double().reshape(1, H, W), big)\n"
           "while True:\n"
           "    low = -torch.nn.functional.max_pool2d(-lab[:, None], 3, 1, 1)[:, 0]\n"
           "    new = torch.where(fg, low, big)\n"
           "    if torch.equal(new, lab):\n"
           "        break\n"
           "    lab = new\n"
           "result = torch.zeros(B, H, W, dtype=torch.int64)\n"
           "for b in range(B):\n"
           "    seen = {}\n"
           "    for value in lab[b].flatten().tolist():\n"
           "        if value != big and value not in seen:\n"
           "            seen[value] = len(seen) + 1\n"
           "    for value, number in seen.items():\n"
           "        result[b][lab[b] == value] = number\n",
           held_out=True),
    Family("tensor_ops/kalman_filter_missing",
           "Run a linear Kalman filter from the state mean `x0` and covariance `P0` over the observations `z` "
           "(one row per time step). At each step t: predict `x = F @ x`, `P = F @ P @ F.T + Q`; then, if row "
           "`z[t]` is observed, update with `y = z[t] - H @ x`, `S = H @ P @ H.T + R`, `K = P @ H.T @ inverse(S)`, "
           "`x = x + K @ y` and `P = (I - K @ H) @ P`. A row whose every entry is NaN is a missing observation "
           "(no row is partly NaN): that step only "
           "predicts. `result[t]` is `x` after step t, for every step, and the rows after those are the final "
           "`P`, so `result` has (steps + state size) rows.",
           _kalman,
           "x, P = x0.clone(), P0.clone()\n"
           "rows = []\n"
           "for zt in z:\n"
           "    x, P = F @ x, F @ P @ F.T + Q\n"
           "    if not torch.isnan(zt).any():\n"
           "        S = H @ P @ H.T + R\n"
           "        K = torch.linalg.solve(S, H @ P).T\n"
           "        x = x + K @ (zt - H @ x)\n"
           "        P = (torch.eye(len(x), dtype=P.dtype) - K @ H) @ P\n"
           "    rows.append(x)\n"
           "result = torch.cat([torch.stack(rows), P])\n",
           "x, P = x0.clone(), P0.clone()\n"
           "rows = []\n"
           "for t in range(z.shape[0]):\n"
           "    x = F @ x\n"
           "    P = F @ P @ F.T + Q\n"
           "    if torch.isfinite(z[t]).all():\n"
           "        K = P @ H.T @ torch.linalg.inv(H @ P @ H.T + R)\n"
           "        x = x + K @ (z[t] - H @ x)\n"
           "        P = P - K @ H @ P\n"
           "    rows.append(x)\n"
           "result = torch.cat([torch.stack(rows), P])\n",
           held_out=True),
    Family("tensor_ops/segment_weighted_variance",
           "Weighted variance per segment, for segments 0 to $s - 1 (element i belongs to segment `seg[i]`). For a "
           "segment with elements i, weights `w[i]` and values `x[i]`: `W1 = sum w`, `W2 = sum w ** 2`, "
           "`m = sum(w * x) / W1` and the variance is `sum(w * (x - m) ** 2) / (W1 - W2 / W1)`. A segment with no "
           "element or with one element has variance 0. Each `result[s]` must be within a relative error of 1e-5 "
           "of the exact value of this formula for the given float32 inputs.",
           _segment_variance,
           "xd, wd = x.double(), w.double()\n"
           "W1 = torch.zeros($s, dtype=torch.float64).index_add(0, seg, wd)\n"
           "W2 = torch.zeros($s, dtype=torch.float64).index_add(0, seg, wd ** 2)\n"
           "count = torch.zeros($s, dtype=torch.int64).index_add(0, seg, torch.ones_like(seg))\n"
           "mean = torch.zeros($s, dtype=torch.float64).index_add(0, seg, wd * xd) / W1.clamp(min=1e-300)\n"
           "ss = torch.zeros($s, dtype=torch.float64).index_add(0, seg, wd * (xd - mean[seg]) ** 2)\n"
           "var = ss / torch.where(count > 1, W1 - W2 / W1, torch.ones_like(W1))\n"
           "result = torch.where(count > 1, var, torch.zeros_like(var)).float()\n",
           "out = []\n"
           "for s in range($s):\n"
           "    members = (seg == s).nonzero().flatten().tolist()\n"
           "    if len(members) < 2:\n"
           "        out.append(0.0)\n"
           "        continue\n"
           "    shift = float(x[members[0]])\n"
           "    ws = [float(w[i]) for i in members]\n"
           "    ds = [float(x[i]) - shift for i in members]\n"
           "    W1, W2 = sum(ws), sum(v * v for v in ws)\n"
           "    m = sum(a * b for a, b in zip(ws, ds)) / W1\n"
           "    out.append(sum(a * (b - m) ** 2 for a, b in zip(ws, ds)) / (W1 - W2 / W1))\n"
           "result = torch.tensor(out, dtype=torch.float32)\n",
           shortcuts={"float32_sums":
               "W1 = torch.zeros($s).index_add(0, seg, w)\n"
               "W2 = torch.zeros($s).index_add(0, seg, w ** 2)\n"
               "count = torch.zeros($s).index_add(0, seg, torch.ones_like(w))\n"
               "mean = torch.zeros($s).index_add(0, seg, w * x) / W1.clamp(min=1e-30)\n"
               "ss = torch.zeros($s).index_add(0, seg, w * (x - mean[seg]) ** 2)\n"
               "result = torch.where(count > 1, ss / torch.where(count > 1, W1 - W2 / W1, 1.0), 0.0)\n"}),
    Family("losses/censored_exponential_nll",
           "Negative log-likelihood per row under an exponential distribution with rate `exp(eta[i])` "
           "(density `rate * exp(-rate * t)` for t >= 0), by the kind of observation: `kind[i] == 0`, the event "
           "happened at time `lo[i]` (use the density there); `kind[i] == 1`, the event had not happened by time "
           "`lo[i]`; `kind[i] == 2`, the event happened in the interval from `lo[i]` to `hi[i]` (use the "
           "probability of that interval; `hi` plays no part in the other kinds). `result[i]` is minus the "
           "natural log of that likelihood, and must be "
           "within a relative error of 1e-5 of its exact value for the given float32 inputs, on every row.",
           _censored,
           "import math\n"
           "rate = eta.double().exp()\n"
           "a, d = rate * lo.double(), rate * (hi.double() - lo.double())\n"
           "log1mexp = torch.where(d < math.log(2), torch.log(-torch.expm1(-d)), torch.log1p(-torch.exp(-d)))\n"
           "nll = torch.where(kind == 0, a - eta.double(), torch.where(kind == 1, a, a - log1mexp))\n"
           "result = nll.float()\n",
           "import math\n"
           "out = []\n"
           "for e, l, h, k in zip(eta.tolist(), lo.tolist(), hi.tolist(), kind.tolist()):\n"
           "    rate = math.exp(e)\n"
           "    if k == 0:\n"
           "        out.append(rate * l - e)\n"
           "    elif k == 1:\n"
           "        out.append(rate * l)\n"
           "    else:\n"
           "        out.append(rate * l - math.log(-math.expm1(-rate * (h - l))))\n"
           "result = torch.tensor(out, dtype=torch.float32)\n",
           shortcuts={"exp_difference":
               "rate, l, h = eta.double().exp(), lo.double(), hi.double()\n"
               "interval = -torch.log(torch.exp(-rate * l) - torch.exp(-rate * h))\n"
               "result = torch.where(kind == 0, rate * l - eta, torch.where(kind == 1, rate * l, interval)).float()\n"}),
    Family("nn_modules/beam_search_length_penalty",
           "Beam search with beam width $k, at most $L tokens and end token $eos, for each batch element b. A "
           "hypothesis is a token sequence; its log-probability `s` is the sum of its tokens' log-probabilities: "
           "the first token `t` has `start[b, t]`, and a token `t` after the token `a` has `logp[b, a, t]`. The beam "
           "starts as the single empty hypothesis (s = 0). At each of at most $L steps: extend every hypothesis in "
           "the beam by every token; rank all these candidates by decreasing `s` and take the first $k; those of "
           "them that end in the end token are finished (they leave the beam), and the others form the next beam; stop "
           "early if the beam is empty. Then every finished hypothesis and every hypothesis left in the beam gets "
           "the score `s / n ** $alpha`, where n is its number of tokens (the end token included). `result[b]` is "
           "the hypothesis with the highest score, its tokens followed by -1 up to length $L.",
           _beam,
           "B, V = start.shape\n"
           "result = torch.full((B, $L), -1, dtype=torch.int64)\n"
           "for b in range(B):\n"
           "    beam, finished = [((), torch.zeros((), dtype=start.dtype))], []\n"
           "    for step in range($L):\n"
           "        cands = []\n"
           "        for toks, s in beam:\n"
           "            row = start[b] if not toks else logp[b, toks[-1]]\n"
           "            cands += [(toks + (t,), s + row[t]) for t in range(V)]\n"
           "        cands.sort(key=lambda c: -float(c[1]))\n"
           "        top = cands[:$k]\n"
           "        finished += [c for c in top if c[0][-1] == $eos]\n"
           "        beam = [c for c in top if c[0][-1] != $eos]\n"
           "        if not beam:\n"
           "            break\n"
           "    toks, _ = max(finished + beam, key=lambda c: float(c[1]) / len(c[0]) ** $alpha)\n"
           "    result[b, :len(toks)] = torch.tensor(toks)\n",
           "B, V = start.shape\n"
           "rows = []\n"
           "for b in range(B):\n"
           "    seqs = torch.zeros(1, 0, dtype=torch.int64)\n"
           "    scores = torch.zeros(1, dtype=torch.float64)\n"
           "    done = []\n"
           "    for step in range($L):\n"
           "        nxt = start[b].double()[None] if step == 0 else logp[b].double()[seqs[:, -1]]\n"
           "        total = (scores[:, None] + nxt).flatten()\n"
           "        best = total.topk(min($k, len(total))).indices\n"
           "        seqs = torch.cat([seqs[best // V], (best % V)[:, None]], 1)\n"
           "        scores = total[best]\n"
           "        ended = seqs[:, -1] == $eos\n"
           "        done += [(seqs[i].tolist(), float(scores[i])) for i in ended.nonzero().flatten().tolist()]\n"
           "        seqs, scores = seqs[~ended], scores[~ended]\n"
           "        if len(seqs) == 0:\n"
           "            break\n"
           "    pool = done + [(s.tolist(), float(v)) for s, v in zip(seqs, scores)]\n"
           "    toks = max(pool, key=lambda c: c[1] / len(c[0]) ** $alpha)[0]\n"
           "    rows.append(toks + [-1] * ($L - len(toks)))\n"
           "result = torch.tensor(rows)\n"),
    Family("optim/lr_range_finder",
           "A learning-rate range test on `loss(w) = mean((x[j] @ w - y[j]) ** 2)` from `w = w0`. Steps are "
           "numbered i = 0, 1, ...; step i uses the learning rate `lr_i = $lr0 * $factor ** i` and the batch "
           "`j = i mod (number of batches)`. At step i: compute the loss `L_i` at the current `w`; update the "
           "running average `avg = $beta * avg + (1 - $beta) * L_i` (avg starts at 0) and its debiased value "
           "`S_i = avg / (1 - $beta ** (i + 1))`; record (`lr_i`, `L_i`, `S_i`); if `S_i > 4 * min(S_0, ..., S_i)`, "
           "stop (without updating `w`); otherwise take the gradient-descent step `w = w - lr_i * grad loss(w)` "
           "on that batch, and stop after step $max_steps - 1 in any case. `result` has three rows: the recorded "
           "learning rates, losses `L_i` and debiased averages `S_i`, one column per step taken.",
           _lr_finder,
           "w = w0.clone()\n"
           "avg, rows = 0.0, []\n"
           "for i in range($max_steps):\n"
           "    lr_i = $lr0 * $factor ** i\n"
           "    xb, yb = x[i % len(x)], y[i % len(x)]\n"
           "    wp = w.clone().requires_grad_()\n"
           "    loss = ((xb @ wp - yb) ** 2).mean()\n"
           "    (grad,) = torch.autograd.grad(loss, wp)\n"
           "    avg = $beta * avg + (1 - $beta) * loss.item()\n"
           "    smooth = avg / (1 - $beta ** (i + 1))\n"
           "    rows.append([lr_i, loss.item(), smooth])\n"
           "    if smooth > 4 * min(r[2] for r in rows):\n"
           "        break\n"
           "    w = w - lr_i * grad\n"
           "result = torch.tensor(rows, dtype=x.dtype).T.contiguous()\n",
           "w = w0.clone()\n"
           "avg, best, lrs, losses, smooths = 0.0, float('inf'), [], [], []\n"
           "i = 0\n"
           "while i < $max_steps:\n"
           "    xb, yb = x[i % x.shape[0]], y[i % x.shape[0]]\n"
           "    r = xb @ w - yb\n"
           "    loss = float((r ** 2).mean())\n"
           "    avg = $beta * avg + (1 - $beta) * loss\n"
           "    smooth = avg / (1 - $beta ** (i + 1))\n"
           "    best = min(best, smooth)\n"
           "    lrs.append($lr0 * $factor ** i); losses.append(loss); smooths.append(smooth)\n"
           "    if smooth > 4 * best:\n"
           "        break\n"
           "    w = w - $lr0 * $factor ** i * 2 * xb.T @ r / len(yb)\n"
           "    i += 1\n"
           "result = torch.tensor([lrs, losses, smooths], dtype=torch.float64)\n"),
    Family("nn_modules/batch_norm_cumulative_average",
           "A batch-norm layer over the C features of 2-D batches, with scale `gamma`, shift `beta` and eps $eps, "
           "whose running statistics are cumulative averages: they start at mean 0 and variance 1, and after k "
           "training passes they are the plain averages of the k batch means and of the k unbiased batch "
           "variances (the starting values no longer count). A training pass normalises with its batch's mean "
           "and biased variance, `(x - mean) / sqrt(var + $eps) * gamma + beta`, then updates the running "
           "statistics; an evaluation pass normalises with the running mean and variance in the same formula and "
           "changes nothing. "
           "Run, in order: evaluation on `e`, training on `a`, training on `b`, evaluation on `e`, training on "
           "`c`, evaluation on `e`. `result` is the six outputs, each flattened row by row, concatenated in that "
           "order, followed by the final running mean and then the final running variance.",
           _batch_norm_cma,
           "bn = torch.nn.BatchNorm1d(gamma.shape[0], eps=$eps, momentum=None)\n"
           "outs = []\n"
           "with torch.no_grad():\n"
           "    bn.weight.copy_(gamma)\n"
           "    bn.bias.copy_(beta)\n"
           "    for batch, training in [(e, False), (a, True), (b, True), (e, False), (c, True), (e, False)]:\n"
           "        bn.train(training)\n"
           "        outs.append(bn(batch).flatten())\n"
           "result = torch.cat(outs + [bn.running_mean, bn.running_var])\n",
           "means, variances, outs = [], [], []\n"
           "for batch, training in [(e, False), (a, True), (b, True), (e, False), (c, True), (e, False)]:\n"
           "    if training:\n"
           "        mu = batch.mean(0)\n"
           "        var = ((batch - mu) ** 2).mean(0)\n"
           "        means.append(mu)\n"
           "        variances.append(((batch - mu) ** 2).sum(0) / (len(batch) - 1))\n"
           "    else:\n"
           "        mu = torch.stack(means).mean(0) if means else torch.zeros_like(gamma)\n"
           "        var = torch.stack(variances).mean(0) if variances else torch.ones_like(gamma)\n"
           "    outs.append(((batch - mu) / torch.sqrt(var + $eps) * gamma + beta).flatten())\n"
           "result = torch.cat(outs + [torch.stack(means).mean(0), torch.stack(variances).mean(0)])\n",
           float64_margin=True),
    Family("nn_modules/bilinear_grid_sample",
           "Bilinear sampling of `img` (batch, channels, H, W) at the points of `grid` (batch, Ho, Wo, 2), where "
           "`grid[..., 0]` is the horizontal coordinate `gx` and `grid[..., 1]` the vertical `gy`, both normalised "
           "so that the image spans -1 to 1. A point maps to the pixel coordinates `ix = $xmap` (column) and "
           "`iy = $ymap` (row), where pixel `img[n, ch, r, c]` sits at `iy = r`, `ix = c`. With `c0 = floor(ix)`, "
           "`r0 = floor(iy)`, `fx = ix - c0` and `fy = iy - r0`, the sample is "
           "`(1-fy)(1-fx) img[r0, c0] + (1-fy) fx img[r0, c0+1] + fy (1-fx) img[r0+1, c0] + fy fx img[r0+1, c0+1]`, "
           "where `img[r, c]` stands for `img[n, ch, r, c]` and a pixel outside the image counts as 0. "
           "`result[n, ch, i, j]` samples channel "
           "`ch` of image `n` at `grid[n, i, j]`.",
           _grid_sample,
           "result = torch.nn.functional.grid_sample(img, grid, mode='bilinear', padding_mode='zeros', "
           "align_corners=$corners)\n",
           "N, C, H, W = img.shape\n"
           "gx, gy = grid[..., 0].double(), grid[..., 1].double()\n"
           "ix = ((gx + 1) / 2 * (W - 1)) if $corners else (((gx + 1) * W - 1) / 2)\n"
           "iy = ((gy + 1) / 2 * (H - 1)) if $corners else (((gy + 1) * H - 1) / 2)\n"
           "c0, r0 = ix.floor(), iy.floor()\n"
           "fx, fy = ix - c0, iy - r0\n"
           "out = torch.zeros(N, C, *grid.shape[1:3], dtype=torch.float64)\n"
           "corners = [(0, 0, (1 - fy) * (1 - fx)), (0, 1, (1 - fy) * fx), (1, 0, fy * (1 - fx)), (1, 1, fy * fx)]\n"
           "for dr, dc, wgt in corners:\n"
           "    r, c = (r0 + dr).long(), (c0 + dc).long()\n"
           "    inside = (r >= 0) & (r < H) & (c >= 0) & (c < W)\n"
           "    for n in range(N):\n"
           "        vals = img[n].double()[:, r[n].clamp(0, H - 1), c[n].clamp(0, W - 1)]\n"
           "        out[n] += vals * (wgt[n] * inside[n])\n"
           "result = out.float()\n"),
    Family("nn_modules/reflect_grouped_conv2d",
           "A 2-D convolution (cross-correlation: the kernel is not flipped) of `x` (1, C_in, H, W) with `w` "
           "(C_out, C_in / $groups, kh, kw) and `bias`, with groups = $groups (output channel o sees only input "
           "channels `g * C_in / $groups` to `(g + 1) * C_in / $groups - 1`, where `g = o // (C_out / $groups)`), "
           "stride $sh along rows and $sw along columns, dilation $dil in both directions, after reflection "
           "padding of $pt rows on top, $pb at the bottom, $pl columns on the left and $pr on the right. Reflection "
           "padding mirrors the image about its edge row or column without repeating it: row -1 is row 1, row H "
           "is row H - 2 (likewise for columns). With `padded` the padded input, indexed from 0 at its top-left "
           "corner, and `g` the output channel's group: `result[0, o, i, j] = bias[o] + sum over c from 0 to "
           "C_in / $groups - 1 and kernel offsets (u, v) of w[o, c, u, v] * padded[g * C_in / $groups + c, "
           "i * $sh + u * $dil, j * $sw + v * $dil]`, for every (i, j) at which the kernel fits in `padded`.",
           _reflect_conv,
           "padded = torch.nn.functional.pad(x, ($pl, $pr, $pt, $pb), mode='reflect')\n"
           "result = torch.nn.functional.conv2d(padded, w, bias, stride=($sh, $sw), dilation=$dil, groups=$groups)\n",
           "_, C, H, W = x.shape\n"
           "O, Cg, kh, kw = w.shape\n"
           "reflect = lambda i, n: -i if i < 0 else (2 * (n - 1) - i if i >= n else i)\n"
           "rows = torch.tensor([reflect(i, H) for i in range(-$pt, H + $pb)])\n"
           "cols = torch.tensor([reflect(j, W) for j in range(-$pl, W + $pr)])\n"
           "padded = x[0].double()[:, rows][:, :, cols]\n"
           "Hp, Wp = padded.shape[1:]\n"
           "Ho, Wo = (Hp - $dil * (kh - 1) - 1) // $sh + 1, (Wp - $dil * (kw - 1) - 1) // $sw + 1\n"
           "out = torch.zeros(O, Ho, Wo, dtype=torch.float64)\n"
           "per_group = O // $groups\n"
           "for o in range(O):\n"
           "    g = o // per_group\n"
           "    for u in range(kh):\n"
           "        for v in range(kw):\n"
           "            patch = padded[g * Cg:(g + 1) * Cg, u * $dil:u * $dil + (Ho - 1) * $sh + 1:$sh, "
           "v * $dil:v * $dil + (Wo - 1) * $sw + 1:$sw]\n"
           "            out[o] += torch.einsum('c,cij->ij', w[o, :, u, v].double(), patch)\n"
           "    out[o] += float(bias[o])\n"
           "result = out[None].float()\n",
           float64_margin=True),
]
