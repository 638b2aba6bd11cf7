"""Kill `generate` before and after each of its file-system steps (for test_golden_replace).

Run as a script in a fresh interpreter, which forks one child per kill, so
the test process itself never forks:

    python _crash_driver.py ROOT {replacing,fresh}

For each step ``n`` and ``when`` in ``before``/``after``, ``ROOT/n-when/``
gets a suite of the OLD cases at ``golden`` (when replacing), then a child
generating the NEW cases there is killed with ``os._exit(9)`` at that step.
Prints JSON: ``{"total": steps of a run that is not killed, "runs": [[n,
when, exit status], ...]}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from relpos_ref import golden
from relpos_ref.golden import build, paths

OLD = ["bias/decode-step/*"]
NEW = ["shaw/clip/*"]

# The steps a generate takes on the file system, each one a place to die.
STEPS = [
    (os, "mkdir"), (os, "rename"), (os, "replace"), (os, "unlink"), (os, "rmdir"),
    (paths, "write_new"), (build, "build_case"),
]


def cases(globs: list[str]) -> list[golden.Case]:
    return golden.default_cases().select(globs, dtypes=["float32"])


def run_child(out: Path, die_at: int | None, when: str) -> tuple[int, int]:
    """Generate NEW at `out` in a child killed at step `die_at`; (exit status, steps)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        count = [0]

        def crashing(real):
            def step(*args, **kwargs):
                count[0] += 1
                if count[0] == die_at and when == "before":
                    os._exit(9)
                result = real(*args, **kwargs)
                if count[0] == die_at and when == "after":
                    os._exit(9)
                return result
            return step

        for owner, name in STEPS:
            setattr(owner, name, crashing(getattr(owner, name)))
        try:
            golden.generate(out, cases(NEW), force=True)
        except BaseException:
            os._exit(3)
        os.write(write, str(count[0]).encode())
        os._exit(0)
    os.close(write)
    steps = b""
    while chunk := os.read(read, 64):
        steps += chunk
    os.close(read)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), int(steps or 0)


def main(root: Path, scenario: str) -> dict:
    def prepare(name: str) -> Path:
        out = root / name / "golden"
        out.parent.mkdir(parents=True)
        if scenario == "replacing":
            golden.generate(out, cases(OLD))
        return out

    code, total = run_child(prepare("count"), None, "before")
    if code != 0:
        msg = f"an uninterrupted run exited {code}"
        raise SystemExit(msg)
    runs = []
    for n in range(1, total + 1):
        for when in ("before", "after"):
            code, _ = run_child(prepare(f"{n}-{when}"), n, when)
            runs.append([n, when, code])
    return {"total": total, "runs": runs}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2])))
