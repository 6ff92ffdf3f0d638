"""What a person sees: a `speclane` command run in a pseudo-terminal (`Terminal`, `in_terminal`), and its screen
rebuilt from the bytes it wrote (`screen`): carriage returns, erased lines and cursor moves, so a test reads what
stays on the screen, not what was once written."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable

CSI = re.compile(r"\x1b\[([0-9;?<=>]*)[ -/]*([@-~])")
OSC = re.compile(r"\x1b\][^\x07\x1b]*(\x07|\x1b\\)")


def screen(raw: str) -> list[str]:
    """The lines a terminal shows after `raw`: printable text, \\r, \\n, \\b, erase-line (K), erase-below (J),
    cursor up (A), down (B), forward (C), back (D), to a column (G) and to a row and column (H, counted from the
    top of what was written); other control sequences change nothing that is read here."""
    lines, row, col, i = [[]], 0, 0, 0
    while i < len(raw):
        m = CSI.match(raw, i) or OSC.match(raw, i)
        if m and m.re is CSI:
            args = [int(a) if a.isdigit() else None for a in m.group(1).split(";")]
            n, op = args[0], m.group(2)
            if op == "K":
                lines[row] = lines[row][:col] if (n or 0) == 0 else []
            elif op == "J":
                del lines[row + 1 :]
                lines[row] = lines[row][:col]
            elif op == "A":
                row = max(0, row - (n or 1))
            elif op == "B":
                row += n or 1
            elif op == "C":
                col += n or 1
            elif op == "D":
                col = max(0, col - (n or 1))
            elif op == "G":
                col = (n or 1) - 1
            elif op == "H":
                row, col = (n or 1) - 1, ((args[1] if len(args) > 1 else None) or 1) - 1
        if m:
            i = m.end()
        else:
            ch = raw[i]
            i += 1
            if ch == "\r":
                col = 0
            elif ch == "\n":
                row, col = row + 1, 0
            elif ch == "\b":
                col = max(0, col - 1)
            elif ch == "\x1b":
                i += 1  # a two-character escape (keypad modes, charsets): nothing shown
            elif ord(ch) >= 32:
                while len(lines) <= row:
                    lines.append([])
                line = lines[row]
                line.extend(" " * (col - len(line)))
                line[col : col + 1] = [ch]
                col += 1
        while len(lines) <= row:
            lines.append([])
    return ["".join(line).rstrip() for line in lines]


class Terminal:
    """`python -m speclane.pipeline.cli *args` with a pseudo-terminal as its stdin, stdout and stderr, `cols`
    wide. `send` types, `wait_for` reads until the screen shows something, `close` collects the exit status."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, cols: int = 120, rows: int = 40):
        self.main, sub = pty.openpty()
        fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = {
            **os.environ,
            "COLUMNS": str(cols),
            "LINES": str(rows),
            "TERM": "xterm-256color",
            "PROMPT_TOOLKIT_NO_CPR": "1",
            **(env or {}),
        }  # no cursor-position query left unanswered
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "speclane.pipeline.cli", *args],
            stdin=sub,
            stdout=sub,
            stderr=sub,
            env=env,
            close_fds=True,
        )
        os.close(sub)
        self.raw = b""

    @property
    def text(self) -> str:
        return self.raw.decode(errors="replace")

    def screen(self) -> list[str]:
        return screen(self.text)

    def _read(self, seconds: float) -> bool:
        """Read what comes within `seconds`; False once the command has closed the terminal."""
        ready, _, _ = select.select([self.main], [], [], seconds)
        if not ready:
            return self.proc.poll() is None
        try:
            chunk = os.read(self.main, 65536)
        except OSError:  # the command closed the terminal
            return False
        self.raw += chunk
        return bool(chunk)

    def wait_for(self, shown: str | Callable[[list[str]], bool], timeout: float = 240) -> list[str]:
        """Read until the screen holds `shown` (a text, or a test of the screen's lines); returns the screen."""
        test = shown if callable(shown) else (lambda lines: shown in "\n".join(lines))
        end = time.monotonic() + timeout
        while not test(self.screen()):
            if time.monotonic() > end or not self._read(0.2):
                raise AssertionError(f"never shown: {shown!r}; the screen:\n" + "\n".join(self.screen()[-40:]))
        return self.screen()

    def send(self, keys: str) -> None:
        os.write(self.main, keys.encode())

    def interrupt(self) -> None:
        """Ctrl-C, as the terminal sends it to the foreground command."""
        self.proc.send_signal(signal.SIGINT)

    def close(self, timeout: float = 240) -> int:
        """Read to the end; the command's exit status."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and self._read(0.5):
            pass
        try:
            return self.proc.wait(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("still running; the screen:\n" + "\n".join(self.screen()[-40:])) from None
        finally:
            os.close(self.main)


def in_terminal(args: list[str], timeout: float = 240) -> str:
    """Everything `speclane *args` writes to a terminal, run to its end; it must succeed."""
    term = Terminal(args)
    rc = term.close(timeout)
    assert rc == 0, term.text[-2000:]
    return term.text
