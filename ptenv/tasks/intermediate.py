"""The intermediate tier: seeded families whose instruction states the maths, not the function.

Each family samples shapes, values and parameters; its reference solution is run like a model's
cell, and `independent` is a second formulation the tolerance gate checks against (build_tasks.py).
Values are continuous draws (never exactly representable in float16), integer inputs avoid ties
and empty groups, and "extreme" inputs are large enough that the textbook formula overflows.
"""

import torch

from ptenv.tasks.families import Family, away_from_zero, normal, pick, randint, uniform


def _pairwise(g):
    n, m, d = randint(g, 3, 6), randint(g, 2, 5), randint(g, 2, 5)
    return {}, {"a": normal(g, n, d), "b": normal(g, m, d)}


def _segments(g):
    n, d, s = randint(g, 6, 10), randint(g, 2, 4), randint(g, 2, 4)
    seg = torch.cat([torch.arange(s), torch.randint(0, s, (n - s,), generator=g)])  # every segment non-empty
    seg = seg[torch.randperm(n, generator=g)]
    return {"s": s}, {"x": normal(g, n, d), "seg": seg}


def _topk(g):
    r, c = randint(g, 2, 4), randint(g, 5, 8)
    return {"k": randint(g, 2, c - 2), "fill": pick(g, ["-1.0", "0.0", "-5.0"])}, {"x": normal(g, r, c)}


def _divmod(g):
    n = randint(g, 6, 10)
    a = torch.randint(-50, 51, (n,), generator=g)
    b = torch.randint(1, 9, (n,), generator=g) * torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
    return {}, {"a": a, "b": b}


def _logsumexp(g):
    r, c = randint(g, 2, 4), randint(g, 3, 6)
    return {"dim": randint(g, 0, 1)}, {"x": normal(g, r, c, scale=uniform(g, 200.0, 900.0, 1).item())}


def _masked_softmax(g):
    r, c = randint(g, 2, 4), randint(g, 4, 7)
    mask = torch.rand(r, c, generator=g) < 0.6
    mask[torch.arange(r), torch.randint(0, c, (r,), generator=g)] = True  # every row keeps a position
    offsets = uniform(g, 200.0, 800.0, r, 1) * pick(g, [-1, 1])  # overflows exp, yet leaves no row one-hot
    return {}, {"x": offsets + normal(g, r, c, scale=1.5), "m": mask}


def _attention(g):
    b, t, d = randint(g, 1, 3), randint(g, 3, 6), randint(g, 2, 4)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[randint(g, 0, b - 1)] = randint(g, 1, t - 1)  # some padding, always
    return {"d": d}, {"q": normal(g, b, t, d), "k": normal(g, b, t, d), "v": normal(g, b, t, d), "lengths": lengths}


def _batchnorm(g):
    n, c, length = randint(g, 3, 5), randint(g, 2, 4), randint(g, 2, 5)
    params = {"momentum": pick(g, ["0.1", "0.2", "0.05"]), "eps": pick(g, ["1e-5", "1e-3"])}
    inputs = {"x": normal(g, n, c, length, scale=2.0) + 0.5, "weight": uniform(g, 0.5, 1.5, c), "bias": away_from_zero(g, c),
              "running_mean": normal(g, c, scale=0.3), "running_var": uniform(g, 0.5, 2.0, c)}
    return params, inputs


def _groupnorm(g):
    groups = randint(g, 2, 3)
    n, c, h, w = randint(g, 1, 3), groups * randint(g, 2, 3), randint(g, 2, 4), randint(g, 2, 4)
    inputs = {"x": normal(g, n, c, h, w, scale=1.5), "weight": uniform(g, 0.5, 1.5, c), "bias": away_from_zero(g, c)}
    return {"groups": groups, "eps": pick(g, ["1e-5", "1e-3"])}, inputs


def _rmsnorm(g):
    shape = (randint(g, 2, 4), randint(g, 2, 3), randint(g, 3, 6))
    return {"eps": pick(g, ["1e-6", "1e-5", "1e-3"])}, {"x": normal(g, *shape), "gain": uniform(g, 0.5, 1.5, shape[-1])}


def _conv(g):
    c_in, c_out, k = randint(g, 1, 3), randint(g, 1, 3), pick(g, [2, 3])
    stride, padding, dilation = randint(g, 1, 2), randint(g, 0, 2), randint(g, 1, 2)
    size = randint(g, 5, 8)
    params = {"stride": stride, "padding": padding, "dilation": dilation, "k": k}
    inputs = {"x": normal(g, 1, c_in, size, size), "w": normal(g, c_out, c_in, k, k, scale=0.5), "b": normal(g, c_out)}
    return params, inputs


def _straight_through(g):
    n = randint(g, 5, 9)
    return {"scale": pick(g, [2, 4, 8])}, {"x": normal(g, n), "w": normal(g, n)}


def _per_sample_grads(g):
    n, d = randint(g, 3, 6), randint(g, 2, 4)
    # |y| > 1 > |tanh|: no cancellation in tanh(...) - y, which the tolerance could not absorb
    y = uniform(g, 1.1, 1.6, n) * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    # and |x . w| mostly below 1, so that 1 - tanh ** 2 does not cancel either
    return {}, {"x": uniform(g, -1.5, 1.5, n, d), "y": y, "w": normal(g, d, scale=0.3)}


def _jacobian(g):
    b, m, n = randint(g, 2, 3), randint(g, 2, 4), randint(g, 2, 4)
    # small weights keep tanh off saturation, where 1 - tanh ** 2 cancels
    return {}, {"x": normal(g, b, n), "W": normal(g, m, n, scale=0.3), "c": normal(g, m, scale=0.3)}


def _label_smoothing(g):
    b, n, c = randint(g, 2, 3), randint(g, 4, 7), randint(g, 3, 6)
    target = torch.randint(0, c, (b, n), generator=g)
    for row in target:  # some ignored samples in every batch, never all of them
        row[torch.randperm(n, generator=g)[: randint(g, 1, n // 2)]] = -100
    return {"eps": pick(g, ["0.1", "0.2", "0.05"])}, {"logits": normal(g, b, n, c, scale=2.0), "target": target}


def _focal(g):
    n, c = randint(g, 4, 7), randint(g, 3, 5)
    inputs = {"logits": normal(g, n, c, scale=2.0), "target": torch.randint(0, c, (n,), generator=g),
              "alpha": uniform(g, 0.25, 1.0, c)}
    return {"gamma": pick(g, ["2.0", "1.5", "0.5"])}, inputs


def _distillation(g):
    n, c = randint(g, 2, 5), randint(g, 3, 6)
    return {"T": pick(g, ["2.0", "3.0", "4.0"])}, {"student": normal(g, n, c, scale=2.0), "teacher": normal(g, n, c, scale=2.0)}


def _grad_accumulation(g):
    k, m, d, o = randint(g, 2, 4), randint(g, 2, 3), randint(g, 2, 4), randint(g, 1, 2)
    params = {"k": k, "m": m, "lr": pick(g, ["0.1", "0.05", "0.2"]), "max_norm": pick(g, ["0.1", "0.05"])}
    return params, {"w": normal(g, o, d, scale=0.5), "x": normal(g, k * m, d), "y": normal(g, k * m, o)}


def _logcumsumexp(g):
    return {}, {"x": normal(g, randint(g, 2, 3), randint(g, 4, 7), scale=uniform(g, 100.0, 500.0, 1).item())}


FAMILIES = [
    Family("tensor_ops/pairwise_distance",
           "The Euclidean distance between every row of `a` and every row of `b`: "
           "`result[i, j] = sqrt(sum_k (a[i, k] - b[j, k]) ** 2)`.",
           _pairwise,
           "result = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1).sqrt()\n",
           "result = torch.cdist(a, b)\n"),
    Family("tensor_ops/segment_mean",
           "Row `n` of `x` belongs to segment `seg[n]` (segments 0 to $s - 1, each with at least one row). "
           "`result[s]` is the mean of the rows of `x` in segment `s` (the mean of each column over those rows).",
           _segments,
           "sums = torch.zeros($s, x.shape[1]).index_add_(0, seg, x)\n"
           "counts = torch.zeros($s).index_add_(0, seg, torch.ones(len(seg)))\n"
           "result = sums / counts[:, None]\n",
           "result = torch.stack([x[seg == s].mean(0) for s in range($s)])\n"),
    Family("tensor_ops/topk_keep",
           "Keep, in each row of `x`, the $k largest values in their places and set every other element to $fill.",
           _topk,
           "values, indices = x.topk($k, dim=1)\n"
           "result = torch.full_like(x, $fill).scatter(1, indices, values)\n",
           "kth = x.sort(dim=1, descending=True).values[:, $k - 1:$k]\n"
           "result = torch.where(x >= kth, x, torch.full_like(x, $fill))\n"),
    Family("tensor_ops/division_modes",
           "Integer division of `a` by `b`, element-wise, in four rows: row 0 the quotient rounded toward "
           "negative infinity, row 1 the remainder that goes with it (`a - b * row0`, which has the sign of `b`), "
           "row 2 the quotient rounded toward zero, row 3 its remainder (`a - b * row2`, which has the sign of `a`).",
           _divmod,
           "q_floor = torch.div(a, b, rounding_mode='floor')\n"
           "q_trunc = torch.div(a, b, rounding_mode='trunc')\n"
           "result = torch.stack([q_floor, a - b * q_floor, q_trunc, a - b * q_trunc])\n",
           shortcuts={"truncation_for_both":
               "q = torch.div(a, b, rounding_mode='trunc')\n"
               "result = torch.stack([q, a - b * q, q, a - b * q])\n"}),
    Family("nn_modules/logsumexp_extreme",
           "`log(sum(exp(x)))` over dimension $dim of `x` (that dimension removed), computed so that it "
           "neither overflows nor underflows: the entries of `x` are in the hundreds.",
           _logsumexp,
           "result = torch.logsumexp(x, dim=$dim)\n",
           "top = x.max(dim=$dim, keepdim=True).values\n"
           "result = (top + torch.log(torch.exp(x - top).sum(dim=$dim, keepdim=True))).squeeze($dim)\n"),
    Family("nn_modules/masked_softmax_extreme",
           "A softmax over each row of `x` that only counts the positions where the boolean mask `m` is True: "
           "`result[i, j] = exp(x[i, j]) / sum over {k : m[i, k]} of exp(x[i, k])` where `m[i, j]` is True, and "
           "exactly 0 where it is False. The entries of `x` are in the hundreds, so compute it without overflow.",
           _masked_softmax,
           "result = torch.softmax(x.masked_fill(~m, float('-inf')), dim=1)\n",
           "top = torch.where(m, x, torch.full_like(x, -1e30)).max(dim=1, keepdim=True).values\n"
           "e = torch.where(m, torch.exp(x - top), torch.zeros_like(x))\n"
           "result = e / e.sum(dim=1, keepdim=True)\n"),
    Family("nn_modules/causal_padded_attention",
           "Scaled dot-product attention per batch element `b`: scores `s[b, i, j] = (q[b, i] . k[b, j]) / sqrt($d)`; "
           "query `i` may attend to key `j` only when `j <= i` (causal) and `j < lengths[b]` (keys at or past the "
           "length are padding); the weights are the softmax of the allowed scores over `j` (disallowed ones get "
           "weight 0), and `result[b, i] = sum_j weight[b, i, j] * v[b, j]`.",
           _attention,
           "t = q.shape[1]\n"
           "allowed = torch.ones(t, t, dtype=torch.bool).tril() & (torch.arange(t) < lengths[:, None, None])\n"
           "scores = (q @ k.transpose(1, 2)) / $d ** 0.5\n"
           "result = torch.softmax(scores.masked_fill(~allowed, float('-inf')), dim=-1) @ v\n",
           "t = q.shape[1]\n"
           "allowed = torch.ones(t, t, dtype=torch.bool).tril() & (torch.arange(t) < lengths[:, None, None])\n"
           "result = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)\n",
           shortcuts={"padding_ignored":
               "scores = (q @ k.transpose(1, 2)) / $d ** 0.5\n"
               "allowed = torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).tril()\n"
               "result = torch.softmax(scores.masked_fill(~allowed, float('-inf')), dim=-1) @ v\n"},
           float64_margin=True),
    Family("nn_modules/batch_norm_training",
           "One training-mode batch-norm step over `x` (N, C, L), per channel `c`: normalise with the batch mean "
           "and the biased batch variance over the N and L dimensions, `y = (x - mean) / sqrt(var + $eps) * "
           "weight[c] + bias[c]`; update the running statistics with momentum $momentum: `running_mean = "
           "(1 - $momentum) * running_mean + $momentum * mean` and `running_var = (1 - $momentum) * running_var + "
           "$momentum * unbiased_var` (the unbiased variance, divided by N*L - 1). `result` is one 1-D tensor: `y` "
           "flattened in row-major order, then the new `running_mean`, then the new `running_var`.",
           _batchnorm,
           "rm, rv = running_mean.clone(), running_var.clone()\n"
           "y = torch.nn.functional.batch_norm(x, rm, rv, weight, bias, training=True, momentum=$momentum, eps=$eps)\n"
           "result = torch.cat([y.flatten(), rm, rv])\n",
           "mean = x.mean(dim=(0, 2))\n"
           "var = x.var(dim=(0, 2), unbiased=False)\n"
           "y = (x - mean[:, None]) / torch.sqrt(var[:, None] + $eps) * weight[:, None] + bias[:, None]\n"
           "rm = (1 - $momentum) * running_mean + $momentum * mean\n"
           "rv = (1 - $momentum) * running_var + $momentum * x.var(dim=(0, 2), unbiased=True)\n"
           "result = torch.cat([y.flatten(), rm, rv])\n",
           shortcuts={"momentum_complement":
               "rm, rv = running_mean.clone(), running_var.clone()\n"
               "y = torch.nn.functional.batch_norm(x, rm, rv, weight, bias, training=True, momentum=1 - $momentum, eps=$eps)\n"
               "result = torch.cat([y.flatten(), rm, rv])\n"},
           float64_margin=True),
    Family("nn_modules/group_norm",
           "Group normalisation of `x` (N, C, H, W) with $groups groups: the channels are split into $groups "
           "consecutive equal groups; each (sample, group) is normalised over its channels and all H*W positions "
           "with its mean and biased variance, `(x - mean) / sqrt(var + $eps)`, then channel `c` is scaled by "
           "`weight[c]` and shifted by `bias[c]`.",
           _groupnorm,
           "result = torch.nn.functional.group_norm(x, $groups, weight, bias, eps=$eps)\n",
           "n, c, h, w = x.shape\n"
           "grouped = x.reshape(n, $groups, -1)\n"
           "mean, var = grouped.mean(-1, keepdim=True), grouped.var(-1, unbiased=False, keepdim=True)\n"
           "y = ((grouped - mean) / torch.sqrt(var + $eps)).reshape(n, c, h, w)\n"
           "result = y * weight[:, None, None] + bias[:, None, None]\n",
           float64_margin=True),
    Family("nn_modules/rms_norm",
           "RMS normalisation over the last dimension of `x`: `result = x / sqrt(mean(x ** 2) + $eps) * gain`, "
           "the mean taken over the last dimension and `gain` applied along it.",
           _rmsnorm,
           "result = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + $eps) * gain\n",
           "result = torch.nn.functional.rms_norm(x, (x.shape[-1],), gain, eps=$eps)\n"),
    Family("nn_modules/conv_arithmetic",
           "A 2-D cross-correlation: `x` is (batch, in_channels, H, W) and is zero-padded by $padding on every "
           "side; with stride $stride and dilation $dilation, `result[n, o, i, j] = b[o] + sum over c, u, v of "
           "w[o, c, u, v] * xpad[n, c, i * $stride + u * $dilation, j * $stride + v * $dilation]` for every "
           "output position where the $k x $k dilated window fits inside the padded input.",
           _conv,
           "result = torch.nn.functional.conv2d(x, w, b, stride=$stride, padding=$padding, dilation=$dilation)\n",
           "n, c, h, wd = x.shape\n"
           "cols = torch.nn.functional.unfold(x, $k, dilation=$dilation, padding=$padding, stride=$stride)\n"
           "oh = (h + 2 * $padding - $dilation * ($k - 1) - 1) // $stride + 1\n"
           "ow = (wd + 2 * $padding - $dilation * ($k - 1) - 1) // $stride + 1\n"
           "result = (w.reshape(w.shape[0], -1) @ cols + b[:, None]).reshape(n, -1, oh, ow)\n"),
    Family("autograd/straight_through_round",
           "Quantise `x` with `q = round(x * $scale) / $scale` (round half to even), using a straight-through "
           "estimator: the backward pass treats the quantiser as the identity (the incoming gradient passes "
           "through unchanged). Return the gradient with respect to `x` of `loss = sum(w * q ** 2)`.",
           _straight_through,
           "class Quantise(torch.autograd.Function):\n"
           "    @staticmethod\n"
           "    def forward(ctx, t):\n"
           "        return torch.round(t * $scale) / $scale\n"
           "    @staticmethod\n"
           "    def backward(ctx, grad):\n"
           "        return grad\n"
           "x = x.clone().requires_grad_()\n"
           "(w * Quantise.apply(x) ** 2).sum().backward()\n"
           "result = x.grad\n",
           "result = 2 * w * torch.round(x * $scale) / $scale\n"),
    Family("autograd/per_sample_gradients",
           "For each sample `n`, the gradient with respect to `w` of that sample's own loss "
           "`(tanh(x[n] . w) - y[n]) ** 2`; `result[n]` is that gradient.",
           _per_sample_grads,
           "from torch.func import grad, vmap\n"
           "loss = lambda w, xn, yn: (torch.tanh(xn @ w) - yn) ** 2\n"
           "result = vmap(grad(loss), in_dims=(None, 0, 0))(w, x, y)\n",
           "t = torch.tanh(x @ w)\n"
           "result = (2 * (t - y) * (1 - t ** 2))[:, None] * x\n"),
    Family("autograd/batched_jacobian",
           "For each batch element `b`, the Jacobian of `f(z) = tanh(W @ z + c)` at `z = x[b]`: "
           "`result[b, i, j]` is the derivative of output `i` with respect to input `j`.",
           _jacobian,
           "from torch.func import jacrev, vmap\n"
           "result = vmap(jacrev(lambda z: torch.tanh(W @ z + c)))(x)\n",
           "t = torch.tanh(x @ W.T + c)\n"
           "result = (1 - t ** 2)[:, :, None] * W\n"),
    Family("losses/label_smoothing_ce",
           "For each batch `b`, cross-entropy with label smoothing $eps of the samples `logits[b, n]` (C classes) "
           "against targets `target[b, n]`: for a sample with target `t`, the target distribution is `1 - $eps` on "
           "class `t` plus `$eps / C` on every class (including `t`), and its loss is `-sum_c dist_c * "
           "log_softmax(logits[b, n])_c`. Samples whose target is -100 are ignored; `result[b]` is the mean loss "
           "over the other samples of batch `b`.",
           _label_smoothing,
           "result = torch.stack([torch.nn.functional.cross_entropy(l, t, ignore_index=-100, label_smoothing=$eps)\n"
           "                      for l, t in zip(logits, target)])\n",
           "losses = []\n"
           "for l, t in zip(logits, target):\n"
           "    keep = t != -100\n"
           "    logp = torch.log_softmax(l[keep], dim=1)\n"
           "    dist = torch.full_like(logp, $eps / l.shape[1])\n"
           "    dist[torch.arange(len(logp)), t[keep]] += 1 - $eps\n"
           "    losses.append(-(dist * logp).sum(1).mean())\n"
           "result = torch.stack(losses)\n",
           shortcuts={"no_smoothing":
               "result = torch.stack([torch.nn.functional.cross_entropy(l, t, ignore_index=-100) for l, t in zip(logits, target)])\n"}),
    Family("losses/focal_loss",
           "The focal loss of each sample: with `p` the softmax of its row of `logits` and `t` its target class, "
           "`loss = -alpha[t] * (1 - p[t]) ** $gamma * log(p[t])`.",
           _focal,
           "logp = torch.log_softmax(logits, dim=1).gather(1, target[:, None]).squeeze(1)\n"
           "result = -alpha[target] * (1 - logp.exp()) ** $gamma * logp\n",
           "p = torch.softmax(logits, dim=1)[torch.arange(len(target)), target]\n"
           "result = -alpha[target] * (1 - p) ** $gamma * torch.log(p)\n"),
    Family("losses/distillation_kl",
           "The knowledge-distillation loss at temperature $T: with `p = softmax(teacher / $T)` and "
           "`q = softmax(student / $T)` over each row, `result[i]` is the KL divergence "
           "`sum_c p_c * (log p_c - log q_c)` of row `i`, times `$T ** 2`.",
           _distillation,
           "log_q = torch.log_softmax(student / $T, dim=1)\n"
           "log_p = torch.log_softmax(teacher / $T, dim=1)\n"
           "kl = torch.nn.functional.kl_div(log_q, log_p, log_target=True, reduction='none').sum(1)\n"
           "result = kl * $T ** 2\n",
           "p, q = torch.softmax(teacher / $T, dim=1), torch.softmax(student / $T, dim=1)\n"
           "result = (p * (p.log() - q.log())).sum(1) * $T ** 2\n",
           held_out=True),
    Family("optim/grad_accumulation_clip",
           "One optimiser step with gradient accumulation: split the rows of `x` and `y` into $k consecutive "
           "micro-batches of $m rows; for each, the loss is `mean((xb @ w.T - yb) ** 2) / $k` (mean over all its "
           "elements) and its gradient with respect to `w` is added to the accumulated gradient. Then scale the "
           "accumulated gradient down so its L2 norm is at most $max_norm (multiply by `$max_norm / (norm + 1e-6)` "
           "when that factor is below 1), and take a plain gradient-descent step with learning rate $lr. "
           "Return the updated `w`.",
           _grad_accumulation,
           "w = torch.nn.Parameter(w.clone())\n"
           "opt = torch.optim.SGD([w], lr=$lr)\n"
           "opt.zero_grad()\n"
           "for xb, yb in zip(x.split($m), y.split($m)):\n"
           "    (((xb @ w.T - yb) ** 2).mean() / $k).backward()\n"
           "torch.nn.utils.clip_grad_norm_([w], max_norm=$max_norm)\n"
           "opt.step()\n"
           "result = w.detach().clone()\n",
           "grad = 2 * (x @ w.T - y).T @ x / y.numel()\n"
           "factor = min(1.0, $max_norm / (grad.norm().item() + 1e-6))\n"
           "result = w - $lr * grad * factor\n"),
    Family("tensor_ops/logcumsumexp_extreme",
           "Along each row of `x`, `result[i, j] = log(sum over k <= j of exp(x[i, k]))`, computed without "
           "overflow or underflow: the entries of `x` are in the hundreds.",
           _logcumsumexp,
           "result = torch.logcumsumexp(x, dim=1)\n",
           "result = torch.stack([torch.logsumexp(x[:, :j + 1], dim=1) for j in range(x.shape[1])], dim=1)\n",
           held_out=True),
]
