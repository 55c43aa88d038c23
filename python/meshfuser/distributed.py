"""Process-group set-up: use torch.distributed's default group, or create it from the launcher's
environment (Gloo for CPU, NCCL for CUDA tensors). A single process without launcher variables is
rank 0 of 1."""
import atexit
import datetime
import os

from . import _C

_cpu_group = None


def _ensure_initialized():
    comm = _C._Communicator.instance()
    if comm.initialized():
        return comm
    import torch
    import torch.distributed as dist
    created_here = not dist.is_initialized()
    # MESHFUSER_PG_TIMEOUT_S bounds every collective of the groups meshfuser creates (the test
    # harness sets it, so that a hang turns into an error).
    timeout = os.environ.get("MESHFUSER_PG_TIMEOUT_S")
    timeout = datetime.timedelta(seconds=int(timeout)) if timeout else None
    if created_here:
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            if torch.cuda.is_available():
                torch.cuda.set_device(local_rank % torch.cuda.device_count())
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            dist.init_process_group(backend="gloo", rank=0, world_size=1)
    world = dist.group.WORLD
    global _cpu_group
    # A Gloo group for control messages (collective input validation) that never touches GPUs, with
    # a bounded timeout so that ranks that disagree get an error instead of waiting forever.
    if dist.get_world_size() == 1:
        _cpu_group = world
    else:
        seconds = int(os.environ.get("MESHFUSER_VALIDATION_TIMEOUT_S", "120"))
        _cpu_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=seconds))
    rank, size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    comm.init(world.group_name, _cpu_group.group_name, rank, size, local_rank, local_size)
    _teams = {}

    def make_team(ranks):
        group = dist.new_group(list(ranks), timeout=timeout)
        _teams[tuple(ranks)] = group  # keep the group alive
        return group.group_name if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER else ""

    comm.set_team_factory(make_team)
    atexit.register(_shutdown, created_here)
    return comm


def _shutdown(created_here):
    """Release meshfuser's process-group references, then the groups meshfuser created, while
    CUDA and c10d are still alive (destroying NCCL groups during static destruction aborts)."""
    import torch.distributed as dist
    _C._Communicator.instance().shutdown()
    if created_here and dist.is_initialized():
        dist.destroy_process_group()


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Communicator:
    """meshfuser.Communicator.instance(): size(), rank(), local_size(), local_rank(), barrier()."""

    @staticmethod
    def instance():
        return _ensure_initialized()
