"""Records the segments and communications each execute() runs."""
from . import _C


class KernelProfile:
    def __init__(self, name, scheduler):
        self.name = name
        self.scheduler = scheduler

    def __repr__(self):
        return f"KernelProfile({self.name!r}, scheduler={self.scheduler!r})"


class _Profile:
    def __init__(self, kernels):
        self.kernel_profiles = [KernelProfile(n, s) for n, s in kernels]


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
