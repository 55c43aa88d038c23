"""Without logging configured, MESHFUSER_DUMP output is printed to stdout, rank in every line."""
import os
import subprocess
import sys


def test_dumps_print_to_stdout_when_logging_is_not_configured():
    code = ("import torch, meshfuser\n"
            "with meshfuser.FusionDefinition() as fd:\n"
            "    x = fd.define_tensor([2, 3]); fd.add_output(fd.ops.relu(x))\n"
            "fd.execute([torch.ones(2, 3)])\n")
    env = dict(os.environ, MESHFUSER_DUMP="host_program")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a process of its own: rank 0 of 1 on a free port
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line]
    assert lines and all(line.startswith("[meshfuser rank 0] ") for line in lines), run.stdout
    assert any("relu" in line for line in lines), run.stdout
