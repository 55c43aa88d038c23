"""Process-group set-up: use torch.distributed's default group, or create it from the launcher's
environment (Gloo for CPU, NCCL for CUDA tensors), and make meshfuser's own groups from it (so its
collectives never interleave with the user's). A single process without launcher variables is rank
0 of 1."""
import atexit
import datetime
import os

from . import _C

_world_group = None  # meshfuser's own group over all ranks (data collectives)
_cpu_group = None    # meshfuser's own Gloo group over all ranks (the per-call agreement)
_teams = {}          # meshfuser's sub-groups, by ranks


_communicator = None  # the process-wide instance, once initialized


def _ensure_initialized():
    comm = _communicator
    if comm is not None and comm.initialized():  # every execute: one call
        return comm
    comm = _C._Communicator.instance()
    if comm.initialized():
        return _remember(comm)
    import torch
    import torch.distributed as dist
    created_here = not dist.is_initialized()
    # MESHFUSER_PG_TIMEOUT_S bounds every collective of the groups meshfuser creates (the test
    # harness sets it, so that a hang turns into an error).
    timeout = os.environ.get("MESHFUSER_PG_TIMEOUT_S")
    timeout = datetime.timedelta(seconds=int(timeout)) if timeout else None
    if created_here:
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            backend = f"cpu:gloo,cuda:{_cuda_backend()}" if torch.cuda.is_available() else "gloo"
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            if torch.cuda.is_available():
                torch.cuda.set_device(local_rank % torch.cuda.device_count())
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            dist.init_process_group(backend="gloo", rank=0, world_size=1)
    rank, size = dist.get_rank(), dist.get_world_size()
    global _world_group, _cpu_group
    if size == 1:
        _world_group = _cpu_group = dist.group.WORLD  # nothing is ever posted on it
    else:
        # meshfuser's own groups, made from the user's (same ranks, same backend, created on every
        # rank in this order): its collectives never interleave with the user's, and its timeouts
        # bound them whoever created the default group.
        everyone = list(range(size))
        _world_group = dist.new_group(everyone, timeout=timeout, backend=_default_backend())
        # A Gloo group for the per-call agreement that never touches GPUs, with a bounded timeout
        # so that ranks out of step get an error instead of waiting forever.
        seconds = int(os.environ.get("MESHFUSER_VALIDATION_TIMEOUT_S", "120"))
        _cpu_group = dist.new_group(everyone, backend="gloo", timeout=datetime.timedelta(seconds=seconds))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    comm.init(_world_group.group_name, _cpu_group.group_name, rank, size, local_rank, local_size)
    from . import _logging
    _logging.set_rank(rank)

    def make_team(ranks):
        group = dist.new_group(list(ranks), timeout=timeout, backend=_default_backend())
        _teams[tuple(ranks)] = group  # keep the group alive
        return group.group_name if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER else ""

    comm.set_team_factory(make_team)
    atexit.register(_shutdown, created_here)
    return _remember(comm)


def _remember(comm):
    global _communicator
    _communicator = comm
    return comm


def _cuda_backend():
    """NCCL for CUDA tensors, or Gloo when MESHFUSER_CUDA_BACKEND=gloo: the test mode in which several
    ranks share one GPU (NCCL refuses two ranks on one device). Chosen explicitly, never by fallback."""
    name = os.environ.get("MESHFUSER_CUDA_BACKEND", "nccl")
    if name not in ("nccl", "gloo"):
        raise _C.Error(f"MESHFUSER_CUDA_BACKEND={name!r}: expected 'nccl' (the default) or 'gloo' (ranks sharing "
                       "a GPU, for testing)")
    return name


def _default_backend():
    import torch.distributed as dist
    if os.environ.get("MESHFUSER_CUDA_BACKEND") is not None:  # meshfuser's groups follow the explicit choice
        import torch
        cuda = _cuda_backend()
        return f"cpu:gloo,cuda:{cuda}" if torch.cuda.is_available() else "gloo"
    try:
        return dist.get_backend_config()  # e.g. "cpu:gloo,cuda:nccl"
    except (AttributeError, RuntimeError, ValueError):
        return dist.get_backend()


def _shutdown(created_here):
    """Release meshfuser's process groups while CUDA and c10d are still alive (destroying NCCL
    groups during static destruction aborts). Python's references go first, while the C++
    Communicator still holds the groups, so that the last reference is dropped in C++ without the
    GIL (a Gloo worker may need the GIL to free a Python-owned tensor while it is joined)."""
    import sys
    import torch.distributed as dist
    global _world_group, _cpu_group
    # A rank still calling execute learns at once that this one makes no more calls (shared-memory
    # control transport), and this rank reports a peer already in a call it never joins.
    try:
        message = _C._Communicator.instance().farewell()
    except Exception as e:  # noqa: BLE001  (nothing must stop the exit path)
        message = f"meshfuser: farewell to the other ranks failed: {e}"
    if message:
        print(message, file=sys.stderr, flush=True)
    # meshfuser's own groups are destroyed here, while the interpreter is alive, unless the user
    # destroyed every group already (a group left to static destruction after a timed-out
    # operation aborted the process at exit).
    if dist.is_initialized():
        _destroy_own_groups(dist)
    _teams.clear()
    _world_group = _cpu_group = None
    _C._Communicator.instance().shutdown()
    if created_here and dist.is_initialized():
        dist.destroy_process_group()


def _destroy_own_groups(dist):
    """In a function of its own: no local reference to a group outlives it (the last reference
    must be the C++ one, dropped without the GIL)."""
    for group in [_world_group, _cpu_group, *_teams.values()]:
        if group is None or group is dist.group.WORLD or group == dist.GroupMember.NON_GROUP_MEMBER:
            continue
        try:
            dist.destroy_process_group(group)
        except (RuntimeError, ValueError, KeyError):
            pass  # already destroyed


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
