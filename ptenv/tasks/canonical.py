"""The task catalogue: one entry per task, nothing derived.

An entry gives a stable id (`category/short_name`), what to compute, each preloaded input as a
torch expression built only from arange/linspace/constants (no RNG, no default initialisers), and
a reference solution run exactly like a model's cell: inputs preloaded by name, answer in `result`.
Shapes, dtypes, the expected output and the instruction are all computed from these (ptenv/tasks/rows.py).

Input values are chosen so that no degenerate answer passes the grader: mixed signs where an
op clips, values not exactly representable in float16, no ties where an op picks an index.
Layer weights are preloaded tensors copied into the module under torch.no_grad().
"""

from dataclasses import dataclass, field

CATEGORIES = {"tensor_ops": 16, "nn_modules": 12, "autograd": 6, "losses": 6, "optim": 5}


@dataclass(frozen=True)
class Task:
    id: str
    does: str
    inputs: dict[str, str]
    solution: str
    # Degenerate answers (e.g. "input:x", "zeros") this task may let through, each with the reason why.
    degenerate_ok: dict[str, str] = field(default_factory=dict)
    # Plausible wrong procedures (name -> code), each graded 0: a seeded instance where one earns the
    # reward is redrawn (see ptenv.tasks.families.Family).
    shortcuts: dict[str, str] = field(default_factory=dict)
    # Redrawn float inputs are multiples of this step (0: any value), so that the thresholds the task
    # compares against occur in the data and a flipped bound is caught.
    grid: float = 0.0
    # Parameters a seeded instance may change: a literal of the instruction and solution (e.g. "0.1"
    # for a learning rate) -> the other values it may take; every occurrence in both is replaced.
    vary: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def category(self) -> str:
        return self.id.split("/")[0]


# Shared by the optimiser tasks: a least-squares fit of y ~ x @ w.T.
_FIT_DATA = {"x": "torch.linspace(-1.0, 1.0, 12).reshape(4, 3)", "y": "torch.linspace(0.7, -0.4, 8).reshape(4, 2)"}
_FIT_W = "torch.linspace(-0.6, 0.9, 6).reshape(2, 3)"

TASKS = [
    # ---------------------------------------------------------------- tensor_ops
    Task("tensor_ops/reshape_blocks",
         "Cut `x` into non-overlapping 2x2 blocks and stack them in row-major block order: "
         "`result[k]` is `x[2*i:2*i+2, 2*j:2*j+2]` where `i, j = divmod(k, 3)`.",
         {"x": "torch.linspace(-1.0, 1.0, 24).reshape(4, 6)"},
         "result = x.reshape(2, 2, 3, 2).permute(0, 2, 1, 3).reshape(6, 2, 2)\n"),
    Task("tensor_ops/transpose_dims",
         "Swap dimensions 0 and 2 of `x`, so that `result[k, j, i] == x[i, j, k]`.",
         {"x": "torch.linspace(-3.0, 2.0, 24).reshape(2, 3, 4)"},
         "result = x.transpose(0, 2)\n"),
    Task("tensor_ops/row_sum_keepdim",
         "Sum each row of `x`, keeping the reduced dimension.",
         {"x": "torch.linspace(-1.5, 2.5, 15).reshape(3, 5)"},
         "result = x.sum(dim=1, keepdim=True)\n"),
    Task("tensor_ops/column_std_unbiased",
         "The sample standard deviation of each column of `x`, with Bessel's correction (divide by N - 1).",
         {"x": "(torch.linspace(0.0, 2.0, 12) ** 2).reshape(4, 3)"},
         "result = x.std(dim=0)\n",
         shortcuts={"biased_std": "result = x.std(dim=0, correction=0)\n"}),
    Task("tensor_ops/row_argmax",
         "The index of the largest element in each row of `x`.",
         {"x": "(torch.arange(20) * 7 % 20 * 0.3 - 2.5).reshape(4, 5)"},
         "result = x.argmax(dim=1)\n"),
    Task("tensor_ops/clamp_range",
         "Clamp every element of `x` into the closed interval [-0.75, 1.25].",
         {"x": "torch.linspace(-2.0, 2.0, 14).reshape(2, 7)"},
         "result = x.clamp(min=-0.75, max=1.25)\n",
         vary={"-0.75": ("-0.5", "-1.0"), "1.25": ("0.75", "1.5")}),
    Task("tensor_ops/masked_fill",
         "A copy of `x` in which every element where the boolean mask `m` is True is replaced by 0.5.",
         {"x": "torch.linspace(-1.0, 1.0, 12).reshape(3, 4)", "m": "torch.arange(12).reshape(3, 4) % 3 == 0"},
         "result = x.masked_fill(m, 0.5)\n",
         vary={"0.5": ("-2.0", "3.5")}),
    Task("tensor_ops/masked_select",
         "The elements of `x` that are greater than 0.5, as a 1-D tensor in row-major order.",
         {"x": "(torch.arange(15) * 4 % 15 * 0.2 - 1.1).reshape(3, 5)"},
         "result = x[x > 0.5]\n",
         vary={"0.5": ("0.0", "0.25")}),
    Task("tensor_ops/band_mask",
         "A boolean mask that is True exactly where -0.5 <= `x` < 1.0.",
         {"x": "torch.linspace(-2.5, 2.25, 20).reshape(4, 5)"},
         "result = (x >= -0.5) & (x < 1.0)\n",
         vary={"-0.5": ("-1.0", "-0.25"), "1.0": ("0.5", "1.5")},
         grid=0.25,
         shortcuts={"lower_bound_excluded": "result = (x > -0.5) & (x < 1.0)\n",
                    "upper_bound_included": "result = (x >= -0.5) & (x <= 1.0)\n"}),
    Task("tensor_ops/sort_descending",
         "Sort each row of `x` in descending order (the sorted values, not the indices).",
         {"x": "(torch.arange(15) * 4 % 15 * 0.3 - 2.0).reshape(3, 5)"},
         "result = torch.sort(x, dim=1, descending=True).values\n"),
    Task("tensor_ops/argsort_rows",
         "The indices that sort each row of `x` in ascending order (as `torch.argsort` along the last dimension).",
         {"x": "(torch.arange(12) * 5 % 12 * 0.25 - 1.4).reshape(3, 4)"},
         "result = torch.argsort(x, dim=-1)\n"),
    Task("tensor_ops/stack_then_cat",
         "Stack `a` and `b` along a new dimension 1 (giving shape (3, 2, 4)), then concatenate `c` "
         "after them along dimension 1.",
         {"a": "torch.linspace(0.1, 1.2, 12).reshape(3, 4)", "b": "torch.linspace(-1.3, -0.2, 12).reshape(3, 4)",
          "c": "torch.linspace(2.0, 3.1, 12).reshape(3, 1, 4)"},
         "result = torch.cat([torch.stack([a, b], dim=1), c], dim=1)\n"),
    Task("tensor_ops/batched_matmul",
         "Multiply each of the 2 matrices in `a` by `b` (`a @ b`, with `b` broadcast over the batch).",
         {"a": "torch.linspace(-1.0, 1.0, 24).reshape(2, 3, 4)", "b": "torch.linspace(0.5, -0.5, 20).reshape(4, 5)"},
         "result = a @ b\n"),
    Task("tensor_ops/normalise_rows",
         "Scale each row of `x` to unit Euclidean (L2) norm.",
         {"x": "torch.linspace(-2.0, 3.0, 12, dtype=torch.float64).reshape(3, 4)"},
         "result = torch.nn.functional.normalize(x, p=2.0, dim=1)\n"),
    Task("tensor_ops/cumsum_rows",
         "The cumulative sum of `x` along dimension 1 (each row separately).",
         {"x": "torch.linspace(-1.0, 1.5, 12).reshape(3, 4)"},
         "result = torch.cumsum(x, dim=1)\n"),
    Task("tensor_ops/cast_trunc_int32",
         "Convert `x` to torch.int32 the way `Tensor.to` does (fractions truncated toward zero).",
         {"x": "torch.linspace(-3.5, 3.5, 12).reshape(3, 4)"},
         "result = x.to(torch.int32)\n",
         vary={"torch.int32": ("torch.int16", "torch.int64")},
         shortcuts={"floor_not_trunc": "result = x.floor().to(torch.int32)\n"}),
    # ---------------------------------------------------------------- nn_modules
    Task("nn_modules/linear_explicit",
         "Apply `torch.nn.Linear(4, 3)` whose weight is `w` and bias is `b` to `x`.",
         {"x": "torch.linspace(-1.0, 1.0, 8).reshape(2, 4)", "w": "torch.linspace(-0.5, 0.5, 12).reshape(3, 4)",
          "b": "torch.tensor([0.1, -0.2, 0.3])"},
         "layer = torch.nn.Linear(4, 3)\n"
         "with torch.no_grad():\n"
         "    layer.weight.copy_(w)\n"
         "    layer.bias.copy_(b)\n"
         "result = layer(x).detach()\n"),
    Task("nn_modules/mlp_relu_sigmoid",
         "Apply to `x` the network Linear(3, 5) -> ReLU -> Linear(5, 2) -> Sigmoid, where the first "
         "Linear has weight `w1` and bias `b1` and the second has weight `w2` and bias `b2`.",
         {"x": "torch.linspace(-1.0, 1.0, 12).reshape(4, 3)", "w1": "torch.linspace(-1.0, 1.2, 15).reshape(5, 3)",
          "b1": "torch.linspace(-0.2, 0.2, 5)", "w2": "torch.linspace(1.5, -1.1, 10).reshape(2, 5)",
          "b2": "torch.tensor([0.05, -0.05])"},
         "net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2), torch.nn.Sigmoid())\n"
         "with torch.no_grad():\n"
         "    net[0].weight.copy_(w1)\n"
         "    net[0].bias.copy_(b1)\n"
         "    net[2].weight.copy_(w2)\n"
         "    net[2].bias.copy_(b2)\n"
         "result = net(x).detach()\n",
         shortcuts={"no_relu": "result = torch.sigmoid((x @ w1.T + b1) @ w2.T + b2)\n"}),
    Task("nn_modules/conv2d_padding",
         "Apply `torch.nn.Conv2d(2, 2, kernel_size=3, padding=1)` whose weight is `w` and bias is `b` to `x`.",
         {"x": "torch.linspace(-1.0, 1.0, 50).reshape(1, 2, 5, 5)", "w": "torch.linspace(-0.3, 0.4, 36).reshape(2, 2, 3, 3)",
          "b": "torch.tensor([0.05, -0.1])"},
         "conv = torch.nn.Conv2d(2, 2, kernel_size=3, padding=1)\n"
         "with torch.no_grad():\n"
         "    conv.weight.copy_(w)\n"
         "    conv.bias.copy_(b)\n"
         "result = conv(x).detach()\n"),
    Task("nn_modules/conv2d_stride",
         "Apply `torch.nn.Conv2d(1, 3, kernel_size=2, stride=2, bias=False)` whose weight is `w` to `x`.",
         {"x": "torch.linspace(0.0, 1.0, 72).reshape(2, 1, 6, 6)", "w": "torch.linspace(-1.0, 1.0, 12).reshape(3, 1, 2, 2)"},
         "conv = torch.nn.Conv2d(1, 3, kernel_size=2, stride=2, bias=False)\n"
         "with torch.no_grad():\n"
         "    conv.weight.copy_(w)\n"
         "result = conv(x).detach()\n"),
    Task("nn_modules/gelu_exact",
         "Apply the exact (erf-based) GELU to `x`, as `torch.nn.GELU()` does by default (not the tanh approximation).",
         # Not below -2.5: at x = -3 the float32 GELU kernels of two CPU types differ from each other by
         # 2.5 times the grader's tolerance (the result is 1 - erf's cancellation), so no reference fits both.
         {"x": "torch.linspace(-2.5, 3.5, 13)"},
         "result = torch.nn.GELU()(x)\n",
         shortcuts={"tanh_approximation": "result = torch.nn.functional.gelu(x, approximate='tanh')\n"}),
    Task("nn_modules/softmax_columns",
         "The softmax of `x` over dimension 0, so that each column sums to 1.",
         {"x": "(torch.arange(12) * 5 % 12 * 0.4 - 2.0).reshape(3, 4)"},
         "result = torch.softmax(x, dim=0)\n"),
    Task("nn_modules/log_softmax_rows",
         "The log-softmax of `x` over its last dimension.",
         {"x": "(torch.arange(15) * 7 % 15 * 0.5 - 3.0).reshape(3, 5)"},
         "result = torch.log_softmax(x, dim=-1)\n"),
    Task("nn_modules/layer_norm_affine",
         "Apply `torch.nn.LayerNorm(4, eps=1e-5)` whose weight is `g` and bias is `b` to `x`.",
         {"x": "(torch.arange(12) * 5 % 12 * 0.3 - 1.0).reshape(3, 4)", "g": "torch.linspace(0.5, 2.0, 4)",
          "b": "torch.tensor([0.0, 0.1, -0.1, 0.2])"},
         "norm = torch.nn.LayerNorm(4, eps=1e-5)\n"
         "with torch.no_grad():\n"
         "    norm.weight.copy_(g)\n"
         "    norm.bias.copy_(b)\n"
         "result = norm(x).detach()\n",
         vary={"1e-5": ("1e-3", "1e-2")}),
    Task("nn_modules/max_pool",
         "Apply `torch.nn.MaxPool2d(kernel_size=3, stride=2, padding=1)` to `x`.",
         {"x": "(torch.arange(36) * 7 % 36 * 0.1 - 1.7).reshape(1, 1, 6, 6)"},
         "result = torch.nn.MaxPool2d(kernel_size=3, stride=2, padding=1)(x)\n"),
    Task("nn_modules/avg_pool",
         "Apply `torch.nn.AvgPool2d(kernel_size=3, stride=2, padding=1)` to `x` (default count_include_pad=True: "
         "padded zeros count in each average).",
         {"x": "torch.linspace(-1.0, 2.0, 50).reshape(1, 2, 5, 5)"},
         "result = torch.nn.AvgPool2d(kernel_size=3, stride=2, padding=1)(x)\n",
         shortcuts={"padding_not_counted":
                    "result = torch.nn.functional.avg_pool2d(x, 3, 2, 1, count_include_pad=False)\n"}),
    Task("nn_modules/flatten_linear",
         "Apply `torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))` to `x`, where the Linear "
         "has weight `w` and bias `b`.",
         {"x": "torch.linspace(-1.0, 1.0, 24).reshape(2, 2, 2, 3)", "w": "torch.linspace(0.3, -0.4, 36).reshape(3, 12)",
          "b": "torch.tensor([0.2, 0.0, -0.2])"},
         "net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))\n"
         "with torch.no_grad():\n"
         "    net[1].weight.copy_(w)\n"
         "    net[1].bias.copy_(b)\n"
         "result = net(x).detach()\n"),
    Task("nn_modules/embedding_lookup",
         "Look up the indices `idx` in `torch.nn.Embedding(6, 3)` whose weight is `weight`.",
         {"idx": "torch.tensor([[0, 2, 5], [4, 4, 1]])", "weight": "torch.linspace(-1.0, 1.0, 18).reshape(6, 3)"},
         "emb = torch.nn.Embedding(6, 3)\n"
         "with torch.no_grad():\n"
         "    emb.weight.copy_(weight)\n"
         "result = emb(idx).detach()\n"),
    # ---------------------------------------------------------------- autograd
    Task("autograd/scalar_backward",
         "Treat `w` as a leaf that requires grad, compute `loss = ((x @ w.T - y) ** 2).mean()`, call "
         "`loss.backward()`, and return the gradient of `loss` with respect to `w`.",
         {"w": "torch.linspace(-1.0, 1.0, 6).reshape(2, 3)", "x": "torch.linspace(0.5, 2.0, 12).reshape(4, 3)",
          "y": "torch.linspace(1.0, -1.0, 8).reshape(4, 2)"},
         "w = w.clone().requires_grad_()\n"
         "loss = ((x @ w.T - y) ** 2).mean()\n"
         "loss.backward()\n"
         "result = w.grad\n"),
    Task("autograd/grad_accumulates",
         "Treat `x` as a leaf that requires grad, call `backward()` on `(x ** 2).sum()` and then on "
         "`(x ** 3).sum()` without zeroing gradients in between, and return the accumulated `x.grad`.",
         {"x": "torch.linspace(-1.0, 1.0, 7)"},
         "x = x.clone().requires_grad_()\n"
         "(x ** 2).sum().backward()\n"
         "(x ** 3).sum().backward()\n"
         "result = x.grad\n"),
    Task("autograd/vector_jacobian",
         "With `y = x * torch.sin(x)`, use `torch.autograd.grad` with `grad_outputs=v` to compute the "
         "vector-Jacobian product of `y` with respect to `x`.",
         {"x": "torch.linspace(0.1, 1.2, 12).reshape(3, 4)", "v": "torch.linspace(1.0, -1.0, 12).reshape(3, 4)"},
         "x = x.clone().requires_grad_()\n"
         "y = x * torch.sin(x)\n"
         "(result,) = torch.autograd.grad(y, x, grad_outputs=v)\n"),
    Task("autograd/detach_target",
         "Treat `x` as a leaf that requires grad, let `target = (x ** 2).detach()` and "
         "`loss = ((x - target) ** 2).sum()`; return the gradient of `loss` with respect to `x` "
         "(no gradient flows through `target`).",
         {"x": "torch.linspace(-1.0, 1.0, 7)"},
         "x = x.clone().requires_grad_()\n"
         "target = (x ** 2).detach()\n"
         "loss = ((x - target) ** 2).sum()\n"
         "(result,) = torch.autograd.grad(loss, x)\n",
         shortcuts={"target_not_detached":
                    "x.requires_grad_()\n(result,) = torch.autograd.grad(((x - x ** 2) ** 2).sum(), x)\n"}),
    Task("autograd/second_derivative",
         "For `f = (x ** 3 * torch.sin(x)).sum()`, the second derivative of `f` with respect to each "
         "element of `x` (the diagonal of the Hessian), using `torch.autograd.grad` with `create_graph=True`.",
         {"x": "torch.linspace(-1.0, 2.0, 8)"},
         "x = x.clone().requires_grad_()\n"
         "f = (x ** 3 * torch.sin(x)).sum()\n"
         "(g,) = torch.autograd.grad(f, x, create_graph=True)\n"
         "(result,) = torch.autograd.grad(g.sum(), x)\n"),
    Task("autograd/gradient_penalty",
         "With `loss = torch.tanh(x @ w).sum()`, let `g` be the gradient of `loss` with respect to `w` "
         "(kept differentiable with `create_graph=True`); return the gradient of `(g ** 2).sum()` with respect to `w`.",
         {"w": "torch.tensor([0.5, -0.3, 0.8])", "x": "torch.linspace(-1.0, 1.0, 12).reshape(4, 3)"},
         "w = w.clone().requires_grad_()\n"
         "loss = torch.tanh(x @ w).sum()\n"
         "(g,) = torch.autograd.grad(loss, w, create_graph=True)\n"
         "(result,) = torch.autograd.grad((g ** 2).sum(), w)\n",
         shortcuts={"first_gradient":
                    "w.requires_grad_()\n(result,) = torch.autograd.grad(torch.tanh(x @ w).sum(), w)\n"}),
    # ---------------------------------------------------------------- losses
    Task("losses/mse_mean_grad",
         "The gradient with respect to `pred` of `torch.nn.MSELoss()` (mean reduction) between `pred` and `target`.",
         {"pred": "torch.linspace(-1.0, 1.0, 12).reshape(3, 4)", "target": "torch.linspace(0.5, -0.3, 12).reshape(3, 4)"},
         "pred = pred.clone().requires_grad_()\n"
         "torch.nn.MSELoss()(pred, target).backward()\n"
         "result = pred.grad\n",
         shortcuts={"sum_not_mean": "result = 2 * (pred - target)\n"}),
    Task("losses/cross_entropy_mean",
         "For each of the 3 mini-batches `logits[i]` (4 samples, 5 classes) with class targets `target[i]`, the "
         "mean cross-entropy loss (`torch.nn.CrossEntropyLoss()` with its default mean reduction).",
         {"logits": "(torch.arange(60) * 7 % 60 * 0.1 - 3.0).reshape(3, 4, 5)",
          "target": "torch.tensor([[1, 0, 4, 2], [3, 3, 0, 1], [2, 4, 1, 0]])"},
         "loss = torch.nn.CrossEntropyLoss()\n"
         "result = torch.stack([loss(logits[i], target[i]) for i in range(3)])\n"),
    Task("losses/cross_entropy_per_sample",
         "The cross-entropy loss of each sample (`reduction='none'`) for class scores `logits` and class targets `target`.",
         {"logits": "(torch.arange(20) * 7 % 20 * 0.25 - 2.0).reshape(4, 5)", "target": "torch.tensor([1, 0, 4, 2])"},
         "result = torch.nn.CrossEntropyLoss(reduction='none')(logits, target)\n"),
    Task("losses/bce_with_logits",
         "The element-wise binary cross-entropy (`reduction='none'`) of `torch.nn.BCEWithLogitsLoss` with "
         "`pos_weight=pos_weight`, for raw scores `logits` and 0/1 targets `target`.",
         {"logits": "torch.linspace(-2.0, 2.5, 12).reshape(4, 3)",
          "target": "(torch.arange(12).reshape(4, 3) % 2).to(torch.float32)", "pos_weight": "torch.tensor([1.0, 2.0, 0.5])"},
         "result = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight, reduction='none')(logits, target)\n",
         shortcuts={"pos_weight_dropped":
                    "result = torch.nn.functional.binary_cross_entropy_with_logits(logits, target, reduction='none')\n"}),
    Task("losses/l1_per_sample",
         "The mean absolute error of each row (sample) of `pred` against `target` (`torch.nn.L1Loss(reduction='none')` "
         "averaged over the last dimension).",
         {"pred": "torch.linspace(-1.0, 2.0, 12).reshape(4, 3)", "target": "torch.linspace(0.4, 0.0, 12).reshape(4, 3)"},
         "result = torch.nn.L1Loss(reduction='none')(pred, target).mean(dim=1)\n"),
    Task("losses/smooth_l1",
         "The element-wise `torch.nn.SmoothL1Loss(beta=0.5, reduction='none')` between `pred` and `target`.",
         {"pred": "torch.linspace(-1.5, 1.5, 12).reshape(3, 4)", "target": "torch.linspace(0.2, -0.1, 12).reshape(3, 4)"},
         "result = torch.nn.SmoothL1Loss(beta=0.5, reduction='none')(pred, target)\n",
         vary={"0.5": ("0.25", "1.0")}),
    # ---------------------------------------------------------------- optim
    Task("optim/sgd_step",
         "Make `w` a parameter (`torch.nn.Parameter(w)`), compute `loss = ((x @ w.T - y) ** 2).mean()`, and take "
         "one step of `torch.optim.SGD([w], lr=0.1)`; return the updated parameter values.",
         {"w": _FIT_W, **_FIT_DATA},
         "w = torch.nn.Parameter(w)\n"
         "opt = torch.optim.SGD([w], lr=0.1)\n"
         "opt.zero_grad()\n"
         "((x @ w.T - y) ** 2).mean().backward()\n"
         "opt.step()\n"
         "result = w.detach().clone()\n",
         vary={"0.1": ("0.05", "0.3")}),
    Task("optim/sgd_momentum",
         "Make `w` a parameter, and with `torch.optim.SGD([w], lr=0.1, momentum=0.9)` take two steps, each one "
         "zeroing the gradient, computing `loss = ((x @ w.T - y) ** 2).mean()` and calling `backward()`; return "
         "the parameter values after the second step.",
         {"w": _FIT_W, **_FIT_DATA},
         "w = torch.nn.Parameter(w)\n"
         "opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)\n"
         "for _ in range(2):\n"
         "    opt.zero_grad()\n"
         "    ((x @ w.T - y) ** 2).mean().backward()\n"
         "    opt.step()\n"
         "result = w.detach().clone()\n",
         vary={"0.1": ("0.05", "0.2"), "0.9": ("0.5", "0.8")},
         shortcuts={"grad_not_zeroed":
                    "w = torch.nn.Parameter(w)\nopt = torch.optim.SGD([w], lr=0.1, momentum=0.9)\n"
                    "for _ in range(2):\n    ((x @ w.T - y) ** 2).mean().backward()\n    opt.step()\n"
                    "result = w.detach()\n"}),
    Task("optim/adam_step",
         "Make `w` a parameter, compute `loss = ((x @ w.T - y) ** 2).mean()`, and take one step of "
         "`torch.optim.Adam([w], lr=0.01, betas=(0.9, 0.99))`; return the updated parameter values.",
         {"w": _FIT_W, **_FIT_DATA},
         "w = torch.nn.Parameter(w)\n"
         "opt = torch.optim.Adam([w], lr=0.01, betas=(0.9, 0.99))\n"
         "opt.zero_grad()\n"
         "((x @ w.T - y) ** 2).mean().backward()\n"
         "opt.step()\n"
         "result = w.detach().clone()\n",
         vary={"0.01": ("0.001", "0.05"), "0.9": ("0.8",), "0.99": ("0.999", "0.9")}),
    Task("optim/adamw_three_steps",
         "Make `w` a parameter, and with `torch.optim.AdamW([w], lr=0.05, weight_decay=0.1)` take three steps, "
         "each one zeroing the gradient, computing `loss = ((x @ w.T - y) ** 2).mean()` and calling `backward()`; "
         "return the parameter values after the third step.",
         {"w": _FIT_W, **_FIT_DATA},
         "w = torch.nn.Parameter(w)\n"
         "opt = torch.optim.AdamW([w], lr=0.05, weight_decay=0.1)\n"
         "for _ in range(3):\n"
         "    opt.zero_grad()\n"
         "    ((x @ w.T - y) ** 2).mean().backward()\n"
         "    opt.step()\n"
         "result = w.detach().clone()\n",
         vary={"0.05": ("0.01", "0.1"), "0.1": ("0.01", "0.5")}),
    Task("optim/clip_grad_norm",
         "Make `w` and `b` parameters, backpropagate `loss = ((x @ w.T + b - y) ** 2).sum()`, then clip their "
         "gradients with `torch.nn.utils.clip_grad_norm_([w, b], max_norm=1.0)`; return the clipped gradients "
         "as one 1-D tensor: `w.grad` flattened in row-major order followed by `b.grad`.",
         {"w": _FIT_W, "b": "torch.tensor([0.1, -0.1])", **_FIT_DATA},
         "w, b = torch.nn.Parameter(w), torch.nn.Parameter(b)\n"
         "((x @ w.T + b - y) ** 2).sum().backward()\n"
         "torch.nn.utils.clip_grad_norm_([w, b], max_norm=1.0)\n"
         "result = torch.cat([w.grad.flatten(), b.grad])\n",
         vary={"1.0": ("0.5", "2.0")},
         shortcuts={"unclipped":
                    "w, b = torch.nn.Parameter(w), torch.nn.Parameter(b)\n((x @ w.T + b - y) ** 2).sum().backward()\n"
                    "result = torch.cat([w.grad.flatten(), b.grad])\n"}),
]

# Tasks whose instruction or solution names its sizes (or whose answer could come out empty on
# small inputs): their seeded instances keep the canonical shapes and redraw only the values.
FIXED_SHAPES = {
    "tensor_ops/reshape_blocks", "tensor_ops/masked_select", "tensor_ops/stack_then_cat", "tensor_ops/batched_matmul",
    "nn_modules/linear_explicit", "nn_modules/mlp_relu_sigmoid", "nn_modules/conv2d_padding",
    "nn_modules/conv2d_stride", "nn_modules/layer_norm_affine", "nn_modules/flatten_linear",
    "nn_modules/embedding_lookup", "losses/cross_entropy_mean", "losses/cross_entropy_per_sample",
}
