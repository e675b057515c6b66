"""One rank of tests/integrations/test_hf_ranks.py: `train_from_mvc` under a 2-process,
torchrun-style launch (gloo, CPU).

    python hf_ranks_worker.py RANK WORLD PORT DIR DELAY

Every rank runs the documented resume line, `train_from_mvc(trainer, DIR/runs, "HEAD")`, on a
shared output directory, with an `MvcCallback(delete=True)` committing the checkpoints it saves;
rank 1 starts DELAY seconds late and writes its RNG state into each checkpoint DELAY seconds
late.  Each writes DIR/rankN.json: the step it trained to and what
it left in the output directory, or the error it raised.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(rank: int, world: int, port: int, root: Path, delay: float) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hf_tiny import trainer as tiny_trainer  # the tests' tiny GPT-2 and data

    from mvc.integrations.hf import MvcCallback, train_from_mvc

    if rank == 1:
        time.sleep(delay)
    trainer = tiny_trainer(root / "out", [MvcCallback(root / "runs", delete=True)],
                           max_steps=10, ddp_backend="gloo")
    if rank == 1:   # a rank that writes its part of each checkpoint late
        save_rng = trainer._save_rng_state

        def late(output_dir: str) -> None:
            time.sleep(delay)
            save_rng(output_dir)
        trainer._save_rng_state = late  # type: ignore[method-assign]
    report: dict = {}
    try:
        out = train_from_mvc(trainer, root / "runs", "HEAD")
        report["step"] = int(out.global_step)
        report["left"] = sorted(p.name for p in (root / "out").iterdir())
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report["error"] = f"{type(exc).__name__}: {exc}"
    (root / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), float(sys.argv[5]))
