"""Every command of README.md runs and exits as the README says (issue 14 item 3).

The commands are read from README.md itself: every line of its shell code blocks (```sh, also
indented inside list items) and its Python code blocks. A command added to the README is run
here without editing this file; one that cannot run here makes the test fail until it is given a
small input or an exclusion below.

How a README line is run
------------------------
Each shell line runs as typed, in README order within its code block (a block's later lines may
read the files its earlier lines wrote, e.g. ``plan.json``), in a fresh directory per block,
through ``bash -o pipefail -c LINE`` (pipes and redirections as in a shell; a failure anywhere in a
pipe fails the line), with ``memplan`` the installed script of this Python (``python -m memplan``
where none is installed). A line must exit 0, or the status its comment names (``# exit 1``).
Only the substitutions of this table change a line; each is applied to the words of the
``memplan`` command it names, nothing else of the line (pipes, redirections, other options) is
touched:

=================================  ============================================================
README                             run here (why)
=================================  ============================================================
``memplan profile|run MODEL ...``  ``-b``/``--batch-size``, ``--input-shape`` and ``--config``
                                   replaced by ``SMALL_INPUTS[MODEL]`` (a resnet at batch 2 on
                                   3x64x64 images, a transformer on 16 tokens with two layers);
                                   ``--repeats 1``. Profiling at the README's sizes takes
                                   minutes on 2 CPU cores.
``--time-limit N`` (CP-SAT)        ``--time-limit 2`` when N is larger: the solvers return their
                                   best plan at the limit, which must still be found (exit 0).
``jq EXPR`` when jq is missing     the same field read by ``python -c`` (jq is not Python; the
                                   JSON memplan prints is what is tested).
``mypkg.models:make_net``          ``mypkg/models.py`` written by this test in the block's
                                   directory: the README's "factory of yours" (found from the
                                   current directory, without ``PYTHONPATH``).
=================================  ============================================================

Lines not run (``EXCLUDED``) are those that need what a CI machine lacks (a GPU:
``--device cuda``, ``make gpu-check``) and the ``make`` targets (``make test`` is what runs this
test in CI); the test checks that the exclusions are exactly the README's lines of that kind, so
the list cannot grow silently. Lines needing an extra that is not installed (torch, transformers,
matplotlib) are not run and the test is then skipped, naming them.

Lines run two at a time (the machine's cores, at most 2; a line that reads a file another
writes runs after it, in its directory), torch's first, with ``OMP_NUM_THREADS=1`` unless set,
so that the test stays about a minute on an idle 2-core machine; everything a failed line
printed is shown. The blocks with a line that profiles or trains (``memplan profile``/``memplan
run``: torch, the longest) are marked slow: ``make test-all`` runs them, ``make test`` the others.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

# Small inputs per model of a README `memplan profile`/`memplan run` line (see the table above).
SMALL_INPUTS: dict[str, tuple[str, ...]] = {
    "resnet18": ("-b", "2", "--input-shape", "3,64,64"),
    "resnet50": ("-b", "2", "--input-shape", "3,64,64"),
    "gpt-small": ("-b", "1", "--input-shape", "16"),
    "gpt-tiny": (),  # already tiny: run as typed
    "hf:gpt2": ("-b", "1", "--input-shape", "16", "--config", "n_layer=2"),
    "hf:llama-1b": (
        "-b",
        "1",
        "--input-shape",
        "16",
        "--config",
        "num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=2,"
        "num_key_value_heads=1,vocab_size=512",
    ),
    "mypkg.models:make_net": (),  # FACTORY below is small
}
SIZE_OPTIONS = ("-b", "--batch-size", "--input-shape", "--config", "--repeats")
TIME_LIMIT = 2

# README lines not run, with the reason (see the module docstring).
EXCLUDED: dict[str, str] = {
    "make run": "sets up .venv and runs `memplan info/solve/compare resnet50`, README commands "
    "run here one by one",
    "make test": "what CI runs (.ci/run): it runs this test",
    "make test-all": "the suite with its slow tests: it runs this test",
}

# The README's `mypkg.models:make_net`, written in the directory of the block that profiles it.
FACTORY = '''\
import torch


def make_net():
    """Four linear blocks and an input batch of 8."""
    blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(4)]
    return torch.nn.Sequential(*blocks), torch.randn(8, 64)
'''


@dataclass
class Line:
    """One command of a README code block."""

    lineno: int  # in README.md
    text: str  # as written, without its comment
    comment: str

    @property
    def expected_status(self) -> int:
        found = re.search(r"\bexit (\d+)\b", self.comment)
        return int(found.group(1)) if found else 0


@dataclass
class Block:
    """One fenced code block of README.md."""

    lineno: int
    lang: str
    lines: list[Line] = field(default_factory=list)
    source: str = ""

    @property
    def key(self) -> str:
        return f"{self.lang}-L{self.lineno}"


FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


def readme_blocks(text: str) -> list[Block]:
    """The fenced code blocks of ``text`` in the languages sh/bash/shell/console and python."""
    blocks: list[Block] = []
    current: Block | None = None
    body: list[tuple[int, str]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(raw)
        if current is None and fence:
            current, body = Block(lineno, fence.group(2) or "text"), []
        elif current is not None and fence and not fence.group(2):
            if current.lang in ("sh", "bash", "shell", "console"):
                current.lang = "sh"
                current.lines = _shell_lines(body)
                blocks.append(current)
            elif current.lang == "python":
                current.source = "\n".join(line for _, line in body) + "\n"
                blocks.append(current)
            current = None
        elif current is not None:
            body.append((lineno, raw))
    return blocks


def _shell_lines(body: list[tuple[int, str]]) -> list[Line]:
    lines: list[Line] = []
    pending = ""
    for lineno, raw in body:
        stripped = raw.strip()
        if stripped.startswith("$ "):
            stripped = stripped[2:]
        if not stripped or (stripped.startswith("#") and not pending):
            continue
        pending += stripped
        if pending.endswith("\\"):  # a continued line
            pending = pending[:-1] + " "
            continue
        command, _, comment = pending.partition(" #")
        lines.append(Line(lineno, " ".join(command.split()), comment.strip()))
        pending = ""
    return lines


def needs_exclusion(command: str) -> bool:
    """A `make` target, or a command that needs a GPU."""
    return command.split()[0] == "make" or "--device cuda" in command


def _shrink_memplan(words: list[str]) -> list[str]:
    """Apply the substitution table to the words of one ``memplan ...`` command."""
    out = list(words)
    if len(out) > 2 and out[1] in ("profile", "run"):
        model = out[2]
        if model not in SMALL_INPUTS:
            raise KeyError(
                f"README profiles {model!r}: add its small inputs to SMALL_INPUTS in {__file__}"
            )
        kept: list[str] = out[:3]
        rest = iter(out[3:])
        for word in rest:
            name = word.split("=", 1)[0]
            if name in SIZE_OPTIONS:
                if "=" not in word:
                    next(rest, None)
                continue
            kept.append(word)
        timed = not {"--estimate", "--gpu-spec", "--graph"} & set(kept)
        out = [*kept, *SMALL_INPUTS[model], *(("--repeats", "1") if timed else ())]
    for k, word in enumerate(out[:-1]):
        if word == "--time-limit" and float(out[k + 1]) > TIME_LIMIT:
            out[k + 1] = str(TIME_LIMIT)
    return out


def substitute(command: str, python: str, have_jq: bool) -> str:
    """The line run for the README line ``command`` (see the table of the module docstring)."""
    pieces = []
    for piece in command.split("|"):
        words = shlex.split(piece)
        if words and words[0] == "memplan":
            words = _shrink_memplan(words)
        elif words and words[0] == "jq" and not have_jq:
            if len(words) != 2 or not re.fullmatch(r"\.\w+", words[1]):
                raise ValueError(f"no stand-in for {piece.strip()!r} without jq")
            read = f"import json, sys; print(json.load(sys.stdin)[{words[1][1:]!r}])"
            words = [python, "-c", read]
        pieces.append(" ".join(_shell_word(word) for word in words))
    return " | ".join(pieces)


def _shell_word(word: str) -> str:
    """``word`` quoted for bash, redirections (``>``, ``2>``, ``>>``) left as they are."""
    return word if re.fullmatch(r"[0-9]?(>>?|<)", word) else shlex.quote(word)


def missing_extras(text: str) -> list[str]:
    """The optional packages a README command or snippet needs that are not installed."""
    needs = []
    if re.search(r"memplan (profile|run)\b|memplan\.torch", text):
        needs.append("torch")
    if "hf:" in text:
        needs.append("transformers")
    if "--plot" in text or re.search(r"memplan plot\b", text):
        needs.append("matplotlib")
    return [name for name in needs if importlib.util.find_spec(name) is None]


@dataclass
class Outcome:
    """What one README line did."""

    line: Line
    ran: str
    status: int | None  # None: not run (missing extras)
    output: str = ""
    missing: tuple[str, ...] = ()


def _env(bin_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)  # the factory must be found from the current directory
    # Two commands run at once on a 2-core machine: one torch thread each, not two contending
    # (docs/benchmarks.md, issue 14 items 1-2); the commands themselves are unchanged.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _memplan_bin(tmp: Path) -> Path:
    """The directory of the installed `memplan` script, or of a stand-in running ``-m memplan``."""
    here = Path(sys.executable).parent
    if (here / "memplan").exists():
        return here
    tmp.mkdir(parents=True, exist_ok=True)
    script = tmp / "memplan"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m memplan "$@"\n')
    script.chmod(0o755)
    return tmp


WRITES = re.compile(r"(?:^|\s)(?:-o|--output|--trace|--plot|[0-9]?>>?)\s+(\S+)")


def jobs_of(block: Block) -> list[list[Line]]:
    """The lines of ``block`` to run, in groups that can run at the same time: a line that names
    a file an earlier line writes (``-o``, ``--trace``, ``--plot``, ``>``) joins that line's
    group and runs after it, in the same directory."""
    jobs: list[list[Line]] = []
    writer: dict[str, int] = {}  # file -> index of the job that writes it
    for line in block.lines:
        if line.text in EXCLUDED:
            continue
        words = set(shlex.split(line.text.replace("|", " ")))
        after = sorted({writer[name] for name in words & writer.keys()})
        assert len(after) <= 1, f"README.md:{line.lineno} reads files of two groups: {after}"
        index = after[0] if after else len(jobs)
        if not after:
            jobs.append([])
        jobs[index].append(line)
        writer |= {name: index for name in WRITES.findall(line.text)}
    return jobs


def run_python(block: Block, workdir: Path, bin_dir: Path) -> list[Outcome]:
    """Run the Python snippet of ``block`` as a script in ``workdir``."""
    missing = tuple(missing_extras(block.source))
    line = Line(block.lineno, "python: the README snippet", "")
    if missing:
        return [Outcome(line, "", None, missing=missing)]
    done = subprocess.run(
        [sys.executable, "-c", block.source],
        cwd=workdir,
        env=_env(bin_dir),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return [Outcome(line, block.source, done.returncode, done.stdout + done.stderr)]


def run_lines(lines: list[Line], workdir: Path, bin_dir: Path) -> list[Outcome]:
    """Run README shell lines in order in ``workdir``."""
    env = _env(bin_dir)
    have_jq = shutil.which("jq") is not None
    outcomes = []
    for line in lines:
        if "mypkg.models:" in line.text:
            (workdir / "mypkg").mkdir(exist_ok=True)
            (workdir / "mypkg" / "__init__.py").write_text("")
            (workdir / "mypkg" / "models.py").write_text(FACTORY)
        ran = substitute(line.text, sys.executable, have_jq)
        missing = tuple(missing_extras(line.text))
        if missing:
            outcomes.append(Outcome(line, ran, None, missing=missing))
            continue
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", ran],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        outcomes.append(Outcome(line, ran, done.returncode, done.stdout + done.stderr))
    return outcomes


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))
RUN_BLOCKS = [b for b in BLOCKS if b.lang == "python" or jobs_of(b)]


def test_readme_has_commands_and_a_snippet():
    shell = [line for b in BLOCKS if b.lang == "sh" for line in b.lines]
    assert len(shell) >= 20, "README.md's shell blocks were not found"
    assert any(b.lang == "python" for b in BLOCKS)


def test_exclusions_are_exactly_the_lines_that_need_them():
    lines = {line.text for b in BLOCKS if b.lang == "sh" for line in b.lines}
    assert {text for text in lines if needs_exclusion(text)} == set(EXCLUDED)


def test_every_profiled_model_has_small_inputs():
    for block in BLOCKS:
        for line in block.lines:
            substitute(line.text, sys.executable, have_jq=False)  # raises for a missing entry


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            "memplan profile resnet50 | memplan solve --algo dynprog --mem 8GB",
            "memplan profile resnet50 -b 2 --input-shape 3,64,64 --repeats 1"
            " | memplan solve --algo dynprog --mem 8GB",
        ),
        (
            "memplan profile resnet18 --batch-size 16 -o resnet18.yaml",
            "memplan profile resnet18 -o resnet18.yaml -b 2 --input-shape 3,64,64 --repeats 1",
        ),
        (
            "memplan solve x --algo olla --mem 1GB --time-limit 60 > plan.csv",
            "memplan solve x --algo olla --mem 1GB --time-limit 2 > plan.csv",
        ),
        ("memplan solve x --time-limit 2", "memplan solve x --time-limit 2"),
    ],
)
def test_substitution(command, expected):
    assert substitute(command, "python", have_jq=True) == expected


def test_lines_that_read_a_file_run_after_the_line_that_writes_it():
    text = (
        "```sh\nmemplan solve p -o plan.json\nmemplan info p\nmemplan simulate p plan.json\n```\n"
    )
    (block,) = readme_blocks(text)
    assert [[line.lineno for line in job] for job in jobs_of(block)] == [[2, 4], [3]]


@pytest.fixture(scope="module")
def readme_runs(request, tmp_path_factory) -> dict[str, list[Future[list[Outcome]]]]:
    """Start the groups of lines of the selected README blocks, two at a time, those that run
    torch first (they take longest); each test waits for its own block's."""
    wanted = {
        item.callspec.params["block"].key
        for item in request.session.items
        if item.module is sys.modules[__name__] and hasattr(item, "callspec")
        if "block" in item.callspec.params
    }
    bin_dir = _memplan_bin(tmp_path_factory.mktemp("bin"))
    work = []  # (heavy, block key, job)
    for block in RUN_BLOCKS:
        if block.key not in wanted:
            continue
        if block.lang == "python":
            work.append((True, block.key, block))
        for lines in jobs_of(block) if block.lang == "sh" else ():
            torch = any(re.search(r"memplan (profile|run)\b", line.text) for line in lines)
            work.append((torch, block.key, lines))
    work.sort(key=lambda item: not item[0])  # stable: README order within each kind
    pool = ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1)))
    futures: dict[str, list[Future[list[Outcome]]]] = {}
    for _, key, job in work:
        workdir = tmp_path_factory.mktemp(key)
        run = run_python if isinstance(job, Block) else run_lines
        futures.setdefault(key, []).append(pool.submit(run, job, workdir, bin_dir))
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def _marks(block: Block) -> list[pytest.MarkDecorator]:
    """A block that profiles or trains needs torch and takes minutes: marked slow."""
    profiles = any(re.search(r"memplan (profile|run)\b", line.text) for line in block.lines)
    return [pytest.mark.torch, pytest.mark.slow] if profiles else []


@pytest.mark.parametrize("block", [pytest.param(b, marks=_marks(b), id=b.key) for b in RUN_BLOCKS])
def test_readme_block(block, readme_runs):
    outcomes = sorted(
        (o for job in readme_runs[block.key] for o in job.result()), key=lambda o: o.line.lineno
    )
    failures = [
        f"README.md:{o.line.lineno}: {o.line.text}\n  ran: {o.ran}\n  exit {o.status}, "
        f"expected {o.line.expected_status}\n{o.output[-3000:]}"
        for o in outcomes
        if o.status is not None and o.status != o.line.expected_status
    ]
    assert not failures, "\n\n".join(failures)
    skipped = [f"README.md:{o.line.lineno} ({', '.join(o.missing)})" for o in outcomes if o.missing]
    if skipped:
        pytest.skip("not installed, not run: " + "; ".join(skipped))
