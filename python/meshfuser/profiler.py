"""Records the segments and communications each execute() runs."""
from . import _C


class KernelProfile:
    """One segment or communication. Communications also carry the bytes this rank sent and
    received (0 for compute segments)."""

    def __init__(self, name, scheduler, bytes_sent=0, bytes_received=0):
        self.name = name
        self.scheduler = scheduler
        self.bytes_sent = bytes_sent
        self.bytes_received = bytes_received

    def __repr__(self):
        extra = f", sent={self.bytes_sent}, received={self.bytes_received}" if self.scheduler == "communication" else ""
        return f"KernelProfile({self.name!r}, scheduler={self.scheduler!r}{extra})"


class _Profile:
    def __init__(self, kernels):
        self.kernel_profiles = [KernelProfile(*k) for k in kernels]


class Profiler:
    def __enter__(self):
        self._recorder = _C.ProfileRecorder()
        _C.start_profiling(self._recorder)
        return self

    def __exit__(self, *exc):
        _C.stop_profiling()
        self.profile = _Profile(self._recorder.kernels())
        return False


PythonProfiler = Profiler
