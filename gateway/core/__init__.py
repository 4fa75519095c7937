"""Types, errors, clocks and the task supervisor shared by every layer."""
