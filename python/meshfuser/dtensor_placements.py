"""DTensor placements <-> meshfuser shardings, and fd.execute with DTensor inputs.

The mapping (for a torch mesh of k <= 3 dims): mesh dim k-1 (the last) <-> mesh_x, k-2 <-> mesh_y,
k-3 <-> mesh_z; `Shard(d)` on a mesh dim <-> an outer split of tensor axis d by that mesh dim's
size, the outer part parallelized on the mesh dim's parallel type; `Replicate()` <-> no split.
`Partial()` inputs are reduced by torch first. meshfuser.dtensor (compile) builds on these helpers;
FusionDefinition.execute calls `execute_with_dtensors` when it is given DTensors. This module
imports neither, so the two never import each other.
"""
from . import _C
from ._C import ParallelType

__all__ = ["execute_with_dtensors"]


def _torch():
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    return torch, DTensor, Shard, Replicate, Partial


def _parallel_type(mesh_dim, mesh_ndim):
    """DTensor mesh dim -> meshfuser parallel type: the last mesh dim is mesh_x."""
    offset = mesh_ndim - 1 - mesh_dim
    return (ParallelType.mesh_x, ParallelType.mesh_y, ParallelType.mesh_z)[offset]


def _is_dtensor(x):
    _, DTensor, _, _, _ = _torch()
    return isinstance(x, DTensor)


def _placement_str(p):
    return type(p).__name__ + (f"({p.dim})" if hasattr(p, "dim") else "()")


def _placements_str(placements):
    return "[" + ", ".join(_placement_str(p) for p in placements) + "]"


def _mesh_ranks(torch_mesh):
    m = torch_mesh.mesh
    return tuple(int(r) for r in m.flatten().tolist()), tuple(int(s) for s in m.shape)


def _check_inputs(inputs, what):
    """Refuse plain tensors mixed with DTensors and meshes of more than 3 dims."""
    torch, DTensor, _, _, _ = _torch()
    if not any(isinstance(t, DTensor) for t in inputs):
        raise _C.ArgumentError(f"{what}: expected DTensor inputs; got none")
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and not isinstance(t, DTensor):
            raise _C.ArgumentError(
                f"{what}: input {i} is a plain torch.Tensor (shape {tuple(t.shape)}) while other inputs are "
                f"DTensors; wrap it with DTensor.from_local(t, mesh, [Replicate()]) or distribute_tensor(...)")
        if isinstance(t, DTensor) and t.device_mesh.ndim > 3:
            raise _C.ArgumentError(
                f"{what}: input {i} lives on a {t.device_mesh.ndim}-D DeviceMesh; at most 3 mesh dims "
                f"(mesh_z, mesh_y, mesh_x) are supported")


def _resolve_partials(inputs):
    """Partial placements -> Replicate, reduced by torch (see the module docstring)."""
    _, DTensor, _, Replicate, Partial = _torch()
    out = []
    for t in inputs:
        if isinstance(t, DTensor) and any(isinstance(p, Partial) for p in t.placements):
            t = t.redistribute(t.device_mesh, [Replicate() if isinstance(p, Partial) else p for p in t.placements])
        out.append(t)
    return out


def _normalized(i, dt):
    """Placements with Shard dims made non-negative; refuse unknown placement types and uneven shards."""
    _, _, Shard, Replicate, _ = _torch()
    ndim = dt.ndim
    placements = []
    for mesh_dim, p in enumerate(dt.placements):
        if type(p) is Shard:
            placements.append(Shard(p.dim % ndim if ndim else p.dim))
        elif isinstance(p, Replicate):
            placements.append(p)
        else:
            raise _C.ArgumentError(
                f"input {i}: placement {p!r} on mesh dim {mesh_dim} is not supported (only Shard, Replicate "
                f"and Partial, which is reduced first)")
    # Uneven shards: the product of the mesh sizes sharding an axis must divide its extent.
    names = dt.device_mesh.mesh_dim_names
    factor = {}
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):
            n = dt.device_mesh.size(mesh_dim)
            factor[p.dim] = factor.get(p.dim, 1) * n
            extent = dt.shape[p.dim]
            if extent % factor[p.dim] != 0:
                dim_name = f" ('{names[mesh_dim]}')" if names else ""
                raise _C.ArgumentError(
                    f"input {i}: uneven shard: tensor axis {p.dim} has extent {extent}, not divisible by mesh "
                    f"size {factor[p.dim]} (mesh dim {mesh_dim}{dim_name}, placements "
                    f"{_placements_str(dt.placements)}); meshfuser needs even shards")
    # Nested shards (one tensor axis on several mesh dims) need a split of a split to be sharded,
    # which meshfuser refuses in this version.
    by_axis = {}
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):
            by_axis.setdefault(p.dim, []).append(mesh_dim)
    for axis, mesh_dims in by_axis.items():
        if len(mesh_dims) > 1:
            raise _C.ArgumentError(
                f"input {i}: tensor axis {axis} is sharded on mesh dims {mesh_dims} "
                f"({_placements_str(dt.placements)}); meshfuser shards one outer split per tensor axis in "
                f"this version, so one tensor axis can be sharded on one mesh dim only")
    return placements


# -- fd.execute with DTensors ---------------------------------------------------------------------

def _expected_placements(i, tv, dt):
    """The placements on dt's mesh that fusion input tv (scheduled) corresponds to; raise on a mesh
    mismatch."""
    _, _, Shard, Replicate, _ = _torch()
    k = dt.device_mesh.ndim
    if not tv.has_device_mesh():
        return [Replicate()] * k
    mesh = tv.device_mesh
    want = (tuple(int(r) for r in mesh.devices), tuple(int(s) for s in mesh.shape))
    got = _mesh_ranks(dt.device_mesh)
    if want != got:
        raise _C.ArgumentError(
            f"input {i}: the fusion input {tv!r} is on the mesh "
            f"of ranks {list(want[0])} with shape {list(want[1])}; the DTensor is on ranks {list(got[0])} with "
            f"shape {list(got[1])}")
    if not tv.splits_are_blocked():
        raise _C.ArgumentError(
            f"input {i}: the fusion input {tv!r} is split interleaved across devices (a device axis that is "
            f"not the outermost part of its axis); a DTensor Shard placement holds one block per device")
    expected = []
    for mesh_dim in range(k):
        axis = tv.sharded_axis(_parallel_type(mesh_dim, k))
        expected.append(Shard(axis) if axis >= 0 else Replicate())
    return expected


def _torch_mesh_for(sharding_mesh, torch_meshes, device_type):
    if sharding_mesh is None or sharding_mesh.size == 0:
        return None
    want = (tuple(int(r) for r in sharding_mesh.devices), tuple(int(s) for s in sharding_mesh.shape))
    for tm in torch_meshes:
        if _mesh_ranks(tm) == want:
            return tm
    torch = _torch()[0]
    from torch.distributed.device_mesh import DeviceMesh as TorchMesh
    return TorchMesh(device_type, torch.tensor(list(want[0])).view(*want[1]))


def _wrap_outputs(fd, outputs, torch_meshes, device_type):
    _, DTensor, Shard, Replicate, _ = _torch()
    shardings = fd.get_output_shardings()
    wrapped = []
    for local, sharding in zip(outputs, shardings):
        tm = _torch_mesh_for(getattr(sharding, "mesh", None), torch_meshes, device_type) or torch_meshes[0]
        k = tm.ndim
        placements, shape = [], list(local.shape)
        for mesh_dim in range(k):
            pt = _parallel_type(mesh_dim, k)
            axis = sharding.axis_sharded_on(pt)
            if axis >= 0:
                placements.append(Shard(axis))
                shape[axis] *= tm.size(mesh_dim)
            else:
                placements.append(Replicate())
        wrapped.append(global_dtensor(local, tm, placements, shape))
    return wrapped, shardings


def global_dtensor(local, torch_mesh, placements, global_shape):
    """DTensor.from_local for a local shard whose global shape meshfuser knows (no check across
    ranks), with the contiguous global strides."""
    _, DTensor, _, _, _ = _torch()
    stride, acc = [0] * len(global_shape), 1
    for a in range(len(global_shape) - 1, -1, -1):
        stride[a] = acc
        acc *= global_shape[a]
    return DTensor.from_local(local, torch_mesh, placements, run_check=False, shape=tuple(global_shape),
                              stride=tuple(stride))


def execute_with_dtensors(fd, inputs, release_inputs=False):
    """fd.execute for DTensor inputs: check meshes and placements against the fusion inputs'
    shardings, run on the local tensors; returns (output DTensors, shardings). release_inputs:
    `inputs` (a list) is emptied and the local tensors are dropped after their last use."""
    given = inputs
    inputs = list(inputs)
    _check_inputs(inputs, "execute")
    inputs = _resolve_partials(inputs)
    fusion = fd.fusion
    if fusion.num_inputs() != len(inputs):
        raise _C.ArgumentError(f"execute: the definition has {fusion.num_inputs()} inputs; got {len(inputs)}")
    locals_, torch_meshes, device_type = [], [], None
    for i, t in enumerate(inputs):
        if not _is_dtensor(t):
            locals_.append(t)
            continue
        if not fusion.input_is_tensor(i):
            raise _C.ArgumentError(f"input {i}: the definition expects a scalar; got a DTensor")
        placements = _normalized(i, t)
        tv = fusion.input(i)
        expected = _expected_placements(i, tv, t)
        if [_placement_str(p) for p in expected] != [_placement_str(p) for p in placements]:
            raise _C.ArgumentError(
                f"input {i}: placement mismatch: the fusion expects {_placements_str(expected)} on its mesh; "
                f"the DTensor has {_placements_str(t.placements)}")
        if not any(tm is t.device_mesh for tm in torch_meshes):
            torch_meshes.append(t.device_mesh)
        device_type = device_type or t.device_mesh.device_type
        locals_.append(t.to_local())
    if release_inputs:  # no reference left here either: the program holds the only ones
        given.clear()
        inputs = t = None
    outputs = fd._handle.execute(locals_, release_inputs)
    return _wrap_outputs(fd, outputs, torch_meshes, device_type)

