"""meshfuser's one output channel: what MESHFUSER_DUMP asks for (fusion_ir, pass_ir, host_program,
cuda_kernel, fallback, communication, recompile, and the torch.compile backend's partitions) reaches Python's `logging` as INFO records of
the logger "meshfuser.<name>", every line prefixed with "[meshfuser rank R]". While the application
configures no logging, they are printed to stdout; configure `logging` (or a handler on the
"meshfuser" logger) to send them elsewhere."""
import atexit
import logging
import sys

from . import _C

logger = logging.getLogger("meshfuser")


class _StdoutUntilConfigured(logging.Handler):
    """Prints records while no other handler would: neither the root logger nor a "meshfuser"
    logger has one of the application's own."""

    def emit(self, record):
        node = logging.getLogger(record.name)
        while node is not None:
            if any(h is not self for h in node.handlers):
                return
            if not node.propagate:
                break
            node = node.parent
        try:
            sys.stdout.write(self.format(record) + "\n")
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 (logging must never raise into a run)
            self.handleError(record)


def _sink(topic, text):
    level = logging.WARNING if topic == "warning" else logging.INFO
    logging.getLogger(f"meshfuser.{topic}").log(level, text)


def install():
    if not any(isinstance(h, _StdoutUntilConfigured) for h in logger.handlers):
        logger.addHandler(_StdoutUntilConfigured())
    if logger.level == logging.NOTSET:
        # Records exist only when MESHFUSER_DUMP asks for them: let INFO through.
        logger.setLevel(logging.INFO)
    _C._set_log_sink(_sink)
    # No calls into Python from C++ once the interpreter is going away.
    atexit.register(_C._set_log_sink, None)


def set_rank(rank):
    _C._set_log_rank(int(rank))
