"""torch.compile(..., backend="meshfuser") on one process: outputs, gradients and training steps equal
eager PyTorch; what runs on ATen is reported and correct."""
import copy
import logging

import pytest
import torch

import meshfuser
import meshfuser.dynamo
from meshfuser.dynamo import partition as dynamo_partition
from meshfuser.testing import llama_decoder_layer


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    meshfuser.dynamo.clear_reports()
    yield
    torch._dynamo.reset()


def _grads(module, inputs):
    return [p.grad for p in module.parameters()] + [x.grad for x in inputs if isinstance(x, torch.Tensor)
                                                    and x.requires_grad]


def run_both(module, *inputs, atol=1e-5, rtol=1e-5):
    """Forward and backward in eager and through the backend; compares outputs and gradients and
    returns the reports of the graphs compiled."""
    eager_module = copy.deepcopy(module)
    eager_in = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    comp_in = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    expected = eager_module(*eager_in)
    compiled = torch.compile(module, backend="meshfuser")
    actual = compiled(*comp_in)
    expected = expected[0] if isinstance(expected, tuple) else expected
    actual = actual[0] if isinstance(actual, tuple) else actual
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)
    (expected.float() * torch.linspace(-1, 1, expected.numel()).view_as(expected)).sum().backward()
    (actual.float() * torch.linspace(-1, 1, actual.numel()).view_as(actual)).sum().backward()
    for a, e in zip(_grads(module, comp_in), _grads(eager_module, eager_in)):
        torch.testing.assert_close(a, e, atol=atol, rtol=rtol)
    return meshfuser.dynamo.reports()


def _ran_on_aten(reports):
    return [(r.title, op, reason) for r in reports for _node, op, reason in r.eager]


def test_registered_name_and_entry_point():
    assert "meshfuser" in torch._dynamo.list_backends()
    import pathlib
    import tomllib
    project = tomllib.loads((pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["torch_dynamo_backends"]["meshfuser"] == "meshfuser.dynamo:backend"


def test_meshfuser_dynamo_is_imported_on_first_use():
    import subprocess
    import sys
    code = ("import sys, meshfuser; assert 'meshfuser.dynamo' not in sys.modules; "
            "assert callable(meshfuser.dynamo.backend); assert 'meshfuser.dynamo' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_mlp_forward_backward_and_no_grad():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    reports = run_both(mlp, torch.randn(4, 16))
    assert [r.title for r in reports] == ["forward", "backward"]
    assert all(len(r.partitions) == 1 and not r.eager for r in reports)
    with torch.no_grad():
        x = torch.randn(4, 16)
        torch.testing.assert_close(torch.compile(mlp, backend=meshfuser.dynamo.backend)(x), mlp(x))
    assert meshfuser.dynamo.reports()[-1].title == "inference"


def test_mlp_training_steps_match_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.SiLU(), torch.nn.Linear(32, 4))
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="meshfuser")
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference))
    for step in range(3):
        x, y = torch.randn(16, 8), torch.randn(16, 4)
        for m, o in ((compiled, opt), (reference, ref_opt)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            o.step()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_transformer_encoder_layer():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    reports = run_both(layer, torch.randn(2, 8, 32))
    assert _ran_on_aten(reports) == []


def _hf():
    return pytest.importorskip("transformers", reason="transformers is not installed and could not be installed "
                                                      "(./scripts/setup installs it)")


def test_gpt2_block():
    _hf()
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_head=4, n_layer=1, resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.0)
    config._attn_implementation = "sdpa"
    reports = run_both(GPT2Block(config), torch.randn(2, 8, 32))
    assert [r.title for r in reports] == ["forward", "backward"]
    assert _ran_on_aten(reports) == []


def test_llama_decoder_layer():
    _hf()
    from transformers import LlamaConfig
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    reports = run_both(llama_decoder_layer(config), torch.randn(2, 8, 32))
    assert [r.title for r in reports] == ["forward", "backward"]
    # The position ids (arange) are made on ATen; everything else is meshfuser's.
    assert {op for _t, op, _r in _ran_on_aten(reports)} == {"arange"}


def test_unsupported_op_runs_on_aten_between_partitions(monkeypatch, caplog):
    monkeypatch.setenv("MESHFUSER_DUMP", "partitions")
    caplog.set_level(logging.INFO, logger="meshfuser.partitions")

    def f(x, w):
        y = torch.relu(x @ w)
        z = torch.cumsum(y, dim=1)   # no meshfuser op: ATen, between two partitions
        return torch.tanh(z) * 2

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    torch.testing.assert_close(torch.compile(f, backend="meshfuser")(x, w), f(x, w))
    (report,) = meshfuser.dynamo.reports()
    assert len(report.partitions) == 2
    assert [(op, reason) for _n, op, reason in report.eager] == [("cumsum", "no meshfuser op for it")]
    (record,) = [r for r in caplog.records if r.name == "meshfuser.partitions"]
    lines = record.getMessage().splitlines()
    assert lines[0] == "[meshfuser rank 0] partitions inference: 2 meshfuser partition(s), 1 node(s) on ATen"
    assert "[meshfuser rank 0]   ATen cumsum (cumsum): no meshfuser op for it" in lines


def test_views_only_partition_stays_on_aten():
    def f(x):
        return torch.cumsum(x.t().unsqueeze(0), 2)

    x = torch.randn(4, 6)
    torch.testing.assert_close(torch.compile(f, backend="meshfuser")(x), f(x))
    (report,) = meshfuser.dynamo.reports()
    assert report.partitions == []
    assert ("t", "a partition of views only (ATen views copy nothing)") in [(op, r) for _n, op, r in report.views]
    assert [op for _n, op, _r in report.eager] == ["cumsum"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dtype_promotion_as_eager(dtype):
    def f(x, y, i, mask):
        a = x * y                      # low precision * float32 -> float32
        b = x + 1.5                    # a Python scalar keeps x's dtype
        c = (i + 1) * 2                # integers stay integers
        d = torch.where(mask, x, 0.0)  # bool mask
        return a, b, c, d, (x / 3).to(torch.float32).sum(-1), x.mean(-1)

    torch.manual_seed(0)
    args = (torch.randn(4, 8).to(dtype), torch.randn(4, 8), torch.randint(0, 5, (4, 8)), torch.rand(4, 8) > 0.5)
    expected = f(*args)
    actual = torch.compile(f, backend="meshfuser")(*args)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a, e)
    assert _ran_on_aten(meshfuser.dynamo.reports()) == []


def test_views_and_in_place_ops_as_eager():
    def f(x, buf):
        y = x.view(2, 3, 4).transpose(1, 2)
        y = y.contiguous()
        y.mul_(2)                       # in-place on an intermediate
        z = y[:, 1:, ::2].unsqueeze(0).squeeze(0)
        buf.add_(1)                     # input mutation: written back as in eager
        return z, y.select(1, 0), x.view(-1)[3:9]

    x = torch.randn(24)
    buf, buf_ref = torch.zeros(3), torch.zeros(3)
    actual = torch.compile(f, backend="meshfuser")(x, buf)
    expected = f(x, buf_ref)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
    torch.testing.assert_close(buf, buf_ref)
    assert actual[2]._base is not None or actual[2].data_ptr() == x.data_ptr() + 3 * x.element_size()


def test_views_saved_for_backward_stay_views():
    """Saving every intermediate (recompute=False), the transposed weights the forward saves for
    the backward are ATen views, not copies; with recomputation (the default) the backward reads
    the weights themselves and the forward saves no transposed weight."""
    from meshfuser.dynamo.gpu_plan import copied_outputs
    for recompute, views in ((False, ["t", "t"]), (True, [])):
        torch._dynamo.reset()
        meshfuser.dynamo.clear_reports()
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
        x = torch.randn(4, 16, requires_grad=True)
        torch.compile(mlp, backend="meshfuser", options={"recompute": recompute})(x).sum().backward()
        forward = meshfuser.dynamo.reports()[0]
        assert forward.title == "forward" and not forward.eager
        assert [op for _n, op, _r in forward.views] == views
        assert copied_outputs(forward.programs[0]) == []


def test_weight_gradients_come_out_in_the_parameters_layout():
    """AOTAutograd writes a linear's weight gradient as t(mm(t(x), dy)); the backend computes dy^T @ x
    instead (transposed operands are GEMM flags), so no transposed product leaves the backward for
    autograd to copy into the parameter's [out, in] layout."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False), torch.nn.SiLU(), torch.nn.Linear(32, 16))
    x = torch.randn(2, 4, 16)
    reports = run_both(mlp, x)
    backward = next(r for r in reports if r.title == "backward")
    assert not backward.eager
    assert [op for _n, op, _r in backward.views if op.startswith(("t", "transpose", "permute"))] == [], backward.views
    for p in backward.programs:
        outputs = p.fd.host_program().split("outputs:")[1]
        assert "permute" not in outputs


def test_partition_report_is_readable():
    report = dynamo_partition.Report("forward")
    report.partitions.append(("forward.fused_0", {"add.Tensor": 2, "linear": 1}))
    report.eager.append(("cumsum", "cumsum", "no meshfuser op for it"))
    assert str(report).splitlines() == [
        "partitions forward: 1 meshfuser partition(s), 1 node(s) on ATen",
        "  forward.fused_0: 3 ops: add.Tensor x2, linear",
        "  ATen cumsum (cumsum): no meshfuser op for it",
    ]


def test_new_sizes_compile_once_each():
    """After a second size Dynamo traces with symbolic shapes; meshfuser compiles that graph once per
    set of sizes, and a size seen before reuses its programs."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    compiled = torch.compile(mlp, backend="meshfuser")
    for rows in (4, 6, 9, 6):
        x = torch.randn(rows, 16, requires_grad=True)
        out = compiled(x)
        out.sum().backward()
        grad, x.grad = x.grad, None
        expected = mlp(x)
        expected.sum().backward()
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(grad, x.grad)
    titles = [r.title for r in meshfuser.dynamo.reports()]
    assert titles == ["forward", "backward"] * 3  # sizes 4, 6 and 9; 6 again compiles nothing
    assert all(not r.eager for r in meshfuser.dynamo.reports())


def test_llama_causal_lm_loss_and_gradients():
    """A whole (tiny) LlamaForCausalLM with its loss: embedding, two layers, the LM head and cross
    entropy; the ops meshfuser has no counterpart for run on ATen between its partitions."""
    _hf()
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=2, vocab_size=100)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 100, (2, 16))
    loss = torch.compile(model, backend="meshfuser")(input_ids=ids, labels=ids).loss
    expected = reference(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(loss, expected)
    loss.backward()
    expected.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)
    on_aten = {op for _t, op, _r in _ran_on_aten(meshfuser.dynamo.reports())}
    assert on_aten == {"arange", "nll_loss_forward", "nll_loss_backward", "embedding_dense_backward"}


def test_option_recompute_chooses_the_partitioner():
    """options={"recompute": False}: AOTAutograd's default partitioner (the backward computes what
    it needs from saved intermediates); the default, min-cut, saves relu's mask as bools computed in
    the forward. Both equal eager."""
    def f(x, w):
        return (torch.relu(x) * 2 + 1) @ w

    where = {}
    for recompute in (True, False):
        torch._dynamo.reset()
        meshfuser.dynamo.clear_reports()
        torch.manual_seed(0)
        x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 3, requires_grad=True)
        xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out = torch.compile(f, backend="meshfuser", options={"recompute": recompute})(x, w)
        expected = f(xr, wr)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)
        torch.testing.assert_close(w.grad, wr.grad)
        where[recompute] = [r.title for r in meshfuser.dynamo.reports() if "le.Scalar" in r.partitions[0][1]]
    assert where == {True: ["forward"], False: ["backward"]}


def test_unknown_option_is_an_error():
    with pytest.raises(Exception) as info:
        torch.compile(torch.nn.Linear(4, 4), backend="meshfuser", options={"recompte": False})(torch.randn(2, 4))
    # torch.compile wraps the backend's error (BackendCompilerFailed) and names its type.
    assert "ArgumentError: torch.compile(backend='meshfuser', options=...): unknown option(s) ['recompte']; " \
        "the backend takes ['recompute']" in str(info.value)


def test_outputs_keep_eager_layout_without_copies():
    """Attention's output comes out [b, s, h, d]-major (the layout of q, read in place), as eager's
    does; the backend returns and saves it so, where a fusion output had been made contiguous (a
    copy of the output and of the activation saved for the backward, and a copy of its gradient)."""
    from torch.profiler import ProfilerActivity, profile
    import torch.nn.functional as F

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 16, 4, 8, requires_grad=True) for _ in range(3))
    expected = attend(q, k, v)
    compiled = torch.compile(attend, backend="meshfuser")
    compiled(q, k, v).sum().backward()  # compiles forward and backward
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = compiled(q, k, v)
    assert out.stride() == expected.stride()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    copies = [e.name for e in prof.events() if e.name in ("aten::copy_", "aten::contiguous")]
    assert copies == [], copies
