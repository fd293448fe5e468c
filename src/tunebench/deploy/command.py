"""The command every deployment runs: `tunebench run ...` with the multi-node flags added.

User-supplied arguments are passed as an exec array, never through a shell, so spaces, quotes,
backticks and newlines stay literal. Kubernetes still expands `$(VAR)` and reduces `$$` to `$` in
command and args, so every `$` of the user's is written as `$$`, which Kubernetes turns back into `$`.
"""

from __future__ import annotations

import hashlib

from tunebench.errors import UserError

RDZV_PORT = 29400
MARKER_BEGIN = "---TUNEBENCH-RESULT-BEGIN---"
MARKER_END = "---TUNEBENCH-RESULT-END---"


def marked(record_json: str) -> str:
    """A record (one line of JSON) between the marker lines `tunebench collect` reads, with its checksum."""
    data = record_json.encode()
    return f"{MARKER_BEGIN} sha256={hashlib.sha256(data).hexdigest()} bytes={len(data)}\n{record_json}\n{MARKER_END}"


def check_user_args(args: list[str], nodes: int, gpus: int | None = None) -> None:
    """The tunebench arguments after `--`: a run or sweep, nothing the deployment sets, valid as `run` checks them."""
    from tunebench.deploy.check import check_run_args, check_sweep_args

    if not args or args[0] not in ("run", "sweep", "train"):
        raise UserError("give the tunebench arguments after --, starting with run, train or sweep "
                        "(e.g. -- run --model mistral-7b --method qlora)")
    if args[0] == "sweep" and nodes > 1:
        raise UserError("a multi-node deployment runs one distributed `tunebench run`; sweeps run on one node")
    reserved = {"--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id", "--nproc-per-node", "--store"}
    clash = sorted(reserved & {a.split("=")[0] for a in args})
    if clash:
        raise UserError(f"{clash[0]} is set by the deployment; leave it out of the tunebench arguments")
    if gpus is not None:
        (check_sweep_args(args[1:]) if args[0] == "sweep" else check_run_args(args[1:], nodes, gpus, args[0]))


def tunebench_argv(user_args: list[str], nodes: int, gpus: int, node_rank: str, endpoint: str,
                   rdzv_id: str, store: str | None) -> list[str]:
    """The argv (unexpanded: `node_rank`, `endpoint`, `rdzv_id` may hold $(VAR) / $VAR for the platform)."""
    check_user_args(user_args, nodes)
    argv = ["tunebench", *user_args]
    if user_args[0] in ("run", "train"):
        argv += ["--nproc-per-node", str(gpus)]
        if nodes > 1:
            argv += ["--nnodes", str(nodes), "--node-rank", node_rank, "--rdzv-endpoint", endpoint,
                     "--rdzv-id", rdzv_id]
        argv.append("--print-result")  # the record between markers in the log, whatever the store
    if user_args[0] == "train" and not any(a.split("=")[0] == "--resume" for a in user_args):
        argv += ["--resume", "auto"]  # a restarted pod or requeued job continues from its latest checkpoint
    argv += ["--store", store] if store else []
    return argv


def k8s_escape(arg: str) -> str:
    return arg.replace("$", "$$")
