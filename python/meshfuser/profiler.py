"""meshfuser.Profiler: what each execute() ran, segment by segment and communication by
communication, with bytes moved and host and device times."""
from . import _C


class KernelProfile:
    """One segment (or one generated kernel of it) or one communication.

    name: "segment 3" (a segment run as several kernels: "segment 3.0", "segment 3.1", ...) or the
        communication as the host program prints it.
    scheduler: "communication", "expr_eval" (ATen), or the generated kernel's scheduler
        ("pointwise", "reduction", "normalization", "transpose", ...).
    bytes_sent, bytes_received: what this rank sent and received (0 for compute).
    time_ms: device time (CUDA events on the current stream; the host time for CPU tensors).
    host_time_ms: host time, from the start of the step to its end. For a communication both run
        from its post to the end of its wait. A segment of several kernels carries its times on its
        first entry (0 on the others).
    """

    def __init__(self, name, scheduler, bytes_sent=0, bytes_received=0, time_ms=0.0, host_time_ms=0.0):
        self.name = name
        self.scheduler = scheduler
        self.bytes_sent = bytes_sent
        self.bytes_received = bytes_received
        self.time_ms = time_ms
        self.host_time_ms = host_time_ms

    @property
    def device_time_ms(self):
        return self.time_ms

    def __repr__(self):
        extra = f", sent={self.bytes_sent}, received={self.bytes_received}" if self.scheduler == "communication" else ""
        return (f"KernelProfile({self.name!r}, scheduler={self.scheduler!r}{extra}, time_ms={self.time_ms:.3f}, "
                f"host_time_ms={self.host_time_ms:.3f})")


class _Profile:
    def __init__(self, kernels):
        self.kernel_profiles = [KernelProfile(*k) for k in kernels]

    def table(self):
        """The profile as text: one line per entry, with times and bytes, and the totals."""
        rows = [("step", "scheduler", "device ms", "host ms", "sent B", "received B")]
        for k in self.kernel_profiles:
            rows.append((k.name, k.scheduler, f"{k.time_ms:.3f}", f"{k.host_time_ms:.3f}",
                         str(k.bytes_sent), str(k.bytes_received)))
        ks = self.kernel_profiles
        rows.append(("total", "", f"{sum(k.time_ms for k in ks):.3f}", f"{sum(k.host_time_ms for k in ks):.3f}",
                     str(sum(k.bytes_sent for k in ks)), str(sum(k.bytes_received for k in ks))))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                         for r in rows)

    def __str__(self):
        return self.table()


class Profiler:
    """`with meshfuser.Profiler() as prof: fd.execute(inputs)`, then `prof.profile.kernel_profiles`
    (or `print(prof.profile)` for a table). Profiles the calls made by this thread."""

    def __enter__(self):
        self._recorder = _C.ProfileRecorder()
        _C.start_profiling(self._recorder)
        return self

    def __exit__(self, *exc):
        _C.stop_profiling()
        self.profile = _Profile(self._recorder.kernels())
        return False


PythonProfiler = Profiler
