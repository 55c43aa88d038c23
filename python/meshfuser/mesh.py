"""DeviceMesh: a dense n-D array of unique ranks (mesh_x = last axis)."""
import torch

from . import _C


class DeviceMesh(_C._DeviceMesh):
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
