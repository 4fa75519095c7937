"""The shipped Grafana dashboard and Prometheus alert rules name only metrics berth exports: every metric a
query reads is a family of a running gateway's /metrics (with lifecycle, autoscaling and tenants
configured, so their families are there too)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from loadgen.harness import REPO_ROOT
from tests.integration.conftest import StartGateway

DASHBOARD = REPO_ROOT / "conf" / "grafana" / "berth-dashboard.json"
ALERTS = REPO_ROOT / "conf" / "prometheus" / "berth-alerts.yml"
NAME = re.compile(r"\bberth_[a-z0-9_]+")
# What Prometheus derives from one family: a counter's _total, a histogram's series.
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def _dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in doc["templating"]["list"] if v.get("type") == "query"]
    return exprs


def _alert_exprs() -> list[str]:
    # one `expr:` a rule, on one line (the file keeps it so; a test below checks each rule has one)
    return [m.group(1) for m in re.finditer(r"^\s+expr: (.+)$", ALERTS.read_text(), re.M)]


def _series_names(text: str) -> set[str]:
    """Every series name a scrape of `text` can hold, whether or not it has a sample yet."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in SUFFIXES)
        names.update(s.name for s in family.samples)
    return names


def test_the_files_hold_queries_and_every_alert_has_an_expression() -> None:
    assert len(_dashboard_exprs()) >= 30
    rules = ALERTS.read_text().count("- alert: ")
    assert rules >= 6
    assert len(_alert_exprs()) == rules
    for alert in ("SloAttainment", "EventLoopLag", "EndpointDown", "ConfigReloadRejected", "AgentCalls"):
        assert f"Berth{alert}" in ALERTS.read_text(), alert


async def test_every_metric_the_dashboard_and_the_alerts_read_is_exported(
    tmp_path: Path, start_gateway: StartGateway
) -> None:
    (tmp_path / "models.toml").write_text(
        '[[models]]\nname = "m"\nengine = "vllm"\ncommand = ["true", "{port}"]\nmemory_gib = 4\n'
    )
    (tmp_path / "agent.toml").write_text(
        'models = "models.toml"\nstate_dir = "state"\nnvml = false\n'
        '[[devices]]\nname = "gpu0"\nmemory_gib = 8\n'
    )
    (tmp_path / "policy.toml").write_text(
        (REPO_ROOT / "policies" / "default.toml").read_text()
        + '\n[autoscale]\nplugin = "queue-length"\ndry_run = true\nmin_instances = 0\nmax_instances = 1\n'
    )
    agent = json.dumps([sys.executable, "-m", "gateway.agent", "-c", str(tmp_path / "agent.toml")])
    running = await start_gateway(
        [],
        toml=(
            '[policy]\nfile = "policy.toml"\n'
            '[lifecycle]\nmodels = "models.toml"\n'
            f'[[nodes]]\nname = "n1"\nagent = {agent}\n'
            '[[tenants]]\nname = "t"\napi_key_sha256 = ["' + "0" * 64 + '"]\n'
        ),
    )
    async with aiohttp.ClientSession() as s, s.get(running.url + "/metrics") as r:
        assert r.status == 200
        exported = _series_names(await r.text())
    read = {n for e in _dashboard_exprs() + _alert_exprs() for n in NAME.findall(e)}
    assert len(read) >= 30
    assert sorted(read - exported) == []
