"""The shipped torch_npu references (references/, docs/REFERENCES.md), each
checked against an independent formula in fp64 on random inputs, at every
dtype torch_npu supports for the op (fp32, fp16, bf16), and in fp64 (where
the verdict's exact run is made). Backward references are checked against
autograd of the forward formula; attention, grouped matmul and the MoE
permutes against loops over rows.

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
        "npu::npu_fusion_attention", "npu::npu_fusion_attention_grad", "npu::npu_grouped_matmul",
        "npu::npu_moe_token_permute", "npu::npu_moe_token_permute_grad", "npu::npu_moe_token_unpermute",
        "npu::npu_moe_token_unpermute_grad", "npu::npu_rms_norm", "npu::npu_rms_norm_backward", "npu::npu_rotary_mul",
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


def unpermute_exact(permuted, sorted_indices, probs, tokens, topk):
    """By loops: out[i] = sum_j probs[i, j] * permuted[sorted_indices[i*topK + j]]."""
    rows = []
    for i in range(tokens):
        row = torch.zeros(permuted.size(1), dtype=torch.float64)
        for j in range(topk):
            k = sorted_indices[i * topk + j].item()
            if k < permuted.size(0):  # rows past num_out_tokens were dropped
                row = row + (1.0 if probs is None else probs[i, j]) * permuted[k]
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("topk,num_out_tokens", [(1, None), (2, None), (3, 0), (2, 9)])
def test_moe_token_permute_and_unpermute_grads(dtype, topk, num_out_tokens):
    gen = torch.Generator().manual_seed(5)
    tokens = rand(7, 6, dtype=dtype, gen=gen)
    experts = torch.randint(0, 4, (7, topk), generator=gen)
    indices = experts.reshape(-1) if topk == 1 else experts
    t64 = tokens.double().requires_grad_(True)
    permuted64, sorted_indices = permute_exact(t64, indices, num_out_tokens)
    grad = rand(*permuted64.shape, dtype=dtype, gen=gen)
    (exact,) = torch.autograd.grad(permuted64, t64, grad.double())
    got = reference("npu_moe_token_permute_grad")(tokens, grad, indices, sorted_indices, False)
    check(got, exact, dtype)

    permuted = permuted64.detach().to(dtype)
    p64 = permuted.double().requires_grad_(True)
    probs = torch.softmax(rand(7, topk, dtype=torch.float64, gen=gen), -1).to(dtype) if topk > 1 else None
    w64 = probs.double().requires_grad_(True) if probs is not None else None
    out = unpermute_exact(p64, sorted_indices, w64, 7, topk)
    dy = rand(7, 6, dtype=dtype, gen=gen)
    exact_grads = torch.autograd.grad(out, [p64] + ([w64] if w64 is not None else []), dy.double())
    got_permuted, got_probs = reference("npu_moe_token_unpermute_grad")(permuted, dy, sorted_indices, probs, False,
                                                                         None)
    check(got_permuted, exact_grads[0], dtype)
    if probs is None:
        assert got_probs.dim() == 0  # torch_npu leaves it unwritten: shape [] (op-plugin's out size)
    else:
        check(got_probs, exact_grads[1], dtype)


def head_rows(x, layout, b, h, d):
    """The [S, d] rows of head h of batch b of `x` in `layout`, by indexing."""
    if layout == "BSH":
        return x[b, :, h * d:(h + 1) * d]
    if layout == "SBH":
        return x[:, b, h * d:(h + 1) * d]
    if layout == "BSND":
        return x[b, :, h]
    return x[b, h]


def is_masked(mode, mask, i, j, sq, skv, pre, nxt):
    """The published rule for query i and key j (docs/REFERENCES.md)."""
    if mask is None:
        return False
    if mode == 0:
        return bool(mask[i, j]) or j - i > nxt or i - j > pre
    if mode == 1:
        return bool(mask[i, j])
    if mode == 2:
        return j > i
    if mode == 3:
        return j > i + skv - sq
    return j - (i + skv - sq) > nxt or (i + skv - sq) - j > pre  # mode 4: the band from the bottom-right


def attention_exact(q, k, v, layout, heads, kv_heads, d, scale, mode, mask, pre, nxt, shape):
    """Query row by query row over the unmasked keys: out, and each row's max and sum of exp(s - max)."""
    batches = q.size(1) if layout == "SBH" else q.size(0)
    out = torch.zeros(shape, dtype=torch.float64)
    stats = torch.zeros(batches, heads, q.size(0 if layout == "SBH" else (2 if layout == "BNSD" else 1)), 2,
                        dtype=torch.float64)
    for b in range(batches):
        for h in range(heads):
            kh = h // (heads // kv_heads)
            qs, ks, vs = head_rows(q, layout, b, h, d), head_rows(k, layout, b, kh, d), head_rows(v, layout, b, kh, d)
            sq, skv = qs.size(0), ks.size(0)
            for i in range(sq):
                keep = [j for j in range(skv) if not is_masked(mode, mask, i, j, sq, skv, pre, nxt)]
                s = torch.stack([scale * torch.dot(qs[i], ks[j]) for j in keep])
                row = torch.softmax(s, 0) @ vs[keep]
                head_rows(out, layout, b, h, vs.size(1))[i] = row
                stats[b, h, i, 0] = s.max().detach()
                stats[b, h, i, 1] = torch.exp(s - s.max()).sum().detach()
    return out, stats


def to_layout(x, layout):
    """[B, N, S, D] into `layout`."""
    b, n, s, d = x.shape
    if layout == "BNSD":
        return x.contiguous()
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        return x.transpose(1, 2).reshape(b, s, n * d).contiguous()
    return x.permute(2, 0, 1, 3).reshape(s, b, n * d).contiguous()


# layout, query heads, key/value heads, Sq, Skv, sparse_mode, pre_tockens, next_tockens, mask kind
ATTENTION_CASES = [
    ("BSH", 4, 4, 5, 5, 0, 2147483647, 2147483647, None),
    ("SBH", 4, 2, 6, 6, 0, 6, 0, "band"),        # causal through the band, GQA
    ("BSND", 4, 1, 6, 6, 0, 2, 1, "band+random"),  # a band, and more masked by atten_mask
    ("BNSD", 2, 2, 5, 7, 1, 0, 0, "random"),
    ("BSND", 4, 2, 6, 6, 2, 0, 0, "tile"),
    ("BNSD", 2, 1, 4, 7, 3, 0, 0, "tile"),
    ("BSH", 2, 2, 5, 7, 4, 2, 1, "tile"),
]


def attention_mask(kind, sq, skv, pre, nxt, gen):
    if kind is None:
        return None
    if kind == "tile":  # modes 2 to 4: the kernel's compressed causal tile, not read by the rule
        return torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)
    i, j = torch.arange(sq).reshape(-1, 1), torch.arange(skv).reshape(1, -1)
    band = (j - i > nxt) | (i - j > pre)
    if kind == "band":
        return band
    # Every query row keeps a key (a row with all keys masked is undefined):
    # key 0 alone, or its own position within the band.
    extra = (torch.rand(sq, skv, generator=gen) < 0.3) & (j != 0)
    if kind == "random":
        return extra
    return band | (extra & (j != i))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_fusion_attention_and_its_grad(dtype, case):
    layout, heads, kv_heads, sq, skv, mode, pre, nxt, kind = case
    gen = torch.Generator().manual_seed(6)
    d, batch, scale = 8, 2, 0.35
    q = to_layout(rand(batch, heads, sq, d, dtype=dtype, gen=gen), layout)
    k = to_layout(rand(batch, kv_heads, skv, d, dtype=dtype, gen=gen), layout)
    v = to_layout(rand(batch, kv_heads, skv, d, dtype=dtype, gen=gen), layout)
    mask = attention_mask(kind, sq, skv, pre, nxt, gen)
    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    out, stats = attention_exact(q64, k64, v64, layout, heads, kv_heads, d, scale, mode, mask, pre, nxt, q.shape)
    got = reference("npu_fusion_attention")(q, k, v, heads, layout, None, None, mask, scale, 1.0, pre, nxt, 0, None,
                                            None, None, mode, True, False, "", None, None, 0, 0)
    check(got[0], out.detach(), dtype)
    stats_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert got[1].shape == (batch, heads, sq, 8) and got[2].shape == (batch, heads, sq, 8)
    check(got[1], stats[..., 0:1].expand(batch, heads, sq, 8), stats_dtype)
    check(got[2], stats[..., 1:2].expand(batch, heads, sq, 8), stats_dtype)
    assert got[3].numel() == 0 and got[4:] == (0, 0, 0)

    dy = rand(*out.shape, dtype=dtype, gen=gen)
    exact = torch.autograd.grad(out, (q64, k64, v64), dy.double())
    grads = reference("npu_fusion_attention_grad")(
        q, k, v, dy, heads, layout, None, None, mask, got[1], got[2], got[3], got[0], scale, 1.0, pre, nxt, 0, 0, 0,
        0, None, None, None, mode, True, False, "", None)
    for g, e in zip(grads[:3], exact):
        check(g, e, dtype)
    assert grads[3].numel() == 0 and grads[4].numel() == 0  # dpse, dsink: no pse, no sink


def test_fusion_attention_takes_older_schemas_and_refuses_what_it_does_not_implement():
    gen = torch.Generator().manual_seed(7)
    q, k, v = (rand(1, 2, 4, 8, dtype=torch.float32, gen=gen) for _ in range(3))
    forward = reference("npu_fusion_attention")
    newest = forward(q, k, v, 2, "BNSD", None, None, None, 0.3, 1.0, 2147483647, 2147483647, 0, None, None, None, 0,
                     True, False, "", None, None, 0, 0)
    # torch_npu 7.0.0/7.1.0's schema stops after `sync`: the rest take their defaults.
    older = forward(q, k, v, 2, "bnsd", None, None, None, 0.3, 1.0, 2147483647, 2147483647, 0, None, None, None, 0,
                    True, False)
    assert torch.equal(newest[0], older[0])
    grad = reference("npu_fusion_attention_grad")
    assert len(grad(q, k, v, q, 2, "BNSD", None, None, None, None, None, None, None, 0.3, 1.0, 2147483647,
                    2147483647, 0, 0, 0, 0, None, None, None, 0, True, False)) == 5
    refused = [dict(keep_prob=0.9), dict(sparse_mode=5), dict(input_layout="TND"), dict(pse=q),
               dict(actual_seq_qlen=[4]), dict(softmax_layout="TND")]
    for kwargs in refused:
        args = dict(query=q, key=k, value=v, head_num=2, input_layout="BNSD")
        args.update(kwargs)
        with pytest.raises(Exception, match="not implemented"):
            forward(**args)


def grouped_exact(x_rows, weights, biases, counts):
    """Row by row: row r of group g (by counts) times weights[g] plus biases[g]; rows past the groups 0."""
    out, r = [], 0
    for g, n in enumerate(counts):
        for _ in range(n):
            y = torch.stack([torch.dot(x_rows[r], weights[g][:, c]) for c in range(weights[g].size(1))])
            out.append(y + biases[g] if biases is not None else y)
            r += 1
    while r < x_rows.size(0):
        out.append(torch.zeros(weights[0].size(1), dtype=torch.float64))
        r += 1
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_grouped_matmul(dtype):
    gen = torch.Generator().manual_seed(8)
    gmm = reference("npu_grouped_matmul")
    k, n = 6, 5
    # group_type None (no grouping): independent pairs, with bias; 3-D x.
    xs = [rand(2, 3, k, dtype=dtype, gen=gen), rand(1, 4, k, dtype=dtype, gen=gen)]
    ws = [rand(k, n, dtype=dtype, gen=gen), rand(k, 3, dtype=dtype, gen=gen)]
    bs = [rand(n, dtype=dtype, gen=gen), rand(3, dtype=dtype, gen=gen)]
    got = gmm(xs, ws, bs, None, None, None, None, None, None, None, None, None, 0, None, 0, 0, None, None)
    assert len(got) == 2
    for x, w, b, y in zip(xs, ws, bs, got):
        rows = x.double().reshape(-1, k)
        check(y, grouped_exact(rows, [w.double()], [b.double()], [rows.size(0)]).reshape(y.shape), dtype)
    # group_type 0: one x, one [E, K, N] weight, cumulative group_list, one output (split_item 3); rows past it 0.
    x = rand(9, k, dtype=dtype, gen=gen)
    w = rand(3, k, n, dtype=dtype, gen=gen)
    cumsum = torch.tensor([2, 2, 7])
    got = gmm([x], [w], None, None, None, None, None, None, cumsum, None, None, None, 3, 0, 0, 0, None, None)
    assert len(got) == 1
    check(got[0], grouped_exact(x.double(), list(w.double().unbind(0)), None, [2, 0, 5]), dtype)
    # group_type 0, counts (group_list_type 1), a list of weights, per-group bias, one output per group.
    counts = torch.tensor([4, 1, 4])
    wl = list(w.unbind(0))
    bl = [rand(n, dtype=dtype, gen=gen) for _ in range(3)]
    got = gmm([x], wl, bl, None, None, None, None, None, counts, None, None, None, 0, 0, 1, 0, None, None)
    exact = grouped_exact(x.double(), [t.double() for t in wl], [t.double() for t in bl], [4, 1, 4])
    assert [t.size(0) for t in got] == [4, 1, 4]
    check(torch.cat(got), exact, dtype)


def test_grouped_matmul_refuses_quantisation_and_activations():
    gen = torch.Generator().manual_seed(9)
    gmm = reference("npu_grouped_matmul")
    x, w = rand(4, 6, dtype=torch.float32, gen=gen), rand(6, 5, dtype=torch.float32, gen=gen)
    with pytest.raises(Exception, match="not implemented"):
        gmm([x], [w], scale=[torch.ones(5)])
    with pytest.raises(Exception, match="not implemented"):
        gmm([x], [w], act_type=1)
    with pytest.raises(Exception, match="not implemented"):
        gmm([x], [w], group_list=torch.tensor([4]), group_type=2)
