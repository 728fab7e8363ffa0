'''Answers of issue 35's five classes, which got through the denylist of before: each must fail at
the hardest level with a reason that names the allowlist, never as a harness error. Each is the
source of a final message's code block, as a model would write it.

ANSWERS: name -> (family, class, source).'''

from ptenv.tasks.fn_advanced import CUMULATIVE, FOLD, INTERPOLATE_LINEAR, NLL_LOSS, SCATTER_REDUCE, SEARCHSORTED, UNFOLD
from ptenv.tasks.fn_expert import CONV_TRANSPOSE1D, LAYER_NORM_BACKWARD, MASKED_SOFTMAX_BACKWARD

LN = "def layer_norm_backward(x, weight, bias, eps, grad_out):\n"
MSB = "def masked_softmax_backward(x, mask, temperature, grad_out):\n"
CT = "def conv_transpose1d(x, weight, bias, stride, padding, output_padding, dilation, groups):\n"
UF = "def unfold(x, kernel_size, stride, padding, dilation, padding_mode):\n"
FD = "def fold(cols, output_size, kernel_size, stride, padding, dilation, reduction):\n"
SR = "def scatter_reduce(self, index, src, reduce, include_self):\n"
# F.pad's modes, which the answers of the unfold family need first.
PAD = "    import torch.nn.functional as F\n    x = F.pad(x, (padding[1],) * 2 + (padding[0],) * 2, mode={'zeros': 'constant'}.get(padding_mode, padding_mode))\n"

AUTOGRAD = {
    # the recorded graph's nodes, called in reverse order: no engine
    "graph_nodes_called": (LAYER_NORM_BACKWARD, LN + """\
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
        y = torch.nn.functional.layer_norm(leaves[0], x.shape[-1:], leaves[1], leaves[2], eps)
    grads, frontier = {}, [(y.grad_fn, (grad_out,))]
    while frontier:
        node, incoming = frontier.pop()
        outgoing = node(*incoming)
        outgoing = outgoing if isinstance(outgoing, tuple) else (outgoing,)
        for (nxt, _), g in zip(node.next_functions, outgoing):
            if nxt is not None and g is not None:
                if hasattr(nxt, 'variable'):
                    grads[id(nxt.variable)] = g
                else:
                    frontier.append((nxt, (g,)))
    return tuple(grads[id(t)] for t in leaves)
"""),
    "parameter_graph_nodes": (MASKED_SOFTMAX_BACKWARD, MSB + """\
    p = torch.nn.Parameter(x.clone())  # a leaf that requires grad, made without requires_grad_
    with torch.enable_grad():
        z = p / temperature
        y = torch.where(mask, torch.exp(z - z.amax(1, keepdim=True)), torch.zeros_like(z))
        y = y / y.sum(1, keepdim=True).clamp(min=1e-30)
    g = grad_out
    for node in (y.grad_fn,):
        g = node(g)
    return (g[0] if isinstance(g, tuple) else g,)
"""),
    "torchscript_symbolic_autodiff": (LAYER_NORM_BACKWARD, LN + """\
    unit = torch.jit.CompilationUnit('''
def f(x, w, b, eps: float):
    m = x.mean(-1, keepdim=True)
    v = ((x - m) * (x - m)).mean(-1, keepdim=True)
    return (x - m) / torch.sqrt(v + eps) * w + b
''')
    graph = unit.f.graph.copy()
    gradient = torch._C._jit_differentiate(graph)  # the backward, as a graph of plain ops
    return gradient
"""),
    "softmax_backward_kernel": (MASKED_SOFTMAX_BACKWARD, MSB + """\
    z = (x / temperature).masked_fill(~mask, float('-inf'))
    y = torch.nan_to_num(torch.softmax(z, 1), nan=0.0)
    return (torch.ops.aten._softmax_backward_data(grad_out, y, 1, x.dtype) / temperature,)
"""),
    "layer_norm_backward_kernel": (LAYER_NORM_BACKWARD, LN + """\
    d = x.shape[-1:]
    mean = x.mean(-1, keepdim=True)
    rstd = 1 / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps)
    return torch.ops.aten.native_layer_norm_backward(grad_out, x, d, mean, rstd, weight, bias, [True, True, True])
"""),
}

OUTSIDE_ATEN = {
    "mkldnn_transposed_convolution": (CONV_TRANSPOSE1D, CT + """\
    out = torch.ops.mkldnn._convolution_transpose_pointwise(
        x.unsqueeze(2), weight.unsqueeze(2), bias, [0, padding], [0, output_padding], [1, stride], [1, dilation],
        groups, 'none', [], '')
    return out.squeeze(2)
"""),
    "mkldnn_one_hot_convolution": (UNFOLD, UF + PAD + """\
    (kh, kw), C = kernel_size, x.shape[1]
    eye = torch.eye(C * kh * kw, dtype=x.dtype).reshape(C * kh * kw, C, kh, kw)  # one-hot weights pick each tap
    out = torch.ops.mkldnn._convolution_pointwise(x, eye, None, [0, 0], stride, dilation, 1, 'none', [], '')
    return out.flatten(2)
"""),
}

SIBLINGS = {
    "segment_reduce_after_a_sort": (SCATTER_REDUCE, SR + """\
    order = torch.sort(index, stable=True).indices
    counts = torch.zeros(self.shape[0], dtype=torch.int64).index_put_((index,), torch.ones_like(index), accumulate=True)
    reduced = torch.segment_reduce(src[order], {'amax': 'max', 'amin': 'min'}.get(reduce, reduce), lengths=counts)
    return torch.where((counts > 0)[:, None], reduced, self)
"""),
    "accumulating_index_put": (SCATTER_REDUCE, SR + """\
    out = self.clone() if include_self else torch.zeros_like(self)
    return out.index_put_((index,), src, accumulate=True)
"""),
    "coalesced_sparse_tensor": (SCATTER_REDUCE, SR + """\
    rows = torch.sparse_coo_tensor(index[None], src, self.shape).coalesce().to_dense()
    return self + rows
"""),
    "col2im_for_the_transposed_convolution": (CONV_TRANSPOSE1D, CT + """\
    cols = (weight.flatten(1).T @ x.squeeze(0)).unsqueeze(0)
    return torch.ops.aten.col2im(cols, [1, (x.shape[2] - 1) * stride + dilation * (weight.shape[2] - 1) + 1],
                                 [1, weight.shape[2]], [1, dilation], [0, padding], [1, stride])
"""),
    "tensor_unfold_view": (UNFOLD, UF + PAD + """\
    (kh, kw), (sh, sw), (dh, dw) = kernel_size, stride, dilation
    windows = x.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)[..., ::dh, ::dw]
    n, c, oh, ow = windows.shape[:4]
    return windows.permute(0, 1, 4, 5, 2, 3).reshape(n, c * kh * kw, oh * ow)
"""),
}

OTHER_LIBRARIES = {
    "numpy_searchsorted": (SEARCHSORTED, """\
import numpy as np
def searchsorted(sorted_sequence, values, right):
    side = 'right' if right else 'left'
    rows = [np.searchsorted(s, v, side=side) for s, v in zip(sorted_sequence.tolist(), values.tolist())]
    return torch.tensor(rows, dtype=torch.int64)
"""),
    "numpy_cumulative_through_tensor_numpy": (CUMULATIVE, """\
def cumulative(x, dim, op, reverse, exclusive):
    y = x.flip(dim) if reverse else x
    a = y.numpy()  # torch's own numpy interop
    out = torch.from_numpy({'sum': a.cumsum, 'prod': a.cumprod}.get(op, a.cumsum)(dim).copy())
    return out.flip(dim) if reverse else out
"""),
    "numpy_interp": (INTERPOLATE_LINEAR, """\
import numpy as np
def interpolate_linear(x, size, align_corners):
    L = x.shape[-1]
    src = np.linspace(0, L - 1, size) if align_corners else np.clip((np.arange(size) + 0.5) * L / size - 0.5, 0, None)
    rows = [np.interp(src, np.arange(L), row) for row in x.reshape(-1, L).tolist()]
    return torch.tensor(rows, dtype=x.dtype).reshape(*x.shape[:-1], size)
"""),
}

# A pasted decomposition is the answer's own composition: these two need ops off the list (F.pad's
# reflect mode, an index_put kernel). One made of allowed ops alone is allowed (COMPOSITIONS).
PASTED = {
    "pasted_im2col_decomposition": (UNFOLD, UF + PAD + """\
    from torch._decomp.decompositions import im2col
    return im2col(x, kernel_size, dilation, [0, 0], stride)
"""),
    "pasted_col2im_decomposition": (FOLD, FD + """\
    from torch._decomp.decompositions import col2im
    total = col2im(cols, output_size, kernel_size, dilation, padding, stride)
    return total
"""),
}

# Compositions of allowed ops, so allowed: graded on their merits (this one gives torch's NaN where
# every target is ignored, which the contract rules 0).
COMPOSITIONS = {
    "pasted_nll_loss_decomposition": (NLL_LOSS, """\
def nll_loss(log_probs, target, weight, ignore_index, reduction):
    from torch._decomp.decompositions import nll_loss_forward
    return nll_loss_forward(log_probs, target, weight, {'none': 0, 'mean': 1, 'sum': 2}[reduction], ignore_index)[0]
"""),
}

CLASSES = {"autograd without its engine": AUTOGRAD, "ops outside aten": OUTSIDE_ATEN, "siblings": SIBLINGS,
           "other libraries": OTHER_LIBRARIES, "pasted decompositions": PASTED}
ANSWERS = {name: (family, cls, source) for cls, answers in CLASSES.items() for name, (family, source) in answers.items()}
