"""`tests/run_in_turn.py ... tests/copy_checkpoint.py SRC_DIR STEP DST_DIR`: rank 0 copies checkpoint STEP of a run
(the file and its checksum, or a sharded checkpoint's directory) into a new run directory, where the job's next
command resumes it: a run interrupted after that checkpoint. The other ranks go on: the next run's process group
waits for rank 0."""
import os
import shutil
import sys
from pathlib import Path

if __name__ == "__main__":
    source, step, target = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    if os.environ.get("RANK", "0") == "0":
        target.mkdir(parents=True, exist_ok=True)
        sharded = source / f"model_{step:05d}.dcp"
        if sharded.is_dir():
            shutil.copytree(sharded, target / sharded.name)
        else:
            for suffix in ("", ".sha256"):
                shutil.copy(source / f"model_{step:05d}.pt{suffix}", target / f"model_{step:05d}.pt{suffix}")
