"""Gateway overhead: what berth adds per request against a bare proxy and the upstream alone, its
event-loop lag, the scheduler's own decision cost, and what cluster mode costs."""
