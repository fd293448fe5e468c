"""The command line: a thin layer over the Python API (tunebench.run, tunebench.Store)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import sys
import traceback
from collections.abc import Sequence

from tunebench import __version__
from tunebench.commands.tune import GOAL_DEFAULT
from tunebench.config import EvalConfig, HwConfig, InferConfig, LoadConfig
from tunebench.errors import UserError
from tunebench.flags import Parser, add_config_flags, add_data_flags, add_run_options, add_train_options
from tunebench.flags import add_store as _store_arg
from tunebench.launch import lean

INTERNAL_ERROR = 3  # our bug: not bad input (2), not a failed run or regression (1)
ENVIRONMENT = 74  # the machine's fault (EX_IOERR): a full disk, a read-only or forbidden path
ENVIRONMENT_FAULTS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO, errno.EMFILE,
                      errno.ENFILE}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tunebench", description="Benchmark and run LLM fine-tuning.")
    parser.add_argument("--version", action="version", version=f"tunebench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    add_run_options(sub.add_parser("run", help="run one training benchmark and store its record"))

    add_train_options(sub.add_parser("train", help="fine-tune on your own data with the benchmark's engine: "
                                                   "checkpoints, resume, the adapter or model out, a record"))

    pl = sub.add_parser("plan", help="predict peak memory per GPU (item by item), tokens/s and step time of a run "
                                     "or train config on a GPU, without running it")
    pl.add_argument("config", nargs="?", help="YAML run or train config; flags override its keys")
    add_config_flags(pl)
    add_data_flags(pl)
    pl.add_argument("--gpu", help="the GPU to plan for (default: this machine's), e.g. H100-80GB, H200, A100-40GB")
    pl.add_argument("--json", action="store_true", help="print the prediction as JSON (the record's metric names, "
                                                        "the breakdown beside them)")
    pl.add_argument("--compare", action="store_true", help="a table over strategies and world sizes")
    pl.add_argument("--gpus", help="with --compare: world sizes (default 1,2,4,8)")
    pl.add_argument("--strategies", help="with --compare: strategies (default all)")
    pl.add_argument("--no-store", action="store_true", help="use the spec sheet, not the store's hw measurements")
    pl.add_argument("--calibration", action="store_true", help="print the planner's fitted constants (value, unit, "
                                                              "what each was fitted on) and exit")
    pl.add_argument("--max", choices=["batch", "seq-len", "model-size"], help="the largest micro-batch, sequence "
                                                                             "length or preset model that fits")
    pl.add_argument("--validate", metavar="SOURCE", help="check the planner against measured GPU runs: a results "
                                                         "store, a results export, a record.json or a folder of "
                                                         "them; runs it was fitted on apart from the rest")
    _store_arg(pl)

    tu = sub.add_parser("tune", help="find the best configuration with few short runs: the planner ranks, real "
                                     "runs decide; writes best.yaml (for run and train) and the Pareto front")
    tu.add_argument("config", nargs="?", help="YAML run config (the baseline); flags override its keys")
    add_config_flags(tu)
    tu.add_argument("--goal", default=GOAL_DEFAULT,
                    help="throughput (tokens/s), cost ($ per 1M tokens, from the price sheet), memory (peak per GPU) "
                         "or context (the longest sequence that trains at the batch size); --objective takes these "
                         "words too")
    tu.add_argument("--max-runs", type=int, help="at most this many runs, the baseline included (default 12; with "
                                                 "--resume: raises the stored budget)")
    tu.add_argument("--max-minutes", type=float, help="stop starting runs after this many minutes (default 60; with "
                                                      "--resume: raises the stored budget)")
    tu.add_argument("--global-batch", type=int, help="hold samples per optimizer step: accumulation follows the "
                                                     "micro-batch and GPUs")
    tu.add_argument("--seq-lens", help="also try these sequence lengths (changes the workload), e.g. 512,1024")
    tu.add_argument("--gpus", help="world sizes to try, e.g. 1,2,4 (default the config's)")
    tu.add_argument("--strategies", help="strategies to try (default every one that accepts the method)")
    tu.add_argument("--optimizers", help="optimizers to try (default the config's and adamw_fused)")
    tu.add_argument("--fixed", help="levers to keep as the config has them: any of strategy, checkpointing, "
                                    "compile, optimizer, float8, memory, batch (comma-separated; float8 is tried "
                                    "only for full fine-tunes on GPUs with float8 tensor cores, with torchao; "
                                    "memory, mlp_chunk and offload, for --goal context on GPUs)")
    tu.add_argument("--trial-warmup", type=int, default=5, help="untimed steps per candidate (5)")
    tu.add_argument("--trial-steps", type=int, default=8, help="timed steps per candidate (8)")
    tu.add_argument("--prices", help="price sheet YAML replacing the shipped one (objective cost, $ on the front)")
    tu.add_argument("--resume", metavar="TUNE_ID", help="continue a tune (its settings and budget as stored)")
    tu.add_argument("--out", help="folder for best.yaml, pareto.png, tune.json (default ./tunebench-tune)")
    tu.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a tunebench "
                                                         "tune's")
    tu.add_argument("--json", action="store_true", help="print the tune's summary as JSON")
    tu.add_argument("--no-store", action="store_true", help=argparse.SUPPRESS)
    _store_arg(tu)

    sw = sub.add_parser("sweep", help="run a suite of configurations, each in its own process, resumably")
    sw.add_argument("suite", nargs="?", help="suite YAML file or built-in name (quick, full, diagnostic, scaling, "
                                             "seed-qlora)")
    sw.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key in every run")
    sw.add_argument("--dry-run", action="store_true", help="print the expanded configurations and their count")
    sw.add_argument("--repeats", type=_repeats, default=None, help="runs per configuration (default 1); the summary "
                                                              "gives mean, std and CV")
    sw.add_argument("--resume", metavar="SWEEP_ID", help="run only what this sweep has no ok result for")
    sw.add_argument("--run-timeout", type=_seconds, default=3600.0, help="seconds one configuration may take "
                                                                      "(default 3600); then status timeout")
    sw.add_argument("--json", action="store_true", help="print the sweep's records as JSON")
    sw.add_argument("--definition", help="run one task of a deployed sweep: its definition (JSON, written by "
                                         "tunebench deploy --sweep)")
    sw.add_argument("--index", help="with --definition: the task's index, or auto (JOB_COMPLETION_INDEX or "
                                    "SLURM_ARRAY_TASK_ID)")
    sw.add_argument("--group", help="with --definition: the GPU-count group the index counts in (Kubernetes)")
    sw.add_argument("--print-result", action="store_true", help="with --definition: print the record between "
                                                                "markers for tunebench collect")
    _store_arg(sw)

    con = sub.add_parser("consistency", help="the same config on each local GPU in turn (or stored runs from "
                                             "several nodes): spread against ±5%% throughput, ±2%% memory")
    con.add_argument("config", nargs="?", help="YAML run config; flags override its keys")
    add_config_flags(con)
    con.add_argument("--sweep", help="compare the stored ok runs of this sweep instead of running")
    con.add_argument("--with-tag", dest="with_tag", help="compare the stored ok runs with this tag instead of running")
    _store_arg(con)

    dep = sub.add_parser("deploy", help="Kubernetes manifests or a Slurm script running tunebench: "
                                        "tunebench deploy k8s|slurm [options] -- run <args>")
    dsub = dep.add_subparsers(dest="target", required=True, parser_class=Parser)
    k8s = dsub.add_parser("k8s", help="JobSet (default), Indexed Job + headless Service, or Kubeflow TrainJob")
    k8s.add_argument("--name", required=True)
    k8s.add_argument("--image", required=True)
    k8s.add_argument("--kind", choices=("jobset", "indexed-job", "trainjob"), default="jobset")
    k8s.add_argument("--namespace")
    k8s.add_argument("--pvc", help="PersistentVolumeClaim holding the results store (mounted at /results)")
    k8s.add_argument("--fabric", choices=("ethernet", "infiniband"), default="ethernet")
    k8s.add_argument("--host-network", action="store_true")
    k8s.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE")
    k8s.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE]:EFFECT")
    k8s.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME")
    k8s.add_argument("--shm-size", default="16Gi")
    k8s.add_argument("--max-restarts", type=int, default=0, help="restarts after a failed pod (JobSet failurePolicy, "
                                                                 "Indexed Job backoffLimit): a train job resumes")
    slurm = dsub.add_parser("slurm", help="an sbatch script with srun + tunebench (torchrun inside)")
    slurm.add_argument("--job-name", default="tunebench")
    slurm.add_argument("--partition")
    slurm.add_argument("--time")
    slurm.add_argument("--store", help="results store path on the cluster's shared file system")
    for p in (k8s, slurm):
        p.add_argument("--sweep", metavar="SUITE", help="spread a suite (built-in or YAML) over the cluster: one task "
                                                        "per configuration (no arguments after --)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="with --sweep: override a config key")
        p.add_argument("--repeats", type=_repeats, help="with --sweep: runs per configuration (default 1)")
        p.add_argument("--parallelism", type=int, default=4, help="with --sweep: tasks at once (default 4)")
        p.add_argument("--resume", metavar="SWEEP_ID", help="deploy only the tasks this sweep has no ok result for "
                                                            "(from the local store)")
        p.add_argument("--sweep-store", help="the local store the sweep is registered in and resumed from "
                                             "(default $TUNEBENCH_STORE or ./tunebench-results/results.db)")
        p.add_argument("--nodes", type=int, default=1)
        p.add_argument("--gpus-per-node", type=int, default=1)
        p.add_argument("-o", "--output", help="write here instead of stdout")

    col = sub.add_parser("collect", help="read marked result records from logs (files or -) into the store")
    col.add_argument("files", nargs="+", help="log files, or - for standard input")
    _store_arg(col)

    rep = sub.add_parser("report", help="report.md, report.html, plots, CSV and Parquet from the results store")
    pick = rep.add_mutually_exclusive_group()
    pick.add_argument("--sweep", help="one sweep's results")
    pick.add_argument("--all", action="store_true", help="every result in the store (the default)")
    rep.add_argument("--out", default="tunebench-report", help="output folder (default ./tunebench-report)")
    rep.add_argument("--prices", help="price sheet YAML replacing the shipped one")
    rep.add_argument("--job-samples", type=int, default=10_000, help="job size for time and cost (default 10,000)")
    rep.add_argument("--title", help="report title")
    rep.add_argument("--publish", action="store_true", help="also one Markdown file per configuration (publish/)")
    rep.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a tunebench "
                                                          "report (its other files are left alone)")
    _store_arg(rep)

    cost = sub.add_parser("cost", help="cost of one stored result for a job of N samples")
    cost.add_argument("id", help="result id or unique prefix")
    cost.add_argument("--samples", type=int, default=10_000)
    cost.add_argument("--prices", help="price sheet YAML replacing the shipped one")
    _store_arg(cost)

    cmp_ = sub.add_parser("compare", help="compare two sweeps, stores (.db) or exported files (.jsonl)")
    cmp_.add_argument("a", help="the reference")
    cmp_.add_argument("b", help="the candidate")
    cmp_.add_argument("--threshold", type=_fraction, default=0.05, help="flag changes beyond this fraction (0.05)")
    _store_arg(cmp_)

    for name, cls, help_ in (
            ("hw", HwConfig, "what the machine can do: matmul TFLOP/s (MAMF), memory and host<->device bandwidth, "
                             "all-reduce/all-gather/reduce-scatter across local GPUs (gloo processes on CPU)"),
            ("load", LoadConfig, "load time and memory of a model at each precision (bf16, fp16, int8, nf4)"),
            ("infer", InferConfig, "text generation: tokens/s, time to first token, prefill and decode rates by batch "
                                   "size and precision")):
        b = sub.add_parser(name, help=help_)
        b.add_argument("config", nargs="?", help="YAML config; flags override its keys")
        add_config_flags(b, cls)
        b.add_argument("--json", action="store_true", help="print the records as JSON on stdout")
        b.add_argument("--no-store", action="store_true", help="do not write the records to the store")
        _store_arg(b)

    ev = sub.add_parser("eval", help="score a model, an adapter or a training job's output (and its base) on "
                                     "lm-evaluation-harness tasks")
    ev.usage = "%(prog)s MODEL|OUTPUT_DIR --tasks T1,T2 [--limit N] [--KEY VALUE ...] [--json] [--no-store]"
    ev.add_argument("target", nargs="?", metavar="MODEL|OUTPUT_DIR", help="a model folder, a peft adapter folder, "
                                                                          "or a `tunebench train` output_dir")
    add_config_flags(ev, EvalConfig)
    ev.add_argument("--json", action="store_true", help="print the records as JSON on stdout")
    ev.add_argument("--no-store", action="store_true", help="do not write the records to the store")
    _store_arg(ev)

    gg = sub.add_parser("export", help="a trained model out as GGUF (llama.cpp, Ollama, LM Studio)")
    gg.add_argument("source", metavar="OUTPUT_DIR|MODEL", help="a `tunebench train` output_dir, a model folder or "
                                                               "a peft adapter folder")
    gg.add_argument("--format", choices=("gguf",), default="gguf", help="the file format (gguf)")
    gg.add_argument("--quant", choices=("f16", "bf16", "q8_0"), default="f16", help="the weights' type (norms stay "
                                                                                   "fp32; default f16)")
    gg.add_argument("-o", "--output", help="the file to write (default OUTPUT_DIR/model.gguf, or "
                                           "MODEL-QUANT.gguf beside a model folder)")
    gg.add_argument("--overwrite", action="store_true", help="replace an existing file")
    gg.add_argument("--json", action="store_true", help="print what was written as JSON on stdout")

    quick = sub.add_parser("quick", help="a quick benchmark sized for this machine, with a comparison table")
    quick.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    quick.add_argument("--out", default="tunebench-report", help="report folder (default ./tunebench-report)")
    _store_arg(quick)

    res = sub.add_parser("results", help="list, show or export stored results")
    rsub = res.add_subparsers(dest="action", required=True, parser_class=Parser)
    ls = rsub.add_parser("list", help="one line per stored result")
    ls.add_argument("--kind")
    ls.add_argument("--sweep")
    show = rsub.add_parser("show", help="one result's full record as JSON")
    show.add_argument("id", help="result id or a unique prefix of it")
    exp = rsub.add_parser("export", help="all results as CSV or JSON lines")
    exp.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    exp.add_argument("-o", "--output", help="file to write (default stdout)")
    rsub.add_parser("schema", help="print the result record's JSON schema")
    merge = rsub.add_parser("merge", help="merge stores written by separate nodes into --store (duplicates skipped)")
    merge.add_argument("stores", nargs="+")
    for p in (ls, show, exp, merge):
        _store_arg(p)
    return parser


MAX_REPEATS = 1000  # runs of one configuration: beyond this a sweep is a mistake, not a measurement


def _seconds(text: str) -> float:
    v = float(text)
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return v


def _fraction(text: str) -> float:
    v = float(text)
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a fraction of 0 or more (0.05 is 5%)")
    return v


def _repeats(text: str) -> int:
    v = int(text)
    if not 1 <= v <= MAX_REPEATS:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 to {MAX_REPEATS:,} runs per configuration")
    return v


def _command(name: str):
    """The handler of a subcommand, imported only when it runs (keeps `--help` and bad input fast)."""
    from tunebench.commands import bench, deploy, export, plan, results, run, sweep, train, tune

    return {"hw": bench.cmd_hw, "load": bench.cmd_load, "infer": bench.cmd_infer, "eval": bench.cmd_eval,
            "export": export.cmd_export, "run": run.cmd_run,
            "quick": run.cmd_quick, "sweep": sweep.cmd_sweep, "consistency": sweep.cmd_consistency,
            "results": results.cmd_results, "report": results.cmd_report, "cost": results.cmd_cost,
            "compare": results.cmd_compare, "deploy": deploy.cmd_deploy, "collect": deploy.cmd_collect,
            "train": train.cmd_train, "plan": plan.cmd_plan, "tune": tune.cmd_tune}[name]


def main(argv: Sequence[str] | None = None) -> int:
    lean.install()
    argv = list(sys.argv[1:] if argv is None else argv)
    user_args: list[str] = []
    if argv[:1] == ["deploy"] and "--" in argv:  # everything after -- is tunebench's own arguments, verbatim
        cut = argv.index("--")
        argv, user_args = argv[:cut], argv[cut + 1:]
    try:
        args = build_parser().parse_args(argv)
        args.user_args = user_args
        args.stdout = sys.stdout  # results go here; anything libraries print (DeepSpeed logs) goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            return _command(args.command)(args)
    except UserError as err:
        print(f"tunebench: error: {_readable(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tunebench: interrupted", file=sys.stderr)
        return 130
    except OSError as err:
        if err.errno not in ENVIRONMENT_FAULTS:
            return _report_internal(err)
        where = f"{err.filename}: " if err.filename else ""
        print(f"tunebench: error: {where}{err.strerror or os.strerror(err.errno)} (the machine's, not the "
              f"configuration's: free space or fix permissions, then run again)", file=sys.stderr)
        return ENVIRONMENT
    except Exception as err:  # not bad input: say what broke in one line (the traceback on request)
        return _report_internal(err)


def _report_internal(err: BaseException) -> int:
    if os.environ.get("TUNEBENCH_DEBUG"):
        traceback.print_exception(err)
    what = _readable(str(err).strip().splitlines()[0] if str(err).strip() else "")
    print(f"tunebench: internal error: {type(err).__name__}: {what} (TUNEBENCH_DEBUG=1 shows the traceback)",
          file=sys.stderr)
    return INTERNAL_ERROR


def _readable(text: str, limit: int = 2000) -> str:
    """An error at a readable length, whatever a value in it held."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit:,} more characters)"


def entry() -> None:
    """The `tunebench` command: main, then an exit that skips the interpreter's teardown (0.3-0.9 s with torch
    and transformers loaded). Everything main wrote is closed by then; `main` itself stays a plain function."""
    from tunebench.launch.processes import exit_now

    exit_now(main())


if __name__ == "__main__":
    entry()
