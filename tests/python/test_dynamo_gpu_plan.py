"""What the backend's Llama decoder-layer programs would run on a GPU, planned on meta tensors (no
GPU needed): one attention and the seven projections' GEMMs per direction, no program output that
is a copy of a view, and ATen outside GEMMs and attention only for the ops the CUDA generator does
not take yet (reshape, slice, cat, pad, an int64 cast), at most as many as today."""
import collections

import pytest
import torch

import meshfuser.dynamo
from meshfuser.dynamo.gpu_plan import aten_work, copied_outputs, gpu_pieces
from meshfuser.testing import llama_decoder_layer

# Upper bounds: what ATen runs per program outside GEMMs, attention and views. Lower is better
# (a generated slice/cat/pad kernel lowers them); a higher count is a regression.
FORWARD_ATEN = {"cat": 3, "cast": 1}   # RoPE's rotate_half and table
BACKWARD_ATEN = {"pad": 4}                            # rotate_half's backward


@pytest.fixture(scope="module")
def llama_programs():
    pytest.importorskip("transformers", reason="transformers is not installed (./scripts/setup installs it)")
    from transformers import LlamaConfig
    torch._dynamo.reset()
    meshfuser.dynamo.clear_reports()
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    x = torch.randn(1, 64, 64, requires_grad=True)
    torch.compile(llama_decoder_layer(config), backend="meshfuser", dynamic=False)(x).sum().backward()
    programs = {r.title: r.programs for r in meshfuser.dynamo.reports()}
    torch._dynamo.reset()
    return programs


@pytest.mark.parametrize("title,gemms,allowed", [("forward", 7, FORWARD_ATEN), ("backward", 14, BACKWARD_ATEN)])
def test_llama_layer_gpu_plan(llama_programs, title, gemms, allowed):
    (program,) = llama_programs[title]
    pieces = gpu_pieces(program)
    kinds = collections.Counter(p.kind for p in pieces)
    # q, k, v, o, gate, up, down (and their weight gradients); transformers before 5.25 also
    # computes the RoPE table's angles with a (tiny) matmul in the forward.
    projections = [p for p in pieces if p.kind == "gemm" and (title == "backward" or "linear" in p.ops)]
    assert len(projections) == gemms
    assert kinds["attention"] == 1
    assert kinds["generated"] > 0
    work = aten_work(pieces)
    assert set(work) <= set(allowed), work
    assert all(work[op] <= allowed[op] for op in work), work
    # A weight gradient leaves its GEMM as it is (the transpose the graph applies runs on ATen as a
    # view); the heads of v saved for the backward are not copied.
    assert copied_outputs(program) == []


def test_backward_has_no_transposed_pointwise_kernel(llama_programs):
    """A weight gradient's transpose used to join the SiLU backward's kernel, which then ran with the
    transpose scheduler and wrote the gradient transposed (a copy)."""
    (program,) = llama_programs["backward"]
    assert not [p for p in gpu_pieces(program) if p.kind == "generated" and "transpose" in p.why]


def test_mlp_silu_and_product_in_one_kernel(llama_programs):
    """With recomputation (the default) the forward does not save SiLU's output, so the MLP's
    SiLU and its product with the up projection are one generated kernel."""
    (program,) = llama_programs["forward"]
    pieces = gpu_pieces(program)
    assert [p for p in pieces if p.kind == "generated" and "silu" in p.ops and "mul" in p.ops]


def test_elementwise_work_moves_before_a_permute():
    """A permutation that is not its own inverse, a broadcast table, slices and a cat along a
    permuted axis: computed on the unpermuted tensor (the permute follows), values as eager's."""
    from meshfuser.dynamo.sink_permutes import sink_permutes

    def f(x, table):
        y = x.permute(0, 2, 3, 1) * table             # [2, 4, 5, 3] * [5, 3]
        z = torch.cat([-y[..., 1:], y[..., :1]], -1)
        return torch.relu(z) + 1

    torch.manual_seed(0)
    x, table = torch.randn(2, 3, 4, 5), torch.randn(5, 3)
    gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="fake")(x, table)
    sink_permutes(gm)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    permutes = [i for i, t in enumerate(ops) if t is torch.ops.aten.permute.default]
    # The input's permute is gone; what is left permutes the table (before the work) and the result.
    assert ops[-1] is torch.ops.aten.permute.default
    assert all(ops[i - 1] is not torch.ops.aten.cat.default for i in permutes[:-1])
    torch.testing.assert_close(gm(x, table), f(x, table))
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, backend="meshfuser")(x, table), f(x, table))
