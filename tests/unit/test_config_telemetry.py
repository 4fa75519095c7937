"""[telemetry] in gateway.toml: strict keys, ranges, and the prior it builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import load_gateway_config
from gateway.config.schema import PrefixConfig, TelemetryConfig
from gateway.core.errors import ConfigError
from gateway.sched.perf import default_prior
from gateway.telemetry.live import prefix_settings, telemetry_settings


def _load(tmp_path: Path, text: str) -> TelemetryConfig:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return load_gateway_config(path, env={}).telemetry


def test_defaults_when_the_section_is_missing(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "")
    assert cfg == TelemetryConfig()
    s = telemetry_settings(cfg)
    assert s.prior == default_prior()
    assert s.kv_capacity_tokens is None
    assert (s.min_observations, s.first_fit_min_observations) == (20, 5)
    assert s.guessed_parts == {"prefill", "decode", "kv", "throughput"}
    assert cfg.first_fit_interval_s == 1.0
    assert (cfg.prompt_tokens, cfg.tokenize_timeout_s) == ("estimate", 0.05)


def test_every_key(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        """
[telemetry]
refresh_interval_s = 0.5
refit_interval_s = 10.0
min_observations = 50
first_fit_min_observations = 10
first_fit_interval_s = 2.0
fit_window = 500
kv_capacity_tokens = 65536
disagreement_tolerance = 3.0
prompt_tokens = "tokenize"
tokenize_timeout_s = 0.2

[telemetry.prior]
k1 = 2e-4
c3 = 0.02
j = 16
""",
    )
    assert (cfg.refresh_interval_s, cfg.refit_interval_s, cfg.min_observations) == (0.5, 10.0, 50)
    assert (cfg.prompt_tokens, cfg.tokenize_timeout_s) == ("tokenize", 0.2)
    assert (cfg.first_fit_min_observations, cfg.first_fit_interval_s) == (10, 2.0)
    s = telemetry_settings(cfg)
    assert s.first_fit_min_observations == 10
    assert (s.fit_window, s.kv_capacity_tokens, s.disagreement_tolerance) == (500, 65536.0, 3.0)
    assert (s.prior.k1, s.prior.c3, s.prior.j) == (2e-4, 0.02, 16.0)
    assert s.prior.c1 == default_prior().c1  # not given: the built-in prior's
    # parts with a coefficient of the operator's are measurements, not a guess: no early first fit
    assert s.guessed_parts == {"throughput"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "[telemetry.prior]\nk9 = 1.0\n",
            "gateway.toml:telemetry.prior.k9: unknown key",
            id="unknown-coefficient",
        ),
        pytest.param(
            "[telemetry]\ndisagreement_tolerance = 1.0\n",
            "gateway.toml:telemetry.disagreement_tolerance:",
            id="tolerance-must-exceed-one",
        ),
        pytest.param(
            "[telemetry.prior]\nk1 = -1.0\n", "gateway.toml:telemetry.prior.k1:", id="negative-coefficient"
        ),
        pytest.param(
            "[telemetry]\nrefit_interval_s = 0\n",
            "gateway.toml:telemetry.refit_interval_s:",
            id="zero-interval",
        ),
        pytest.param(
            "[telemetry]\nfirst_fit_min_observations = 2\n",
            "gateway.toml:telemetry.first_fit_min_observations: expected integer >= 3",
            id="first-fit-below-the-decode-unknowns",
        ),
        pytest.param(
            "[telemetry]\nmin_observations = 4\n",
            "gateway.toml:telemetry.first_fit_min_observations: must not exceed "
            "telemetry.min_observations (4",
            id="first-fit-above-min-observations",
        ),
        pytest.param(
            "[telemetry]\nrefit_interval_s = 0.5\n",
            "gateway.toml:telemetry.first_fit_interval_s: must not exceed telemetry.refit_interval_s (0.5)",
            id="first-fit-interval-above-refit-interval",
        ),
        pytest.param(
            '[telemetry]\nprompt_tokens = "exact"\n',
            "gateway.toml:telemetry.prompt_tokens: invalid value 'exact' "
            "(expected one of: estimate, tokenize)",
            id="unknown-prompt-tokens-mode",
        ),
        pytest.param(
            "[telemetry]\nprompt_tokens = true\n",
            "gateway.toml:telemetry.prompt_tokens: expected string, got boolean",
            id="prompt-tokens-not-a-string",
        ),
        pytest.param(
            "[telemetry]\ntokenize_timeout_s = 50\n",
            "gateway.toml:telemetry.tokenize_timeout_s: expected number <= 5",
            id="tokenize-timeout-in-milliseconds",
        ),
        pytest.param(
            "[telemetry]\ntokenize_timeout_s = 0\n",
            "gateway.toml:telemetry.tokenize_timeout_s: expected number > 0",
            id="zero-tokenize-timeout",
        ),
        pytest.param(
            "[telemetry]\ntokenize_timeout_ms = 50\n",
            "gateway.toml:telemetry.tokenize_timeout_ms: unknown key",
            id="tokenize-timeout-unit-typo",
        ),
    ],
)
def test_errors_name_the_key_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gateway.toml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_gateway_config("gateway.toml", env={})
    assert str(e.value).startswith(expected)


def _prefix(tmp_path: Path, text: str) -> PrefixConfig:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return load_gateway_config(path, env={}).prefix


def test_prefix_defaults_and_every_key(tmp_path: Path) -> None:
    assert _prefix(tmp_path, "") == PrefixConfig()
    cfg = _prefix(tmp_path, '[prefix]\nsource = "approximate"\nblock_tokens = 32\nindex_tokens = 65536\n')
    assert (cfg.source, cfg.block_tokens, cfg.index_tokens) == ("approximate", 32, 65536)
    s = prefix_settings(cfg)
    assert (s.source, s.block_tokens, s.index_tokens, s.block_chars) == ("approximate", 32, 65536, 128)
    # the index's size falls back to the engines' configured KV capacity
    assert prefix_settings(PrefixConfig(), TelemetryConfig(kv_capacity_tokens=4096)).index_tokens == 4096


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ('[prefix]\nsource = "exact"\n', "prefix.source"),
        ("[prefix]\nblock_tokens = 0\n", "prefix.block_tokens"),
        ("[prefix]\nindex_size = 10\n", "prefix.index_size"),
    ],
    ids=["unknown source", "block size", "unknown key"],
)
def test_prefix_errors_name_the_key(tmp_path: Path, text: str, path: str) -> None:
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        _prefix(tmp_path, text)


def test_the_shipped_gateway_toml_documents_prefix() -> None:
    shipped = Path(__file__).resolve().parents[2] / "conf" / "gateway.toml"
    assert load_gateway_config(shipped, env={}).prefix == PrefixConfig()
