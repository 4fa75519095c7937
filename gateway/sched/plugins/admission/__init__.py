"""Admitters: what happens to a request on arrival when its SLO looks infeasible."""
