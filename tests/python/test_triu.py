"""triu: an op its registry entry defines alone (attributes, check, axis map, ATen form), reached
from fd.ops by name. Reference: torch.triu."""
import pytest
import torch

import meshfuser
from meshfuser import DataType, FusionDefinition


@pytest.mark.parametrize("diagonal", [None, 1, -2])
def test_triu_matches_torch(diagonal):
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, 4, 5])
        fd.add_output(fd.ops.triu(x) if diagonal is None else fd.ops.triu(x, diagonal=diagonal))
    t = torch.randn(2, 4, 5)
    assert torch.equal(fd.execute([t])[0], torch.triu(t, diagonal or 0))
    assert f"triu(T0, diagonal={diagonal or 0})" in str(fd)


def test_triu_of_integers_keeps_the_dtype():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], dtype=DataType.Int)
        fd.add_output(fd.ops.triu(fd.ops.add(x, 1), diagonal=0))
    t = torch.arange(12).reshape(3, 4)
    assert torch.equal(fd.execute([t])[0], torch.triu(t + 1))


def test_triu_errors_name_the_op_and_the_attribute():
    with FusionDefinition() as fd:
        x = fd.define_tensor([3, 3])
        with pytest.raises(meshfuser.Error, match=r"triu: unknown attribute 'k'; triu takes \[diagonal\]"):
            fd.ops.triu(x, k=1)
        with pytest.raises(meshfuser.Error, match=r"triu: attribute 'diagonal' must be a int; got a float \(1.5\)"):
            fd.ops.triu(x, diagonal=1.5)
        with pytest.raises(meshfuser.Error, match=r"triu\(T\d+, diagonal=0\): T\d+ has 1 axis; triu needs at least 2"):
            fd.ops.triu(fd.define_tensor([3]))
