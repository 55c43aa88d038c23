"""The fault suite: one job per out-of-step fault, each a fresh set of CPU (Gloo) ranks, so that a
broken group cannot spill into the next fault. Out-of-step faults run under torchrun; rank death
and the exit path use a plain launcher (torchrun would stop the survivors when a rank dies). Every
job has a hard timeout: a hang is a failure. Exits non-zero when any job fails."""
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("MESHFUSER_TEST_DEVICE", "cpu")
    env["CUDA_VISIBLE_DEVICES"] = ""  # the fault suite runs on CPU ranks (Gloo)
    env.update(extra)
    return env


def torchrun(script, n, env, timeout):
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", os.path.join(HERE, script)]
    return run_group([cmd], env, timeout)


def spawn(script, n, env, timeout):
    """n ranks as plain processes (the launcher's variables set by hand)."""
    port = str(free_port())
    cmds, envs = [], []
    for r in range(n):
        e = dict(env, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmds.append([PY, os.path.join(HERE, script)])
        envs.append(e)
    return run_group(cmds, envs, timeout)


def run_group(cmds, envs, timeout):
    """Runs the commands at once; returns (exit codes, output). A command still running at the
    deadline is killed with its process group and gets exit code 'timeout'."""
    if isinstance(envs, dict):
        envs = [envs] * len(cmds)
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for c, e in zip(cmds, envs)]
    deadline = time.monotonic() + timeout
    codes, outputs = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            codes.append(p.returncode)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            codes.append("timeout")
        outputs.append(out)
    return codes, "\n".join(outputs)


def main():
    quick = dict(MESHFUSER_VALIDATION_TIMEOUT_S="5", MESHFUSER_PG_TIMEOUT_S="5")
    jobs = [  # name, launcher, script, ranks, env, timeout (s), expected exit codes
        ("skip an execute, then run another program", torchrun, "fault_skip_then_other_program.py", 3, quick, 90, [0]),
        ("skip one of three calls of a definition (told when the rank shuts down)", torchrun,
         "fault_skip_same_definition.py", 2, quick, 90, [0]),
        ("skip one of three calls of a stream-loop program", torchrun, "fault_skip_same_definition.py", 3,
         dict(quick, FAULT_PROGRAM="stream_loop"), 90, [0]),
        ("skip the last execute (agreement timeout)", torchrun, "fault_skip_last_call.py", 2, quick, 90, [0]),
        ("skip an execute with the agreement disabled (data timeout)", torchrun, "fault_data_timeout.py", 2,
         dict(quick, MESHFUSER_DISABLE="collective_validation"), 90, [0]),
        ("a rank fails after the agreement, before posting (default mode)", torchrun, "fault_after_agreement.py", 2,
         dict(quick, MESHFUSER_INJECT_FAULT="after_agreement:1"), 90, [0]),
        ("a rank fails after the last communication (strict mode tells the others)", torchrun,
         "fault_after_agreement.py", 3, dict(quick, MESHFUSER_INJECT_FAULT="at_end:2", MESHFUSER_DISTRIBUTED_DEBUG="DETAIL"),
         90, [0]),
        ("a rank dies before a call", spawn, "fault_rank_death.py", 4, quick, 90, [0, 0, 0, 3]),
        ("a rank dies during a call (agreement disabled)", spawn, "fault_rank_death.py", 2,
         dict(quick, MESHFUSER_DISABLE="collective_validation"), 90, [0, 3]),
    ]
    runs = int(os.environ.get("MESHFUSER_SHUTDOWN_RUNS", "20"))
    for i in range(runs):
        jobs.append((f"exit path with dist.destroy_process_group(), run {i + 1}/{runs}", spawn, "fault_shutdown.py", 2,
                     dict(FAULT_USER_INIT=str(i % 2)), 60, [0, 0]))
    only = sys.argv[1:]
    failures = []
    for name, launcher, script, n, env, timeout, expected in jobs:
        if only and not any(o in script for o in only):
            continue
        start = time.monotonic()
        codes, output = launcher(script, n, base_env(env), timeout)
        took = time.monotonic() - start
        ok = codes == expected
        print(f"[fault] {'ok  ' if ok else 'FAIL'} {name} ({n} ranks, {took:.1f} s, exit codes {codes})", flush=True)
        if not ok:
            failures.append(name)
            print(output[-6000:], flush=True)
        elif os.environ.get("MESHFUSER_FAULT_VERBOSE"):
            print(output[-3000:], flush=True)
    if failures:
        print("[fault] FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("[fault] all fault jobs passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
