"""Which engines exist and their state: the endpoint set (configured and agent-started endpoints), the
instance state machine (`instances`, sans-IO: the live manager and the fleet simulator drive the same
one), the node agents' client (`agent_client`) and the live lifecycle manager (`manager`)."""
