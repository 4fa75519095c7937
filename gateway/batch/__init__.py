"""The OpenAI Files and Batches API: a durable store (SQLite and files on disk, embedded by default), the
validation of input files, and the runner that feeds batch lines to the scheduler as capacity frees.

The HTTP routes live in the front (`gateway.front.files_api`, `gateway.front.batches_api`), and so does
the one way a line reaches an engine (`gateway.front.batch_lines`: the same admission, scheduler and
dispatch as any request); this package sees that only through the `LineRunner` protocol.
"""
