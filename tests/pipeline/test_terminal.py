"""What a person sees: `generate` run in a pseudo-terminal, its screen rebuilt from the bytes it wrote (carriage
returns, erased lines, cursor moves), holds the whole answer: progress bars on the same terminal never erase it."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time

PROMPT = "What is the capital of France?"
ARGS = ["generate", "--chat", "--prompt", PROMPT, "--max-tokens", "12", "--spec-backend", "ngram"]
CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


def screen(raw: str) -> list[str]:
    """The lines a terminal shows after `raw`: printable text, \\r, \\n, erase-line (K), erase-below (J), cursor up (A),
    down (B) and to a column (G); other control sequences change nothing that is read here."""
    lines, row, col, i = [[]], 0, 0, 0
    while i < len(raw):
        m = CSI.match(raw, i)
        if m:
            n = int(m.group(1)) if m.group(1).isdigit() else None
            op = m.group(2)
            if op == "K":
                lines[row] = lines[row][:col] if (n or 0) == 0 else []
            elif op == "J":
                del lines[row + 1:]
                lines[row] = lines[row][:col]
            elif op == "A":
                row = max(0, row - (n or 1))
            elif op == "B":
                row += n or 1
            elif op == "G":
                col = (n or 1) - 1
            i = m.end()
            continue
        ch = raw[i]
        i += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row, col = row + 1, 0
        elif ch == "\x1b" or ord(ch) < 32:
            continue
        else:
            line = lines[row]
            line.extend(" " * (col - len(line)))
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
        while len(lines) <= row:
            lines.append([])
    return ["".join(line) for line in lines]


def _in_terminal(args: list[str], timeout: float = 240) -> str:
    main, sub = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}
    proc = subprocess.Popen([sys.executable, "-m", "speclane.pipeline.cli", *args], stdin=sub, stdout=sub, stderr=sub,
                            env=env, close_fds=True)
    os.close(sub)
    out, end = b"", time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([main], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(main)
    assert proc.returncode == 0, out.decode(errors="replace")[-2000:]
    return out.decode(errors="replace")


def test_the_streamed_answer_stays_on_screen():
    done = subprocess.run([sys.executable, "-m", "speclane.pipeline.cli", *ARGS, "--json"], capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.splitlines()[0])["text"].strip()
    assert answer
    shown = "\n".join(screen(_in_terminal(ARGS)))
    assert answer.split("\n")[0] in shown, shown
