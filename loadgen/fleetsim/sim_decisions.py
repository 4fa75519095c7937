"""The fleet simulator carries out berth's decisions as the live driver does: a dispatch submits the
request to its endpoint's engine (with the engine priority berth sends), a preemption aborts the victim's
engine request, a rejection answers the client; in cluster mode the replicas' loads are published."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gateway.core import errors
from gateway.core.types import EndpointId
from gateway.sched.decisions import Decision, Dispatch, Preempt
from gateway.sched.types import PeerLoad
from gateway.upstream.dialects import dialect_for
from loadgen.engine_sim.tokens import GENERATED_TOKEN_ID, TokenIds
from loadgen.fleetsim.gateway import SimGateway
from loadgen.fleetsim.sim_state import SimState
from loadgen.fleetsim.streams import Call


class DecisionSide(SimState):
    # ----------------------------------------------------------------- berth's decisions
    def _apply(self, decisions: Sequence[Decision], gw: SimGateway | None = None) -> None:
        """Carry out the decisions of replica `gw`'s scheduler (None: the first, the only one without
        cluster mode). Serving the call left to do (`Scheduler.owed`) is carried on first, at the same
        instant: its slices decide as one uncut serve would (`gateway.sched.slices`)."""
        sched = (gw or self.gw).scheduler
        if sched.owed:
            decisions = list(decisions)
            while sched.owed:
                decisions.extend(sched.serve())
        self._count_faults()
        for d in decisions:
            if isinstance(d, Preempt):
                self._preempted(d)
                continue
            call = self._running.get(d.req.id)
            if call is None or call.done:
                if isinstance(d, Dispatch):  # nobody waits for it any more: give the seat back
                    src = gw or self.gw
                    self._apply(src.scheduler.complete(d.req.id), src)
                continue
            if isinstance(d, Dispatch):
                self._dispatch(call, d)
            else:
                self._reject(call, d.error)

    def _preempted(self, d: Preempt) -> None:
        """Abort the victim's engine request; its client keeps waiting for the rest of its stream."""
        self.preemptions += 1
        call = self._running.get(d.victim.id)
        if call is None or call.endpoint is None:
            return
        ep = call.endpoint
        if call.engine_req is not None:
            self._cut(ep)
            ep.engine.abort(call.engine_req)
            self._on_engine.pop(call.engine_req, None)
            call.engine_req = None
        call.endpoint = None
        if ep.wake_at is None:
            self._step(ep)

    def _dispatch(self, call: Call, d: Dispatch) -> None:
        now = self.clock.t
        ep = self._by_id[d.endpoint.id]
        ctx = call.ctx
        ctx.attempts += 1
        ctx.endpoint = ep.id
        ctx.dispatched_at = now
        if self.life is not None:
            self.life.on_dispatch(d.req, ep.id)
        call.gw.dispatched(ctx, d.req, ep.id)  # the placing replica's own prefix index
        call.endpoint = ep
        call.result.endpoint = ep.id
        spec = call.task.spec.calls[call.index]
        done = call.produced  # tokens the client has from earlier, preempted runs
        if done:
            self.resumes += 1
            self.recomputed_tokens += spec.prompt_tokens + done
        else:
            call.result.queue_ms = round((now - ctx.arrival) * 1000.0, 3)
        call.run_base = done
        call.run_first_at = None
        call.report_at = done + 1
        priority = spec.priority or 0
        if d.endpoint.priority_scheduling:
            urgency = call.gw.scheduler.engine_priority(d.req.id)
            if urgency is not None:
                priority = dialect_for(d.endpoint.engine).priority(urgency)
        self._cut(ep)  # the iterations after the one in flight may admit it
        try:
            call.engine_req = ep.engine.submit(
                d.req.id,
                # the engine counts the prompt it gets (the body's tokens, when an engine caches)
                prompt_tokens=(spec.prompt_tokens if call.prompt_ids is None else len(call.prompt_ids))
                + done,
                output_tokens=max(1, spec.output_tokens - done),
                max_tokens=max(1, spec.output_tokens - done),
                priority=priority,
                now=now,
                token_ids=_with_output(call.prompt_ids, done),
            )
        except ValueError as e:  # the engine refuses what cannot fit its KV cache (a 400 live)
            self._running.pop(d.req.id, None)
            self._apply(call.gw.scheduler.complete(d.req.id), call.gw)
            self._reject(call, errors.upstream_status(400, str(e)))
            return
        self._on_engine[call.engine_req] = call
        if ep.wake_at is None:
            self._step(ep)

    def _count_faults(self) -> None:
        for gw in self.gws:
            sched = gw.scheduler
            if sched.faults:
                self.faults += len(sched.take_faults())

    def _publish(self) -> None:
        """Cluster mode's beat: every replica's own load per endpoint, summed over the others, handed to
        each replica's scheduler (gateway.cluster.member; Redis's round trip is not modelled)."""
        own = [gw.scheduler.own_loads() for gw in self.gws]
        for i, gw in enumerate(self.gws):
            peers: dict[EndpointId, PeerLoad] = {}
            for j, loads in enumerate(own):
                if j == i:
                    continue
                for eid, v in loads.items():
                    was = peers.get(eid)
                    peers[eid] = (
                        v
                        if was is None
                        else PeerLoad(
                            was.inflight + v.inflight,
                            was.prompt_tokens + v.prompt_tokens,
                            was.output_tokens + v.output_tokens,
                        )
                    )
            self._apply(gw.scheduler.observe_peers(peers), gw)


def _with_output(ids: TokenIds | None, produced: int) -> TokenIds | None:
    """A resumed request's ids: the prompt's, then the tokens the client already has."""
    if ids is None or not produced:
        return ids
    return np.concatenate([ids, np.full(produced, GENERATED_TOKEN_ID, dtype=np.int64)])
