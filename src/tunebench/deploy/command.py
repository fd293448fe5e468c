"""The command every deployment runs: `tunebench run ...` with the multi-node flags added.

User-supplied arguments are passed as an exec array, never through a shell, so spaces, quotes,
backticks and newlines stay literal. Kubernetes still expands `$(VAR)` and reduces `$$` to `$` in
command and args, so every `$` of the user's is written as `$$`, which Kubernetes turns back into `$`.
"""

from __future__ import annotations

from tunebench.errors import UserError

RDZV_PORT = 29400
MARKER_BEGIN = "---TUNEBENCH-RESULT-BEGIN---"
MARKER_END = "---TUNEBENCH-RESULT-END---"


def marked(record_json: str) -> str:
    """A record between the markers `tunebench collect` looks for in logs."""
    return f"{MARKER_BEGIN}\n{record_json}\n{MARKER_END}"


def check_user_args(args: list[str], nodes: int) -> None:
    if not args or args[0] not in ("run", "sweep"):
        raise UserError("give the tunebench arguments after --, starting with run or sweep "
                        "(e.g. -- run --model mistral-7b --method qlora)")
    if args[0] == "sweep" and nodes > 1:
        raise UserError("a multi-node deployment runs one distributed `tunebench run`; sweeps run on one node")
    reserved = {"--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id", "--nproc-per-node", "--store"}
    clash = sorted(reserved & {a.split("=")[0] for a in args})
    if clash:
        raise UserError(f"{clash[0]} is set by the deployment; leave it out of the tunebench arguments")


def tunebench_argv(user_args: list[str], nodes: int, gpus: int, node_rank: str, endpoint: str,
                   rdzv_id: str, store: str | None) -> list[str]:
    """The argv (unexpanded: `node_rank`, `endpoint`, `rdzv_id` may hold $(VAR) / $VAR for the platform)."""
    check_user_args(user_args, nodes)
    argv = ["tunebench", *user_args]
    if user_args[0] == "run":
        argv += ["--nproc-per-node", str(gpus)]
        if nodes > 1:
            argv += ["--nnodes", str(nodes), "--node-rank", node_rank, "--rdzv-endpoint", endpoint,
                     "--rdzv-id", rdzv_id]
        argv.append("--print-result")  # the record between markers in the log, whatever the store
    argv += ["--store", store] if store else []
    return argv


def k8s_escape(arg: str) -> str:
    return arg.replace("$", "$$")
