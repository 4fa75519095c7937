"""Preemption plugins (`gateway.sched.interfaces.Preemptor`)."""
