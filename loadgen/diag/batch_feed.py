"""What the batch machinery itself costs per line: a batch of `--lines` lines through the runner, the
SQLite store and the files on disk, with a LineRunner that answers every line at once (no scheduler, no
engine), so that what is timed is validation, feeding, recording each answer (one transaction each) and
writing the output file.

    berth-loadgen diag batch-feed [--lines 20000] [--in-flight 64]

Prints the validation time, the run (feed + answers) in lines per second, the finalization time, and the
peak resident memory of the process before the batch and after it (a batch is fed from disk: the peak
should grow by far less than the input file's size).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from pathlib import Path

import orjson

from gateway.batch.lines import LineAnswer, LineRequest
from gateway.batch.metrics import BatchMetrics
from gateway.batch.model import FileRecord
from gateway.batch.runner import BatchRunner, BatchSettings
from gateway.batch.sqlite_store import SqliteBatchStore
from gateway.batch.validate import BodyCheck
from gateway.core.tasks import TaskSupervisor

_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": " t0 t1 t2 t3"}}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34},
    }
)


class InstantLines:
    def checker(self) -> BodyCheck:
        return lambda endpoint, body: None

    def accepting(self) -> bool:
        return True

    async def run(self, line: LineRequest) -> LineAnswer:
        return LineAnswer(200, _ANSWER, prompt_tokens=30, completion_tokens=4)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


async def bench(lines: int, in_flight: int, root: Path) -> None:
    text = "lorem ipsum dolor sit amet " * 20

    def chunk(start: int) -> bytes:  # the input is written a thousand lines at a time, never whole
        return b"".join(
            orjson.dumps(
                {
                    "custom_id": f"req-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": "m",
                        "messages": [{"role": "user", "content": f"{i} {text}"}],
                        "max_tokens": 64,
                    },
                }
            )
            + b"\n"
            for i in range(start, min(start + 1000, lines))
        )

    runner = BatchRunner(
        SqliteBatchStore(root / "batch.sqlite3"),
        BatchSettings(dir=root, max_lines_in_flight=in_flight, max_lines=max(lines, 1)),
        InstantLines(),
        BatchMetrics(),
    )
    await runner.ensure_open()
    runner.files.ensure()
    upload = runner.files.upload("file-in", 1 << 40)
    for start in range(0, lines, 1000):
        await upload.write(chunk(start))
    await upload.commit()
    await runner.store.add_file(
        FileRecord(
            id="file-in", owner="t", purpose="batch", filename="in.jsonl", bytes=upload.size, created_at=0
        )
    )
    before = _peak_mib()
    t0 = time.perf_counter()
    rec = await runner.create("t", "file-in", "/v1/chat/completions", "24h", None)
    t1 = time.perf_counter()
    tasks = TaskSupervisor()
    tasks.spawn("batch-feeder", runner.run)
    await runner.wait_ended(rec.id)
    t2 = time.perf_counter()
    await tasks.close()
    done = await runner.store.get_batch("t", rec.id)
    await runner.close()
    assert done is not None
    assert done.completed == lines, done
    size = (root / "files" / "file-in").stat().st_size / (1 << 20)
    print(f"lines {lines}, input {size:.1f} MiB, in flight at most {in_flight}")
    print(f"validation        {t1 - t0:7.2f} s")
    print(f"run and finalize  {t2 - t1:7.2f} s   ({lines / (t2 - t1):,.0f} lines/s)")
    print(f"peak RSS          {before:7.1f} MiB before the batch, {_peak_mib():.1f} MiB after")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="berth-loadgen diag batch-feed", description=__doc__)
    p.add_argument("--lines", type=int, default=20_000)
    p.add_argument("--in-flight", type=int, default=64)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="berth-batch-bench-") as d:
        asyncio.run(bench(args.lines, args.in_flight, Path(d)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
