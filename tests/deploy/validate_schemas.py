#!/usr/bin/env python3
"""tests/deploy/validate_schemas.py RENDERED.yaml...

Validates every object of rendered kustomize overlays against the Kubernetes OpenAPI schemas
bundled by the PyPI package kubernetes-validate, in strict mode (unknown fields are errors),
for each Kubernetes version in KUBE_VERSIONS: 1.27, the oldest the manifests support (gRPC
probes are GA there; policy/v1 PodDisruptionBudget since 1.21), and the newest bundled.

The ServiceMonitor (a Prometheus Operator CRD, no part of Kubernetes' schemas) is validated
against the operator's CRD schema as the PyPI package cloudcoil-models-prometheus-operator
carries it (pydantic models generated from the CRDs: types, enums, patterns), with unknown
fields rejected by comparing the object to what the model keeps.  Without that package the
ServiceMonitor check is reported as skipped and the rest still counts.

Exit 0 when all validate, 1 otherwise, 77 when kubernetes-validate is not importable.
"""
import sys

import yaml

try:
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError
except ImportError:
    print("SKIPPED: Python package kubernetes-validate is not installed "
          "(pip install 'kubernetes-validate==1.37.0' into build/venv; scripts/test.sh does)")
    sys.exit(77)

OLDEST = "1.27.0"


def servicemonitor_checker():
    try:
        from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor
    except ImportError:
        return None

    def dropped(src, kept, path=""):
        """Keys present in src but not in the model's dump: fields the CRD does not know."""
        out = []
        if isinstance(src, dict) and isinstance(kept, dict):
            for k, v in src.items():
                if k not in kept:
                    out.append(f"{path}.{k}".lstrip("."))
                else:
                    out += dropped(v, kept[k], f"{path}.{k}")
        elif isinstance(src, list) and isinstance(kept, list):
            for i, (a, b) in enumerate(zip(src, kept)):
                out += dropped(a, b, f"{path}[{i}]")
        return out

    def check(obj):
        try:
            m = ServiceMonitor.model_validate(obj)
        except Exception as e:   # pydantic.ValidationError: every failing field, with the rule
            return str(e).replace("\n", "\n      ")
        unknown = dropped(obj, m.model_dump(by_alias=True, exclude_unset=True, mode="json"))
        return f"unknown fields: {', '.join(unknown)}" if unknown else None

    return check


def main(paths):
    versions = [OLDEST, kubernetes_validate.utils.latest_version()]
    sm_check = servicemonitor_checker()
    failures = 0
    counted = 0
    for path in paths:
        with open(path) as f:
            objs = [d for d in yaml.safe_load_all(f) if d]
        for o in objs:
            name = f"{o.get('kind')}/{o.get('metadata', {}).get('name')}"
            if o.get("kind") == "ServiceMonitor":
                if sm_check is None:
                    print(f"  skipped: {path}: {name}: CRD schema check needs "
                          "cloudcoil-models-prometheus-operator (not installed)")
                    continue
                err = sm_check(o)
                counted += 1
                if err:
                    failures += 1
                    print(f"  FAIL {path}: {name} against the Prometheus Operator CRD: {err}")
                continue
            for v in versions:
                counted += 1
                try:
                    kubernetes_validate.validate(o, v, strict=True)
                except SchemaNotFoundError:
                    failures += 1
                    print(f"  FAIL {path}: {name}: no schema for {o.get('apiVersion')} in "
                          f"Kubernetes {v}")
                except kubernetes_validate.ValidationError as e:
                    failures += 1
                    where = ".".join(str(p) for p in e.path)
                    print(f"  FAIL {path}: {name} (Kubernetes {v}) at {where}: {e.message}")
    print(f"{'ok' if not failures else 'FAIL'}: {counted} validations (Kubernetes "
          f"{' and '.join(versions)}, strict), {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
