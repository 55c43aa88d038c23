"""torch.compile(backend="meshfuser") on modules parallelized with DTensor (parallelize_module): the
program meshfuser runs is the global one with the placements as shardings, and meshfuser plans the
communications. Every rank builds the same unsharded module from a fixed seed; outputs and every
parameter gradient equal the unsharded eager module's, and the communications are asserted."""
import copy

import pytest
import torch

import meshfuser
import meshfuser.dynamo
from meshfuser.testing import communication_kinds, llama_decoder_layer

pytestmark = pytest.mark.timeout(120)
TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    meshfuser.dynamo.clear_reports()
    yield
    torch._dynamo.reset()


def _mesh(multidevice_test):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh(multidevice_test.device.type, (multidevice_test.size,), mesh_dim_names=("tp",))


def _comms(prof):
    """The communication kinds this rank ran (collectives over a one-rank team post nothing)."""
    names = [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]
    return [k for k in communication_kinds(names) if k != "NoOp"]


def _expect(kinds, d):
    return kinds if d > 1 else []


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _compare_grads(sharded, reference):
    for (name, p), (_, q) in zip(sharded.named_parameters(), reference.named_parameters()):
        assert p.grad is not None, name
        if hasattr(p, "placements"):
            assert p.grad.placements == p.placements, name
        torch.testing.assert_close(_full(p.grad), q.grad, **TOL, msg=name)


def _run(module, plan, x, multidevice_test, split=None):
    """Runs the unsharded module and the parallelized, compiled one (each rank passing its shard of
    x along `split` when given, else all of x); runs both backward with the same output gradient.
    Returns (output, reference output, input gradient, reference's, forward comms, backward comms)."""
    from torch.distributed.tensor.parallel import parallelize_module
    d, r = multidevice_test.size, multidevice_test.rank
    shard = (lambda t: t.chunk(d, split)[r]) if split is not None else (lambda t: t)
    reference = copy.deepcopy(module).to(multidevice_test.device)
    sharded = parallelize_module(copy.deepcopy(module).to(multidevice_test.device), _mesh(multidevice_test), plan)
    compiled = torch.compile(sharded, backend="meshfuser")
    x = x.to(multidevice_test.device)
    x_ref, x_in = x.clone().requires_grad_(), shard(x).clone().requires_grad_()
    with meshfuser.Profiler() as prof:
        out = compiled(x_in)
    forward = _comms(prof)
    expected = reference(x_ref)
    dy = torch.randn(expected.shape, device=expected.device)
    with meshfuser.Profiler() as prof:
        out.backward(shard(dy))
    backward = _comms(prof)
    expected.backward(dy)
    _compare_grads(sharded, reference)
    return out, shard(expected), x_in.grad, shard(x_ref.grad), forward, backward


class MLP(torch.nn.Module):
    def __init__(self, e, f):
        super().__init__()
        self.norm = torch.nn.LayerNorm(e)
        self.up = torch.nn.Linear(e, f)
        self.down = torch.nn.Linear(f, e)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def test_mlp_tensor_parallel(multidevice_test):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    d = multidevice_test.size
    mlp = MLP(8, 16 * d)
    out, expected, gx, gx_ref, fw, bw = _run(mlp, {"up": ColwiseParallel(), "down": RowwiseParallel()},
                                             torch.randn(2, 4, 8), multidevice_test)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(gx, gx_ref, **TOL)
    # Megatron's plan: one Allreduce after the row-parallel linear, one for the input's gradient.
    assert fw == _expect(["Allreduce"], d)
    assert bw == _expect(["Allreduce"], d)
    reports = meshfuser.dynamo.reports()
    assert [r.title for r in reports] == ["forward", "backward"]
    assert all(not r.eager for r in reports), [str(r) for r in reports]


def test_mlp_sequence_parallel(multidevice_test):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    d = multidevice_test.size
    mlp = MLP(8, 16 * d)
    plan = {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1))}
    out, expected, gx, gx_ref, fw, bw = _run(mlp, plan, torch.randn(2, 4 * d, 8), multidevice_test, split=1)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(gx, gx_ref, **TOL)
    # Megatron's sequence-parallel plan: gather the sequence before the column-parallel linear,
    # reduce-scatter after the row-parallel one; backward the mirror image, then one Allreduce each
    # for the LayerNorm's weight and bias gradients (summed over the sequence each rank holds).
    assert fw == _expect(["Allgather", "ReduceScatter"], d)
    assert bw == _expect(["Allgather", "ReduceScatter", "Allreduce", "Allreduce"], d)


def test_mlp_training_steps_match_eager(multidevice_test):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    d = multidevice_test.size
    dev = multidevice_test.device
    model = torch.nn.Sequential(torch.nn.Linear(8, 16 * d), torch.nn.SiLU(), torch.nn.Linear(16 * d, 8)).to(dev)
    reference = copy.deepcopy(model)
    parallelize_module(model, _mesh(multidevice_test), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    compiled = torch.compile(model, backend="meshfuser")
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference))
    for _ in range(3):
        x, y = torch.randn(4, 8, device=dev), torch.randn(4, 8, device=dev)
        for m, o in ((compiled, opt), (reference, ref_opt)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(_full(p), q, **TOL)


def test_inference_under_no_grad(multidevice_test):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    d = multidevice_test.size
    mlp = MLP(8, 16 * d).to(multidevice_test.device)
    reference = copy.deepcopy(mlp)
    parallelize_module(mlp, _mesh(multidevice_test), {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x = torch.randn(3, 8, device=multidevice_test.device)
    with torch.no_grad(), meshfuser.Profiler() as prof:
        out = torch.compile(mlp, backend="meshfuser")(x)
    torch.testing.assert_close(out, reference(x), **TOL)
    assert _comms(prof) == _expect(["Allreduce"], d)
    assert [r.title for r in meshfuser.dynamo.reports()] == ["inference"]


def test_new_sizes(multidevice_test):
    """A second batch size makes Dynamo trace with symbolic sizes; each size gets its program."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    d = multidevice_test.size
    mlp = MLP(8, 16 * d).to(multidevice_test.device)
    reference = copy.deepcopy(mlp)
    parallelize_module(mlp, _mesh(multidevice_test), {"up": ColwiseParallel(), "down": RowwiseParallel()})
    compiled = torch.compile(mlp, backend="meshfuser")
    for rows in (3, 5, 7, 5):
        x = torch.randn(rows, 8, device=multidevice_test.device)
        with meshfuser.Profiler() as prof:
            out = compiled(x)
        torch.testing.assert_close(out, reference(x), **TOL)
        assert _comms(prof) == _expect(["Allreduce"], d)
    # Parameters require gradients: a forward and a backward graph per size (3, 5, 7; 5 again: none).
    assert [r.title for r in meshfuser.dynamo.reports()] == ["forward", "backward"] * 3


class _SumOfShard(torch.nn.Module):
    """Sums each rank's local output columns: a different number on every rank, which the global
    program cannot express."""

    def __init__(self, d):
        super().__init__()
        self.up = torch.nn.Linear(8, 4 * d)

    def forward(self, x):
        return self.up(x).sum(-1, keepdim=True) * 2


def test_local_code_over_the_sharded_axis_is_refused(multidevice_test):
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    d = multidevice_test.size
    module = parallelize_module(_SumOfShard(d).to(multidevice_test.device), _mesh(multidevice_test),
                                {"up": ColwiseParallel()})
    compiled = torch.compile(module, backend="meshfuser")
    x = torch.randn(3, 8, device=multidevice_test.device)
    if d == 1:  # one rank: the local code is the global code
        torch.testing.assert_close(compiled(x), module(x), **TOL)
        return
    with pytest.raises(meshfuser.ArgumentError, match=r"`sum` .* reduces over the sharded axis.*split on axis 1"):
        compiled(x)


def test_transformer_encoder_layer_feed_forward_parallel(multidevice_test):
    """nn.TransformerEncoderLayer with its feed-forward linears parallelized; attention stays
    replicated (its packed in-projection has no parallel style)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    d = multidevice_test.size
    layer = torch.nn.TransformerEncoderLayer(16, 2, 8 * d, dropout=0.0, batch_first=True)
    out, expected, gx, gx_ref, fw, bw = _run(layer, {"linear1": ColwiseParallel(), "linear2": RowwiseParallel()},
                                             torch.randn(2, 4, 16), multidevice_test)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(gx, gx_ref, **TOL)
    assert fw == _expect(["Allreduce"], d)


@pytest.mark.float32_attention
def test_llama_decoder_layer_tensor_parallel(multidevice_test):
    pytest.importorskip("transformers", reason="transformers is not installed and could not be installed "
                                               "(./scripts/setup installs it)")
    from transformers import LlamaConfig
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    d = multidevice_test.size
    config = LlamaConfig(hidden_size=16 * d, intermediate_size=32 * d, num_attention_heads=2 * d,
                         num_key_value_heads=d, num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    plan = {f"layer.self_attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")}
    plan |= {"layer.self_attn.o_proj": RowwiseParallel(), "layer.mlp.gate_proj": ColwiseParallel(),
             "layer.mlp.up_proj": ColwiseParallel(), "layer.mlp.down_proj": RowwiseParallel()}
    out, expected, gx, gx_ref, fw, bw = _run(llama_decoder_layer(config), plan, torch.randn(2, 4, 16 * d), multidevice_test)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(gx, gx_ref, **TOL)
    if multidevice_test.device.type != "cpu":
        return  # float32 attention traces to the memory-efficient kernel on GPUs, which runs on ATen here
    assert fw == _expect(["Allreduce"] * 2, d)
    # Backward: the input gradients of the five column-parallel linears (q, k, v, gate, up) are
    # partial sums; the planner adds them before reducing (sum_partials), as Megatron adds the
    # partial products of q/k/v and of gate/up: two Allreduces.
    assert bw == _expect(["Allreduce"] * 2, d)
    # Only the position ids (arange) run on ATen; attention, RoPE, RMSNorm and the MLP are meshfuser's.
    on_aten = {op for r in meshfuser.dynamo.reports() for _n, op, _why in r.eager}
    assert on_aten <= {"arange", "arange.start"}


def test_functional_collectives_become_communications(multidevice_test):
    """Collectives the user wrote on plain tensors are meshfuser programs: an Allreduce, an
    Allgather and a ReduceScatter meshfuser posts, with the work around them in partitions."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    d, dev = multidevice_test.size, multidevice_test.device
    group = dist.group.WORLD

    def f(x, w):
        y = torch.relu(x @ w)
        summed = funcol.all_reduce(y, "sum", group)
        gathered = funcol.all_gather_tensor(y, 0, group)
        scattered = funcol.reduce_scatter_tensor(torch.cat([y] * d), "sum", 0, group)
        return torch.tanh(summed) * 2, gathered + 1, scattered

    torch.manual_seed(multidevice_test.rank)  # each rank its own values
    x, w = torch.randn(4, 8, device=dev), torch.randn(8, 8, device=dev)
    with meshfuser.Profiler() as prof:
        out = torch.compile(f, backend="meshfuser")(x, w)
    assert _comms(prof) == _expect(["Allreduce", "Allgather", "ReduceScatter"], d)
    y = torch.relu(x @ w)
    summed, gathered = y.clone(), torch.empty(4 * d, 8, device=dev)
    dist.all_reduce(summed)
    dist.all_gather_into_tensor(gathered, y)
    # Chunk r of every rank's cat([y] * d) is its y: the reduce-scattered rows are the sum of the y's.
    for actual, expected in zip(out, (torch.tanh(summed) * 2, gathered + 1, summed)):
        torch.testing.assert_close(actual, expected, **TOL)
    (report,) = meshfuser.dynamo.reports()
    assert not report.eager
    assert [name.split(".")[-1] for name, _ops in report.partitions if "fused" not in name] == \
        ["all_reduce", "all_gather", "reduce_scatter"]


class _LlamaWithRope(torch.nn.Module):
    """A LlamaDecoderLayer given its rotary tables (made from the global positions, replicated):
    under sequence parallelism each rank holds a slice of the sequence, not its first positions."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
        self.layer = LlamaDecoderLayer(config, 0)

    def forward(self, x, cos, sin):
        out = self.layer(x, position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out


@pytest.mark.float32_attention
def test_llama_decoder_layer_sequence_parallel(multidevice_test):
    pytest.importorskip("transformers", reason="transformers is not installed and could not be installed "
                                               "(./scripts/setup installs it)")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    d, r, dev = multidevice_test.size, multidevice_test.rank, multidevice_test.device
    config = LlamaConfig(hidden_size=16 * d, intermediate_size=32 * d, num_attention_heads=2 * d,
                         num_key_value_heads=d, num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    reference = _LlamaWithRope(config).to(dev)
    sharded = copy.deepcopy(reference)
    seq = Shard(1)
    plan = {"layer.input_layernorm": SequenceParallel(), "layer.post_attention_layernorm": SequenceParallel(),
            "layer.self_attn.o_proj": RowwiseParallel(output_layouts=seq),
            "layer.mlp.down_proj": RowwiseParallel(output_layouts=seq)}
    plan |= {f"layer.self_attn.{n}": ColwiseParallel(input_layouts=seq) for n in ("q_proj", "k_proj", "v_proj")}
    plan |= {f"layer.mlp.{n}": ColwiseParallel(input_layouts=seq) for n in ("gate_proj", "up_proj")}
    parallelize_module(sharded, _mesh(multidevice_test), plan)
    x = torch.randn(2, 4 * d, 16 * d, device=dev)
    cos, sin = LlamaRotaryEmbedding(config).to(dev)(x, torch.arange(4 * d, device=dev)[None])
    x_ref, x_in = x.clone().requires_grad_(), x.chunk(d, 1)[r].clone().requires_grad_()
    with meshfuser.Profiler() as prof:
        out = torch.compile(sharded, backend="meshfuser")(x_in, cos, sin)
    forward = _comms(prof)
    expected = reference(x_ref, cos, sin)
    torch.testing.assert_close(out, expected.chunk(d, 1)[r], **TOL)
    dy = torch.randn(expected.shape, device=dev)
    out.backward(dy.chunk(d, 1)[r])
    expected.backward(dy)
    torch.testing.assert_close(x_in.grad, x_ref.grad.chunk(d, 1)[r], **TOL)
    _compare_grads(sharded, reference)
    if dev.type != "cpu":
        return  # float32 attention traces to the memory-efficient kernel on GPUs, which runs on ATen here
    # Megatron's SP forward: one Allgather before the attention's and the MLP's column-parallel
    # projections (q, k and v share the gathered input), one ReduceScatter after each row-parallel one.
    assert forward == _expect(["Allgather", "ReduceScatter"] * 2, d)
    assert not [e for rep in meshfuser.dynamo.reports() for e in rep.eager]
