"""The Python examples run (one process here; the multi-rank tests cover the same blocks sharded)."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run_example(name, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)  # one process: rank 0 of 1
    # On CPUs the examples compute in float32, which these tolerances are for (on a GPU they run
    # bfloat16; benchmarks/transformer_block.py and the bf16 training test cover that).
    env["CUDA_VISIBLE_DEVICES"] = ""
    run = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout


def _max_error(pattern, stdout):
    match = re.search(pattern + r" ([0-9.e+-]+)", stdout)
    assert match, stdout
    return float(match.group(1))


@pytest.mark.parametrize("form", ["tp", "sp"])
def test_gpt_block_example_matches_pytorch(form):
    stdout = _run_example("gpt_block.py", "--form", form, "--seq", "8", "--head-dim", "8", "--backward")
    assert _max_error(r"max \|error\| vs PyTorch", stdout) < 1e-4, stdout
    assert _max_error(r"max \|gradient error\| vs autograd", stdout) < 1e-4, stdout


@pytest.mark.parametrize("form", ["tp", "sp"])
def test_llama_block_example_matches_pytorch(form):
    stdout = _run_example("llama_block.py", "--form", form, "--seq", "8", "--head-dim", "8", "--ffn-per-rank", "24",
                          "--backward")
    assert _max_error(r"max \|error\| vs PyTorch", stdout) < 1e-4, stdout
    assert _max_error(r"max \|gradient error\| vs autograd", stdout) < 1e-4, stdout


@pytest.mark.parametrize("block", ["gpt", "llama"])
def test_transformer_block_benchmark_runs_on_cpu(tmp_path, block):
    """The benchmark's CPU smoke run: its own check of meshfuser against eager passes and it prints
    the table (torch.compile left out to keep this quick); the Llama-style block with 2 key/value
    heads for 4 query heads."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]),
               MESHFUSER_BENCH_DIR=str(tmp_path))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "transformer_block.py"), "--iters", "1",
                          "--no-compile", "--seq", "16", "--hidden", "32", "--heads", "4", "--kv-heads", "2",
                          "--ffn", "48", "--block", block], env=env,
                         capture_output=True, text=True, timeout=120, cwd=ROOT / "benchmarks")
    assert run.returncode == 0, run.stderr
    assert "meshfuser" in run.stdout and "eager" in run.stdout, run.stdout


def test_moe_layer_example_matches_autograd():
    stdout = _run_example("moe_layer.py", "--tokens", "12", "--experts", "4")
    assert _max_error(r"max \|error\| vs PyTorch", stdout) < 1e-4, stdout
    assert _max_error(r"max \|gradient error\| vs autograd", stdout) < 1e-4, stdout
    assert "AllToAll" in stdout and "dispatch: splits from" in stdout, stdout


def test_moe_layer_benchmark_runs_on_cpu(tmp_path):
    """The benchmark's CPU smoke run: it checks meshfuser against eager itself and prints the table."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]),
               MESHFUSER_BENCH_DIR=str(tmp_path), CUDA_VISIBLE_DEVICES="")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "moe_layer.py"), "--iters", "1", "--no-compile"],
                         env=env, capture_output=True, text=True, timeout=120, cwd=ROOT / "benchmarks")
    assert run.returncode == 0, run.stderr
    assert "meshfuser" in run.stdout and "eager" in run.stdout and "fwd_bwd_vs_eager" in run.stdout, run.stdout
