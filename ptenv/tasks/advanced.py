"""The advanced tier: seeded families that chain several ideas (recurrences from explicit weights,
attention internals, custom autograd, second-order gradients, optimiser maths written out).

As in the intermediate tier, the instruction states the maths, the reference runs like a model's
cell, and `independent` is a second formulation for the tolerance gate. Weights are kept small
where a tanh or sigmoid would saturate (1 - tanh ** 2 cancels there, beyond the tolerance).
"""

import torch

from ptenv.tasks.families import Family, normal, pick, randint, uniform


def _gru(g):
    t, b, i, h = randint(g, 2, 4), randint(g, 1, 3), randint(g, 2, 4), randint(g, 2, 4)
    inputs = {"x": normal(g, t, b, i), "h0": normal(g, b, h, scale=0.5),
              "w_ih": normal(g, 3 * h, i, scale=0.4), "w_hh": normal(g, 3 * h, h, scale=0.4),
              "b_ih": normal(g, 3 * h, scale=0.2), "b_hh": normal(g, 3 * h, scale=0.2)}
    return {"h": h}, inputs


def _lstm(g):
    params, inputs = _gru(g)
    h, i = params["h"], inputs["x"].shape[2]
    inputs.update({"c0": normal(g, *inputs["h0"].shape, scale=0.5), "w_ih": normal(g, 4 * h, i, scale=0.4),
                   "w_hh": normal(g, 4 * h, h, scale=0.4), "b_ih": normal(g, 4 * h, scale=0.2),
                   "b_hh": normal(g, 4 * h, scale=0.2)})
    return params, inputs


def _mha(g):
    heads, dh = randint(g, 2, 3), randint(g, 2, 3)
    b, t, e = randint(g, 1, 2), randint(g, 3, 5), heads * dh
    inputs = {"x": normal(g, b, t, e)}
    inputs.update({name: normal(g, e, e, scale=0.5) for name in ("wq", "wk", "wv")})
    # A small output projection: an output that cancels to near 0 is a sum of terms small enough that
    # their float32 rounding stays well inside the grader's absolute tolerance.
    inputs["wo"] = normal(g, e, e, scale=0.03)
    return {"heads": heads, "dh": dh, "e": e}, inputs


def _rotary(g):
    b, t, d = randint(g, 1, 2), randint(g, 3, 6), 2 * randint(g, 2, 4)
    return {"base": pick(g, ["10000.0", "100.0"]), "offset": randint(g, 0, 3)}, {"x": normal(g, b, t, d)}


def _reversal(g):
    n, d, h = randint(g, 3, 5), randint(g, 2, 4), randint(g, 2, 4)
    inputs = {"x": normal(g, n, d, scale=0.5), "W1": normal(g, d, h, scale=0.5), "v": normal(g, n, h)}
    return {"lam": pick(g, ["0.5", "1.0", "2.0"])}, inputs


def _hvp(g):
    m, n = randint(g, 3, 5), randint(g, 2, 4)
    return {}, {"A": normal(g, m, n), "x": normal(g, n, scale=0.5), "v": normal(g, n)}


def _adamw(g):
    n, d = randint(g, 4, 6), randint(g, 2, 4)
    params = {"steps": randint(g, 2, 4), "lr": pick(g, ["0.01", "0.05", "0.1"]), "beta1": pick(g, ["0.9", "0.8"]),
              "beta2": pick(g, ["0.999", "0.99"]), "eps": pick(g, ["1e-8", "1e-6"]), "wd": pick(g, ["0.01", "0.1"])}
    return params, {"w": normal(g, d), "x": normal(g, n, d), "y": normal(g, n)}


def _warmup_cosine(g):
    n, d = randint(g, 4, 6), randint(g, 2, 4)
    params = {"steps": randint(g, 4, 6), "warmup": randint(g, 1, 2), "lr": pick(g, ["0.1", "0.05"]),
              "lr_min": pick(g, ["0.001", "0.01"]), "mu": pick(g, ["0.9", "0.5"])}
    return params, {"w": normal(g, d), "x": normal(g, n, d), "y": normal(g, n)}


def _transposed_conv(g):
    b, c_in, c_out, length, k = randint(g, 1, 2), randint(g, 1, 3), randint(g, 1, 3), randint(g, 3, 5), randint(g, 2, 3)
    inputs = {"x": normal(g, b, c_in, length), "w": normal(g, c_in, c_out, k), "bias": normal(g, c_out)}
    return {"stride": randint(g, 1, 3)}, inputs


def _window_argmax(g):
    k = randint(g, 2, 4)
    return {"k": k, "stride": randint(g, 1, k)}, {"x": normal(g, randint(g, 1, 3), randint(g, 7, 11))}


def _embedding_bag(g):
    v, e, bags = randint(g, 5, 8), randint(g, 2, 4), randint(g, 2, 4)
    sizes = torch.randint(1, 4, (bags,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)[:-1]])
    idx = torch.randint(0, v, (int(sizes.sum()),), generator=g)
    return {}, {"weight": normal(g, v, e), "idx": idx, "offsets": offsets, "psw": uniform(g, 0.2, 1.5, len(idx))}


def _triplet(g):
    classes = randint(g, 2, 3)
    labels = torch.arange(classes).repeat_interleave(torch.randint(2, 4, (classes,), generator=g))
    labels = labels[torch.randperm(len(labels), generator=g)]  # every class has at least two members
    return {"margin": pick(g, ["0.5", "1.0", "2.0"])}, {"emb": normal(g, len(labels), randint(g, 2, 4)), "labels": labels}


def _causal_conv(g):
    b, c, o, length, k = randint(g, 1, 2), randint(g, 1, 3), randint(g, 1, 3), randint(g, 5, 8), randint(g, 2, 3)
    inputs = {"x": normal(g, b, c, length), "w": normal(g, o, c, k), "bias": normal(g, o)}
    return {"dilation": randint(g, 1, 2), "k": k}, inputs


def _sequence_nll(g):
    b, t, c = randint(g, 2, 3), randint(g, 3, 6), randint(g, 3, 5)
    inputs = {"logits": normal(g, b, t, c, scale=2.0), "targets": torch.randint(0, c, (b, t), generator=g),
              "lengths": torch.randint(1, t + 1, (b,), generator=g)}
    return {}, inputs


def _layer_norm_grad(g):
    n, d = randint(g, 2, 4), randint(g, 3, 6)
    inputs = {"x": normal(g, n, d, scale=2.0), "gamma": uniform(g, 0.5, 1.5, d), "v": normal(g, n, d)}
    return {"eps": pick(g, ["1e-5", "1e-3"])}, inputs


def _gradient_penalty(g):
    n, d, h = randint(g, 2, 4), randint(g, 2, 3), randint(g, 2, 4)
    return {}, {"x": normal(g, n, d), "W": normal(g, h, d, scale=0.5), "u": normal(g, h)}


FAMILIES = [
    Family("nn_modules/gru_from_weights",
           "Run a GRU over the sequence `x` (time, batch, input) from the hidden state `h0`, with explicit weights "
           "whose rows are three blocks of $h in the order r, z, n (reset, update, new): at each step, with "
           "`gi = x_t @ w_ih.T + b_ih` and `gh = h @ w_hh.T + b_hh` split into those blocks, `r = sigmoid(gi_r + gh_r)`, "
           "`z = sigmoid(gi_z + gh_z)`, `n = tanh(gi_n + r * gh_n)` and `h = (1 - z) * n + z * h`. "
           "`result[t]` is the hidden state after step `t`.",
           _gru,
           "h, outs = h0, []\n"
           "for xt in x:\n"
           "    ir, iz, in_ = (xt @ w_ih.T + b_ih).chunk(3, dim=1)\n"
           "    hr, hz, hn = (h @ w_hh.T + b_hh).chunk(3, dim=1)\n"
           "    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)\n"
           "    n = torch.tanh(in_ + r * hn)\n"
           "    h = (1 - z) * n + z * h\n"
           "    outs.append(h)\n"
           "result = torch.stack(outs)\n",
           "gru = torch.nn.GRU(x.shape[2], $h)\n"
           "with torch.no_grad():\n"
           "    for name, value in [('weight_ih_l0', w_ih), ('weight_hh_l0', w_hh), ('bias_ih_l0', b_ih), ('bias_hh_l0', b_hh)]:\n"
           "        getattr(gru, name).copy_(value)\n"
           "    result = gru(x, h0[None])[0]\n",
           shortcuts={"gate_swapped":
               "h, outs = h0, []\n"
               "for xt in x:\n"
               "    ir, iz, in_ = (xt @ w_ih.T + b_ih).chunk(3, dim=1)\n"
               "    hr, hz, hn = (h @ w_hh.T + b_hh).chunk(3, dim=1)\n"
               "    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)\n"
               "    h = z * torch.tanh(in_ + r * hn) + (1 - z) * h\n"
               "    outs.append(h)\n"
               "result = torch.stack(outs)\n"},
           float64_margin=True),
    Family("nn_modules/lstm_from_weights",
           "Run an LSTM over the sequence `x` (time, batch, input) from the states `h0` and `c0`, with explicit "
           "weights whose rows are four blocks of $h in the order i, f, g, o: at each step, with "
           "`a = x_t @ w_ih.T + b_ih + h @ w_hh.T + b_hh` split into those blocks, `i = sigmoid(a_i)`, "
           "`f = sigmoid(a_f)`, `g = tanh(a_g)`, `o = sigmoid(a_o)`, `c = f * c + i * g` and `h = o * tanh(c)`. "
           "`result[:, :$h]` is the final `h` and `result[:, $h:]` the final `c`.",
           _lstm,
           "h, c = h0, c0\n"
           "for xt in x:\n"
           "    i, f, g, o = (xt @ w_ih.T + b_ih + h @ w_hh.T + b_hh).chunk(4, dim=1)\n"
           "    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)\n"
           "    h = torch.sigmoid(o) * torch.tanh(c)\n"
           "result = torch.cat([h, c], dim=1)\n",
           "lstm = torch.nn.LSTM(x.shape[2], $h)\n"
           "with torch.no_grad():\n"
           "    for name, value in [('weight_ih_l0', w_ih), ('weight_hh_l0', w_hh), ('bias_ih_l0', b_ih), ('bias_hh_l0', b_hh)]:\n"
           "        getattr(lstm, name).copy_(value)\n"
           "    _, (h, c) = lstm(x, (h0[None], c0[None]))\n"
           "result = torch.cat([h[0], c[0]], dim=1)\n"),
    Family("nn_modules/multihead_causal_attention",
           "Causal multi-head self-attention over `x` (batch, time, $e) with $heads heads and no biases: "
           "`q = x @ wq.T`, `k = x @ wk.T`, `v = x @ wv.T`; head `h` uses features `h*$dh` to `h*$dh + $dh - 1` of "
           "each; in each head, position `i` attends to positions `j <= i` with weights softmax over `j` of "
           "`q_i . k_j / sqrt($dh)`, giving the weighted sum of `v_j`; the heads' outputs are concatenated in head "
           "order along the features and `result = concat @ wo.T`.",
           _mha,
           "b, t, e = x.shape\n"
           "split = lambda m: (x @ m.T).reshape(b, t, $heads, $dh).transpose(1, 2)\n"
           "q, k, v = split(wq), split(wk), split(wv)\n"
           "scores = (q @ k.transpose(-1, -2)) / $dh ** 0.5\n"
           "causal = torch.ones(t, t, dtype=torch.bool).tril()\n"
           "heads = torch.softmax(scores.masked_fill(~causal, float('-inf')), dim=-1) @ v\n"
           "result = heads.transpose(1, 2).reshape(b, t, e) @ wo.T\n",
           "mha = torch.nn.MultiheadAttention($e, $heads, bias=False, batch_first=True)\n"
           "with torch.no_grad():\n"
           "    mha.in_proj_weight.copy_(torch.cat([wq, wk, wv]))\n"
           "    mha.out_proj.weight.copy_(wo)\n"
           "    t = x.shape[1]\n"
           "    result = mha(x, x, x, attn_mask=torch.ones(t, t, dtype=torch.bool).triu(1), need_weights=False)[0]\n",
           float64_margin=True),
    Family("nn_modules/rotary_embedding",
           "Rotary position embedding of `x` (batch, time, D): the token at time index `t` has position "
           "`p = t + $offset`; features `2i` and `2i + 1` form pair `i`, rotated by the angle `p * $base ** (-2i / D)`: "
           "`result[..., 2i] = x[..., 2i] * cos - x[..., 2i + 1] * sin` and "
           "`result[..., 2i + 1] = x[..., 2i] * sin + x[..., 2i + 1] * cos`.",
           _rotary,
           "d = x.shape[-1]\n"
           "theta = $base ** (-torch.arange(0, d, 2) / d)\n"
           "angle = (torch.arange(x.shape[1]) + $offset)[:, None] * theta\n"
           "even, odd = x[..., 0::2], x[..., 1::2]\n"
           "result = torch.stack([even * angle.cos() - odd * angle.sin(), even * angle.sin() + odd * angle.cos()], "
           "dim=-1).flatten(-2)\n",
           "d = x.shape[-1]\n"
           "angle = (torch.arange(x.shape[1]) + $offset)[:, None] * $base ** (-torch.arange(0, d, 2) / d)\n"
           "pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())\n"
           "result = torch.view_as_real(pairs * torch.polar(torch.ones_like(angle), angle)).flatten(-2)\n"),
    Family("autograd/gradient_reversal",
           "With `h = x @ W1`, pass `h` through a gradient-reversal layer: the identity in the forward pass, "
           "while the backward pass multiplies the incoming gradient by `-$lam`. Let `r` be its output and "
           "`loss = sum(tanh(r) * v)`. Return the gradient of `loss` with respect to `W1`.",
           _reversal,
           "class Reverse(torch.autograd.Function):\n"
           "    @staticmethod\n"
           "    def forward(ctx, t):\n"
           "        return t.view_as(t)\n"
           "    @staticmethod\n"
           "    def backward(ctx, grad):\n"
           "        return -$lam * grad\n"
           "W1 = W1.clone().requires_grad_()\n"
           "(torch.tanh(Reverse.apply(x @ W1)) * v).sum().backward()\n"
           "result = W1.grad\n",
           "result = -$lam * x.T @ ((1 - torch.tanh(x @ W1) ** 2) * v)\n"),
    Family("autograd/hessian_vector_product",
           "For `f(x) = sum(log(1 + exp(A @ x)))`, the Hessian of `f` at `x` times the vector `v`.",
           _hvp,
           "from torch.func import grad, jvp\n"
           "f = lambda z: torch.nn.functional.softplus(A @ z).sum()\n"
           "result = jvp(grad(f), (x,), (v,))[1]\n",
           "s = torch.sigmoid(A @ x)\n"
           "result = A.T @ (s * (1 - s) * (A @ v))\n",
           float64_margin=True),
    Family("optim/adamw_written_out",
           "Minimise `loss(w) = mean((x @ w - y) ** 2)` for $steps steps, each with the gradient `g` at the current "
           "`w` (steps numbered from t = 1; `m` and `v` start at zero): first `w = w - $lr * $wd * w` (decoupled "
           "weight decay), then `m = $beta1 * m + (1 - $beta1) * g`, `v = $beta2 * v + (1 - $beta2) * g ** 2`, "
           "`m_hat = m / (1 - $beta1 ** t)`, `v_hat = v / (1 - $beta2 ** t)` and "
           "`w = w - $lr * m_hat / (sqrt(v_hat) + $eps)`. Return `w` after the last step.",
           _adamw,
           "w = torch.nn.Parameter(w.clone())\n"
           "opt = torch.optim.AdamW([w], lr=$lr, betas=($beta1, $beta2), eps=$eps, weight_decay=$wd)\n"
           "for _ in range($steps):\n"
           "    opt.zero_grad()\n"
           "    ((x @ w - y) ** 2).mean().backward()\n"
           "    opt.step()\n"
           "result = w.detach().clone()\n",
           "m, v = torch.zeros_like(w), torch.zeros_like(w)\n"
           "for t in range(1, $steps + 1):\n"
           "    g = 2 * x.T @ (x @ w - y) / len(y)\n"
           "    w = w - $lr * $wd * w\n"
           "    m, v = $beta1 * m + (1 - $beta1) * g, $beta2 * v + (1 - $beta2) * g ** 2\n"
           "    w = w - $lr * (m / (1 - $beta1 ** t)) / ((v / (1 - $beta2 ** t)).sqrt() + $eps)\n"
           "result = w\n",
           shortcuts={"adam_l2_decay":
               "w = torch.nn.Parameter(w.clone())\n"
               "opt = torch.optim.Adam([w], lr=$lr, betas=($beta1, $beta2), eps=$eps, weight_decay=$wd)\n"
               "for _ in range($steps):\n    opt.zero_grad()\n    ((x @ w - y) ** 2).mean().backward()\n    opt.step()\n"
               "result = w.detach().clone()\n"}),
    Family("optim/warmup_cosine_momentum",
           "Minimise `loss(w) = mean((x @ w - y) ** 2)` for $steps steps of gradient descent with momentum $mu "
           "(`buf = g` at the first step, then `buf = $mu * buf + g`; `w = w - lr_t * buf`), where step "
           "`t = 0, 1, ...` uses the learning rate `lr_t = $lr * (t + 1) / $warmup` while `t < $warmup`, and after "
           "that `lr_t = $lr_min + 0.5 * ($lr - $lr_min) * (1 + cos(pi * (t - $warmup) / ($steps - $warmup)))`. "
           "Return `w` after the last step.",
           _warmup_cosine,
           "import math\n"
           "w = torch.nn.Parameter(w.clone())\n"
           "opt = torch.optim.SGD([w], lr=$lr, momentum=$mu)\n"
           "for t in range($steps):\n"
           "    lr_t = $lr * (t + 1) / $warmup if t < $warmup else "
           "$lr_min + 0.5 * ($lr - $lr_min) * (1 + math.cos(math.pi * (t - $warmup) / ($steps - $warmup)))\n"
           "    opt.param_groups[0]['lr'] = lr_t\n"
           "    opt.zero_grad()\n"
           "    ((x @ w - y) ** 2).mean().backward()\n"
           "    opt.step()\n"
           "result = w.detach().clone()\n",
           "import math\n"
           "buf = None\n"
           "for t in range($steps):\n"
           "    lr_t = $lr * (t + 1) / $warmup if t < $warmup else "
           "$lr_min + 0.5 * ($lr - $lr_min) * (1 + math.cos(math.pi * (t - $warmup) / ($steps - $warmup)))\n"
           "    g = 2 * x.T @ (x @ w - y) / len(y)\n"
           "    buf = g if buf is None else $mu * buf + g\n"
           "    w = w - lr_t * buf\n"
           "result = w\n"),
    Family("tensor_ops/transposed_conv_scatter",
           "A 1-D transposed convolution with stride $stride and no padding: every input element scatters a "
           "weighted copy of the kernel, `result[n, o, t * $stride + j] += x[n, c, t] * w[c, o, j]` summed over "
           "all `c`, `t` and kernel positions `j`, on an output of length `(L - 1) * $stride + K` that starts at "
           "`bias[o]` (L the input length, K the kernel size).",
           _transposed_conv,
           "result = torch.nn.functional.conv_transpose1d(x, w, bias, stride=$stride)\n",
           "n, c, length = x.shape\n"
           "k = w.shape[2]\n"
           "out = bias[None, :, None].repeat(n, 1, (length - 1) * $stride + k)\n"
           "for t in range(length):\n"
           "    out[:, :, t * $stride:t * $stride + k] += torch.einsum('nc,cok->nok', x[:, :, t], w)\n"
           "result = out\n"),
    Family("tensor_ops/window_argmax",
           "Slide a window of $k elements with stride $stride along each row of `x` (window `j` covers "
           "`x[:, j*$stride : j*$stride + $k]`, for every `j` where it fits); `result[b, j]` is the index in the row "
           "(from 0 to the row length - 1) of the largest element of window `j`.",
           _window_argmax,
           "windows = x.unfold(1, $k, $stride)\n"
           "result = windows.argmax(-1) + torch.arange(windows.shape[1]) * $stride\n",
           "result = torch.nn.functional.max_pool1d(x[:, None], $k, $stride, return_indices=True)[1][:, 0]\n"),
    Family("nn_modules/weighted_embedding_bags",
           "Bag `b` holds the indices `idx[offsets[b] : offsets[b + 1]]` (the last bag runs to the end of `idx`); "
           "`result[b]` is the sum over the bag's positions `i` of `psw[i] * weight[idx[i]]`.",
           _embedding_bag,
           "result = torch.nn.functional.embedding_bag(idx, weight, offsets, mode='sum', per_sample_weights=psw)\n",
           "bounds = offsets.tolist() + [len(idx)]\n"
           "result = torch.stack([(psw[s:e, None] * weight[idx[s:e]]).sum(0) for s, e in zip(bounds, bounds[1:])])\n",
           held_out=True),
    Family("losses/batch_hard_triplet",
           "Batch-hard triplet loss per anchor: with `d(i, j)` the Euclidean distance between rows `i` and `j` of "
           "`emb`, anchor `i`'s hardest positive distance is the largest `d(i, j)` over `j != i` with "
           "`labels[j] == labels[i]`, its hardest negative distance the smallest `d(i, j)` over `labels[j] != "
           "labels[i]`, and `result[i] = max(0, hardest_positive - hardest_negative + $margin)`.",
           _triplet,
           "d = ((emb[:, None] - emb[None]) ** 2).sum(-1).sqrt()\n"
           "same = labels[:, None] == labels[None]\n"
           "positive = d.masked_fill(~same, float('-inf')).max(1).values\n"
           "negative = d.masked_fill(same, float('inf')).min(1).values\n"
           "result = (positive - negative + $margin).clamp(min=0)\n",
           "d = torch.cdist(emb, emb)\n"
           "rows = []\n"
           "for i in range(len(emb)):\n"
           "    same = labels == labels[i]\n"
           "    rows.append(torch.relu(d[i][same].max() - d[i][~same].min() + $margin))\n"
           "result = torch.stack(rows)\n"),
    Family("nn_modules/causal_dilated_conv",
           "A causal dilated 1-D convolution with dilation $dilation: "
           "`result[n, o, t] = bias[o] + sum over c and j of w[o, c, j] * x[n, c, t - ($k - 1 - j) * $dilation]`, "
           "where `x` is zero at negative time indices; the output has the input's length.",
           _causal_conv,
           "padded = torch.nn.functional.pad(x, (($k - 1) * $dilation, 0))\n"
           "result = torch.nn.functional.conv1d(padded, w, bias, dilation=$dilation)\n",
           "length = x.shape[2]\n"
           "result = bias[None, :, None].expand(x.shape[0], -1, length).clone()\n"
           "for j in range($k):\n"
           "    shift = ($k - 1 - j) * $dilation\n"
           "    shifted = torch.nn.functional.pad(x, (shift, 0))[:, :, :length]\n"
           "    result = result + torch.einsum('oc,nct->not', w[:, :, j], shifted)\n"),
    Family("losses/masked_sequence_nll",
           "For each sequence `b`, the mean over its first `lengths[b]` time steps of the negative log-likelihood "
           "`-log_softmax(logits[b, t])[targets[b, t]]` (the later steps are padding and do not count).",
           _sequence_nll,
           "nll = -torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)\n"
           "valid = torch.arange(logits.shape[1]) < lengths[:, None]\n"
           "result = (nll * valid).sum(1) / lengths\n",
           "result = torch.stack([torch.nn.functional.cross_entropy(logits[b, :n], targets[b, :n]) "
           "for b, n in enumerate(lengths.tolist())])\n"),
    Family("autograd/layer_norm_input_grad",
           "With `y = (x - mean) / sqrt(var + $eps) * gamma`, mean and biased variance taken over the last "
           "dimension of each row, return the gradient of `sum(y * v)` with respect to `x`.",
           _layer_norm_grad,
           "x = x.clone().requires_grad_()\n"
           "y = torch.nn.functional.layer_norm(x, (x.shape[-1],), gamma, eps=$eps)\n"
           "(result,) = torch.autograd.grad((y * v).sum(), x)\n",
           "sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + $eps)\n"
           "xhat = (x - x.mean(-1, keepdim=True)) / sigma\n"
           "g = v * gamma\n"
           "result = (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True)) / sigma\n",
           held_out=True),
    Family("autograd/gradient_penalty_weights",
           "A critic `D(z) = u . tanh(W @ z)` scores each row of `x`. The gradient penalty is the mean over the "
           "rows `n` of `(||grad_z D(z) at z = x[n]||_2 - 1) ** 2`. Return the gradient of the penalty with "
           "respect to `W`.",
           _gradient_penalty,
           "W = W.clone().requires_grad_()\n"
           "xs = x.clone().requires_grad_()\n"
           "scores = torch.tanh(xs @ W.T) @ u\n"
           "(gx,) = torch.autograd.grad(scores.sum(), xs, create_graph=True)\n"
           "penalty = ((gx.norm(dim=1) - 1) ** 2).mean()\n"
           "(result,) = torch.autograd.grad(penalty, W)\n",
           "from torch.func import grad, vmap\n"
           "def penalty(W):\n"
           "    gx = vmap(grad(lambda z: u @ torch.tanh(W @ z)))(x)\n"
           "    return ((gx.norm(dim=1) - 1) ** 2).mean()\n"
           "result = grad(penalty)(W)\n",
           float64_margin=True),
]
