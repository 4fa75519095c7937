"""A policy file's `[slo]` and `[tasks]` sections checked and built into the `SloPolicy` admission and
the scheduler read (`gateway.core.slo`); every problem named by its key path."""

from __future__ import annotations

from typing import Final

from gateway.config.policy_schema import PolicyFile
from gateway.core.errors import ConfigError
from gateway.core.slo import (
    DEFAULT_CLASS,
    SloClass,
    SloPolicy,
    SloRule,
    TaskSettings,
    default_slo_policy,
)
from gateway.core.types import ApiKind

_PATHS: Final = frozenset(api.path for api in ApiKind)


def build_slo(pf: PolicyFile) -> SloPolicy:
    """The `[slo]` and `[tasks]` sections checked and built; raises the first problem."""
    slo, problems = slo_problems(pf)
    if problems:
        raise problems[0]
    return slo


def slo_problems(pf: PolicyFile) -> tuple[SloPolicy, list[ConfigError]]:
    """The `[slo]` and `[tasks]` sections built, and every problem found (named by key path). With
    problems, the SLO policy is built from the classes and rules that had none (the default class
    falling back to the first of them): good for checking the plugins that take it, nothing else."""
    sec = pf.slo
    t = pf.tasks
    problems: list[ConfigError] = []
    tasks = TaskSettings(
        idle_expiry_s=t.idle_expiry_s,
        max_tasks=t.max_tasks,
        learn_allotments=t.learn_allotments,
        learn_min_samples=t.learn_min_samples,
    )
    if not sec.classes:
        if sec.default_class not in ("", DEFAULT_CLASS):
            problems.append(
                ConfigError(
                    f"class {sec.default_class!r} is not defined (no [[slo.classes]])",
                    path="slo.default_class",
                )
            )
        if sec.rules:
            problems.append(ConfigError("rules need [[slo.classes]] to name", path="slo.rules[0].class"))
        slo = SloPolicy(
            classes=default_slo_policy().classes,
            default_class=DEFAULT_CLASS,
            tasks=tasks,
            unknown_class=sec.unknown_class,
        )
        return slo, problems
    classes: dict[str, SloClass] = {}
    for i, c in enumerate(sec.classes):
        where = f"slo.classes[{i}]"
        if not c.name.strip() or any(ch.isspace() for ch in c.name):
            problems.append(
                ConfigError(f"must be non-empty without whitespace, got {c.name!r}", path=f"{where}.name")
            )
            continue
        if c.name in classes:
            problems.append(ConfigError(f"duplicate class {c.name!r}", path=f"{where}.name"))
            continue
        classes[c.name] = SloClass(
            name=c.name,
            kind=c.kind,
            band=i if c.band is None else c.band,
            ttft_ms=c.ttft_ms,
            itl_ms=c.itl_ms,
            e2e_ms=c.e2e_ms,
            task_sla_ms=c.task_sla_ms,
            task_metric=c.task_metric,
            steps=c.steps,
            on_infeasible=c.on_infeasible,
            max_queue=c.max_queue,
        )
    # A class that is declared but had a problem is reported once, above, not again where it is named.
    declared = {c.name for c in sec.classes}
    if not classes:  # every class had a problem: check the rest against the built-in one
        classes = dict(default_slo_policy().classes)
    default = sec.default_class or sec.classes[0].name
    if default not in classes:
        if default not in declared:
            problems.append(ConfigError(_unknown_class(default, classes), path="slo.default_class"))
        default = next(iter(classes))
    rules: list[SloRule] = []
    for i, r in enumerate(sec.rules):
        where = f"slo.rules[{i}]"
        rule_problems: list[ConfigError] = []
        if r.slo_class not in declared:
            rule_problems.append(ConfigError(_unknown_class(r.slo_class, classes), path=f"{where}.class"))
        if r.path is not None and r.path not in _PATHS:
            known = ", ".join(sorted(_PATHS))
            rule_problems.append(
                ConfigError(f"unknown path {r.path!r} (known: {known})", path=f"{where}.path")
            )
        for lo, hi in (("max_tokens_min", "max_tokens_max"), ("prompt_chars_min", "prompt_chars_max")):
            a, b = getattr(r, lo), getattr(r, hi)
            if a is not None and b is not None and a > b:
                rule_problems.append(ConfigError(f"must not be below {lo} ({a})", path=f"{where}.{hi}"))
        if rule_problems or r.slo_class not in classes:
            problems += rule_problems
            continue
        rules.append(
            SloRule(
                slo_class=r.slo_class,
                model=r.model,
                path=r.path,
                stream=r.stream,
                max_tokens_min=r.max_tokens_min,
                max_tokens_max=r.max_tokens_max,
                prompt_chars_min=r.prompt_chars_min,
                prompt_chars_max=r.prompt_chars_max,
                body=dict(r.body),
            )
        )
    slo = SloPolicy(
        classes=classes,
        default_class=default,
        rules=tuple(rules),
        tasks=tasks,
        unknown_class=sec.unknown_class,
    )
    return slo, problems


def _unknown_class(name: str, classes: dict[str, SloClass]) -> str:
    return f"unknown SLO class {name!r} (known: {', '.join(classes)})"
