"""berth-agent: the node agent, one per GPU machine, the only thing that starts or stops engine processes.

The gateway runs it per action (`berth-agent [-c agent.toml] node | list | plan | start | stop | logs`) and
reads one JSON object from its stdout (`contract`). Modules, in the order a command uses them:
`config` (agent.toml and models.toml, strictly decoded), `inventory` (devices: NVML or configured sizes),
`procs` (/proc: process identity, groups, CPU time), `state` (instance records and the node lock),
`ledger` (per-device memory admission, sans-IO), `view` (the node as one invocation sees it, and the
reports built from it), `backends` (process groups or systemd units), `health` (the engine's health
route), `loading` (waiting for a launched engine), `ports`, `wait` (bounded polling), `adoption` (the
records re-adopted as every command begins), `admission` (a start's checks and its record), `node` (the
commands), `cli`.
Imports only `gateway.core`.
"""
