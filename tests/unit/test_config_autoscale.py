"""The policy file's [autoscale] table: the scaler built through the registry, the runner's settings and
per-model bounds, and errors that name the file and key path."""

from __future__ import annotations

import pytest

from gateway.config import parse_policy_text
from gateway.core.errors import ConfigError
from gateway.core.types import ModelName
from gateway.sched.autoscale import UNBOUNDED, ModelBounds
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.autoscale.chiron import ChironScaler

BASE = '[ordering]\nplugin = "fcfs"\n[placement]\npicker = { plugin = "max-score" }\n'


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_policy_text(BASE + text, "p.toml", default_registry())
    return str(info.value)


def test_no_autoscale_table_means_no_autoscaling() -> None:
    assert parse_policy_text(BASE, "p.toml", default_registry()).autoscale is None


def test_the_autoscale_table_builds_the_scaler_and_the_runners_settings() -> None:
    text = BASE + (
        '[autoscale]\nplugin = "chiron"\nparams = { theta = 0.33 }\ndry_run = true\ninterval_s = 2\n'
        "scale_out_cooldown_s = 10\nscale_in_cooldown_s = 90\nreclass_cooldown_s = 15\nmin_instances = 1\n"
        "[autoscale.models.code-a]\nmax_instances = 4\n"
        '[autoscale.models."org/llama-3.1-8b"]\nmin_instances = 2\nmax_instances = 6\n'
    )
    a = parse_policy_text(text, "p.toml", default_registry()).autoscale
    assert a is not None
    assert isinstance(a.scaler, ChironScaler)
    assert a.scaler.p.theta == 0.33
    s = a.settings
    assert (s.dry_run, s.interval_s, s.scale_out_cooldown_s, s.scale_in_cooldown_s, s.reclass_cooldown_s) == (
        True,
        2.0,
        10.0,
        90.0,
        15.0,
    )
    assert s.default_bounds == ModelBounds(1, UNBOUNDED)
    assert s.bounds_of(ModelName("code-a")) == ModelBounds(1, 4)
    assert s.bounds_of(ModelName("org/llama-3.1-8b")) == ModelBounds(2, 6)
    assert s.bounds_of(ModelName("other")) == ModelBounds(1, UNBOUNDED)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            '[autoscale]\nplugin = "nope"\n',
            "p.toml:autoscale.plugin: unknown scaler plugin 'nope' (known: aladdin-workers, cato-sla, "
            "chiron, queue-length, utilization-band)",
            id="unknown-plugin",
        ),
        pytest.param(
            '[autoscale]\nplugin = "lru"\n',
            "p.toml:autoscale.plugin: unknown scaler plugin 'lru' (known: aladdin-workers, cato-sla, "
            "chiron, queue-length, utilization-band); 'lru' is a evictor plugin",
            id="plugin-of-another-kind",
        ),
        pytest.param(
            '[autoscale]\nplugin = "chiron"\nparams = { tehta = 0.3 }\n',
            "p.toml:autoscale.params.tehta: unknown key (known: theta, delta, seats, interactive_class, "
            "min_interactive, max_retire, group_span_s, quantile, default_tokens_per_s, warmup_s, "
            "max_batch_step, reclass)",
            id="unknown-param",
        ),
        pytest.param(
            '[autoscale]\nplugin = "utilization-band"\nparams = { low = 0.9, high = 0.5 }\n',
            "p.toml:autoscale.params: low (0.9) must be below high (0.5)",
            id="param-cross-check",
        ),
        pytest.param(
            '[autoscale]\nplugin = "chiron"\ncooldown_s = 3\n',
            "p.toml:autoscale.cooldown_s: unknown key (known: plugin, params, dry_run, interval_s, "
            "scale_out_cooldown_s, scale_in_cooldown_s, reclass_cooldown_s, min_instances, max_instances, "
            "models)",
            id="unknown-key",
        ),
        pytest.param(
            '[autoscale]\nplugin = "chiron"\nmax_instances = 0\n',
            "p.toml:autoscale.max_instances: expected integer >= 1",
            id="max-zero",
        ),
        pytest.param(
            '[autoscale]\nplugin = "chiron"\nmin_instances = 3\nmax_instances = 2\n',
            "p.toml:autoscale.max_instances: must not be below min_instances (3)",
            id="default-min-above-max",
        ),
        pytest.param(
            '[autoscale]\nplugin = "chiron"\n[autoscale.models.m]\nmin_instances = 5\nmax_instances = 2\n',
            "p.toml:autoscale.models.m.max_instances: must not be below min_instances (5)",
            id="model-min-above-max",
        ),
        pytest.param(
            '[autoscale]\nplugin = "chiron"\n[autoscale.models.m]\nmax = 2\n',
            "p.toml:autoscale.models.m.max: unknown key (known: min_instances, max_instances)",
            id="model-unknown-key",
        ),
    ],
)
def test_autoscale_errors_name_the_file_and_key_path(text: str, expected: str) -> None:
    assert _error(text) == expected
