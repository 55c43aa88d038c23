"""meshfuser.visualize_sharding(fd or tensor): which rank holds which block of each input and
output, as text (in the spirit of DTensor's visualize_sharding)."""
from . import _C
from ._C import ParallelType

_DEVICE_TYPES = (ParallelType.mesh_x, ParallelType.mesh_y, ParallelType.mesh_z)


def _runs(positions):
    """[0, 1, 2, 6, 7] -> "0:3,6:8" (half-open ranges, as Python slices)."""
    out, start, prev = [], None, None
    for p in positions:
        if start is None:
            start = prev = p
        elif p == prev + 1:
            prev = p
        else:
            out.append(f"{start}:{prev + 1}")
            start = prev = p
    if start is not None:
        out.append(f"{start}:{prev + 1}")
    return ",".join(out)


def _tensor_view_blocks(tv, shape):
    """Per rank of tv's mesh, the global index ranges it holds, one per axis; `shape` the global
    extents (None where unknown: blocks are then "block k/n")."""
    if not tv.has_device_mesh():
        return None
    mesh = tv.device_mesh
    sharded = {}
    for pt in _DEVICE_TYPES:
        try:
            axis = tv.sharded_axis(pt)
        except _C.Error:
            axis = -1
        if axis >= 0:
            sharded[pt] = axis
    rows = {}
    for rank in mesh.devices:
        cells = []
        for axis, extent in enumerate(shape):
            if extent is None or extent < 0:
                pts = [pt for pt, a in sharded.items() if a == axis]
                if not pts:
                    cells.append(":")
                    continue
                coords = mesh.coordinates_of(rank)
                parts = []
                for pt in pts:
                    mesh_axis = len(mesh.shape) - 1 - _DEVICE_TYPES.index(pt)
                    parts.append(f"block {coords[mesh_axis]}/{mesh.shape[mesh_axis]}")
                cells.append(" ".join(parts))
                continue
            positions = tv.shard_positions(axis, extent, rank)
            cells.append(f"0:{extent}" if positions is None else _runs(positions))
        rows[rank] = cells
    return rows


def _describe_tv(fd_label, tv, shape):
    dims = "[" + ", ".join("?" if s is None or s < 0 else str(s) for s in shape) + "]"
    label = repr(tv) + ("" if tv.name == repr(tv) else f" ({tv.name})")
    head = f"{fd_label} {label} {dims} {str(tv.dtype).replace('DataType.', '')}"
    rows = _tensor_view_blocks(tv, shape)
    if rows is None:
        return [head + ": no mesh (sharding decided by propagation; see fd.get_output_shardings() after execute)"]
    lines = [head + f" on mesh {list(tv.device_mesh.devices)}:"]
    for rank, cells in rows.items():
        lines.append(f"  rank {rank}: [{', '.join(cells)}]")
    return lines


def _describe_sharding(fd_label, tv, shape, sharding):
    """An output whose sharding propagation chose (one block per device along each sharded axis)."""
    label = repr(tv) + ("" if tv.name == repr(tv) else f" ({tv.name})")
    dims = "[" + ", ".join("?" if s is None else str(s) for s in shape) + "]"
    mesh = sharding.mesh
    lines = [f"{fd_label} {label} {dims} {str(tv.dtype).replace('DataType.', '')} on mesh {list(mesh.devices)} "
             "(sharding chosen by propagation):"]
    for rank in mesh.devices:
        coords = mesh.coordinates_of(rank)
        cells = [":" if s is None else f"0:{s}" for s in shape]
        for pt in _DEVICE_TYPES:
            axis = sharding.axis_sharded_on(pt)
            if axis < 0 or axis >= len(shape):
                continue
            mesh_axis = len(mesh.shape) - 1 - _DEVICE_TYPES.index(pt)
            k, n = coords[mesh_axis], mesh.shape[mesh_axis]
            if shape[axis] is None:
                cells[axis] = f"block {k}/{n}"
            else:
                size = shape[axis] // n
                cells[axis] = f"{k * size}:{(k + 1) * size}"
        lines.append(f"  rank {rank}: [{', '.join(cells)}]")
    return lines


def _describe_dtensor(t):
    from torch.distributed.tensor import Shard
    mesh = t.device_mesh
    ranks = mesh.mesh
    lines = [f"DTensor {list(t.shape)} {t.dtype} on mesh {ranks.tolist()} placements {list(t.placements)}:"]
    import itertools
    for coords in itertools.product(*[range(n) for n in ranks.shape]):
        ranges = [(0, n) for n in t.shape]
        for mesh_dim, p in enumerate(t.placements):
            if isinstance(p, Shard):
                lo, hi = ranges[p.dim]
                n = ranks.shape[mesh_dim]
                size = -(-(hi - lo) // n)  # torch.chunk's block size
                start = min(lo + coords[mesh_dim] * size, hi)
                ranges[p.dim] = (start, min(start + size, hi))
        rank = int(ranks[coords])
        lines.append(f"  rank {rank}: [{', '.join(f'{a}:{b}' for a, b in ranges)}]")
    return lines


def visualize_sharding(x, shapes=None):
    """Prints (and returns) which rank holds which block of each input and output of a
    FusionDefinition, or of a DTensor. Blocks are global index ranges per axis, like slices
    ("0:4" rows 0..3; "0:2,4:6" for an interleaved split; ":" the whole axis). For a definition,
    `shapes` (global shapes of the inputs, e.g. [t.shape for t in global_inputs]) fills in
    extents defined as -1; otherwise they show as "?" with "block k/n"."""
    lines = []
    if hasattr(x, "device_mesh") and hasattr(x, "placements"):
        lines = _describe_dtensor(x)
    elif hasattr(x, "fusion") and hasattr(x, "execute"):
        fusion = x.fusion
        shapes = list(shapes) if shapes is not None else None
        for i, v in enumerate(fusion.inputs()):
            if not isinstance(v, _C.TensorView):
                continue
            shape = [None if s < 0 else s for s in v.shape]
            if shapes is not None and i < len(shapes):
                shape = [int(s) for s in shapes[i]]
            lines += _describe_tv(f"input {i}", v, shape)
        try:
            shardings = x.get_output_shardings()  # after an execute: what propagation decided
        except _C.Error:
            shardings = None
        for i, v in enumerate(fusion.outputs()):
            shape = [None if s < 0 else s for s in v.shape]
            if not v.has_device_mesh() and shardings is not None:
                lines += _describe_sharding(f"output {i}", v, shape, shardings[i])
            else:
                lines += _describe_tv(f"output {i}", v, shape)
    elif hasattr(x, "shape") and hasattr(x, "dtype"):
        lines = [f"tensor {list(x.shape)} {x.dtype}: not a DTensor; each rank holds what it was given"]
    else:
        raise _C.ArgumentError(f"visualize_sharding: expected a FusionDefinition or a DTensor; got {type(x).__name__}")
    text = "\n".join(lines)
    print(text)
    return text
