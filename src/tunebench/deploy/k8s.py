"""Kubernetes manifests for a tunebench run on N nodes of G GPUs: JobSet (default), Indexed Job +
headless Service, or Kubeflow Trainer TrainJob. Generated from the same arguments `tunebench run` takes.

Every pod runs `tunebench run ... --nnodes N --node-rank <its index> --rdzv-endpoint <pod 0>:29400`,
and tunebench starts torchrun itself (c10d rendezvous hosted by node rank 0). Results go to a PVC
store when one is named, and are always printed between markers in the log for `tunebench collect`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from tunebench.deploy import fields
from tunebench.deploy.command import RDZV_PORT, k8s_escape, tunebench_argv
from tunebench.errors import UserError

FABRIC_ENV = {
    # The seeds' notes: A10 VMs have plain Ethernet, no RDMA; A100/H100 bare metal has InfiniBand/RoCE.
    "ethernet": {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"},
    "infiniband": {"NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "5", "NCCL_SOCKET_IFNAME": "eth0"},
}
RESULTS_DIR = "/results"


@dataclass
class K8sJob:
    name: str
    nodes: int
    gpus_per_node: int
    image: str
    user_args: list[str]
    kind: str = "jobset"
    namespace: str | None = None
    pvc: str | None = None
    fabric: str = "ethernet"
    host_network: bool = False
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    image_pull_secrets: list[str] = field(default_factory=list)
    shm_size: str = "16Gi"
    max_restarts: int = 0


def _check(job: K8sJob) -> None:
    fields.dns_label("name", job.name, 42)  # pod names add "-node-0-0" and the like
    if job.namespace is not None:
        fields.dns_label("namespace", job.namespace)
    fields.image(job.image)
    fields.quantity("shm-size", job.shm_size)
    if job.pvc is not None:
        fields.dns_subdomain("pvc", job.pvc)
    for k, v in job.node_selector.items():
        fields.label_key("node-selector key", k)
        fields.label_value("node-selector value", v)
    for t in job.tolerations:
        fields.label_key("toleration key", t["key"])
        fields.label_value("toleration value", t.get("value", ""))
    for s in job.image_pull_secrets:
        fields.dns_subdomain("image-pull-secret", s)
    if job.max_restarts < 0:
        raise UserError(f"invalid max-restarts={job.max_restarts}: must be 0 or more")
    if job.nodes < 1 or job.gpus_per_node < 1:
        raise UserError("nodes and gpus-per-node must be positive")
    if job.kind == "trainjob" and job.host_network:
        raise UserError("--host-network with --kind trainjob: Kubeflow Trainer's runtime patches (v2.3) cannot set "
                        "hostNetwork; use --kind jobset or indexed-job")
    if job.fabric not in FABRIC_ENV:
        raise UserError(f"invalid fabric={job.fabric}: ethernet or infiniband")


def _argv(job: K8sJob, node_rank: str, endpoint: str) -> list[str]:
    store = f"{RESULTS_DIR}/results.db" if job.pvc else None
    return tunebench_argv([k8s_escape(a) for a in job.user_args], job.nodes, job.gpus_per_node, node_rank,
                          endpoint, job.name, store)


def _env(job: K8sJob, index_env: bool = True) -> list[dict]:
    env = {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "NCCL_DEBUG": "WARN"} | FABRIC_ENV[job.fabric]
    out = [{"name": k, "value": v} for k, v in env.items()]
    if index_env:  # the pod's completion index, declared here so that $(NODE_RANK) expands in the command
        out.append({"name": "NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}})
    return out


def _mounts(job: K8sJob) -> tuple[list[dict], list[dict]]:
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": job.shm_size}}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if job.pvc:
        volumes.append({"name": "results", "persistentVolumeClaim": {"claimName": job.pvc}})
        mounts.append({"name": "results", "mountPath": RESULTS_DIR})
    return volumes, mounts


def _pod_spec(job: K8sJob, argv: list[str], subdomain: str | None = None, index_env: bool = True) -> dict:
    volumes, mounts = _mounts(job)
    gpus = {"nvidia.com/gpu": job.gpus_per_node}
    spec: dict = {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True},
        "containers": [{
            "name": "tunebench", "image": job.image, "command": argv, "env": _env(job, index_env),
            "ports": [{"name": "rdzv", "containerPort": RDZV_PORT}],
            "resources": {"requests": dict(gpus), "limits": dict(gpus)}, "volumeMounts": mounts,
        }],
        "volumes": volumes,
    }
    if subdomain:
        spec["subdomain"] = subdomain
    if job.host_network:  # only when asked: it shares the node's network namespace
        spec |= {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
    if job.node_selector:
        spec["nodeSelector"] = dict(job.node_selector)
    if job.tolerations:
        spec["tolerations"] = list(job.tolerations)
    if job.image_pull_secrets:  # by name: no secret value is ever written here
        spec["imagePullSecrets"] = [{"name": n} for n in job.image_pull_secrets]
    return spec


def _meta(job: K8sJob, name: str | None = None) -> dict:
    meta = {"name": name or job.name, "labels": {"app.kubernetes.io/name": "tunebench",
                                                 "app.kubernetes.io/instance": job.name}}
    if job.namespace:
        meta["namespace"] = job.namespace
    return meta


def _indexed(job: K8sJob, pod: dict, backoff: int = 0) -> dict:
    # In a JobSet a failed pod fails its Job and the JobSet restarts every node (failurePolicy): the
    # rendezvous needs them all. A plain Indexed Job replaces failed pods itself, up to `backoff` times.
    return {"parallelism": job.nodes, "completions": job.nodes, "completionMode": "Indexed", "backoffLimit": backoff,
            "template": {"metadata": {"labels": {"app.kubernetes.io/instance": job.name}}, "spec": pod}}


def jobset(job: K8sJob) -> list[dict]:
    # JobSet names pods <jobset>-<replicatedJob>-<job index>-<pod index> under the subdomain <jobset>.
    endpoint = f"{job.name}-node-0-0.{job.name}:{RDZV_PORT}"
    pod = _pod_spec(job, _argv(job, "$(NODE_RANK)", endpoint))
    return [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": _meta(job),
             "spec": {"failurePolicy": {"maxRestarts": job.max_restarts},
                      "network": {"enableDNSHostnames": True},
                      "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": _indexed(job, pod)}}]}}]


def indexed_job(job: K8sJob) -> list[dict]:
    # An Indexed Job's pods are named <job>-<index>; the headless Service gives them <job>-<index>.<job>.
    endpoint = f"{job.name}-0.{job.name}:{RDZV_PORT}"
    pod = _pod_spec(job, _argv(job, "$(NODE_RANK)", endpoint), subdomain=job.name)
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(job),
               "spec": {"clusterIP": "None", "selector": {"batch.kubernetes.io/job-name": job.name},
                        "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT}]}}
    return [service, {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(job),
                      "spec": _indexed(job, pod, job.max_restarts)}]


def trainjob(job: K8sJob) -> list[dict]:
    # The torch-distributed runtime injects PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT.
    argv = _argv(job, "$(PET_NODE_RANK)", "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)")
    gpus = {"nvidia.com/gpu": job.gpus_per_node}
    pod = _pod_spec(job, argv, index_env=False)
    patch_pod = {k: v for k, v in pod.items() if k not in ("containers", "restartPolicy")}
    patch_pod["containers"] = [{"name": "node", "volumeMounts": pod["containers"][0]["volumeMounts"]}]
    return [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": _meta(job),
             "spec": {"runtimeRef": {"name": "torch-distributed"},
                      "trainer": {"image": job.image, "command": argv, "numNodes": job.nodes,
                                  "resourcesPerNode": {"requests": dict(gpus), "limits": dict(gpus)},
                                  "env": _env(job, index_env=False)},
                      "runtimePatches": [{"manager": "tunebench.dev/deploy", "trainingRuntimeSpec": {"template": {
                          "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
                              "spec": patch_pod}}}}]}}}}]}}]


KINDS = {"jobset": jobset, "indexed-job": indexed_job, "trainjob": trainjob}


def manifests(job: K8sJob) -> list[dict]:
    _check(job)
    if job.kind not in KINDS:
        raise UserError(f"invalid kind={job.kind}: {', '.join(KINDS)}")
    return KINDS[job.kind](job)


def to_yaml(docs: list[dict]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, width=1 << 20)


def sweep_manifests(job: K8sJob, tasks, parallelism: int) -> list[dict]:
    """A ConfigMap with the sweep's definition and one Indexed Job per GPU count: completion index i of the
    job for G GPUs runs that group's task i, at most `parallelism` at once, each pod asking for G GPUs."""
    from dataclasses import replace

    from tunebench.deploy.sweep import task_argv

    _check(job)
    if parallelism < 1:
        raise UserError(f"invalid parallelism={parallelism}: must be at least 1")
    name = f"{job.name}-sweep"
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(job, name),
                  "data": {"definition.json": tasks.definition_json()}}
    docs: list[dict] = [config_map]
    for gpus, positions in tasks.groups().items():
        store = f"{RESULTS_DIR}/{tasks.sweep_id}/g{gpus}-task-{{index}}.db" if job.pvc else "/tmp/tunebench.db"
        pod = _pod_spec(replace(job, gpus_per_node=gpus), task_argv("/sweep/definition.json", gpus, store),
                        index_env=False)
        pod["volumes"].append({"name": "sweep", "configMap": {"name": name}})
        pod["containers"][0]["volumeMounts"].append({"name": "sweep", "mountPath": "/sweep", "readOnly": True})
        del pod["containers"][0]["ports"]  # no rendezvous between tasks
        spec = {"parallelism": min(parallelism, len(positions)), "completions": len(positions),
                "completionMode": "Indexed", "backoffLimit": len(positions) * (job.max_restarts + 1),
                "template": {"metadata": {"labels": {"app.kubernetes.io/instance": job.name}}, "spec": pod}}
        docs.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(job, f"{job.name}-g{gpus}"),
                     "spec": spec})
    return docs
