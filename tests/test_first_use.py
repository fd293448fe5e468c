"""First use: fast start, CPU defaults that make sense, honest wording, nothing cut or misleading."""

import io
import json
import subprocess
import sys
import time

import pytest

from conftest import QUICK, run_json
from tunebench.record import ResultRecord, TrainMetrics

NO_TORCH = ("import sys\nfrom tunebench.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules or 'transformers' in sys.modules else 'LIGHT', file=sys.stderr)")


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["run", "--batch-size", "0"], ["results", "schema"],
                                  ["results", "list", "--store", "/nonexistent/x.db"],
                                  ["deploy", "slurm", "--", "run", "--model", "mistral-7b"],
                                  ["report", "--store", "/nonexistent/x.db"]])
def test_light_commands_import_no_torch(argv):
    p = subprocess.run([sys.executable, "-c", NO_TORCH.format(argv=argv)], capture_output=True, text=True)
    assert p.stderr.strip().endswith("LIGHT"), p.stderr


def test_help_is_fast():
    """Under a second on the CI machine: the best of three starts (python itself included)."""
    best = 99.0
    for _ in range(3):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "tunebench.cli", "--help"], capture_output=True, text=True)
        best = min(best, time.perf_counter() - t0)
        assert p.returncode == 0 and "usage" in p.stdout.lower()
    assert best < 1.0, f"--help took {best:.2f} s"


def _parsers(parser):
    """Every parser under `parser` (its subcommands', recursively)."""
    import argparse

    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_command_prints_its_help():
    """Every subcommand's --help formats (a % in a field's description once broke `run --help`)."""
    from pydantic import BaseModel, Field

    from tunebench.cli import build_parser
    from tunebench.flags import Parser, add_config_flags

    helps = [p.format_help() for p in _parsers(build_parser())]
    assert len(helps) > 20 and any("--optimizer" in h for h in helps)

    class Percent(BaseModel):  # a description with a % sign, as argparse %-formats help
        model: str = Field("x", description="100% of it")

    p = Parser(prog="x")
    add_config_flags(p, Percent)
    assert "100% of it" in p.format_help()


def test_version(tb):
    code = 0
    try:
        tb("--version")
    except SystemExit as e:
        code = e.code
    assert code == 0


def test_cpu_runs_fp32_by_default_and_says_so(tb, store):
    rec = run_json(tb, store)
    assert rec["config"]["precision"] == "auto" and rec["metrics"]["precision"] == "fp32"
    code, out, _ = tb("run", *QUICK, "--no-store")
    assert "fp32 (auto)" in out


def test_a_model_too_big_for_host_memory_is_refused(tb, monkeypatch):
    import tunebench.run_preflight as run_preflight

    monkeypatch.setattr(run_preflight, "available_host_bytes", lambda: 8 * 2**30)
    code, _, err = tb("run", "--model", "mistral-7b", "--device", "cpu", "--method", "lora", "--no-store")
    assert code == 2 and "needs at least 27.0 GiB of host memory" in err and "7.25 B parameters" in err


def test_qlora_counts_the_parameters_it_stands_for(tb, store):
    lora = run_json(tb, store, "--method", "lora")["metrics"]
    qlora = run_json(tb, store, "--method", "qlora")["metrics"]
    assert qlora["params_total"] == lora["params_total"] and qlora["params_trainable"] == lora["params_trainable"]


def test_load_shows_host_memory_on_the_cpu(tb):
    code, out, _ = tb("load", "--device", "cpu", "--precisions", "bf16", "--json", "--no-store")
    (rec,) = json.loads(out)
    assert code == 0 and rec["metrics"]["rss_delta_bytes"] > 0.5 * rec["metrics"]["model_bytes"]


def test_cpu_wording(tb, store, tmp_path):
    run_json(tb, store)
    code, _, err = tb("report", "--store", str(store), "--out", str(tmp_path / "rep"), "--publish")
    assert code == 0
    text = (tmp_path / "rep" / "report.md").read_text() + "".join(
        p.read_text() for p in (tmp_path / "rep" / "publish").glob("*.md"))
    for wrong in ("per GPU", "0 GiB each", "driver None"):
        assert wrong not in text
    assert "CPU" in text


def _rec(tps: float, seq: int = 512, gpu: str = "NVIDIA H100 80GB HBM3", torch_v: str = "2.11") -> ResultRecord:
    cfg = {"model": "mistral-7b", "method": "qlora", "strategy": "single", "batch_size": 8, "grad_accum": 1,
           "seq_len": seq, "precision": "bf16"}
    return ResultRecord(config=cfg, config_hash=f"h{seq}", status="ok",
                        environment={"device": "cuda", "gpu": {"name": gpu}, "versions": {"torch": torch_v}},
                        metrics=TrainMetrics(tokens_per_s=tps, tokens_per_s_per_gpu=tps, samples_per_s=tps / seq))


def test_report_keeps_environments_apart_and_recommends_nothing_within_the_noise(tmp_path):
    from tunebench.report.build import write_report

    noisy_base = [_rec(1000.0), _rec(1100.0)]  # CV 6.7%: differences under ~13% are noise
    records = noisy_base + [_rec(1120.0, seq=1024), _rec(2000.0, seq=1024, gpu="NVIDIA H200")]
    write_report(records, tmp_path, [], "t")
    md = (tmp_path / "report.md").read_text()
    assert "4 runs of 2 configurations" in md
    assert "[NVIDIA H200" in md and "[NVIDIA H100" in md  # one config, two environments: never averaged
    assert "1,000.0 to 1,100.0 tokens/s, CV 6.7%" in md
    recommendations = md.split("## Recommendations")[1]
    assert "gains 7%" not in recommendations  # +6.7% against a baseline this noisy is no finding
    assert "gains 90%" in recommendations  # the H200 run is far beyond it


def test_tables_keep_figures_whole_in_120_columns():
    from rich.console import Console

    from tunebench.console import rich_table
    from tunebench.report.views import list_table

    recs = [_rec(1234567.8, gpu="NVIDIA H200 NVL with a long marketing name") for _ in range(3)]
    for r in recs:
        r.metrics.peak_mem_allocated_bytes = 76 * 2**30
    console = Console(file=io.StringIO(), width=120)
    console.print(rich_table(list_table(recs)))
    out = console.file.getvalue()
    assert out.count("1,234,567.8") == 3 and out.count("76.00 GiB") == 3


def test_a_cpu_run_lists_its_peak_host_memory(tb, tmp_path):
    from conftest import run_json

    run_json(tb, tmp_path / "r.db")
    code, out, _ = tb("results", "list", "--store", str(tmp_path / "r.db"))
    assert code == 0 and "peak memory" in out and " GiB RSS" in out


def test_a_long_run_says_how_long_it_will_take_and_never_goes_quiet(capsys, monkeypatch):
    from tunebench.config import RunConfig
    from tunebench.console import progress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])  # a step takes 50 ms of this clock
    with progress.run_progress(RunConfig(model="tiny-llama", device="cpu", steps=10**9)) as step:
        for i in range(5):
            clock[0] += 40 if i == 0 else 0.05  # the first step compiles: it says nothing of the others
            step(i, 6.9)
        clock[0] += 31  # a tenth of the run is far off: the log still hears from it
        step(5, 6.8)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].endswith("step 1/1,000,000,000 loss 6.9000 (40 s)")  # no guess from the compiling step alone
    assert "1,000,000,000 steps: about 579 days at 0.05 s a step (the first took 40 s)" in lines[1]
    assert "step 6/1,000,000,000 loss 6.8000 (71 s; about" in lines[2]
