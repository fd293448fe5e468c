"""Offline validation of generated manifests: built-in kinds with kubernetes-validate, CRDs (JobSet,
Kubeflow TrainJob) with JSON Schema against the pinned CRD files in schemas/ (see its README)."""

from __future__ import annotations

import copy
from functools import cache
from importlib import resources
from typing import Any

import yaml

CRDS = {("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets.yaml",
        ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml"}
K8S_VERSION = "1.33.0"


def _strict(node: Any) -> Any:
    """openAPIV3 -> JSON Schema: int-or-string as anyOf; unknown fields refused where not preserved."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-validations")}
        if node.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out = {"anyOf": [{"type": "integer"}, {"type": "string"}], **{k: v for k, v in out.items()
                                                                         if k not in ("anyOf",)}}
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(node, list):
        return [_strict(x) for x in node]
    return node


@cache
def crd_schema(api_version: str, kind: str) -> dict:
    group, _, version = api_version.partition("/")
    text = resources.files("tunebench.deploy").joinpath("schemas", CRDS[(api_version, kind)]).read_text()
    crd = yaml.safe_load(text)
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema = copy.deepcopy(v["schema"]["openAPIV3Schema"])
            # metadata is validated by the API server's ObjectMeta, not the CRD
            schema["properties"]["metadata"] = {"type": "object"}
            return _strict(schema)
    raise KeyError(f"{kind} {api_version} not in the pinned CRD")


def validate(doc: dict) -> None:
    """Raise if the manifest is not valid for its kind (jsonschema / kubernetes_validate errors)."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRDS:
        import jsonschema

        jsonschema.validate(doc, crd_schema(*key))
    else:
        import kubernetes_validate

        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
