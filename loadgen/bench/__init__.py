"""Benchmarks, one package per question (`berth-loadgen bench --list`; docs/benchmarks.md): `overhead`
(what berth costs), `scheduling` (how well it places and orders work), `lifecycle` (which models are
resident, how many instances, of which configuration), `simulator` (can the fleet simulator's figures be
trusted, how far does it scale, how good are the fitted models) and `reliability` (faults, foreign
clients). Every one is registered in `catalogue` and ends in `skeleton.run_bench`. Performance is measured
here, never asserted in tests."""
