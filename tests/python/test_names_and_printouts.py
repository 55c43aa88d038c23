"""Names given to define_tensor in print(fd), the host program and errors; short constants; the
host program without deallocations unless asked; hints in the errors newcomers hit first."""
import pytest
import torch

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType
from meshfuser._torch_check import check as torch_check


def _named():
    with FusionDefinition() as fd:
        h = fd.define_tensor([4, 8], name="hidden_states")
        w = fd.define_tensor([8], name="norm_weight")
        y = fd.ops.mul(fd.ops.add(h, 1e-5), w)
        fd.add_output(fd.ops.relu(y))
    return fd, h, w


def test_names_in_print_host_program_and_errors():
    fd, h, w = _named()
    assert h.name == "hidden_states" and w.name == "norm_weight"
    text = str(fd)
    assert "name=hidden_states" in text and "name=norm_weight" in text, text
    x, g = torch.randn(4, 8), torch.randn(8)
    (out,) = fd.execute([x, g])
    torch.testing.assert_close(out, ((x + 1e-5) * g).relu())
    program = fd.host_program()
    assert "names: T0=hidden_states T1=norm_weight" in program, program
    with pytest.raises(meshfuser.Error, match=r"input 0 \(T0 \(hidden_states\)\) axis 1: expected local extent 8"):
        fd.execute([torch.randn(4, 9), g])


def test_unnamed_tensor_name_is_the_ir_name():
    with FusionDefinition() as fd:
        x = fd.define_tensor([2])
        fd.add_output(fd.ops.neg(x))
    assert x.name == "T0"


def test_a_name_must_be_a_word():
    with pytest.raises(meshfuser.ArgumentError, match=r"name 'two words' .* must be a word"):
        with FusionDefinition() as fd:
            fd.define_tensor([2], name="two words")


def test_constants_print_short():
    fd, _, _ = _named()
    text = str(fd)
    assert "1e-05" in text and "1.0000000000000001e-05" not in text, text


def test_constants_that_differ_in_the_last_bit_stay_distinct_programs():
    outs = []
    for c in (0.1, 0.1 + 2 ** -56):
        with FusionDefinition() as fd:
            x = fd.define_tensor([2], dtype=meshfuser.DataType.Double)
            fd.add_output(fd.ops.add(x, c))
        outs.append(str(fd))
    assert outs[0] != outs[1]


def test_host_program_hides_deallocations_unless_asked():
    fd, _, _ = _named()
    fd.execute([torch.randn(4, 8), torch.randn(8)])
    short, full = fd.host_program(), fd.host_program(deallocations=True)
    assert "deallocate" not in short, short
    if "deallocate" in full:
        assert "deallocations not shown" in short, short


def test_parallelizing_an_unsplit_axis_suggests_outer_split():
    mesh = DeviceMesh([0, 1])
    with pytest.raises(meshfuser.Error, match=r"split it by the mesh size first: outer_split\(0, 2\) "
                                               r"\(outer_split\(axis, mesh.size\)\)"):
        with FusionDefinition() as fd:
            x = fd.define_tensor([4, 3], name="x")
            fd.add_output(fd.ops.relu(x))
            x.set_device_mesh(mesh)
            x.axis(0).parallelize(ParallelType.mesh_x)
        fd.execute([torch.ones(4, 3)])


def test_a_two_device_mesh_in_one_process_suggests_torchrun():
    meshfuser.Communicator.instance()
    if meshfuser.Communicator.instance().size() != 1:
        pytest.skip("one process only")
    mesh = DeviceMesh([0, 1])
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 3], name="x")
        y = fd.ops.sum(x, [0])
        fd.add_output(y)
        x.set_device_mesh(mesh)
        y.set_device_mesh(mesh)
        x.outer_split(0, 2)
        x.axis(0).parallelize(ParallelType.mesh_x)
    with pytest.raises(meshfuser.Error, match=r"mesh \[0 1\] \(of T0 \(x\)\) has 2 devices, but this process runs "
                                               r"alone .*torchrun --nproc_per_node=2"):
        fd.execute([torch.ones(2, 3)])


def test_set_device_mesh_names_what_it_accepts():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4])
        fd.add_output(fd.ops.neg(x))
        with pytest.raises(meshfuser.ArgumentError, match=r"expected a meshfuser.DeviceMesh, a "
                                                          r"torch.distributed.DeviceMesh or a list of ranks; got "
                                                          r"builtins.str"):
            x.set_device_mesh("0,1")


def test_internal_parallel_types_are_not_offered():
    names = set(ParallelType.__members__)
    assert {"mesh_x", "mesh_y", "mesh_z", "stream", "serial"} <= names
    assert not names & {"thread_x", "block_x", "unroll", "vectorize"}, names


def test_torch_version_mismatch_names_both_versions():
    torch_check("2.13.0+cpu", "2.13.1")  # same major.minor: accepted
    with pytest.raises(ImportError, match=r"built against torch 2.11.0\+cu128 but this Python imports torch "
                                          r"2.13.0.*pip install --no-build-isolation"):
        torch_check("2.11.0+cu128", "2.13.0")
    assert meshfuser._C._built_with_torch.split("+")[0].split(".")[:2] == torch.__version__.split(".")[:2]


def test_public_functions_have_docstrings_and_named_arguments():
    for f in (FusionDefinition.execute, FusionDefinition.define_tensor, FusionDefinition.host_program,
              meshfuser.visualize_sharding, meshfuser.TensorView.set_device_mesh):
        assert f.__doc__, f
    unnamed = []
    for cls in (meshfuser._C.TensorView, meshfuser._C.Fusion, meshfuser._C._DeviceMesh, meshfuser._C.FusionHandle,
                meshfuser._C._Communicator):
        for name in dir(cls):
            doc = getattr(getattr(cls, name), "__doc__", None) or ""
            if not name.startswith("__") and "arg0" in doc:
                unnamed.append(f"{cls.__name__}.{name}")
    assert unnamed == [], unnamed
