"""Renders and lints helm/poolgate offline (helm-python-sdk) for several value sets, and checks
every manifest with kubernetes-validate --strict (the ServiceMonitor against the CRD schema kept
in the repo). Also checks that a broken template and a wrong-typed value do fail.
Exit status 0 when all is well; prints one line per check."""

import copy
import json
import pathlib
import shutil
import sys
import tempfile

import jsonschema
import kubernetes_validate
import yaml
from helm_python import Chart, lint

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "poolgate"
K8S_VERSION = "1.30.0"
SERVICE_MONITOR_SCHEMA = json.loads((CHART / "crds-schemas" / "servicemonitor.schema.json").read_text())

VALUE_SETS = {
    "defaults": {},
    "hpa off, servicemonitor on, no network policy": {
        "relay": {"hpa": {"enabled": False}},
        "selector": {"hpa": {"enabled": False}},
        "admission": {"hpa": {"enabled": False}},
        "serviceMonitor": {"enabled": True},
        "networkPolicy": {"enabled": False},
    },
    "no migrations, divided policy, no pdb": {
        "migrations": {"enabled": False},
        "admission": {"failurePolicy": "divided", "replicas": 3, "pdb": {"enabled": False}},
        "relay": {"service": {"type": "LoadBalancer"}, "pdb": {"enabled": False}},
        "logFormat": "text",
    },
}

failures = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}")
    if not ok:
        failures.append(name)


def render(path, values):
    chart = Chart.load(str(path))
    return chart.render(values, name="pg", namespace="poolgate", is_install=True)


def manifests(rendered):
    for filename, text in sorted(rendered.items()):
        for document in yaml.safe_load_all(text):
            if document:
                yield filename, document


def validate(label, values):
    try:
        rendered = render(CHART, values)
    except Exception as error:  # noqa: BLE001
        check(f"[{label}] renders", False, f"{type(error).__name__}: {error}")
        return
    kinds = []
    for filename, document in manifests(rendered):
        kind = document.get("kind")
        kinds.append(kind)
        name = f"[{label}] {filename} {kind}/{document.get('metadata', {}).get('name')}"
        if kind == "ServiceMonitor":
            try:
                jsonschema.validate(document, SERVICE_MONITOR_SCHEMA)
                check(name, True)
            except jsonschema.ValidationError as error:
                check(name, False, error.message)
            continue
        try:
            kubernetes_validate.validate(document, K8S_VERSION, strict=True)
            check(name, True)
        except Exception as error:  # noqa: BLE001
            check(name, False, f"{type(error).__name__}: {error}")
    check(f"[{label}] has the three Deployments", kinds.count("Deployment") == 3, str(kinds))
    policies = kinds.count("NetworkPolicy")
    wanted = 0 if values.get("networkPolicy", {}).get("enabled") is False else 2
    check(f"[{label}] network policies for selector and admission", policies == wanted, str(kinds))
    docs = [document for _, document in manifests(rendered)]
    for deployment in (d for d in docs if d.get("kind") == "Deployment"):
        env = deployment["spec"]["template"]["spec"]["containers"][0].get("env", [])
        check(
            f"[{label}] {deployment['metadata']['name']} gets the service token from a Secret",
            any(e.get("name") == "POOLGATE_SERVICE_TOKEN" and "secretKeyRef" in e.get("valueFrom", {}) for e in env),
        )
    config = next(d for d in docs if d.get("kind") == "ConfigMap")["data"]
    admission = values.get("admission", {})
    hpa_on = admission.get("hpa", {}).get("enabled", True)
    expected = str(admission.get("hpa", {}).get("maxReplicas", 6) if hpa_on else admission.get("replicas", 2))
    check(f"[{label}] ADMISSION_EXPECTED_REPLICAS follows the HPA", config["ADMISSION_EXPECTED_REPLICAS"] == expected, config["ADMISSION_EXPECTED_REPLICAS"])
    text = "\n".join(rendered.values())
    check(f"[{label}] no secret value inlined", "secretKeyRef" in text and "redis://" not in text and "postgres://" not in text)


def main():
    result = lint(str(CHART), strict=True)
    # Severity: 1 info, 2 warning, 4 error; strict lint fails on warnings too.
    problems = list(result.get("errors", [])) + [m for m in result.get("messages", []) if m.get("severity", 0) >= 2]
    check("helm lint --strict", not problems, str(problems))
    for label, values in VALUE_SETS.items():
        validate(label, values)
    # A wrong-typed value must fail (values.schema.json).
    try:
        render(CHART, {"relay": {"port": "eighty"}})
        check("a wrong-typed value fails", False, "rendered anyway")
    except Exception:  # noqa: BLE001
        check("a wrong-typed value fails", True)
    # A broken template must fail.
    with tempfile.TemporaryDirectory() as scratch:
        broken = pathlib.Path(scratch) / "poolgate"
        shutil.copytree(CHART, broken)
        (broken / "templates" / "broken.yaml").write_text("kind: {{ .Values.image.tag | nosuchfunction }}\n")
        try:
            render(broken, {})
            check("a broken template fails", False, "rendered anyway")
        except Exception:  # noqa: BLE001
            check("a broken template fails", True)
    print(f"{len(failures)} helm checks failed" if failures else "helm chart: all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
