"""Renders and lints helm/poolgate offline (helm-python-sdk) for several value sets, and checks
every manifest with kubernetes-validate --strict (the ServiceMonitor against the CRD schema kept
in the repo; the PrometheusRule, a CRD too, with promtool instead: `promtool check rules` and the
unit tests of helm/tests/alerts.test.yaml on the rules extracted from the rendered chart). Also
checks that a broken template, a wrong-typed value and a changed alert threshold do fail, and
that the Grafana dashboard and the status page's port render as configured.
Exit status 0 when all is well; prints one line per check. Without promtool on PATH the alert
checks fail (Debian: `apt-get install -y prometheus`)."""

import copy
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

import jsonschema
import kubernetes_validate
import yaml
from helm_python import Chart, lint

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "poolgate"
ALERT_TESTS = ROOT / "helm" / "tests" / "alerts.test.yaml"
DASHBOARD = CHART / "dashboards" / "poolgate.json"
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
    "dashboard, alerts and the status page on": {
        "grafana": {"dashboard": {"enabled": True, "folder": "LLM"}},
        "alerts": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "selector": {"adminHttp": {"enabled": True, "bindAddress": "0.0.0.0"}, "unpriced": "refuse"},
        "serviceMonitor": {"enabled": True},
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
        if kind == "PrometheusRule":
            # A CRD kubernetes-validate does not know: promtool checks it (check_alerts).
            continue
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
    docs = [document for _, document in manifests(rendered)]
    check_dashboard(label, values, docs)
    check_admin_http(label, values, docs)
    rules = [d for d in docs if d.get("kind") == "PrometheusRule"]
    alerts_on = values.get("alerts", {}).get("enabled", False)
    check(f"[{label}] a PrometheusRule only with alerts.enabled", len(rules) == (1 if alerts_on else 0), str(kinds))
    policies = kinds.count("NetworkPolicy")
    wanted = 0 if values.get("networkPolicy", {}).get("enabled") is False else 2
    check(f"[{label}] network policies for selector and admission", policies == wanted, str(kinds))
    for deployment in (d for d in docs if d.get("kind") == "Deployment"):
        env = deployment["spec"]["template"]["spec"]["containers"][0].get("env", [])
        check(
            f"[{label}] {deployment['metadata']['name']} gets the service token from a Secret",
            any(e.get("name") == "POOLGATE_SERVICE_TOKEN" and "secretKeyRef" in e.get("valueFrom", {}) for e in env),
        )
    config = next(d for d in docs if d.get("kind") == "ConfigMap" and "ADMISSION_EXPECTED_REPLICAS" in d.get("data", {}))["data"]
    admission = values.get("admission", {})
    hpa_on = admission.get("hpa", {}).get("enabled", True)
    expected = str(admission.get("hpa", {}).get("maxReplicas", 6) if hpa_on else admission.get("replicas", 2))
    check(f"[{label}] ADMISSION_EXPECTED_REPLICAS follows the HPA", config["ADMISSION_EXPECTED_REPLICAS"] == expected, config["ADMISSION_EXPECTED_REPLICAS"])
    text = "\n".join(rendered.values())
    check(f"[{label}] no secret value inlined", "secretKeyRef" in text and "redis://" not in text and "postgres://" not in text)


def check_dashboard(label, values, docs):
    """The dashboard ConfigMap: only when enabled, labelled for the sidecar, the file's JSON."""
    dashboard = values.get("grafana", {}).get("dashboard", {})
    maps = [d for d in docs if d.get("kind") == "ConfigMap" and "poolgate.json" in d.get("data", {})]
    if not dashboard.get("enabled", False):
        check(f"[{label}] no dashboard ConfigMap by default", not maps)
        return
    check(f"[{label}] one dashboard ConfigMap", len(maps) == 1)
    if len(maps) != 1:
        return
    metadata = maps[0]["metadata"]
    check(f"[{label}] dashboard labelled for the Grafana sidecar", metadata.get("labels", {}).get("grafana_dashboard") == "1", str(metadata))
    if dashboard.get("folder"):
        check(f"[{label}] dashboard folder annotation", metadata.get("annotations", {}).get("grafana_folder") == dashboard["folder"], str(metadata))
    try:
        shipped = json.loads(maps[0]["data"]["poolgate.json"])
    except json.JSONDecodeError as error:
        check(f"[{label}] dashboard JSON parses", False, str(error))
        return
    check(f"[{label}] dashboard JSON is dashboards/poolgate.json", shipped == json.loads(DASHBOARD.read_text()))
    panels = shipped.get("panels", [])
    check(f"[{label}] every dashboard panel has a query", bool(panels) and all(p.get("targets") for p in panels))


def check_admin_http(label, values, docs):
    """The status page's port: the flag, a container port, a Service port and a NetworkPolicy entry
    only when enabled."""
    admin = values.get("selector", {}).get("adminHttp", {})
    enabled = admin.get("enabled", False)
    port = admin.get("port", 9464)
    bind = admin.get("bindAddress", "127.0.0.1")
    selector = next(d for d in docs if d.get("kind") == "Deployment" and d["metadata"]["name"].endswith("-selector"))
    container = selector["spec"]["template"]["spec"]["containers"][0]
    args = container.get("args", [])
    container_ports = [p["containerPort"] for p in container.get("ports", [])]
    services = [d for d in docs if d.get("kind") == "Service" and d["metadata"]["name"].endswith("-selector")]
    service_ports = [p["port"] for s in services for p in s["spec"]["ports"]]
    policies = [d for d in docs if d.get("kind") == "NetworkPolicy" and d["metadata"]["name"].endswith("-selector")]
    policy_entries = [
        rule for p in policies for rule in p["spec"]["ingress"] if any(q.get("port") == port for q in rule.get("ports", []))
    ]
    if not enabled:
        check(f"[{label}] no status page by default", "--admin-http-listen" not in args and port not in container_ports and port not in service_ports and not policy_entries)
        return
    check(f"[{label}] selector gets --admin-http-listen", args == ["--admin-http-listen", f"{bind}:{port}"], str(args))
    check(f"[{label}] status page container and Service ports", port in container_ports and port in service_ports, f"{container_ports} {service_ports}")
    if values.get("networkPolicy", {}).get("enabled", True):
        admin_only = [
            rule for rule in policy_entries
            if rule.get("from") == [{"podSelector": {"matchLabels": {"poolgate-admin": "true"}}}]
        ]
        check(f"[{label}] status page reachable only from poolgate-admin pods", len(policy_entries) == 1 and len(admin_only) == 1, str(policy_entries))


def extracted_rules(values):
    """The rules file of the rendered chart's PrometheusRule (alerts on, `values` over the defaults)."""
    merged = copy.deepcopy(values)
    merged.setdefault("alerts", {})["enabled"] = True
    rendered = render(CHART, merged)
    rules = [d for _, d in manifests(rendered) if d.get("kind") == "PrometheusRule"]
    if len(rules) != 1:
        raise RuntimeError(f"expected one PrometheusRule, rendered {len(rules)}")
    return yaml.safe_dump({"groups": rules[0]["spec"]["groups"]}, sort_keys=False)


def promtool_tests(values):
    """`promtool check rules` and `promtool test rules` on the extracted rules: (ok, output)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return False, "promtool not found on PATH (Debian: apt-get install -y prometheus)"
    with tempfile.TemporaryDirectory() as scratch:
        directory = pathlib.Path(scratch)
        (directory / "rules.yaml").write_text(extracted_rules(values))
        shutil.copy(ALERT_TESTS, directory / "alerts.test.yaml")
        for command in (["check", "rules", "rules.yaml"], ["test", "rules", "alerts.test.yaml"]):
            done = subprocess.run([promtool, *command], cwd=directory, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                return False, f"promtool {' '.join(command)}: {done.stdout}{done.stderr}"
    return True, ""


def check_alerts():
    ok, output = promtool_tests({})
    check("alert rules pass promtool check and their unit tests (helm/tests/alerts.test.yaml)", ok, output)
    if shutil.which("promtool") is None:
        return
    # The tests must be able to fail: a changed threshold breaks them.
    ok, _ = promtool_tests({"alerts": {"addedLatency": {"p99Seconds": 5}}})
    check("the alert unit tests fail when a threshold changes", not ok)


def main():
    result = lint(str(CHART), strict=True)
    # Severity: 1 info, 2 warning, 4 error; strict lint fails on warnings too.
    problems = list(result.get("errors", [])) + [m for m in result.get("messages", []) if m.get("severity", 0) >= 2]
    check("helm lint --strict", not problems, str(problems))
    for label, values in VALUE_SETS.items():
        validate(label, values)
    check_alerts()
    # The selector's unpriced policy reaches its environment; a policy it does not have fails.
    for policy in ["fallback", "refuse"]:
        text = "\n".join(render(CHART, {"selector": {"unpriced": policy}}).values())
        check(f"selector.unpriced={policy} reaches SELECTOR_UNPRICED", f'SELECTOR_UNPRICED: "{policy}"' in text)
    try:
        render(CHART, {"selector": {"unpriced": "free"}})
        check("an unpriced policy the selector lacks fails", False, "rendered anyway")
    except Exception:  # noqa: BLE001
        check("an unpriced policy the selector lacks fails", True)
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
