"""Reliability: the fault-matrix soak, and a client nobody here wrote (vLLM's own benchmark) pointed at
berth."""
