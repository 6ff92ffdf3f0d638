"""The benchmark workloads: fixed prompts from offline text nobody here wrote, generated once and committed.

Three workloads: `code_edit` (a chunk of a held-out standard-library file, or of one of
transformers' `modular_*.py` files, followed by a cue to repeat it with an edit: the answer copies the prompt, the
case prompt lookup is for), `code_gen` (a function to write from its signature and a description taken from a
held-out stdlib docstring) and `prose` (CPython's `pydoc_data.topics` and Debian's licence texts, to explain in
free words). Files are chosen by the same held-out rule the drafter fitting uses (stages/fitting/data.py), so a
fitted drafter is never measured on its own training text.

    python -m speclane.bench.workloads          # rewrites bench/prompts.jsonl (deterministic: same files, same output)

Owns the generator and the loader; what is measured on the prompts is elsewhere (bench/measure.py).
"""

from __future__ import annotations

import ast
import json
import random
import re
import sys
import sysconfig
from pathlib import Path

PROMPTS = Path(__file__).with_name("prompts.jsonl")
WORKLOADS = ("code_edit", "code_gen", "prose")
PER_WORKLOAD = 24
CHUNK_LINES = (22, 34)  # lines of code per code-edit prompt: about 200-400 tokens with the cue
PROSE_CHARS = 1100  # about 250 tokens
# Long-prompt buckets (prompts of about 256, 1k and 4k tokens): the first two workloads' prompts are
# the 256 bucket; these are code edits of a longer chunk and prose to summarize, about 1k and 4k tokens.
LONG = {"long_1k": 3600, "long_4k": 14000}  # characters (code and this prose run about 3.5 characters a token)
PER_LONG = 6
EDITS = (
    "Repeat this code exactly, but rename `{name}` to `{name}_v2` everywhere.",
    "Repeat this code with a one-line comment added above `{name}`; change nothing else.",
    "Rewrite this code unchanged except that `{name}` gets a docstring.",
)


def _held_out(name: str) -> bool:
    from speclane.stages.fitting.data import held_out  # the drafter fitting's split: measure only on text it never saw

    return held_out(name)


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo")
    files = sorted(f for f in root.rglob("*.py") if not set(f.relative_to(root).parts) & set(skip))
    return [f for f in files if _held_out(str(f))]


def _defs(text: str) -> list[tuple[int, str]]:
    """(line index, name) of each top-level or method `def`/`class` in `text`."""
    return [(i, m.group(2)) for i, row in enumerate(text.splitlines()) if (m := re.match(r"\s*(def|class) (\w+)", row))]


def _code_edit(rng: random.Random, files: list[Path], n: int) -> list[dict]:
    out = []
    import transformers

    modular = sorted(Path(transformers.__file__).parent.glob("models/*/modular_*.py"))
    modular = [f for f in modular if _held_out(str(f))]
    while len(out) < n:
        src = rng.choice(modular if len(out) % 3 == 2 else files)  # one in three from transformers' modular files
        text = src.read_text(encoding="utf-8", errors="replace")
        defs = _defs(text)
        if not defs:
            continue
        start, name = rng.choice(defs)
        chunk = "\n".join(text.splitlines()[start : start + rng.randint(*CHUNK_LINES)]).strip("\n")
        if len(chunk) < 400 or len(chunk) > 2400:
            continue
        cue = rng.choice(EDITS).format(name=name)
        out.append({"source": _short(src), "user": f"```python\n{chunk}\n```\n\n{cue}"})
    return out


def _code_gen(rng: random.Random, files: list[Path], n: int) -> list[dict]:
    out, seen = [], set()
    while len(out) < n:
        src = rng.choice(files)
        try:
            tree = ast.parse(src.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        funcs = [
            f
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef)
            and not f.name.startswith("_")
            and (doc := ast.get_docstring(f))
            and 120 < len(doc) < 900
        ]
        if not funcs:
            continue
        f = rng.choice(funcs)
        if (src, f.name) in seen:
            continue
        seen.add((src, f.name))
        sig = f"def {f.name}({ast.unparse(f.args)}):"
        out.append(
            {
                "source": f"{_short(src)}:{f.name}",
                "user": f"Write a Python function `{sig}`.\n\n{ast.get_docstring(f)}\n\nGive only the code.",
            }
        )
    return out


def _prose(rng: random.Random, n: int) -> list[dict]:
    from pydoc_data.topics import topics

    pools = [[(f"pydoc_data.topics:{k}", v) for k, v in sorted(topics.items()) if _held_out(f"pydoc_data.topics:{k}")]]
    lic = Path("/usr/share/common-licenses")
    if lic.is_dir():  # Debian's licence texts; absent elsewhere, then pydoc alone
        pools.append(
            [(f"common-licenses/{f.name}", f.read_text(errors="replace")) for f in sorted(lic.iterdir()) if f.is_file()]
        )
    out = []
    while len(out) < n:
        name, text = rng.choice(pools[len(out) % len(pools)])  # alternate documentation and licences
        paras = [p.strip() for p in re.split(r"\n\s*\n", text) if len(p.strip()) > 300]
        if not paras:
            continue
        para = rng.choice(paras)[:PROSE_CHARS]
        ask = rng.choice(
            (
                "Explain this in your own words:",
                "Summarize this text, then say why it matters:",
                "Continue this text in the same style:",
            )
        )
        out.append({"source": name, "user": f"{ask}\n\n{para}"})
    return out


def _long(rng: random.Random, files: list[Path], n: int, chars: int) -> list[dict]:
    """Alternately a code edit of about `chars` characters of a held-out stdlib file (from a def on), and held-out
    pydoc topics (consecutive ones joined up to that length) to summarize. The licence texts are not used here:
    most are in the drafters' fitting corpus, and the held-out ones are near-copies of fitted ones."""
    from pydoc_data.topics import topics

    docs = [v.strip() for k, v in sorted(topics.items()) if _held_out(f"pydoc_data.topics:{k}")]
    starts = iter(rng.sample(range(len(docs)), len(docs)))  # a different first topic for each prompt
    out = []
    while len(out) < n:
        if len(out) % 2 == 0:
            src = rng.choice(files)
            rows = src.read_text(encoding="utf-8", errors="replace").splitlines()
            defs = [d for d in _defs("\n".join(rows)) if sum(len(r) + 1 for r in rows[d[0] :]) > chars]
            if not defs:
                continue
            start, name = rng.choice(defs)
            chunk = "\n".join(rows[start:])[:chars].rsplit("\n", 1)[0]
            cue = rng.choice(EDITS).format(name=name)
            out.append({"source": _short(src), "user": f"```python\n{chunk}\n```\n\n{cue}"})
        else:
            i = next(starts)
            text, names = "", []
            while len(text) < chars:
                text += docs[i % len(docs)] + "\n\n"
                names.append(str(i % len(docs)))
                i += 1
            text = text[:chars].rsplit("\n", 1)[0]
            out.append(
                {
                    "source": f"pydoc_data.topics (held-out topics from #{names[0]})",
                    "user": f"Summarize this text:\n\n{text}",
                }
            )
    return out


def _short(path: Path) -> str:
    parts = path.parts
    cut = max(i for i, p in enumerate(parts) if p in ("python3.11", "lib", "transformers") or p.startswith("python3"))
    return "/".join(parts[cut:])


def generate(per_workload: int = PER_WORKLOAD, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    files = _stdlib_files()
    rows = {
        "code_edit": _code_edit(rng, files, per_workload),
        "code_gen": _code_gen(rng, files, per_workload),
        "prose": _prose(rng, per_workload),
    }
    long_rng = random.Random(seed + 1)  # its own stream: adding buckets leaves the workloads' prompts as they were
    rows.update({w: _long(long_rng, files, PER_LONG, chars) for w, chars in LONG.items()})
    return [{"id": f"{w}-{i:02d}", "workload": w, **row} for w in (*WORKLOADS, *LONG) for i, row in enumerate(rows[w])]


def load(path: Path = PROMPTS) -> list[dict]:
    """The committed prompts: dicts with id, workload, source, user (the chat message)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pick(prompts: list[dict], workload: str, n: int) -> list[dict]:
    """The first `n` prompts of a workload, in file order (a quick run measures a prefix of a full one)."""
    return [p for p in prompts if p["workload"] == workload][:n]


def main() -> int:
    rows = generate()
    PROMPTS.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {PROMPTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
