"""The shipped torch_npu references (references/, docs/REFERENCES.md), each
checked against an independent formula in fp64 on random inputs, at every
dtype torch_npu supports for the op (fp32, fp16, bf16), and in fp64 (where
the verdict's exact run is made). Backward references are checked against
autograd of the forward formula.

The references are read from $MOERR_REFERENCES (the build's
share/moerr/references; ctest sets it).
"""
import os

import pytest
import torch

DIR = os.environ.get("MOERR_REFERENCES", "")
# The largest relative L2 error against fp64, per dtype: moerr's per-dtype
# thresholds (docs/REPLAY.md, "Diff"); fp64 runs must agree to rounding.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def reference(name):
    path = os.path.join(DIR, name + ".pt")
    if not os.path.isfile(path):
        pytest.fail(f"{path} is missing: build the moerr_references target")
    return torch.jit.load(path)


def listed():
    with open(os.path.join(DIR, "references.list")) as f:
        return {line.split()[0]: line.split()[1] for line in f if line.strip() and not line.startswith("#")}


def check(got, exact, dtype):
    """`got` is in `dtype`, and within its tolerance of `exact`."""
    assert got.dtype == dtype, got.dtype
    assert got.shape == exact.shape
    g = got.double()
    rel = ((g - exact).norm() / exact.norm()).item()
    assert rel <= TOLERANCE[dtype], f"relative L2 error {rel:.3g} at {dtype}"


def rand(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def test_the_list_names_every_file():
    entries = listed()
    assert set(entries) == {
        "npu::npu_moe_token_permute", "npu::npu_moe_token_unpermute", "npu::npu_rms_norm", "npu::npu_rms_norm_backward", "npu::npu_rotary_mul",
        "npu::npu_rotary_mul_backward", "npu::npu_swiglu", "npu::npu_swiglu_backward"}
    for file in entries.values():
        assert os.path.isfile(os.path.join(DIR, file))


def swiglu_exact(x, dim):
    a, b = x.narrow(dim, 0, x.shape[dim] // 2), x.narrow(dim, x.shape[dim] // 2, x.shape[dim] // 2)
    return a / (1 + torch.exp(-a)) * b


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [-1, 0])
def test_swiglu_and_its_backward(dtype, dim):
    gen = torch.Generator().manual_seed(1)
    x = rand(6, 10, dtype=dtype, gen=gen)
    x64 = x.double().requires_grad_(True)
    exact = swiglu_exact(x64, dim)
    check(reference("npu_swiglu")(x, dim), exact.detach(), dtype)
    grad = rand(*exact.shape, dtype=dtype, gen=gen)
    (exact_dx,) = torch.autograd.grad(exact, x64, grad.double())
    check(reference("npu_swiglu_backward")(grad, x, dim), exact_dx, dtype)


def rms_exact(x, gamma, eps):
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    rms = torch.sqrt((x ** 2).mean(dims, keepdim=True) + eps)
    return x / rms * gamma, 1 / rms


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma_shape", [(16,), (4, 16)])
def test_rms_norm_and_its_backward(dtype, gamma_shape):
    gen = torch.Generator().manual_seed(2)
    eps = 1e-6
    x = rand(3, 4, 16, dtype=dtype, gen=gen)
    gamma = rand(*gamma_shape, dtype=dtype, gen=gen)
    x64, g64 = x.double().requires_grad_(True), gamma.double().requires_grad_(True)
    y, rstd = rms_exact(x64, g64, eps)
    got_y, got_rstd = reference("npu_rms_norm")(x, gamma, eps)
    check(got_y, y.detach(), dtype)
    check(got_rstd, rstd.detach(), torch.float64 if dtype == torch.float64 else torch.float32)
    dy = rand(*y.shape, dtype=dtype, gen=gen)
    exact_dx, exact_dgamma = torch.autograd.grad(y, (x64, g64), dy.double())
    dx, dgamma = reference("npu_rms_norm_backward")(dy, x, gamma, got_rstd)
    check(dx, exact_dx, dtype)
    check(dgamma, exact_dgamma, torch.float64 if dtype == torch.float64 else torch.float32)


def rotation(d):
    """R with x @ R.T = cat(-x2, x1): a matrix, not the references' slicing."""
    r = torch.zeros(d, d, dtype=torch.float64)
    h = d // 2
    for i in range(h):
        r[i, h + i] = -1.0
        r[h + i, i] = 1.0
    return r


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_mul_and_its_backward(dtype):
    gen = torch.Generator().manual_seed(3)
    x = rand(2, 5, 3, 8, dtype=dtype, gen=gen)           # B S N D
    r1 = torch.cos(rand(1, 5, 1, 8, dtype=torch.float64, gen=gen)).to(dtype)
    r2 = torch.sin(rand(1, 5, 1, 8, dtype=torch.float64, gen=gen)).to(dtype)
    x64, a64, b64 = (t.double().requires_grad_(True) for t in (x, r1, r2))
    exact = x64 * a64 + (x64 @ rotation(8).T) * b64
    check(reference("npu_rotary_mul")(x, r1, r2), exact.detach(), dtype)
    grad = rand(*exact.shape, dtype=dtype, gen=gen)
    exact_grads = torch.autograd.grad(exact, (x64, a64, b64), grad.double())
    got = reference("npu_rotary_mul_backward")(grad, x, r1, r2)
    for g, e in zip(got, exact_grads):
        check(g, e, dtype)


def permute_exact(tokens, indices, num_out_tokens):
    """By loops: token slots grouped by expert, in slot order within one."""
    topk = 1 if indices.dim() == 1 else indices.size(1)
    flat = indices.reshape(-1).tolist()
    order = sorted(range(len(flat)), key=lambda i: (flat[i], i))
    sorted_indices = [0] * len(flat)
    for j, i in enumerate(order):
        sorted_indices[i] = j
    rows = len(flat) if not num_out_tokens else min(len(flat), num_out_tokens)
    permuted = torch.stack([tokens[order[j] // topk] for j in range(rows)])
    return permuted, torch.tensor(sorted_indices, dtype=torch.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("topk,num_out_tokens", [(1, None), (2, None), (3, 0), (2, 9)])
def test_moe_token_permute_and_unpermute(dtype, topk, num_out_tokens):
    gen = torch.Generator().manual_seed(4)
    tokens = rand(7, 6, dtype=dtype, gen=gen)
    experts = torch.randint(0, 4, (7, topk), generator=gen)  # ties: several slots per expert
    indices = experts.reshape(-1) if topk == 1 else experts
    permuted, sorted_indices = reference("npu_moe_token_permute")(tokens, indices, num_out_tokens, False)
    exact_permuted, exact_sorted = permute_exact(tokens, indices, num_out_tokens)
    assert permuted.dtype == dtype and torch.equal(permuted, exact_permuted)  # a gather: exact
    assert sorted_indices.dtype == torch.int32 and torch.equal(sorted_indices, exact_sorted)

    probs = torch.softmax(rand(7, topk, dtype=torch.float64, gen=gen), -1).to(dtype) if topk > 1 else None
    out = reference("npu_moe_token_unpermute")(permuted, sorted_indices, probs, False, None)
    exact = torch.zeros(7, 6, dtype=torch.float64)
    for i in range(7):
        for j in range(topk):
            row = exact_sorted[i * topk + j].item()
            weight = 1.0 if probs is None else probs[i, j].double()
            if row < permuted.size(0):  # rows past num_out_tokens were dropped
                exact[i] += weight * permuted[row].double()
    check(out, exact, dtype)
