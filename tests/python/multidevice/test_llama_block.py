"""The Llama-style block forward (examples/transformer_blocks.py) on 1-4 ranks against unsharded
PyTorch: RMSNorm, column-parallel q/k/v, RoPE (rotate_half from slice, neg and cat along the
unsharded head dim: local), causal attention on this rank's heads, row-parallel output projection,
SiLU-gated MLP with column-parallel gate/up and row-parallel down. TP: exactly two Allreduce;
SP: an Allgather before each column-parallel part and a ReduceScatter after each row-parallel one."""
import pathlib
import sys

import pytest
import torch

import meshfuser
from meshfuser import DeviceMesh

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
import transformer_blocks as blocks  # noqa: E402

pytestmark = pytest.mark.timeout(120)
TOL = dict(rtol=1e-4, atol=1e-4)
COMMS = {"tp": ["Allreduce"] * 2, "sp": ["Allgather", "ReduceScatter"] * 2}


@pytest.mark.parametrize("form", ["tp", "sp"])
def test_llama_block_forward(multidevice_test, form):
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(range(d))
    b, s, h, hd, ffn = 2, 2 * d, 2 * d, 8, 12 * d
    e = h * hd
    full = blocks.llama_parameters(b, s, e, hd, ffn, seed=5)
    expected = blocks.llama_reference(full, h)
    local = {n: t.to(multidevice_test.device) for n, t in blocks.llama_shard(full, form, d, rank).items()}
    x = local.pop("x")

    fd = blocks.llama_forward_definition(b, s, h, hd, ffn, d, form)
    with meshfuser.Profiler() as prof:
        (out,) = fd.execute(blocks.llama_forward_inputs(x, local))
    assert blocks.communications(prof.profile) == (COMMS[form] if d > 1 else [])
    if form == "sp":
        expected = mesh.shard_tensor(expected, 1, rank)
    torch.testing.assert_close(out.cpu(), expected, **TOL)
    # RoPE's slices and cat run on this rank's heads: no communication between the projections and
    # attention, which runs in a segment of its own.
    program = fd.host_program()
    # (On CUDA the segmentation section lists the piece too: only the schedule's lines count.)
    attention = [line for line in program.splitlines() if "sdpfa_fwd(" in line and not line.strip().startswith("piece")]
    assert len(attention) == 1 and attention[0].strip().startswith("run segment"), program


def test_rope_matches_pytorch_rotate_half(multidevice_test):
    """RoPE alone, unsharded: slice + neg + cat against torch.cat of the halves."""
    b, h, s, hd = 1, 2, 4, 8
    t = torch.randn(b, h, s, hd, generator=torch.Generator().manual_seed(6))
    cos, sin = blocks.rope_tables(s, hd)
    with meshfuser.FusionDefinition() as fd:
        tv, c, sn = fd.define_tensor([b, h, s, hd]), fd.define_tensor([s, hd]), fd.define_tensor([s, hd])
        fd.add_output(blocks.rotary(fd, tv, c, sn, hd))
    (out,) = fd.execute([t, cos, sin])
    half = hd // 2
    expected = t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin
    torch.testing.assert_close(out.cpu(), expected, **TOL)
