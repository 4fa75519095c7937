"""`python -m gateway.agent`: the same as the `berth-agent` console script."""

from gateway.agent.cli import main

raise SystemExit(main())
