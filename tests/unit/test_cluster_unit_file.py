"""systemd/berth@.service: berth.service's unit, one replica per instance (the instance is its port)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_sdnotify_unit_file import UNIT, parse_unit

TEMPLATE = UNIT.parent / "berth@.service"


def test_the_template_is_the_service_with_a_port_and_a_name_per_instance() -> None:
    base = parse_unit(UNIT.read_text())
    tmpl = parse_unit(TEMPLATE.read_text())
    s = tmpl["Service"]
    assert s["ExecStart"] == ["/usr/local/bin/berth serve -c /etc/berth/gateway.toml --listen 127.0.0.1:%i"]
    assert "BERTH_CLUSTER_NAME=%H-%i" in s["Environment"]
    assert s["StateDirectory"] == ["berth/%i"]
    # Everything else (notify, watchdog, drain, sandbox) is berth.service's.
    same = {
        k: v
        for k, v in base["Service"].items()
        if k not in ("ExecStart", "StateDirectory", "WorkingDirectory", "Environment")
    }
    assert {k: s[k] for k in same} == same
    assert set(base["Service"]["Environment"]) <= set(s["Environment"])
    assert tmpl["Install"] == base["Install"]


def test_the_template_names_its_docs() -> None:
    assert "docs/cluster.md" in Path(TEMPLATE).read_text()
