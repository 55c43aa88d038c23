"""DeviceMesh: a dense n-D array of unique ranks (mesh_x = last axis)."""
import torch

from . import _C


class DeviceMesh(_C._DeviceMesh):
    """A dense n-D array of unique ranks. DeviceMesh(range(d)) or a list: 1-D; a torch tensor
    (torch.arange(4).view(2, 2)): n-D, mesh_x its last axis, mesh_y the one before."""

    def __init__(self, devices):
        if isinstance(devices, torch.Tensor):
            super().__init__(devices.flatten().tolist(), list(devices.shape))
            return
        flat = [int(d) for d in devices]
        super().__init__(flat, [len(flat)])

    def shard_tensor(self, t, axis, rank=None):
        """This rank's even slice of `t` along `axis` (1-D mesh)."""
        if len(self.shape) != 1:
            raise _C.ArgumentError(f"shard_tensor: mesh {self} is {len(self.shape)}-D; use meshfuser.shard_tensor(t, tv)")
        if rank is None:
            from .distributed import Communicator
            rank = Communicator.instance().rank()
        index = self.linear_index_of(rank)
        if index < 0:
            raise _C.ArgumentError(f"shard_tensor: rank {rank} is not in mesh {self}")
        n = self.size
        if t.size(axis) % n != 0:
            raise _C.ArgumentError(f"shard_tensor: axis {axis} has extent {t.size(axis)}, not divisible by {n} devices")
        return t.chunk(n, dim=axis)[index].contiguous()


def as_device_mesh(mesh, what="set_device_mesh"):
    """A meshfuser mesh from a meshfuser.DeviceMesh, a torch.distributed.DeviceMesh (its ranks, in
    its shape), a torch tensor of ranks, or a list/range of ranks."""
    if isinstance(mesh, _C._DeviceMesh):
        return mesh
    if type(mesh).__name__ == "DeviceMesh" and hasattr(mesh, "mesh") and isinstance(mesh.mesh, torch.Tensor):
        ranks = mesh.mesh
        return DeviceMesh(ranks if ranks.dim() > 1 else ranks.flatten().tolist())
    if isinstance(mesh, torch.Tensor):
        return DeviceMesh(mesh)
    if isinstance(mesh, (list, tuple, range)) and all(isinstance(r, int) for r in mesh):
        return DeviceMesh(mesh)
    raise _C.ArgumentError(f"{what}: expected a meshfuser.DeviceMesh, a torch.distributed.DeviceMesh or a list of "
                           f"ranks; got {type(mesh).__module__}.{type(mesh).__name__}")
