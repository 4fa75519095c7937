"""Parameters shared by the plugins that predict latencies (see `gateway.sched.predict`)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from gateway.sched.predict import PredictParams


class PredictionParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    # mean: predicted means; normal / cantelli: means plus the bound for violation probability `tau`
    # from the output-length predictor's spread (Aladdin's tail mode).
    tail: Literal["mean", "normal", "cantelli"] = "mean"
    tau: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.1
    # Share of time prefills of new arrivals pause decoding (slows every predicted token).
    prefill_overhead: Annotated[float, Meta(ge=0.0, le=10.0)] = 0.1

    def predict_params(self) -> PredictParams:
        return PredictParams(tail=self.tail, tau=self.tau, prefill_overhead=self.prefill_overhead)
