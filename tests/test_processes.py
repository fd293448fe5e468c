"""No process outlives its run: timeouts and killed sweeps end every rank; one runner per sweep; no litter."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from conftest import cli_subprocess, runs_alive, runs_gone
from tunebench.store import Store

TINY = {"model": "tiny-llama", "device": "cpu", "seq_len": 32, "batch_size": 1, "steps": 4, "warmup": 1}
def _suite(tmp_path, runs, name="p") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "base": TINY, "runs": runs}))
    return path


def test_sweep_timeout_ends_every_rank(tmp_path):
    path = _suite(tmp_path, [{"name": "hang", "strategy": "ddp", "nproc_per_node": 2, "fault": "hang@1",
                              "tag": ["t-timeout"]}])
    p = cli_subprocess("sweep", str(path), "--store", str(tmp_path / "r.db"), "--run-timeout", "10", "--json",
                       timeout=300)
    (rec,) = json.loads(p.stdout)
    assert rec["status"] == "timeout"
    assert runs_gone("t-timeout"), "a rank outlived its timed-out run"


def test_killed_sweep_takes_its_ranks_with_it(tmp_path):
    path = _suite(tmp_path, [{"name": "long", "strategy": "ddp", "nproc_per_node": 2, "steps": 100000,
                              "tag": ["t-killed"]}])
    sweep = subprocess.Popen([sys.executable, "-m", "tunebench.cli", "sweep", str(path), "--store",
                              str(tmp_path / "r.db")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline and len([p for p in runs_alive("t-killed")
                                          if "tunebench.launch.worker" in " ".join(p.cmdline())]) < 2:
        time.sleep(0.5)
    assert time.time() < deadline, "the ranks never started"
    sweep.send_signal(signal.SIGKILL)
    sweep.wait()
    assert runs_gone("t-killed"), "ranks outlived their killed sweep"


def test_run_timeout_ends_a_hung_distributed_run(tmp_path):
    started = time.time()
    p = cli_subprocess("run", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "32", "--steps", "4",
                       "--warmup", "1", "--strategy", "ddp", "--nproc-per-node", "2", "--fault", "hang@1",
                       "--tag", "t-run-timeout", "--run-timeout", "10", "--json", "--store", str(tmp_path / "r.db"),
                       timeout=300)
    rec = json.loads(p.stdout)
    assert p.returncode == 1 and rec["status"] == "timeout" and "10 s" in rec["error"]
    assert time.time() - started < 120
    assert runs_gone("t-run-timeout")
    assert [r.status for r in Store(tmp_path / "r.db").records()] == ["timeout"]


def test_watchdog_ends_ranks_stuck_outside_a_collective(tmp_path):
    # every rank hangs between steps: no collective waits, so only the step watchdog (`timeout`) can end them
    started = time.time()
    p = cli_subprocess("run", "--model", "tiny-llama", "--device", "cpu", "--seq-len", "32", "--steps", "4",
                       "--warmup", "1", "--strategy", "ddp", "--nproc-per-node", "2", "--fault", "hang@1",
                       "--tag", "t-watchdog", "--timeout", "6", "--json", "--store", str(tmp_path / "r.db"),
                       timeout=300)
    rec = json.loads(p.stdout)
    assert p.returncode == 1 and rec["status"] == "timeout", rec["error"]
    assert "made no progress for 6 s" in rec["error"] and "inject_fault" in rec["error"]  # where it was stuck
    assert "To enable traceback" not in rec["error"]
    assert time.time() - started < 120
    assert runs_gone("t-watchdog")


def test_one_runner_per_sweep(tmp_path):
    path = _suite(tmp_path, [{"name": "slow", "steps": 100000, "tag": ["t-lock"]}, {"name": "b"}])
    store = tmp_path / "r.db"
    first = subprocess.Popen([sys.executable, "-m", "tunebench.cli", "sweep", str(path), "--store", str(store)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        sweep_id = None
        while time.time() < deadline and not sweep_id:
            if store.exists():
                with Store(store) as s:
                    row = s.conn.execute("SELECT name FROM locks").fetchone()
                    sweep_id = row[0].split(" ", 1)[1] if row else None
            time.sleep(0.3)
        assert sweep_id, "the first sweep never took its lock"
        second = cli_subprocess("sweep", "--resume", sweep_id, "--store", str(store), timeout=120)
        assert second.returncode == 2 and "is being run by process" in second.stderr, second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert runs_gone("t-lock")
    with Store(store) as s:  # its owner died (kill -9 left the lock behind): the next runner takes it over
        s.acquire(f"sweep {sweep_id}")
        s.release(f"sweep {sweep_id}")


def test_stale_run_directories_are_cleaned(tmp_path):
    from tunebench.launch.rundir import RunDir

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = Path(tempfile.mkdtemp(prefix="tunebench-run-"))
    (stale / "owner").write_text(f"{dead.pid} {os.uname().nodename}")
    (stale / "job.json").write_text("{}")
    live = Path(tempfile.mkdtemp(prefix="tunebench-sweep-"))
    (live / "owner").write_text(f"{os.getpid()} {os.uname().nodename}")
    try:
        with RunDir.temporary() as fresh:
            assert fresh.path.is_dir()
        assert not stale.exists() and live.exists() and not fresh.path.exists()
    finally:
        import shutil

        shutil.rmtree(live, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)


def test_the_fast_exit_waits_for_a_thread_still_writing(tmp_path):
    """exit_now skips the interpreter's teardown but not what its exit would wait for: a non-daemon thread (a
    tracker's upload) finishes and atexit handlers run, in that order; an executor's idle worker (torch.compile
    keeps some) is stopped, not waited for forever."""
    out = tmp_path / "out.txt"
    code = f"""
import atexit, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tunebench.launch.processes import exit_now
out = Path({str(out)!r})
def write():
    time.sleep(0.5)
    out.write_text("thread")
ThreadPoolExecutor(1).submit(lambda: 1).result()  # its worker stays, idle, until the executor is shut down
threading.Thread(target=write).start()
atexit.register(lambda: out.write_text(out.read_text() + ", atexit"))
exit_now(3)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and out.read_text() == "thread, atexit", p.stderr
