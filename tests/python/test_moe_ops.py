"""Mixture-of-experts ops (grouped_mm and the routing ops) against PyTorch on CPU, their user
errors, the printer/parser round trip, and a tiny single-device MoE layer."""
import pytest
import torch

import meshfuser
from meshfuser import DataType, FusionDefinition

DT = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16, torch.int64: DataType.Int,
      torch.int32: DataType.Int32}


def _run(build, inputs):
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor(list(t.shape), dtype=DT[t.dtype]) for t in inputs]
        outs = build(fd, *tvs)
        for o in outs if isinstance(outs, (list, tuple)) else [outs]:
            fd.add_output(o)
    return fd, fd.execute(list(inputs))


def _offsets(sizes):
    return torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)


def _grouped_reference(mat1, mat2, offs):
    """torch._grouped_mm's meaning, written as a loop of matmuls."""
    if mat1.dim() == 3:
        return torch.bmm(mat1, mat2)
    offs = offs.cpu()
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    if mat2.dim() == 3:
        out = torch.zeros(mat1.shape[0], mat2.shape[2], dtype=mat1.dtype, device=mat1.device)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[s:e] = mat1[s:e] @ mat2[g]
        return out
    return torch.stack([mat1[:, s:e] @ mat2[s:e] for s, e in zip(starts, ends)])


# -- grouped_mm ---------------------------------------------------------------------------------
# Extents are multiples of 4 floats: PyTorch's own grouped GEMM wants 16-byte aligned strides.

def _check_grouped(out, mat1, mat2, offs):
    torch.testing.assert_close(out, _grouped_reference(mat1, mat2, offs))
    if hasattr(torch, "_grouped_mm") and not mat1.is_cuda:  # PyTorch's CPU grouped GEMM, where it has one
        torch.testing.assert_close(out, torch._grouped_mm(mat1, mat2, offs=offs))


@pytest.mark.parametrize("sizes", [[3, 0, 5, 2], [10], [0, 0, 4]], ids=["uneven", "one", "empty_groups"])
def test_grouped_mm_2d_3d(sizes):
    torch.manual_seed(0)
    offs = _offsets(sizes)
    m = int(offs[-1])
    mat1, mat2 = torch.randn(m, 8), torch.randn(len(sizes), 8, 12)
    _, (out,) = _run(lambda fd, a, b, o: fd.ops.grouped_mm(a, b, o), [mat1, mat2, offs])
    assert out.shape == (m, 12)
    _check_grouped(out, mat1, mat2, offs)


def test_grouped_mm_3d_3d():
    torch.manual_seed(1)
    mat1, mat2 = torch.randn(3, 4, 8), torch.randn(3, 8, 4)
    _, (out,) = _run(lambda fd, a, b: fd.ops.grouped_mm(a, b), [mat1, mat2])
    torch.testing.assert_close(out, torch.bmm(mat1, mat2))
    _check_grouped(out, mat1, mat2, None)


def test_grouped_mm_2d_2d_weight_gradient():
    torch.manual_seed(2)
    offs = _offsets([4, 0, 4, 4])
    k = int(offs[-1])
    mat1, mat2 = torch.randn(5, k), torch.randn(k, 8)  # [features, tokens] x [tokens, features]
    _, (out,) = _run(lambda fd, a, b, o: fd.ops.grouped_mm(a, b, o), [mat1, mat2, offs])
    assert out.shape == (4, 5, 8)
    _check_grouped(out, mat1, mat2, offs)
    torch.testing.assert_close(out[1], torch.zeros(5, 8))  # an expert without tokens


def test_grouped_mm_bfloat16_on_cpu_is_the_loop():
    torch.manual_seed(3)
    offs = _offsets([2, 6])
    mat1, mat2 = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(2, 16, 8, dtype=torch.bfloat16)
    _, (out,) = _run(lambda fd, a, b, o: fd.ops.grouped_mm(a, b, o), [mat1, mat2, offs])
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, _grouped_reference(mat1, mat2, offs))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (torch._grouped_mm on CUDA bfloat16)")
def test_grouped_mm_cuda_bfloat16_matches_pytorch():
    torch.manual_seed(4)
    offs = _offsets([64, 0, 128, 64]).cuda()
    mat1 = torch.randn(256, 128, dtype=torch.bfloat16, device="cuda")
    mat2 = torch.randn(4, 128, 64, dtype=torch.bfloat16, device="cuda")
    _, (out,) = _run(lambda fd, a, b, o: fd.ops.grouped_mm(a, b, o), [mat1, mat2, offs])
    torch.testing.assert_close(out, torch._grouped_mm(mat1, mat2, offs=offs))
    torch.testing.assert_close(out.float(), _grouped_reference(mat1.float().cpu(), mat2.float().cpu(),
                                                               offs.cpu()).cuda(), rtol=2e-2, atol=2e-1)


@pytest.mark.parametrize("case, match", [
    (lambda fd: fd.ops.grouped_mm(fd.define_tensor([4, 8]), fd.define_tensor([2, 7, 6]),
                                  fd.define_tensor([2], dtype=DataType.Int32)),
     r"grouped_mm: mat2 T1 has 7 at axis 1 .*expected 8"),
    (lambda fd: fd.ops.grouped_mm(fd.define_tensor([4, 8]), fd.define_tensor([2, 8, 6]),
                                  fd.define_tensor([3], dtype=DataType.Int32)),
     r"grouped_mm: offsets T2 has 3 at axis 0 .*expected 2"),
    (lambda fd: fd.ops.grouped_mm(fd.define_tensor([4, 8]), fd.define_tensor([2, 8, 6]),
                                  fd.define_tensor([2], dtype=DataType.Int)),
     r"grouped_mm: offsets T2 must be int32; got int64"),
    (lambda fd: fd.ops.grouped_mm(fd.define_tensor([4, 8]), fd.define_tensor([2, 8, 6])),
     r"a 2-D mat1 needs offsets"),
    (lambda fd: fd.ops.grouped_mm(fd.define_tensor([2, 4, 8]), fd.define_tensor([2, 8, 6]),
                                  fd.define_tensor([2], dtype=DataType.Int32)),
     r"3-D x 3-D takes no offsets"),
    (lambda fd: fd.ops.grouped_mm(fd.define_tensor([2, 4, 8]), fd.define_tensor([8, 6])),
     r"expected 2-D x 3-D"),
    (lambda fd: fd.ops.grouped_mm(fd.define_tensor([4, 8]), fd.define_tensor([2, 8, 6], dtype=DataType.BFloat16),
                                  fd.define_tensor([2], dtype=DataType.Int32)),
     r"must have one floating-point dtype"),
    (lambda fd: fd.ops.grouped_mm(fd.define_tensor([2, 4, 8]), fd.define_tensor([3, 8, 6])),
     r"grouped_mm: mat2 T1 has 3 at axis 0 .*expected 2"),
], ids=["k", "groups", "offsets_dtype", "no_offsets", "extra_offsets", "ranks", "dtypes", "batch"])
def test_grouped_mm_errors(case, match):
    with pytest.raises(meshfuser.Error, match=match):
        with FusionDefinition() as fd:
            case(fd)


@pytest.mark.parametrize("ends, match", [([3, 2], r"entry 1 is 2"), ([3, 9], r"within \[0, 6\]")])
def test_grouped_mm_bad_offsets_at_run_time(ends, match):
    mat1, mat2 = torch.randn(6, 4), torch.randn(2, 4, 3)
    offs = torch.tensor(ends, dtype=torch.int32)
    with pytest.raises(meshfuser.Error, match=r"grouped_mm: offsets T2 hold \[.*\]; they must be .*" + match):
        _run(lambda fd, a, b, o: fd.ops.grouped_mm(a, b, o), [mat1, mat2, offs])


# -- topk, sort, argsort ------------------------------------------------------------------------

@pytest.mark.parametrize("dim, largest", [(-1, True), (0, False), (1, True)])
def test_topk(dim, largest):
    torch.manual_seed(3)
    x = torch.randn(6, 7)
    _, (values, indices) = _run(lambda fd, t: fd.ops.topk(t, 3, dim=dim, largest=largest), [x])
    ref = torch.topk(x, 3, dim=dim, largest=largest)
    torch.testing.assert_close(values, ref.values)
    torch.testing.assert_close(indices, ref.indices)


def test_sort_and_argsort_stable():
    x = torch.tensor([[3, 1, 2, 1, 3, 0], [5, 5, 4, 4, 6, 6]], dtype=torch.int64)
    _, (values, indices, order) = _run(
        lambda fd, t: [*fd.ops.sort(t, dim=1, descending=True, stable=True),
                       fd.ops.argsort(t, dim=-1, stable=True)], [x])
    ref = torch.sort(x, dim=1, descending=True, stable=True)
    torch.testing.assert_close(values, ref.values)
    torch.testing.assert_close(indices, ref.indices)
    torch.testing.assert_close(order, torch.argsort(x, dim=-1, stable=True))


@pytest.mark.parametrize("build, match", [
    (lambda fd, x: fd.ops.topk(x, 5, dim=1), r"topk: k = 5 is out of range for axis 1 of T0 \(shape \[3, 4\]\); "
                                              r"expected 0 <= k <= 4"),
    (lambda fd, x: fd.ops.topk(x, 2, dim=2), r"topk: dim 2 is out of range for T0 of shape \[3, 4\]"),
    (lambda fd, x: fd.ops.topk(x, fd.define_scalar(2, DataType.Int)), r"k must be a Python int"),
    (lambda fd, x: fd.ops.argsort(x, dim=-3), r"argsort: dim -3 is out of range"),
    (lambda fd, x: fd.ops.sort(fd.ops.gt(x, 0.0)), r"sort: T1 is bool"),
    (lambda fd, x: fd.ops.topk(fd.ops.gt(x, 0.0), 1), r"topk: T1 is bool; topk needs numbers"),
])
def test_sort_errors(build, match):
    with pytest.raises(meshfuser.Error, match=match):
        with FusionDefinition() as fd:
            build(fd, fd.define_tensor([3, 4]))


# -- index_select, gather, take_along_axis, scatter, index_add ----------------------------------

def test_index_select_both_orders():
    torch.manual_seed(4)
    x, index = torch.randn(5, 3), torch.tensor([4, 0, 0, 2], dtype=torch.int32)
    _, (a, b) = _run(lambda fd, t, i: [fd.ops.index_select(t, 0, i), fd.ops.index_select(t, i, 0)], [x, index])
    torch.testing.assert_close(a, torch.index_select(x, 0, index))
    torch.testing.assert_close(b, a)


def test_gather_and_take_along_axis():
    torch.manual_seed(5)
    x = torch.randn(4, 6)
    index = torch.randint(0, 6, (4, 3))
    small = torch.randint(0, 6, (2, 3))
    _, (a, b, c) = _run(lambda fd, t, i, s: [fd.ops.gather(t, 1, i), fd.ops.take_along_axis(t, i, 1),
                                             fd.ops.gather(t, s, 1)], [x, index, small])
    torch.testing.assert_close(a, torch.gather(x, 1, index))
    torch.testing.assert_close(b, torch.take_along_dim(x, index, 1))
    torch.testing.assert_close(c, torch.gather(x, 1, small))


def test_scatter_and_index_add():
    torch.manual_seed(6)
    x = torch.randn(5, 4)
    index = torch.tensor([[4, 0, 1, 3], [2, 3, 0, 1]])
    src = torch.randn(2, 4)
    rows = torch.tensor([0, 3, 3, 1])
    update = torch.randn(4, 4)
    _, (a, b) = _run(lambda fd, t, i, s, r, u: [fd.ops.scatter(t, 0, i, s), fd.ops.index_add(t, 0, r, u)],
                     [x, index, src, rows, update])
    torch.testing.assert_close(a, torch.scatter(x, 0, index, src))
    torch.testing.assert_close(b, torch.index_add(x, 0, rows, update))  # repeated rows accumulate


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    torch.manual_seed(9)
    x = torch.randn(4, 5)
    index = torch.tensor([[3, 0, 3, 1, 0], [3, 2, 0, 0, 1], [0, 0, 3, 1, 2]])  # repeats reduce together
    src = torch.randn(3, 5)
    _, (out,) = _run(lambda fd, t, i, s: fd.ops.scatter_reduce(t, 0, i, s, reduce, include_self=include_self),
                     [x, index, src])
    torch.testing.assert_close(out, torch.scatter_reduce(x, 0, index, src, reduce, include_self=include_self))


def test_scatter_add_counts_experts_per_row():
    """Per-row expert counts (a batched bincount): scatter_add of ones at the chosen experts; nvFuser's
    argument order (x, index, src, dim) too."""
    chosen = torch.tensor([[1, 3], [3, 0], [2, 3]])
    zeros, ones = torch.zeros(3, 4), torch.ones(3, 2)
    _, (a, b) = _run(lambda fd, z, c, o: [fd.ops.scatter_add(z, 1, c, o),
                                          fd.ops.scatter_reduce(z, c, o, 1, reduce="amax", include_self=False)],
                     [zeros, chosen, ones])
    torch.testing.assert_close(a, zeros.scatter_add(1, chosen, ones))
    torch.testing.assert_close(b, zeros.scatter_reduce(1, chosen, ones, "amax", include_self=False))


@pytest.mark.parametrize("build, match", [
    (lambda fd, x, i: fd.ops.index_select(x, 0, fd.define_tensor([2, 2], dtype=DataType.Int)),
     r"index_select: index T\d+ has shape \[2, 2\] \(2-D\); expected 1-D"),
    (lambda fd, x, i: fd.ops.index_select(x, 0, fd.define_tensor([2])),
     r"index_select: index T\d+ must be int64 or int32; got float"),
    (lambda fd, x, i: fd.ops.gather(x, 1, fd.define_tensor([6, 2], dtype=DataType.Int)),
     r"gather: index T\d+ has 6 at axis 0 \(shape \[6, 2\]\); expected at most 5"),
    (lambda fd, x, i: fd.ops.take_along_axis(x, fd.define_tensor([4, 2], dtype=DataType.Int), 1),
     r"take_along_axis: index T\d+ has 4 at axis 0 .*expected 5"),
    (lambda fd, x, i: fd.ops.index_add(x, 0, i, fd.define_tensor([2, 4])),
     r"index_add: src T\d+ has 2 at axis 0 .*expected 3, the extent of index T1"),
    (lambda fd, x, i: fd.ops.index_add(x, 0, i, fd.define_tensor([3, 4], dtype=DataType.BFloat16)),
     r"index_add: src T\d+ has dtype bfloat16 but the input T0 has float"),
    (lambda fd, x, i: fd.ops.scatter(x, 0, fd.define_tensor([2, 4], dtype=DataType.Int), fd.define_tensor([1, 4])),
     r"scatter: index T\d+ has 2 at axis 0 .*expected at most 1, the extent of src"),
    (lambda fd, x, i: fd.ops.scatter(x, 0, fd.define_tensor([1, 4], dtype=DataType.Int),
                                     fd.define_tensor([1, 4], dtype=DataType.Double)),
     r"scatter: src T\d+ has dtype double but the input T0 has float"),
    (lambda fd, x, i: fd.ops.index_add(x, "0", i, x), r"index_add: expected an int axis"),
    (lambda fd, x, i: fd.ops.index_select(x, 0, [1, 2]), r"index_select: expected a TensorView; got list"),
    (lambda fd, x, i: fd.ops.bincount(i, 4.0), r"bincount: minlength must be a Python int; got float"),
    (lambda fd, x, i: fd.ops.scatter_reduce(x, 0, fd.define_tensor([1, 4], dtype=DataType.Int),
                                            fd.define_tensor([1, 4]), "max"),
     r"scatter_reduce: reduce is 'max'; expected one of sum, prod, mean, amax, amin"),
    (lambda fd, x, i: fd.ops.scatter_reduce(x, 0, fd.define_tensor([1, 4], dtype=DataType.Int),
                                            fd.define_tensor([1, 4])),
     r"scatter_reduce: expected reduce"),
    (lambda fd, x, i: fd.ops.scatter_reduce(x, 0, fd.define_tensor([2, 4], dtype=DataType.Int),
                                            fd.define_tensor([1, 4]), "sum"),
     r"scatter_reduce: index T\d+ has 2 at axis 0 .*expected at most 1, the extent of src"),
])
def test_indexing_errors(build, match):
    with pytest.raises(meshfuser.Error, match=match):
        with FusionDefinition() as fd:
            build(fd, fd.define_tensor([5, 4]), fd.define_tensor([3], dtype=DataType.Int))


def test_operands_of_another_definition():
    with FusionDefinition() as other:
        index = other.define_tensor([2], dtype=DataType.Int)
    match = r"index_select: operand 1 \(T0\) belongs to another fusion definition than operand 0 \(T0\)"
    with pytest.raises(meshfuser.Error, match=match):
        with FusionDefinition() as fd:
            fd.ops.index_select(fd.define_tensor([3, 2]), 0, index)


def test_index_out_of_range_at_run_time_names_the_op():
    x, index = torch.randn(3, 2), torch.tensor([0, 7])
    with pytest.raises(meshfuser.Error, match=r"while running T2 = index_select\(T0, T1, dim=0\)"):
        _run(lambda fd, t, i: fd.ops.index_select(t, 0, i), [x, index])


# -- cumsum, bincount ---------------------------------------------------------------------------

def test_cumsum():
    torch.manual_seed(7)
    x, counts = torch.randn(3, 5), torch.tensor([3, 0, 2], dtype=torch.int32)
    _, (a, b, c) = _run(lambda fd, t, n: [fd.ops.cumsum(t, 1), fd.ops.cumsum(n, 0),
                                          fd.ops.cumsum(n, 0, dtype=DataType.Int32)], [x, counts])
    torch.testing.assert_close(a, torch.cumsum(x, 1))
    torch.testing.assert_close(b, torch.cumsum(counts, 0))  # int64, as PyTorch
    torch.testing.assert_close(c, torch.cumsum(counts, 0, dtype=torch.int32))


def test_bincount():
    experts = torch.tensor([0, 3, 3, 1, 3], dtype=torch.int32)
    _, (counts,) = _run(lambda fd, e: fd.ops.bincount(e, 6), [experts])
    torch.testing.assert_close(counts, torch.bincount(experts, minlength=6))


def test_bincount_errors():
    with pytest.raises(meshfuser.Error, match=r"bincount: minlength is 0; expected >= 1"):
        with FusionDefinition() as fd:
            fd.ops.bincount(fd.define_tensor([4], dtype=DataType.Int), 0)
    with pytest.raises(meshfuser.Error, match=r"bincount: input T0 has shape \[2, 2\] \(2-D\); expected 1-D"):
        with FusionDefinition() as fd:
            fd.ops.bincount(fd.define_tensor([2, 2], dtype=DataType.Int), 4)
    match = r"bincount: the values of T0 must lie in \[0, 4\).*got values in \[0, 4\]"
    with pytest.raises(meshfuser.Error, match=match):
        _run(lambda fd, e: fd.ops.bincount(e, 4), [torch.tensor([0, 4, 1])])


# -- printer/parser -----------------------------------------------------------------------------

def test_print_names_attributes():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6])
        values, indices = fd.ops.topk(x, 2, dim=1, largest=False, sorted=True)
        fd.add_output(values)
        fd.add_output(fd.ops.argsort(x, 0, descending=True, stable=True))
        fd.add_output(fd.ops.bincount(fd.ops.reshape(indices, [8]), 6))
        fd.add_output(fd.ops.scatter_reduce(x, 1, indices, values, "amax", include_self=False))
    text = str(fd)
    assert "scatter_reduce(T0, T2, T1, dim=1, reduce=amax, include_self=false)" in text
    assert "topk(T0, k=2, dim=1, largest=false, sorted=true)" in text
    assert "argsort(T0, dim=0, descending=true, stable=true)" in text
    assert "minlength=6)" in text


# -- a tiny mixture-of-experts layer ------------------------------------------------------------

def _moe_reference(x, router, w_gate, w_up, w_down, k):
    tokens, experts = x.shape[0], router.shape[0]
    probs = torch.softmax(x @ router.t(), dim=-1)
    weights, chosen = torch.topk(probs, k, dim=-1)
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token_of = order // k
    routed = x[token_of]
    offs = torch.bincount(flat, minlength=experts).cumsum(0).to(torch.int32)
    h = torch.nn.functional.silu(_grouped_reference(routed, w_gate, offs)) * _grouped_reference(routed, w_up, offs)
    y = _grouped_reference(h, w_down, offs) * weights.reshape(-1)[order].unsqueeze(-1)
    return torch.zeros_like(x).index_add(0, token_of, y)


def test_moe_layer_single_device():
    torch.manual_seed(8)
    tokens, hidden, ffn, experts, k = 12, 16, 8, 4, 2
    x = torch.randn(tokens, hidden)
    router = torch.randn(experts, hidden)
    w_gate, w_up = torch.randn(experts, hidden, ffn) / 4, torch.randn(experts, hidden, ffn) / 4
    w_down = torch.randn(experts, ffn, hidden) / 4

    def layer(fd, x, router, w_gate, w_up, w_down):
        logits = fd.ops.linear(x, router)  # router, then softmax
        e = fd.ops.exp(fd.ops.sub(logits, fd.ops.max(logits, [1], keepdim=True)))
        probs = fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True))
        weights, chosen = fd.ops.topk(probs, k, dim=-1)
        flat = fd.ops.reshape(chosen, [tokens * k])
        order = fd.ops.argsort(flat, dim=0, stable=True)
        token_of = fd.ops.cast(fd.ops.div(order, float(k)), DataType.Int)  # order // k
        routed = fd.ops.index_select(x, 0, token_of)
        counts = fd.ops.bincount(flat, experts)
        offs = fd.ops.cumsum(counts, 0, dtype=DataType.Int32)
        h = fd.ops.mul(fd.ops.silu(fd.ops.grouped_mm(routed, w_gate, offs)), fd.ops.grouped_mm(routed, w_up, offs))
        y = fd.ops.grouped_mm(h, w_down, offs)
        routed_weights = fd.ops.index_select(fd.ops.reshape(weights, [tokens * k]), 0, order)
        y = fd.ops.mul(y, fd.ops.broadcast_in_dim(routed_weights, [tokens * k, hidden], [0]))
        zeros = fd.ops.mul(x, 0.0)
        return fd.ops.index_add(zeros, 0, token_of, y)

    _, (out,) = _run(layer, [x, router, w_gate, w_up, w_down])
    torch.testing.assert_close(out, _moe_reference(x, router, w_gate, w_up, w_down, k))


def test_routing_ops_run_on_aten_around_generated_kernels():
    """fd.cuda_kernels (meta inputs, no GPU needed): the routing ops and grouped_mm evaluate on meta
    tensors, and only the pointwise silu after them becomes a generated kernel."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 16])
        w = fd.define_tensor([4, 16, 8])
        experts = fd.define_tensor([8], dtype=DataType.Int)
        offs = fd.ops.cumsum(fd.ops.bincount(experts, 4), 0, dtype=DataType.Int32)
        order = fd.ops.argsort(experts, 0, stable=True)
        fd.add_output(fd.ops.silu(fd.ops.grouped_mm(fd.ops.index_select(x, 0, order), w, offs)))
    meta = [torch.empty(8, 16, device="meta"), torch.empty(4, 16, 8, device="meta"),
            torch.empty(8, dtype=torch.long, device="meta")]
    kernels = fd.cuda_kernels(meta)
    assert len(kernels) == 1
    assert "expf" in kernels[0]


def test_errors_name_the_tensor_by_its_name():
    with pytest.raises(meshfuser.Error, match=r"grouped_mm: offsets T2 \(expert_ends\) must be int32"):
        with FusionDefinition() as fd:
            fd.ops.grouped_mm(fd.define_tensor([4, 8], name="tokens"), fd.define_tensor([2, 8, 4]),
                              fd.define_tensor([2], dtype=DataType.Int, name="expert_ends"))
