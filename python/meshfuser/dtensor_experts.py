"""meshfuser.dtensor.compile(define, expert_parallel=...): DTensors split on the expert-parallel mesh
dim (Shard(0): tokens over the data-parallel ranks, expert weights on their expert axis) are this
rank's block, and outputs come back Shard(0) (or Partial()) on that mesh dim (see meshfuser.dtensor)."""
from . import _C
from .dtensor_placements import _is_dtensor, _parallel_type, _torch, global_dtensor


def _expert_mesh_dim(inputs, expert_parallel):
    """The index of the expert-parallel mesh dim (a name or an index) on the inputs' torch mesh."""
    torch_mesh = next(t.device_mesh for t in inputs if _is_dtensor(t))
    names = torch_mesh.mesh_dim_names or ()
    if isinstance(expert_parallel, str):
        if expert_parallel not in names:
            raise _C.ArgumentError(f"compile: expert_parallel={expert_parallel!r} is not a mesh dim name of the "
                                   f"inputs' mesh (names {list(names)})")
        return names.index(expert_parallel)
    if not 0 <= int(expert_parallel) < torch_mesh.ndim:
        raise _C.ArgumentError(f"compile: expert_parallel={expert_parallel} is not a mesh dim of the inputs' "
                               f"{torch_mesh.ndim}-D mesh")
    return int(expert_parallel)


def _rank_local_inputs(inputs, placements, expert_dim):
    """Indices of the DTensor inputs split on the expert mesh dim (Shard(0) only)."""
    _, _, Shard, _, _ = _torch()
    local = set()
    for i, pl in enumerate(placements):
        if pl is None:
            continue
        p = pl[expert_dim]
        if isinstance(p, Shard):
            if p.dim != 0:
                raise _C.ArgumentError(
                    f"input {i}: Shard({p.dim}) on the expert-parallel mesh dim {expert_dim}; rank-local inputs "
                    f"are split on their first axis (tokens, or the expert axis of expert weights)")
            local.add(i)
    return local


def _execute_expert_parallel(fd, inputs, local_inputs, expert_dim, partial_outputs):
    """Runs fd on the local tensors; outputs are Shard(0) (or Partial()) on the expert mesh dim and
    keep the other mesh dims' shardings."""
    _, _, Shard, Replicate, Partial = _torch()
    torch_mesh = next(t.device_mesh for t in inputs if _is_dtensor(t))
    locals_ = [t.to_local() if _is_dtensor(t) else t for t in inputs]
    outputs = fd._handle.execute(locals_)
    shardings = fd.get_output_shardings()
    k = torch_mesh.ndim
    wrapped = []
    for index, (local, sharding) in enumerate(zip(outputs, shardings)):
        placements, shape = [], list(local.shape)
        for mesh_dim in range(k):
            axis = sharding.axis_sharded_on(_parallel_type(mesh_dim, k))
            if mesh_dim == expert_dim:
                placements.append(Partial() if index in partial_outputs else Shard(0))
                if index not in partial_outputs:
                    shape[0] *= torch_mesh.size(mesh_dim)
            elif axis >= 0:
                placements.append(Shard(axis))
                shape[axis] *= torch_mesh.size(mesh_dim)
            else:
                placements.append(Replicate())
        wrapped.append(global_dtensor(local, torch_mesh, placements, shape))
    return wrapped
