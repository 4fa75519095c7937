"""Every benchmark, registered once: `berth-loadgen bench NAME` runs it, `bench --list` shows its question,
and the smoke test (`tests/unit/test_bench_smoke.py`) runs its smoke form and every preset it lists.

The descriptions are data (a module is named, not imported), so listing them imports no benchmark."""

from __future__ import annotations

from typing import Final

from loadgen.bench.skeleton import Benchmark, Catalogue


def _argv(options: str) -> tuple[str, ...]:
    return tuple(options.split())


_SCHEDULING_TINY: Final = _argv("--duration 3 --seeds 1 --rates 1 --patterns pattern1 --no-aladdin")

BENCHMARKS: Final = Catalogue(
    (
        # -- overhead: what berth costs
        Benchmark(
            name="overhead",
            group="overhead",
            question="What does berth add per request (CPU, latency, event-loop lag) over a bare proxy, and "
            "what does its loop pay for an SLO preset deciding over a full fleet with a standing queue?",
            targets=(
                "berth's CPU per request and added latency within the stated ratios to the bare proxy",
                "event-loop lag p99 <= the bare proxy's + 0.5 ms in the same run",
                "with --tests queue (coding-assistant, 100 endpoints, 1,000 queued): lag p99 <= the bare "
                "proxy's + 0.5 ms, no scheduler call over 5 ms",
            ),
            module="loadgen.bench.overhead.proxy",
            # the standing-queue phase at its smallest; the other phases' end-to-end run is the live test
            smoke=_argv("--quick --tests queue"),
            live_test="tests/integration/test_bench_overhead.py",
            processes=True,
        ),
        Benchmark(
            name="decisions",
            group="overhead",
            question="What does one scheduler call cost with a long queue on a large fleet, per preset?",
            targets=(
                "p99 <= 1 ms for submit, complete and tick with every preset",
                "p99 <= 2 ms in the batch backlog case",
            ),
            module="loadgen.bench.overhead.decision_cost",
            quick=_argv("--endpoints 20 --queued 200 --rounds 300 --warmup 10 --backlog 1000"),
            smoke=_argv("--endpoints 2 --queued 8 --rounds 20 --warmup 1 --backlog 8 --no-profile"),
        ),
        Benchmark(
            name="cluster-cost",
            group="overhead",
            question="What does cluster mode (a shared Redis) cost berth and Redis per request?",
            targets=(),
            module="loadgen.bench.overhead.cluster_cost",
            smoke=_argv("--quick --rounds 1 --duration 0.5 --warmup 0.2 --concurrency 4"),
            needs="redis-server on PATH",
            processes=True,
        ),
        # -- scheduling: how well berth places and orders work
        Benchmark(
            name="scheduling",
            group="scheduling",
            question="Does berth's SLO-aware policy beat round robin, power of two and least outstanding on "
            "CATO's coding setting?",
            targets=(
                "at the heaviest load: berth >= the best baseline + 0.10 task goodput, no task type "
                "below the best baseline for it by more than 0.02 (on the means over seeds)",
            ),
            module="loadgen.bench.scheduling.policies",
            smoke=_SCHEDULING_TINY,
            # the other shipped presets and the variants `--policies` may name (not run by default)
            presets=(_argv("--policies berth,default,chat-and-batch,aladdin,aladdin-paper,berth-scan"),),
            live_test="tests/integration/test_bench_scheduling_live.py",  # its --live form
        ),
        Benchmark(
            name="aladdin",
            group="scheduling",
            question="At each arrival rate, how few endpoints keep goodput >= 0.95 under berth's best fit, "
            "least outstanding and power of two?",
            targets=(
                "berth <= 1.2x the ATGT capacity floor at the highest rate (JSQ's ratio shown beside it)",
            ),
            module="loadgen.bench.scheduling.aladdin",
            smoke=_argv("--rates 3 --duration 4 --seeds 1 --max-endpoints 4 --stop-above 2"),
            presets=(_argv("--policies berth,aladdin-paper"),),  # the paper's variant (not run by default)
        ),
        Benchmark(
            name="whatif",
            group="scheduling",
            question="How does the coding fleet fare at ten times the traffic on 200 endpoints?",
            targets=(),
            module="loadgen.bench.scheduling.whatif",
            quick=_argv("--patterns pattern1"),
            smoke=_argv("--endpoints 6 --scale 0.4 --duration 4 --patterns pattern1"),
        ),
        Benchmark(
            name="classes",
            group="scheduling",
            question="Do instance classes, preemption and adaptive caps keep interactive work on target "
            "beside a batch backlog (Chiron's setting)?",
            targets=(
                "where least outstanding's interactive attainment < 0.90: berth keeps >= 0.99 with batch "
                "throughput >= 0.9x least outstanding's",
                "berth's batch throughput >= 0.9x the best static cap that keeps the ITL targets",
            ),
            module="loadgen.bench.scheduling.classes_live",
            smoke=_argv("--quick --backlog 40 --duration 5"),
            live_test="tests/integration/test_bench_classes_live.py",
        ),
        Benchmark(
            name="prefix",
            group="scheduling",
            question="With engine prefix caches, does berth beat the cache-aware routers' rule on goodput "
            "and TTFT?",
            targets=(
                "berth >= the best peer + 0.10 goodput and TTFT p90 <= 0.5x the best peer's where the best "
                "peer falls below 0.90",
                "berth's engine hit rate >= 0.75x the oracle's; prefix awareness costs <= 0.01 goodput "
                "on the control",
            ),
            module="loadgen.bench.scheduling.prefix",
            smoke=_argv("--quick --duration 6 --endpoints 2 --seeds 1"),
            presets=(_argv("--workloads coding"), _argv("--workloads sharegpt-like")),
            live_test="tests/integration/test_bench_prefix_live.py",
        ),
        Benchmark(
            name="batch-sim",
            group="scheduling",
            question="Does a large batch finish in its window while interactive chat keeps its SLO?",
            targets=(
                "interactive attainment at most 0.01 below its baseline with the batch beside it",
                "the batch completes within 1.1x the time the spare capacity allows",
            ),
            module="loadgen.bench.scheduling.batch_live",  # the simulated run, or --live its confirmation
            smoke=_argv("--lines 40 --duration 6 --rate 1"),
        ),
        Benchmark(
            name="cluster-replicas",
            group="scheduling",
            question="Does goodput hold with 1 to 4 berth replicas sharing the engines (cluster mode)?",
            targets=("3 replicas within 0.02 of one gateway's goodput",),
            module="loadgen.bench.scheduling.cluster_replicas",
            smoke=_argv("--replicas 1,2 --seeds 1 --duration 4"),
        ),
        # -- lifecycle: which models are resident, how many instances, of which configuration
        Benchmark(
            name="eviction",
            group="lifecycle",
            question="Does CACE eviction beat LRU when the models do not all fit (CACE's setting)?",
            targets=(
                "CACE closes >= 50 % of the LRU-to-Belady gap in evictions and mean TTFT on >= 2 patterns",
                "on no pattern worse than LRU on a mean figure (95 % interval of the ratio)",
            ),
            module="loadgen.bench.lifecycle.eviction",
            smoke=_argv("--quick --seeds 0 --duration-s 20"),
        ),
        Benchmark(
            name="autoscaling",
            group="lifecycle",
            question="Do berth's global autoscalers save devices at the same goodput (Chiron's, CATO's and "
            "MaaSO's settings)?",
            targets=(
                "chiron: <= 0.6x utilization-band's device-hours at equal attainment",
                "cato: cato-sla's device-hours <= 0.8x queue-length's at task goodput within 0.01",
                "maaso: as `bench maaso`",
            ),
            module="loadgen.bench.lifecycle.autoscaling",
            smoke=_argv("--smoke --seeds 0"),
        ),
        Benchmark(
            name="maaso",
            group="lifecycle",
            question="Do heterogeneous instance configurations placed by the SLO mix beat plain replication "
            "on the same devices?",
            targets=("the share of the headroom over plain replication gained >= 50 % at every burstiness",),
            module="loadgen.bench.lifecycle.maaso",
            smoke=_argv("--quick --duration 10"),
        ),
        # -- simulator: can its figures be trusted, how far does it scale, how good are the fitted models
        Benchmark(
            name="fidelity",
            group="simulator",
            question="Does the fleet simulator give the live path's figures on the same fleet, trace and "
            "policy?",
            targets=(
                "simulated task goodput within 0.03 of the live run's",
                "simulated P95 TTFT within 15 % of the live run's",
            ),
            module="loadgen.bench.simulator.fidelity",
            quick=_argv("--rates 8.5 --duration 30"),
            smoke=_argv("--rates 1 --duration 4 --endpoints 1 --speed 8"),
            processes=True,
        ),
        Benchmark(
            name="simscale",
            group="simulator",
            question="How fast and how large can the fleet simulator run (wall time, memory per endpoint)?",
            targets=(
                "the headline fleet within 60 s of wall time",
                "wall time near-linear in simulated requests (log-log slope <= 1.05)",
                "peak memory stated",
            ),
            module="loadgen.bench.simulator.sim_scale",
            quick=_argv("--sizes 10,20 --no-headline"),
            smoke=_argv("--sizes 2,4 --curve-duration 2 --no-headline --cpu="),
        ),
        Benchmark(
            name="predict-accuracy",
            group="simulator",
            question="How well do berth's fitted telemetry models predict the engine simulator?",
            targets=(
                "prefill and decode MAPE <= 10 %, KV MAPE <= 5 %",
                "output-length prediction no worse than the pooled spread; queue wait R^2 stated target",
            ),
            module="loadgen.bench.simulator.predict_accuracy",
            quick=_argv("--fit-requests 60 --queued 60"),
            smoke=_argv("--fit-requests 24 --queued 16 --speed 40 --queue-speed 40"),
        ),
        Benchmark(
            name="predict-live",
            group="simulator",
            question="How close does a live berth's fitted performance model get to the engine simulator's?",
            targets=(),
            module="loadgen.bench.simulator.predict_live",
            quick=_argv("--requests 60"),
            smoke=_argv("--requests 12 --speed 20"),
            processes=True,
        ),
        Benchmark(
            name="predict-real",
            group="simulator",
            question="How close does berth's fitted model get to a real vLLM on CPU?",
            targets=(),
            module="loadgen.bench.simulator.predict_real",
            quick=_argv("--requests 30"),
            live_test="tests/engine/test_bench_engine_smoke.py",
            needs="the engine venv (make engine-env)",
        ),
        # -- reliability: does berth stay correct under faults and with clients nobody here wrote
        Benchmark(
            name="soak",
            group="reliability",
            question="Does berth end every request precisely and return to its baseline under every fault "
            "kind?",
            targets=(
                "every invariant holds (requests end precisely, counters, tasks, connections, memory, "
                "log, keys, drain, every fault kind injected)",
            ),
            module="loadgen.bench.reliability.soak",
            live_test="tests/integration/test_soak.py",
        ),
        Benchmark(
            name="vllm",
            group="reliability",
            question="Is berth a drop-in for a vLLM server to vLLM's own benchmark client?",
            targets=("every request of `vllm bench serve` succeeds through berth",),
            module="loadgen.bench.reliability.vllm_bench",
            quick=_argv("--num-prompts 40"),
            live_test="tests/engine/test_bench_engine_smoke.py",
            needs="the engine venv (make engine-env)",
        ),
    )
)
