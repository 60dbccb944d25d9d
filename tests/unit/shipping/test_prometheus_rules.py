"""The chart's alerting rules and the dashboard's queries, evaluated by promtool on synthetic series.

The PrometheusRule is rendered by helm with default thresholds, its groups written as a rule file, and
`promtool test rules` checks each alert fires when it should (and not before, and not when healthy).
The same run evaluates the dashboard's own queries across an operator failover and a model deletion: the
standby exports no model series and a deleted model's series go stale, so each panel shows one value per
pool from whichever replica acts, and nothing for the deleted model.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.shipping.chart import CHART_DIR, Manifest, find_promtool, one, render

NS, MODEL, POOL = "team-a", "llama", "llama-gfx942"


@pytest.fixture(scope="module")
def rule_manifests(helm: str) -> list[Manifest]:
    return render(helm, "metrics.prometheusRule.enabled=true", "metrics.podMonitor.enabled=true")


@pytest.fixture(scope="module")
def job(rule_manifests: list[Manifest]) -> str:
    # The ServiceMonitor's targets get the metrics Service's name as their job; the rules select it.
    services = [s for s in rule_manifests if s["kind"] == "Service"]
    (metrics_service,) = [s for s in services if s["metadata"]["name"].endswith("-metrics")]
    return str(metrics_service["metadata"]["name"])


def _pool(job: str, instance: str = "op-a", model: str = MODEL, pool: str = POOL) -> str:
    return f'job="{job}", instance="{instance}", namespace="{NS}", model="{model}", pool="{pool}"'


def _expand(template: str, labels: dict[str, str], value: str) -> str:
    """The rendered annotation with Prometheus's template actions filled in: the expected text comes from
    the PrometheusRule helm rendered, never retyped; `value` is how the alert's value reads once formatted
    (humanize, humanizePercentage)."""
    text = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda match: labels[match.group(1)], template)
    text = re.sub(r"\{\{\s*\$value(\s*\|\s*\w+)?\s*\}\}", value, text)
    assert "{{" not in text, f"a template action the test does not expand: {template}"
    return text


def _alert(rule: dict[str, Any], labels: dict[str, str] | None = None, value: str = "") -> dict[str, Any]:
    """One firing alert of `rule` as promtool reports it: the rule's labels plus the expression's, and
    every annotation expanded for those labels and value."""
    labels = labels or {}
    return {
        "exp_labels": {**rule["labels"], **labels},
        "exp_annotations": {name: _expand(text, labels, value) for name, text in rule["annotations"].items()},
    }


def _pool_labels(model: str = MODEL, pool: str = POOL) -> dict[str, str]:
    return {"namespace": NS, "model": model, "pool": pool}


def _run_promtool(promtool: str, tmp_path: Path, groups: list[dict[str, Any]], tests: list[dict[str, Any]]) -> str:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}))
    result = subprocess.run([promtool, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, f"promtool test rules failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _dashboard_exprs() -> dict[str, str]:
    """Each panel query with Grafana's variables set to All and a 5m rate interval."""
    dashboard = json.loads((CHART_DIR / "dashboards" / "specdec-operator.json").read_text())
    exprs = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "5m")
            for variable in ("$namespace", "$model", "$pool"):
                expr = expr.replace(variable, ".*")
            exprs[f"{panel['title']}/{target['refId']}"] = expr
    return exprs


def _rules(manifests: list[Manifest]) -> dict[str, dict[str, Any]]:
    groups = one(manifests, "PrometheusRule")["spec"]["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def test_rules_pass_promtool_check(rule_manifests: list[Manifest], tmp_path: Path) -> None:
    """`promtool check rules`: every expression parses, every template compiles, no duplicate rule."""
    promtool = find_promtool()
    groups = one(rule_manifests, "PrometheusRule")["spec"]["groups"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run([promtool, "check", "rules", "--lint=all", "--lint-fatal", "rules.yaml"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, f"promtool check rules failed:\n{result.stdout}\n{result.stderr}"
    assert f"SUCCESS: {len(_rules(rule_manifests))} rules found" in result.stdout, result.stdout


def test_every_rule_carries_the_configured_thresholds_and_a_runbook(rule_manifests: list[Manifest]) -> None:
    rules = _rules(rule_manifests)
    assert set(rules) == {"SpecdecAcceptanceRateLow", "SpecdecKThrash", "SpecdecCanaryRolledBack",
                          "SpecdecModelNotReady",
                          "SpecdecScrapeFailures", "SpecdecReconcileErrors", "SpecdecNoActiveOperator",
                          "SpecdecSeveralActiveOperators"}
    runbooks = (CHART_DIR.parents[1] / "docs" / "runbooks.md").read_text().lower()
    for name, rule in rules.items():
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor == name.lower() and f"## {anchor}" in runbooks, name
    # The values' thresholds reach both the expression and the text an on-call engineer reads.
    acceptance = rules["SpecdecAcceptanceRateLow"]
    assert acceptance["expr"].endswith("< 0.6") and acceptance["for"] == "15m"
    assert "below 60% for 15m" in acceptance["annotations"]["description"]
    assert "within 10m" in rules["SpecdecKThrash"]["annotations"]["description"]  # kThrash.cooldown
    assert "More than 10%" in rules["SpecdecScrapeFailures"]["annotations"]["description"]


def test_every_alert_fires_when_it_should_and_not_otherwise(rule_manifests: list[Manifest], job: str,
                                                            tmp_path: Path) -> None:
    promtool = find_promtool()
    rules = _rules(rule_manifests)
    groups = one(rule_manifests, "PrometheusRule")["spec"]["groups"]
    healthy = _pool(job, pool="llama-gfx90a")
    model = f'job="{job}", instance="op-a", namespace="{NS}", model="{MODEL}"'
    other = f'job="{job}", instance="op-a", namespace="{NS}", model="qwen"'
    tests: list[dict[str, Any]] = [
        {   # One model not Ready for 20 minutes (its reason changing from RolloutInProgress to ImagePullBackOff
            # after 5), another Ready: fires after 15 minutes, counted from the first reason.
            "interval": "1m",
            "input_series": [
                {"series": f'specdec_model_condition{{{model}, type="Ready", status="False", '
                           f'reason="RolloutInProgress"}}', "values": "1x5"},
                {"series": f'specdec_model_condition{{{model}, type="Ready", status="False", '
                           f'reason="ImagePullBackOff"}}', "values": "_x5 1x15"},
                {"series": f'specdec_model_condition{{{other}, type="Ready", status="True", reason="PoolsReady"}}',
                 "values": "1x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "14m", "alertname": "SpecdecModelNotReady", "exp_alerts": []},
                {"eval_time": "16m", "alertname": "SpecdecModelNotReady",
                 "exp_alerts": [_alert(rules["SpecdecModelNotReady"], {"namespace": NS, "model": MODEL})]},
            ],
        },
        {   # Acceptance 50% for half an hour on one pool, 80% on another: fires after 15 minutes, one alert.
            "interval": "1m",
            "input_series": [
                {"series": f"specdec_acceptance_rate{{{_pool(job)}}}", "values": "0.5x30"},
                {"series": f"specdec_acceptance_rate{{{healthy}}}", "values": "0.8x30"},
                {"series": f'specdec_active{{job="{job}", instance="op-a"}}', "values": "1x30"},
            ],
            "alert_rule_test": [
                {"eval_time": "14m", "alertname": "SpecdecAcceptanceRateLow", "exp_alerts": []},
                {"eval_time": "16m", "alertname": "SpecdecAcceptanceRateLow",
                 "exp_alerts": [_alert(rules["SpecdecAcceptanceRateLow"], _pool_labels(), "50%")]},
                {"eval_time": "16m", "alertname": "SpecdecNoActiveOperator", "exp_alerts": []},
                {"eval_time": "16m", "alertname": "SpecdecSeveralActiveOperators", "exp_alerts": []},
            ],
        },
        {   # A dip below 60% shorter than 15 minutes does not fire.
            "interval": "1m",
            "input_series": [{"series": f"specdec_acceptance_rate{{{_pool(job)}}}", "values": "0.8x5 0.4x10 0.8x20"}],
            "alert_rule_test": [{"eval_time": f"{m}m", "alertname": "SpecdecAcceptanceRateLow", "exp_alerts": []}
                                for m in (10, 16, 25)],
        },
        {   # K: one pool changes twice within the 600 s cooldown (its counter born at the first change);
            # another changes once every 15 minutes on a long-lived counter, which is not thrash.
            "interval": "1m",
            "input_series": [
                {"series": f"specdec_k_changes_total{{{_pool(job)}}}", "values": "_x20 1 1 1 2x10"},
                {"series": f"specdec_k_changes_total{{{healthy}}}", "values": "0x14 1x14 2x14"},
            ],
            "alert_rule_test": [
                {"eval_time": "22m", "alertname": "SpecdecKThrash", "exp_alerts": []},
                {"eval_time": "24m", "alertname": "SpecdecKThrash",
                 "exp_alerts": [_alert(rules["SpecdecKThrash"], _pool_labels(), "2")]},
                {"eval_time": "40m", "alertname": "SpecdecKThrash", "exp_alerts": []},
            ],
        },
        {   # A canary's first rollback creates its counter at 1; the alert holds for 30 minutes.
            # A promoted canary never fires.
            "interval": "1m",
            "input_series": [
                {"series": f'specdec_rollouts_total{{{_pool(job)}, result="rolledback"}}', "values": "_x5 1x60"},
                {"series": f'specdec_rollouts_total{{{healthy}, result="promoted"}}', "values": "_x5 1x60"},
            ],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "SpecdecCanaryRolledBack", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "SpecdecCanaryRolledBack",
                 "exp_alerts": [_alert(rules["SpecdecCanaryRolledBack"], _pool_labels())]},
                {"eval_time": "40m", "alertname": "SpecdecCanaryRolledBack", "exp_alerts": []},
            ],
        },
        {   # Scrapes: 10 a minute, all fine for 10 minutes, then 2 of them time out (20% failing); the 10m
            # window crosses 10% about 5 minutes later and the alert waits 10 more. Reconciles keep failing.
            "interval": "1m",
            "input_series": [
                {"series": f'specdec_scrapes_total{{job="{job}", instance="op-a", result="ok"}}',
                 "values": "0+10x10 108+8x30"},
                {"series": f'specdec_scrapes_total{{job="{job}", instance="op-a", result="timeout"}}',
                 "values": "0x10 2+2x30"},
                {"series": f'specdec_reconcile_total{{job="{job}", instance="op-a", result="error"}}',
                 "values": "1+1x40"},
                {"series": f'specdec_reconcile_total{{job="{job}", instance="op-a", result="ok"}}',
                 "values": "0+5x40"},
            ],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "SpecdecScrapeFailures", "exp_alerts": []},
                {"eval_time": "30m", "alertname": "SpecdecScrapeFailures",
                 "exp_alerts": [_alert(rules["SpecdecScrapeFailures"], value="20%")]},
                {"eval_time": "8m", "alertname": "SpecdecReconcileErrors", "exp_alerts": []},
                {"eval_time": "12m", "alertname": "SpecdecReconcileErrors",
                 "exp_alerts": [_alert(rules["SpecdecReconcileErrors"], value="10")]},
            ],
        },
        {   # Healthy operator: 1 timeout in 20 scrapes a minute (5%, under 10%), reconciles all succeed.
            "interval": "1m",
            "input_series": [
                {"series": f'specdec_scrapes_total{{job="{job}", instance="op-a", result="ok"}}',
                 "values": "0+19x40"},
                {"series": f'specdec_scrapes_total{{job="{job}", instance="op-a", result="timeout"}}',
                 "values": "0+1x40"},
                {"series": f'specdec_reconcile_total{{job="{job}", instance="op-a", result="ok"}}',
                 "values": "0+5x40"},
            ],
            "alert_rule_test": [{"eval_time": "30m", "alertname": alert, "exp_alerts": []}
                                for alert in ("SpecdecScrapeFailures", "SpecdecReconcileErrors")],
        },
        {   # Failover: op-a acts for 10 minutes and dies; op-b, a standby, takes over 2 minutes later.
            # Then both pause (equal priorities) from minute 20: no replica acts, the alert fires 5 minutes
            # later. op-a comes back acting at minute 39 and op-b too at 41 (split peering): two act.
            "interval": "1m",
            "input_series": [
                {"series": f'specdec_active{{job="{job}", instance="op-a"}}', "values": "1x9 stale _x28 1x20"},
                {"series": f'specdec_active{{job="{job}", instance="op-b"}}', "values": "0x11 1x7 0x20 1x20"},
            ],
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": "SpecdecNoActiveOperator", "exp_alerts": []},
                {"eval_time": "15m", "alertname": "SpecdecSeveralActiveOperators", "exp_alerts": []},
                {"eval_time": "24m", "alertname": "SpecdecNoActiveOperator", "exp_alerts": []},
                {"eval_time": "25m", "alertname": "SpecdecNoActiveOperator",
                 "exp_alerts": [_alert(rules["SpecdecNoActiveOperator"])]},
                {"eval_time": "43m", "alertname": "SpecdecSeveralActiveOperators", "exp_alerts": []},
                {"eval_time": "47m", "alertname": "SpecdecSeveralActiveOperators",
                 "exp_alerts": [_alert(rules["SpecdecSeveralActiveOperators"], value="2")]},
                {"eval_time": "45m", "alertname": "SpecdecNoActiveOperator", "exp_alerts": []},
            ],
        },
        {   # Nothing scraped at all is no active replica too.
            "interval": "1m",
            "input_series": [{"series": 'up{job="elsewhere"}', "values": "1x10"}],
            "alert_rule_test": [
                {"eval_time": "4m", "alertname": "SpecdecNoActiveOperator", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "SpecdecNoActiveOperator",
                 "exp_alerts": [_alert(rules["SpecdecNoActiveOperator"])]}],
        },
    ]
    output = _run_promtool(promtool, tmp_path, groups, tests)
    assert "SUCCESS" in output, output


def test_dashboard_panels_stay_right_across_failover_and_model_deletion(
    helm: str, rule_manifests: list[Manifest], job: str, tmp_path: Path
) -> None:
    """op-a acts until minute 10 and dies (its series go stale); op-b, a standby until then, exports no
    model series and takes over at minute 12. Model "gone" is deleted at minute 20: the acting replica
    drops its series. At minute 30 every panel shows one series per live pool, from op-b."""
    promtool = find_promtool()
    groups = one(rule_manifests, "PrometheusRule")["spec"]["groups"]
    gone = _pool(job, instance="op-b", model="gone", pool="gone-gfx942")
    series = [
        {"series": f"specdec_effective_k{{{_pool(job)}}}", "values": "4x9 stale"},
        {"series": f"specdec_effective_k{{{_pool(job, instance='op-b')}}}", "values": "_x11 3x30"},
        {"series": f"specdec_effective_k{{{_pool(job, model='gone', pool='gone-gfx942')}}}", "values": "2x9 stale"},
        {"series": f"specdec_effective_k{{{gone}}}", "values": "_x11 2x7 stale"},
        {"series": f"specdec_k_changes_total{{{_pool(job)}}}", "values": "1x9 stale"},
        {"series": f"specdec_k_changes_total{{{_pool(job, instance='op-b')}}}", "values": "_x11 1 1 1 1 2x26"},
        # The deleted model changed K once under op-b (a fresh counter at 1) before its deletion at minute 19.
        {"series": f"specdec_k_changes_total{{{gone}}}", "values": "_x11 1x7 stale"},
        {"series": f'specdec_active{{job="{job}", instance="op-a"}}', "values": "1x9 stale"},
        {"series": f'specdec_active{{job="{job}", instance="op-b"}}', "values": "0x11 1x30"},
    ]
    exprs = _dashboard_exprs()
    k_expr = next(expr for title, expr in exprs.items() if title.startswith("Effective K per pool/A"))
    changes_expr = next(expr for title, expr in exprs.items() if title.startswith("K changes/A"))
    active_expr = next(expr for title, expr in exprs.items() if title.startswith("Active operator replicas/A"))
    tests = [{
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            # Before the failover: op-a's values, both models.
            {"expr": k_expr, "eval_time": "5m", "exp_samples": [
                {"labels": f'{{namespace="{NS}", model="{MODEL}", pool="{POOL}"}}', "value": 4},
                {"labels": f'{{namespace="{NS}", model="gone", pool="gone-gfx942"}}', "value": 2}]},
            # After failover and deletion: op-b's K for the live model, nothing for the deleted one.
            {"expr": k_expr, "eval_time": "30m", "exp_samples": [
                {"labels": f'{{namespace="{NS}", model="{MODEL}", pool="{POOL}"}}', "value": 3}]},
            # K changes: op-b's one change at minute 16 is out of the 5m window; the deleted model has no row.
            {"expr": changes_expr, "eval_time": "30m", "exp_samples": [
                {"labels": f'{{namespace="{NS}", model="{MODEL}", pool="{POOL}"}}', "value": 0}]},
            {"expr": changes_expr, "eval_time": "17m", "exp_samples": [
                {"labels": f'{{namespace="{NS}", model="{MODEL}", pool="{POOL}"}}', "value": 1.25},
                {"labels": f'{{namespace="{NS}", model="gone", pool="gone-gfx942"}}', "value": 0}]},
            {"expr": active_expr, "eval_time": "30m", "exp_samples": [{"labels": "{}", "value": 1}]},
        ],
    }]
    _run_promtool(promtool, tmp_path, groups, tests)


def test_pod_monitor_selects_runtime_pods_and_labels_them_like_the_operator(
    rule_manifests: list[Manifest],
) -> None:
    monitor = one(rule_manifests, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "specdec-operator", "app.kubernetes.io/name": "specdec-runtime"}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http"
    targets = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert {"model", "pool", "track"} <= targets
