"""The README and docs/ say what the code says (issue 33), so they cannot drift unseen:

- every file list names every file it lists and nothing that is not there (the README's layout,
  docs/tasks.md's files, docs/map.md's table of which test covers which module);
- every count, cap and default the code can compute is read out of the doc and compared with the
  code's value (claims());
- no word the glossary of docs/map.md retires is used, in the docs or in ptenv/ (RETIRED);
- every relative link, path, cited test and hostile trick exists.

Each failure names the doc's line and what the code says. Measured figures (docs/benchmarks.md,
docs/difficulty.md, timings) are not the code's to state: they carry their date instead.
CHANGELOG.md records past names and counts, and is not checked, except that it names the current
split version.
"""

import ast
import dataclasses
import functools
import inspect
import re
from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
NUMBER_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5}


def read_doc(doc: str) -> str:
    return (ROOT / doc).read_text()


def line_of(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def table(text: str, heading: str) -> list[tuple[int, list[str]]]:
    """(line, cells) of each body row of the first table after `heading`."""
    at = ("\n" + text).find(f"\n{heading}\n")
    assert at >= 0, f"no heading {heading!r}: its table is checked (tests/test_docs.py)"
    lines = text[at:].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    last = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    offset = line_of(text, at)
    return [(offset + i, [c.strip() for c in lines[i].strip("|").split(" | ")]) for i in range(first + 2, last)]


def backticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def number(value) -> str:
    """A number as the docs write it: 30.0 -> 30, 0.2 -> 0.2."""
    return f"{value:g}" if isinstance(value, float) else str(value)


# --- file lists -------------------------------------------------------------------------------

def files_under(folder: Path) -> set[Path]:
    """The files a reader should find named: modules and data, not packages' __init__.py."""
    return {p for p in folder.rglob("*") if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts}


MODULES = files_under(ROOT / "ptenv")
TEST_FILES = {*(ROOT / "tests").glob("test_*.py"), *ROOT.glob("test_*.py")}


def resolve(names: list[str], bases: list[Path]) -> tuple[set[Path], list[str]]:
    """The files (or folders) a cell's names stand for, and the names that stand for nothing. A bare
    name (`session.py`) is in the folder of the cell's previous path (`inside/supervisor.py`)."""
    found, missing, folder = set(), [], None
    for name in names:
        candidates = ([folder / name] if folder and "/" not in name else []) + [base / name for base in bases]
        matches = next((m for c in candidates if c.parent.is_dir() and (m := sorted(c.parent.glob(c.name)))), [])
        if not matches:
            missing.append(name)
            continue
        found |= set(matches) if "*" in name else {matches[0]}
        if "/" in name.rstrip("/"):
            folder = matches[0] if matches[0].is_dir() else matches[0].parent
    return found, missing


def covered(paths: set[Path]) -> set[Path]:
    """The files `paths` name, a folder standing for everything under it."""
    return set().union(*[files_under(p) if p.is_dir() else {p} for p in paths])


def test_the_readme_layout_names_every_module_and_only_files_that_exist():
    text, problems, named = read_doc("README.md"), [], set()
    for line, (where, what) in table(text, "## Layout"):
        folders = backticked(where)
        for folder in folders:
            if not (ROOT / folder).exists():
                problems.append(f"README.md:{line}: `{folder}` does not exist")
        if len(folders) == 1 and folders[0].startswith("ptenv/"):
            base = ROOT / folders[0]
            if base.is_file():
                named.add(base)
                continue
            files = [n for n in backticked(what) if re.fullmatch(r"[\w*]+\.(py|json)", n)]
            found, missing = resolve(files, [base])
            named |= found
            problems += [f"README.md:{line}: `{folders[0]}{n}` does not exist" for n in missing]
    problems += [f"README.md, the layout table: no row names ptenv/{p.relative_to(ROOT / 'ptenv')}"
                 for p in sorted(MODULES - named)]
    assert not problems, "\n".join(problems)


def test_the_task_files_table_names_every_file_of_ptenv_tasks():
    text, problems, named = read_doc("docs/tasks.md"), [], set()
    for line, (files, _) in table(text, "# Tasks"):
        found, missing = resolve(backticked(files), [ROOT])
        named |= found
        problems += [f"docs/tasks.md:{line}: `{n}` does not exist" for n in missing]
    problems += [f"docs/tasks.md, the table of files: no row names {p.relative_to(ROOT)}"
                 for p in sorted(files_under(ROOT / "ptenv" / "tasks") - named)]
    assert not problems, "\n".join(problems)


def test_the_map_says_which_test_covers_every_module_and_names_every_test_file():
    text, problems, modules, tests = read_doc("docs/map.md"), [], set(), set()
    for line, (module_cell, test_cell) in table(text, "## Which test covers which module"):
        found, missing = resolve([n for n in backticked(module_cell) if re.search(r"\.\w+$|/$", n)],
                                 [ROOT / "ptenv", ROOT])
        modules |= covered(found)
        problems += [f"docs/map.md:{line}: `{n}` does not exist" for n in missing]
        found, missing = resolve([n for n in backticked(test_cell) if n.endswith(".py")], [ROOT / "tests", ROOT])
        tests |= found
        problems += [f"docs/map.md:{line}: no test file `{n}`" for n in missing]
    problems += [f"docs/map.md, which test covers which module: no row for ptenv/{p.relative_to(ROOT / 'ptenv')}"
                 for p in sorted(MODULES - modules)]
    problems += [f"docs/map.md, which test covers which module: no row names {p.relative_to(ROOT)}"
                 for p in sorted(TEST_FILES - tests)]
    assert not problems, "\n".join(problems)


# --- counts, caps and defaults ----------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    doc: str
    pattern: str  # a regex whose groups are what the doc states, at every match
    code: Callable[[], object]  # what the code says, as the groups should read (one value or a tuple)
    source: str  # where the code says it
    within: bool = False  # the doc states a range (its two groups) that the code's (min, max) must lie in
    parse: Callable[[str], str] | None = None  # what a group (a block of lines) says, for a list; else its words

    def expected(self) -> tuple[str, ...]:
        value = self.code()
        return tuple(map(number, value)) if isinstance(value, tuple) else (number(value),)

    def problems(self, text: str) -> list[str]:
        expected = self.expected()
        # A space in a pattern stands for any run of whitespace: a sentence may wrap anywhere.
        matches = list(re.finditer(self.pattern.replace(" ", r"\s+"), text))
        if not matches:
            return [f"{self.doc}: nothing matches {self.pattern!r} any more, where the code says "
                    f"{', '.join(expected)} ({self.source}): say it again, or change claims() in tests/test_docs.py"]
        wrong = []
        for m in matches:
            stated = tuple(self.parse(g) if self.parse else " ".join(g.split()) for g in m.groups())
            if self.within:
                ok = int(stated[0]) <= int(expected[0]) and int(expected[1]) <= int(stated[1])
            else:
                ok = stated == expected
            if not ok:
                said = f"from {stated[0]} to {stated[1]}" if self.within else ", ".join(stated)
                code = f"from {expected[0]} to {expected[1]}" if self.within else ", ".join(expected)
                wrong.append(f"{self.doc}:{line_of(text, m.start())}: says {said} where the code says {code} "
                             f"({self.source})")
        return wrong


def tasks():
    from ptenv.tasks.canonical import TASKS
    return TASKS


def tiers(kind="result") -> dict:
    from ptenv.tasks import tiers as catalogue
    return catalogue.TIERS if kind == "result" else catalogue.FUNCTION_TIERS


def families(kind="result") -> list:
    return [f for members in tiers(kind).values() for f in members]


def generated() -> list:
    return [f for tier, members in tiers().items() if tier != "basic" for f in members]


def default_rows(tier: str, split: str, kind: str = "result") -> int:
    """The size of a default set, as tiers.select builds it (tests/test_splits.py checks the sets)."""
    from ptenv.tasks import tiers as catalogue
    if kind == "result" and tier == "basic":
        return len(tasks()) if split == "train" else catalogue.BASIC_TEST_PER_FAMILY * len(tiers()["basic"])
    return catalogue.DEFAULT_PER_FAMILY[split] * len(catalogue.families(tier, split, kind))


def limits():
    from ptenv.host.transports import LIMITS
    return LIMITS


def constant(module: str, name: str):
    return lambda: getattr(__import__(module, fromlist=[name]), name)


def in_source(module: str, pattern: str) -> Callable[[], str]:
    """A value the code writes as a literal, read from its source."""
    def value():
        return re.search(pattern, inspect.getsource(__import__(module, fromlist=["_"]))).group(1)
    return value


def signature_defaults() -> dict:
    from ptenv.env.classic import load_environment
    return {name: p.default for name, p in inspect.signature(load_environment).parameters.items()
            if p.kind is not p.VAR_KEYWORD}


def as_argument(value) -> str:
    """A default as the README's arguments table writes it: `"train"`, `-1`, `false`."""
    return f"`{str(value).lower() if isinstance(value, bool) else repr(value).replace(chr(39), chr(34))}`"


def prime_request():
    from ptenv.host import prime
    return prime.sandbox_request(limits())


@functools.cache
def rubric() -> str:
    """The metrics table's rows, `name` and weight, as load_environment's rubric has them."""
    from ptenv.env.classic import load_environment
    ours = load_environment(kind="function", num_train_examples=1).rubric.rubrics[0]
    return " ".join(f"{f.__name__}={w:g}" for f, w in zip(ours.funcs, ours.weights))


def setup_pin(pattern: str) -> Callable[[], str]:
    """A version scripts/setup installs."""
    return in_source_file(ROOT / "scripts" / "setup", pattern)


def in_source_file(path: Path, pattern: str) -> Callable[[], str]:
    return lambda: re.search(pattern, path.read_text()).group(1)


def claims() -> list[Claim]:
    fields = {f.name: f.default for f in dataclasses.fields(limits())}
    unit = {"cell_timeout": " s", "grace": " s"}
    limit_value = {"output_bytes": lambda v: f"{v // 1024} KiB"}
    found = []

    # README.md
    found += [
        Claim("README.md", r"`?torch==([\d.]+)", setup_pin(r"\ntorch=(\S+)"), "scripts/setup: torch="),
        Claim("README.md", r"with verifiers ([\d.]+) in `\.venv`, or with ([\d.]+) in `\.venv-v1`",
              lambda: (setup_pin(r"classic\) venv=\.venv verifiers=(\S+) ;;")(), setup_pin(r"v1\) venv=\.venv-v1 verifiers=(\S+) ;;")()),
              "scripts/setup"),
        Claim("README.md", r"train \((\d+) examples, the canonical tasks\)", lambda: len(tasks()), "canonical.TASKS"),
        Claim("README.md", r"The defaults give exactly the (\d+) canonical tasks", lambda: len(tasks()), "canonical.TASKS"),
        Claim("README.md", r"`canonical\.py` \(the (\d+) tasks\)", lambda: len(tasks()), "canonical.TASKS"),
        Claim("README.md", r"\(default `max_turns=(\d+)`\)", lambda: signature_defaults()["max_turns"], "load_environment"),
        Claim("README.md", r"`\|a - e\| <= ([\d.e-]+) \+ ([\d.e-]+) \* \|e\|`",
              lambda: tuple(f"{v:.0e}".replace("e-0", "e-") for v in (constant("ptenv.grader", "ATOL")(),
                                                                       constant("ptenv.grader", "RTOL")())),
              "grader.ATOL, RTOL"),
        Claim("README.md", r"after the (\d+) s time limit", lambda: limits().cell_timeout, "transports.LIMITS.cell_timeout"),
        Claim("README.md", r"output cut past (\d+) KiB", lambda: limits().output_bytes // 1024, "Limits.output_bytes"),
        Claim("README.md", r"a (\d+) MiB cap, never pickle", lambda: constant("ptenv.inside.protocol", "MAX_TENSOR_BYTES")() >> 20,
              "protocol.MAX_TENSOR_BYTES"),
        Claim("README.md", r"each with a (\d+)% bootstrap", lambda: round(constant("ptenv.report.bootstrap", "LEVEL")() * 100),
              "report.bootstrap.LEVEL"),
        Claim("README.md", r"(\d+) times, seeded", constant("ptenv.report.bootstrap", "RESAMPLES"), "report.bootstrap.RESAMPLES"),
        Claim("README.md", r"its `outcome` \(([^)]+)\)", lambda: " ".join(constant("ptenv.grader", "OUTCOMES")()),
              "grader.OUTCOMES", parse=names),
        Claim("README.md", r"\| `num_train_examples` \|[^|]+\|[^|]+\| Rows of `split`, 1 to (\d+),",
              constant("ptenv.tasks.tiers", "MAX_EXAMPLES"), "tiers.MAX_EXAMPLES"),
        Claim("README.md", r"\| `seed` \|[^|]+\|[^|]+\| Which instances, 0 to (\d+)\.",
              constant("ptenv.tasks.tiers", "MAX_SEED"), "tiers.MAX_SEED"),
        Claim("README.md", r"\| `hidden_cases` \|[^|]+\|[^|]+\| Function tasks: hidden calls per rollout, 1 to (\d+)[,|]",
              constant("ptenv.inside.protocol", "MAX_HIDDEN_CASES"), "protocol.MAX_HIDDEN_CASES"),
        Claim("README.md", r"### Environment Arguments\n\n((?:\|[^\n]*\n)+)",
              lambda: " ".join([*signature_defaults(), "**kwargs"]), "load_environment's parameters, in order",
              parse=lambda rows: " ".join(re.findall(r"^\| `?([\w*]+)`? \|", rows, re.M)[1:])),
        Claim("README.md", r"### Metrics\n\n((?:\|[^\n]*\n)+)", rubric, "load_environment's rubric",
              parse=lambda rows: " ".join(f"{n}={float(w):g}" for n, w in re.findall(r"^\| `(\w+)` \| ([\d.]+) \|", rows, re.M))),
        Claim("README.md", r"(?s)Dependencies: (.*?); for local sandboxes", dependencies, "pyproject.toml: dependencies",
              parse=lambda text: " ".join(sorted(d for d in re.findall(r"`([^`]+)`", text) if "==" not in d))),
    ]
    for name, default in signature_defaults().items():
        found.append(Claim("README.md", rf"\| `{name}` \| [^|]+ \| ([^|]+?) \|", lambda d=default: as_argument(d),
                           f"load_environment's default {name}"))
    for category, count in Counter(t.category for t in tasks()).items():
        found.append(Claim("README.md", rf"\| {category} \| (\d+) \|", lambda c=count: c, "canonical.TASKS' categories"))
    for tier in tiers():
        sets = (f"the {len(tasks())} canonical tasks / {default_rows(tier, 'test')} (one seeded instance per family)"
                if tier == "basic" else f"{default_rows(tier, 'train')} / {default_rows(tier, 'test')}")
        found.append(Claim(
            "README.md", rf"\| `{tier}` \| (\d+) \| (\d+) \| ([^|]+?) \| (\d+): (\d+) / (\d+) \|",
            lambda t=tier, s=sets: (len(tiers()[t]), sum(f.held_out for f in tiers()[t]), s, len(tiers("function")[t]),
                                    default_rows(t, "train", "function"), default_rows(t, "test", "function")),
            "tiers.TIERS, FUNCTION_TIERS and their default sets"))

    # docs/sandbox.md
    memory = "ptenv.inside.memory"
    found += [
        Claim("docs/sandbox.md", r"a pool of (\d+) idle sandboxes",
              lambda: __import__("ptenv.host.local", fromlist=["_"]).LocalSandboxClient.pool_size, "LocalSandboxClient.pool_size"),
        Claim("docs/sandbox.md", r"(?s)requests, each with one name on every hop.*?```\n(.*?)```",
              lambda: " ".join(constant("ptenv.inside.prime_cli", "OPS")()), "prime_cli.OPS",
              parse=lambda block: " ".join(line.split()[0] for line in block.splitlines())),
        Claim("docs/sandbox.md", r"(\d+) GiB \+ (\d+) MiB scratch \+ (\d+) MiB `/dev/shm`",
              lambda: (limits().memory_mb // 1024, limits().scratch_mb, limits().shm_mb), "Limits"),
        Claim("docs/sandbox.md", r"Tasks are capped at (\d+)", lambda: limits().processes, "Limits.processes"),
        Claim("docs/sandbox.md", r"(?:`FAULT_RATE_KB`,|faults at most|faster than) (\d+) GiB/s", lambda: constant(memory, "FAULT_RATE_KB")() >> 20, "memory.FAULT_RATE_KB"),
        Claim("docs/sandbox.md", r"every ([\d.]+) s far below the limit \(([\d.]+) GiB of headroom or more\), down to "
              r"every (\d+) ms near it",
              lambda: (constant(memory, "MEMORY_POLL")(), constant(memory, "FAULT_RATE_KB")() * constant(memory, "MEMORY_POLL")() / 2**20,
                       round(constant(memory, "MIN_POLL")() * 1000)), "memory.MEMORY_POLL, MIN_POLL, FAULT_RATE_KB"),
        Claim("docs/sandbox.md", r"\((\d+) KiB at most each, without huge pages\)", constant(memory, "FAULT_KB"), "memory.FAULT_KB"),
        Claim("docs/sandbox.md", r"a private `/dev/pts` \((\d+) ptys\)", lambda: limits().ptys, "Limits.ptys"),
        Claim("docs/sandbox.md", r"The supervisor runs as another and keeps only (.*?)\. The model cannot",
              lambda: " ".join(sorted(n for n, v in vars(__import__("ptenv.inside.syscalls", fromlist=["_"])).items()
                                      if n.startswith("CAP_") and v in constant("ptenv.inside.isolation", "SUPERVISOR_CAPS")())),
              "isolation.SUPERVISOR_CAPS", parse=lambda text: " ".join(sorted(re.findall(r"`(\w+)`", text)))),
        Claim("docs/sandbox.md", r"A second seccomp filter keeps (.*?) off PID 1",
              lambda: " ".join(sorted(set(constant("ptenv.inside.seccomp", "MODEL_RULES")()) - {"setns"})),
              "seccomp.MODEL_RULES (setns aside: the model's own namespace)",
              parse=lambda text: " ".join(sorted(re.findall(r"`(\w+)`", text)))),
        Claim("docs/sandbox.md", r"address space \((\d+) GiB above what it inherits from the fork server\), (\d+) MiB per "
              r"file, (\d+) open files, no core files, and CPU time (\d+)x the cell limit\. (\d+) processes per model uid",
              lambda: (limits().memory_mb // 1024, limits().file_mb, limits().open_files, limits().cpu_per_cell_limit,
                       limits().processes), "Limits"),
        Claim("docs/sandbox.md", r"\(tmpfs, (\d+) MiB and (\d+) MiB\)", lambda: (limits().scratch_mb, limits().shm_mb), "Limits"),
        Claim("docs/sandbox.md", r"\| (\d+) per sandbox", lambda: limits().processes, "Limits.processes"),
        Claim("docs/sandbox.md", r"model runs as uid (\d+) in a user namespace",
              constant("ptenv.inside.isolation", "ROOTLESS_MODEL_UID"), "isolation.ROOTLESS_MODEL_UID"),
        Claim("docs/sandbox.md", r"runs the interpreter as uid (\d+) with no capabilities",
              constant("ptenv.inside.supervisor", "CONTAINER_MODEL_UID"), "supervisor.CONTAINER_MODEL_UID"),
        Claim("docs/sandbox.md", r"nice (\d+)", constant("ptenv.inside.supervisor", "MODEL_NICE"), "supervisor.MODEL_NICE"),
        Claim("docs/sandbox.md", r"read (\d+) KiB per (\d+) ms \((\d+) MiB/s\)",
              lambda: (int(in_source("ptenv.inside.streams", r"os\.read\(fd, (\d+)\)")()) // 1024,
                       round(constant("ptenv.inside.streams", "PACE")() * 1000),
                       round(int(in_source("ptenv.inside.streams", r"os\.read\(fd, (\d+)\)")()) / constant("ptenv.inside.streams", "PACE")() / 2**20)),
              "streams.read_available, PACE"),
        Claim("docs/sandbox.md", r"= (\d+) x `cell_timeout` \((\d+) s; `SIGXCPU`, then `SIGKILL` (\d+) s later\)",
              lambda: (limits().cpu_per_cell_limit, limits().cpu_per_cell_limit * limits().cell_timeout,
                       in_source("ptenv.inside.supervisor", r"\(cpu, cpu \+ (\d+)\)")()), "Limits, Supervisor.cpu_limit"),
        Claim("docs/sandbox.md", r"a `bash` command and the read-back each have (\d+) s",
              constant("ptenv.host.transports", "COMMAND_TIMEOUT"), "transports.COMMAND_TIMEOUT"),
        Claim("docs/sandbox.md", r"The\s+host waits (\d+) s for a cell's reply",
              lambda: limits().cell_timeout + constant("ptenv.host.transports", "CELL_MARGIN")(),
              "Transport.cell_deadline"),
        Claim("docs/sandbox.md", r"deadline plus `grace` plus (\d+) s", constant("ptenv.host.local", "HOST_MARGIN"), "local.HOST_MARGIN"),
        Claim("docs/sandbox.md", r"The largest `result` \(and input\) is (\d+) MiB",
              lambda: constant("ptenv.inside.protocol", "MAX_TENSOR_BYTES")() >> 20, "protocol.MAX_TENSOR_BYTES"),
        Claim("docs/sandbox.md", r"at most (\d+) KiB and (\d+) JSON containers",
              lambda: (constant("ptenv.inside.replies", "SKELETON_CAP")() // 1024, constant("ptenv.inside.replies", "MAX_CONTAINERS")()),
              "replies.SKELETON_CAP, MAX_CONTAINERS"),
        Claim("docs/sandbox.md", r"base64-encodes those (\d+) MiB at a time",
              lambda: constant("ptenv.inside.protocol", "PIECE")() >> 20, "protocol.PIECE"),
        Claim("docs/sandbox.md", r"its (\d+) KiB skeleton", lambda: constant("ptenv.inside.replies", "SKELETON_CAP")() // 1024,
              "replies.SKELETON_CAP"),
        Claim("docs/sandbox.md", r"in a `([\w.:-]+)` container on Prime's\s+service, with (\d+) CPU, (\d+) GB of memory and (\d+) GB of disk",
              lambda: (prime_request().docker_image, prime_request().cpu_cores, prime_request().memory_gb,
                       prime_request().disk_size_gb), "prime.sandbox_request"),
        Claim("docs/sandbox.md", r"for up to (\d+) minutes while torch installs",
              lambda: constant("ptenv.host.prime", "READY_TIMEOUT")() // 60, "prime.READY_TIMEOUT"),
    ]
    for name, default in fields.items():
        found.append(Claim("docs/sandbox.md", rf"\| `{name}` \| ([^|]+?) \|",
                           lambda n=name, d=default: limit_value.get(n, number)(d) + unit.get(n, ""), f"Limits.{name}"))

    # docs/tasks.md
    tiers_module = "ptenv.tasks.tiers"
    canonical = "ptenv.tasks.canonical"
    found += [
        Claim("docs/tasks.md", r"(?i)the (\d+) canonical (?:tasks|rows)", lambda: len(tasks()), "canonical.TASKS"),
        Claim("docs/tasks.md", r"`train\.jsonl` is these (\d+) rows", lambda: len(tasks()), "canonical.TASKS"),
        Claim("docs/tasks.md", r"For (\d+) tasks it also redraws the sizes",
              lambda: len(tasks()) - len(constant(canonical, "FIXED_SHAPES")()), "canonical.TASKS, FIXED_SHAPES"),
        Claim("docs/tasks.md", r"The (\d+) tasks whose instruction names its sizes \(`FIXED_SHAPES`\)",
              lambda: len(constant(canonical, "FIXED_SHAPES")()), "canonical.FIXED_SHAPES"),
        Claim("docs/tasks.md", r"(\d+) tasks also vary a parameter", lambda: sum(bool(t.vary) for t in tasks()), "Task.vary"),
        Claim("docs/tasks.md", r"`tensor_ops/band_mask` redraws its values on its ([\d.]+) `grid`",
              lambda: next(t.grid for t in tasks() if t.id == "tensor_ops/band_mask"), "canonical: band_mask's grid"),
        Claim("docs/tasks.md", r"`seed \* (\d+) \+ 2k", constant(tiers_module, "SEED_STRIDE"), "tiers.SEED_STRIDE"),
        Claim("docs/tasks.md", r"basic\s+`test` is one seeded instance per family \((\d+)\)",
              lambda: default_rows("basic", "test"), "tiers.BASIC_TEST_PER_FAMILY"),
        Claim("docs/tasks.md", r"`train` is (\d+) instances per\s+family that is not held out, and its `test` is (\d+) per family",
              lambda: tuple(constant(tiers_module, "DEFAULT_PER_FAMILY")().values()), "tiers.DEFAULT_PER_FAMILY"),
        Claim("docs/tasks.md", r"intermediate (\d+) and (\d+), advanced (\d+) and (\d+), expert (\d+) and (\d+)",
              lambda: tuple(default_rows(t, s) for t in ("intermediate", "advanced", "expert") for s in ("train", "test")),
              "the default sets (tiers.select)"),
        Claim("docs/tasks.md", r"`float64_margin=True`: (\d+) families, (\d+)\s+result families and (\d+) function families",
              lambda: (sum(f.float64_margin for f in generated() + families("function")),
                       sum(f.float64_margin for f in generated()), sum(f.float64_margin for f in families("function"))),
              "Family.float64_margin, FunctionFamily.float64_margin"),
        Claim("docs/tasks.md", r"within (1/\d+) of the tolerance",
              lambda: f"1/{round(1 / constant('ptenv.tasks.families', 'MARGIN')())}", "families.MARGIN"),
        Claim("docs/tasks.md", r"miss it by (\d+) tolerances", lambda: round(constant("ptenv.tasks.families", "SHORTCUT_MARGIN")()),
              "families.SHORTCUT_MARGIN"),
        Claim("docs/tasks.md", r"\(2\^-(\d+), (\w+) seeded sign patterns\)",
              lambda: (round(-__import__("math").log2(constant("ptenv.tasks.families", "ROUNDING")())),
                       {v: k for k, v in NUMBER_WORDS.items()}[constant("ptenv.tasks.families", "ROUNDINGS")()]),
              "families.ROUNDING, ROUNDINGS"),
        Claim("docs/tasks.md", r"no good draw in (\d+) fails", constant("ptenv.tasks.families", "MAX_DRAWS"), "families.MAX_DRAWS"),
        Claim("docs/tasks.md", r"(\d+) canonical tasks and (\d+) generated families declare them",
              lambda: (sum(bool(t.shortcuts) for t in tasks()), sum(bool(f.shortcuts) for f in generated())),
              "Task.shortcuts, Family.shortcuts"),
        Claim("docs/tasks.md", r"(?s)\*\*Write the entry\*\*: `Family\((.*?)\)`",
              lambda: signature_of("ptenv.tasks.families", "Family"), "families.Family's fields"),
        Claim("docs/tasks.md", r"the category is one of (.*?) \(the row parser", lambda: " ".join(constant(canonical, "CATEGORIES")()),
              "canonical.CATEGORIES", parse=names),
    ]
    for tier in tiers():
        found.append(Claim("docs/tasks.md", rf"\| `{tier}` \| (\d+) \| (\d+) \|",
                           lambda t=tier: (len(tiers()[t]), sum(f.held_out for f in tiers()[t])), "tiers.TIERS"))

    # docs/function-tasks.md
    functions = "ptenv.tasks.functions"
    found += [
        Claim("docs/function-tasks.md", r"Each call has (\d+) s", constant("ptenv.host.requests", "CALL_LIMIT"), "requests.CALL_LIMIT"),
        Claim("docs/function-tasks.md", r"a tuple of at most (\d+)\)", constant("ptenv.inside.protocol", "MAX_HIDDEN_OUTPUTS"),
              "protocol.MAX_HIDDEN_OUTPUTS"),
        Claim("docs/function-tasks.md", r"at most\s+(\d+) KiB each", lambda: constant("ptenv.inside.protocol", "HIDDEN_OUTPUT_CAP")() // 1024,
              "protocol.HIDDEN_OUTPUT_CAP"),
        Claim("docs/function-tasks.md", r"`hidden_cases` in all \(default (\d+)\)", constant(functions, "DEFAULT_HIDDEN_CASES"),
              "functions.DEFAULT_HIDDEN_CASES"),
        Claim("docs/function-tasks.md", r"(?s)`FunctionFamily\((.*?)\)`", lambda: signature_of(functions, "FunctionFamily"),
              "functions.FunctionFamily's fields"),
        Claim("docs/function-tasks.md", r"Give (\d+) to (\d+) `Case`s",
              lambda: (min(len(f.cases) for f in families("function")), max(len(f.cases) for f in families("function"))),
              "every function family's cases", within=True),
        Claim("docs/function-tasks.md", r"Give (\d+) to (\d+) plausible wrong implementations",
              lambda: (min(len(f.wrong) for f in families("function")), max(len(f.wrong) for f in families("function"))),
              "every function family's wrong implementations", within=True),
    ]

    # docs/threat-model.md
    protocol = "ptenv.inside.protocol"
    found += [
        Claim("docs/threat-model.md", r"(\d+) prompts, each played with one of (\d+) tricks",
              lambda: (in_source_file(ROOT / "tests" / "test_hostile.py", r'"-n", "(\d+)"')(),
                       len(__import__("tests.support.hostile", fromlist=["_"]).TRICKS)),
              "tests/test_hostile.py's -n, tests/support/hostile.py: TRICKS"),
        Claim("docs/threat-model.md", r"lone surrogates, over (\d+) KiB", lambda: constant("ptenv.host.tool_input", "MAX_CHARS")() // 1024,
              "tool_input.MAX_CHARS"),
        Claim("docs/threat-model.md", r"is refused over (\d+) KiB by its length, and shape-checked \(at most (\d+) containers\)",
              lambda: (constant("ptenv.inside.replies", "SKELETON_CAP")() // 1024, constant("ptenv.inside.replies", "MAX_CONTAINERS")()),
              "replies.SKELETON_CAP, MAX_CONTAINERS"),
        Claim("docs/threat-model.md", r"refuses a shape of more than (\d+) sizes", constant("ptenv.inside.codec", "MAX_DIMS"),
              "codec.MAX_DIMS"),
        Claim("docs/threat-model.md", r"The codec's (\d+) MiB cap", lambda: constant(protocol, "MAX_TENSOR_BYTES")() >> 20,
              "protocol.MAX_TENSOR_BYTES"),
        Claim("docs/threat-model.md", r"Each call's (\d+) s is enforced", constant("ptenv.host.requests", "CALL_LIMIT"),
              "requests.CALL_LIMIT"),
        Claim("docs/threat-model.md", r"the caller's (\d+) s is a kill", constant("ptenv.host.requests", "CALL_LIMIT"),
              "requests.CALL_LIMIT"),
        Claim("docs/threat-model.md", r"or over (\d+) outputs", constant(protocol, "MAX_HIDDEN_OUTPUTS"), "protocol.MAX_HIDDEN_OUTPUTS"),
        Claim("docs/threat-model.md", r"each at most (\d+) KiB, then rebuilt", lambda: constant(protocol, "HIDDEN_OUTPUT_CAP")() // 1024,
              "protocol.HIDDEN_OUTPUT_CAP"),
        Claim("docs/threat-model.md", r"Over (\d+) KiB: an invalid answer", lambda: constant("ptenv.host.answer", "MAX_ANSWER_CHARS")() // 1024,
              "answer.MAX_ANSWER_CHARS"),
        Claim("docs/threat-model.md", r"(\d+) KiB kept per stream", lambda: limits().output_bytes // 1024, "Limits.output_bytes"),
        Claim("docs/threat-model.md", r"past the (\d+) KiB kept a stream is read (\d+) KiB per (\d+) ms",
              lambda: (limits().output_bytes // 1024, int(in_source("ptenv.inside.streams", r"os\.read\(fd, (\d+)\)")()) // 1024,
                       round(constant("ptenv.inside.streams", "PACE")() * 1000)), "Limits.output_bytes, streams"),
        Claim("docs/threat-model.md", r"(\d+) processes per sandbox", lambda: limits().processes, "Limits.processes"),
        Claim("docs/threat-model.md", r"A private `devpts` of (\d+)", lambda: limits().ptys, "Limits.ptys"),
        Claim("docs/threat-model.md", r"`SIGALRM` at the cell limit \((\d+) s\)", lambda: limits().cell_timeout, "Limits.cell_timeout"),
        Claim("docs/threat-model.md", r"is killed (\d+) s later", lambda: limits().grace, "Limits.grace"),
        Claim("docs/threat-model.md", r"plus a (\d+) MiB piece", lambda: constant(protocol, "PIECE")() >> 20, "protocol.PIECE"),
        Claim("docs/threat-model.md", r"`max_turns` calls of up to (\d+) s each", lambda: limits().cell_timeout, "Limits.cell_timeout"),
        Claim("docs/threat-model.md", r"at most (\d+) GiB/s", lambda: constant(memory, "FAULT_RATE_KB")() >> 20, "memory.FAULT_RATE_KB"),
    ]

    # docs/map.md
    found += [
        Claim("docs/map.md", r"\| outcome \| How a verdict ends: ([^|]+) \|", lambda: " ".join(constant("ptenv.grader", "OUTCOMES")()),
              "grader.OUTCOMES", parse=names),
        Claim("docs/map.md", r"\| kind \| A task's kind: `(\w+)` or `(\w+)` \|", constant("ptenv.tasks.tiers", "KINDS"), "tiers.KINDS"),
    ]
    for op, request_fields in constant("ptenv.inside.supervisor", "REQUESTS")().items():
        found.append(Claim("docs/map.md", rf"\| `{op}` \| [^|]+ \| ([^|]+?) \|", lambda f=request_fields: " ".join(f) or "none",
                           f"supervisor.REQUESTS[{op!r}]", parse=lambda cell: names(cell) or cell))
    found.append(Claim("docs/map.md", r"(?s)## The requests across the boundary.*?\|[-|]+\|\n((?:\| `\w+` \|[^\n]*\n)+)",
                       lambda: " ".join(constant("ptenv.inside.prime_cli", "OPS")()), "prime_cli.OPS",
                       parse=lambda rows: " ".join(re.findall(r"^\| `(\w+)` \|", rows, re.M))))
    found.append(Claim("docs/map.md", r"(?s)## The requests across the boundary.*?\|[-|]+\|\n((?:\| `\w+` \|[^\n]*\n)+)",
                       lambda: " ".join(sorted(constant("ptenv.inside.supervisor", "REQUESTS")())), "supervisor.REQUESTS",
                       parse=lambda rows: " ".join(sorted(re.findall(r"^\| `(\w+)` \|", rows, re.M)))))
    return found


def names(text: str) -> str:
    """The backticked names a sentence or cell lists, in order."""
    return " ".join(re.findall(r"`(\w+)`", text))


def signature_of(module: str, name: str) -> str:
    """A dataclass's fields as a recipe writes its call: required ones bare, the others with their default."""
    cls = constant(module, name)()
    parts = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            parts.append(f"{f.name}={f.default!r}".replace("'", '"'))
        elif f.default_factory is not dataclasses.MISSING:
            parts.append(f"{f.name}={f.default_factory()!r}")
        else:
            parts.append(f.name)
    return ", ".join(parts)


def dependencies() -> str:
    """pyproject.toml's dependencies, sorted (the README lists torch's first)."""
    import tomllib
    return " ".join(sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]))


def false_claims(read: Callable[[str], str] = read_doc) -> list[str]:
    """One line per claim of the docs that the code contradicts or that the docs no longer make."""
    return [problem for claim in claims() for problem in claim.problems(read(claim.doc))]


def test_every_count_cap_and_default_the_docs_state_is_the_codes():
    problems = false_claims()
    assert not problems, "\n".join(problems)


# --- retired words ----------------------------------------------------------------------------

# What each word of the glossary (docs/map.md) retires, as a pattern for the retired sense only
# (`exec` and `sh` also name a process's exec and a stride's height, "harness error" the report's
# count of harness faults), and where it applies: ptenv/ and the docs, or ptenv/ alone where the
# docs quote another project's name (verifiers 0.4's own HarnessError).
EVERYWHERE, CODE_ONLY = "everywhere", "ptenv/ only"
RETIRED = {
    "supervisor": (r"supervisor \(the harness|the harness, PID 1|PID 1[^.|\n]*; the harness\b", EVERYWHERE),
    "session": (r"ptenv-session", EVERYWHERE),
    "preload": (r"`load` request|[\"']op[\"']: [\"']load[\"']", EVERYWHERE),
    "cell": (r"`exec`|ptenv-\w+ exec\b|\bexec request|\(preload, exec\b|[\"']op[\"']: [\"']exec[\"']", EVERYWHERE),
    "shell command": (r"`sh`|ptenv-\w+ sh\b|\bsh request|[\"']op[\"']: [\"']sh[\"']", EVERYWHERE),
    "result": (r"`result` request|[\"']op[\"']: [\"']result[\"']", EVERYWHERE),
    "trial": (r"hidden phase|`hidden` request|[\"']op[\"']: [\"']hidden[\"']", EVERYWHERE),
    "caller": (r"\bjudg(?:e|es|ed|ing)\b", EVERYWHERE),
    "request": (r"\b(?:harness's|our) own commands\b|\bcommands\.py\b|command (?:encoders|parsers)", EVERYWHERE),
    "ptenv-request": (r"ptenv-session", EVERYWHERE),
    "harness": (r"supervisor \(the harness|chat harness|harness program|the harness cleanup", EVERYWHERE),
    "harness fault": (r"\bHarnessError\b", CODE_ONLY),
    "assess": (r"\bgrad(?:e|es|ed|ing) (?:a |the |each )?rollouts?\b|\bgrading\.py\b", EVERYWHERE),
    "allowlist": (r"\bban\b|\bban\.py\b|\bBAN_RULES\b", CODE_ONLY),
    "outcome": (r"verdict(?:'s|\.|\[[\"'])\s*kind|failure `kind`|[Ii]ts kind is", EVERYWHERE),
}


def glossary() -> dict[str, str]:
    """Each word of docs/map.md's glossary and what it retires (its last column)."""
    return {word: retired for _, (word, _, retired) in table(read_doc("docs/map.md"), "## Glossary")}


def test_every_retired_word_of_the_glossary_has_its_patterns():
    retiring = {word for word, retired in glossary().items() if retired}
    assert retiring == set(RETIRED), f"glossary words that retire one: {sorted(retiring)}; patterns for: {sorted(RETIRED)}"


def test_no_retired_word_is_used_in_ptenv_or_the_docs():
    glossary_rows = {line for line, _ in table(read_doc("docs/map.md"), "## Glossary")}
    texts = [(str(p.relative_to(ROOT)), p.read_text(), CODE_ONLY) for p in sorted((ROOT / "ptenv").rglob("*.py"))]
    texts += [(doc, read_doc(doc), EVERYWHERE) for doc in DOCS]
    found = []
    for name, text, kind in texts:
        for number_, line in enumerate(text.splitlines(), 1):
            if name == "docs/map.md" and number_ in glossary_rows:
                continue
            for word, (pattern, where) in RETIRED.items():
                if (where == EVERYWHERE or kind == CODE_ONLY) and re.search(pattern, line):
                    found.append(f"{name}:{number_}: {re.search(pattern, line).group(0)!r} is retired "
                                 f"(docs/map.md: say {word!r}, not {glossary()[word]})")
    assert not found, "\n".join(dict.fromkeys(found))


# --- links, paths, tests and tricks the docs cite ---------------------------------------------

# Files the docs name that are not this repository's: a run's outputs, verifiers 0.4's and mcp's
# sources, and placeholders.
NOT_OURS = {"results.jsonl", "traces.jsonl", "metadata.json", "report.md", "report.csv", "report.png", "compare.md",
            "verifiers/v1/harnesses/utils/core.py", "harnesses/utils/mcp.py", "mcp/client/streamable_http.py",
            "CODE.py"}
REPO_FILES = {p for top in ("ptenv", "tests", "bench", "scripts", "docs") for p in (ROOT / top).rglob("*") if p.is_file()} \
    | {p for p in ROOT.iterdir() if p.is_file()}


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", path.read_text(), re.M)}


def test_every_relative_link_and_anchor_exists():
    problems = []
    for doc in DOCS + ["CHANGELOG.md"]:
        text = read_doc(doc)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target, _, anchor = m.group(1).partition("#")
            if re.match(r"\w+:", target):
                continue
            path = (ROOT / doc).parent / target if target else ROOT / doc
            where = f"{doc}:{line_of(text, m.start())}"
            if not path.exists():
                problems.append(f"{where}: the link to {target} leads nowhere")
            elif anchor and anchor not in anchors(path):
                problems.append(f"{where}: {path.relative_to(ROOT)} has no heading #{anchor}")
    assert not problems, "\n".join(problems)


def exists(name: str, doc: str) -> bool:
    if name in NOT_OURS or "<" in name:
        return True
    if "/" not in name.rstrip("/"):
        return any(fnmatch(p.name, name) for p in REPO_FILES)
    bases = [ROOT, ROOT / "ptenv", (ROOT / doc).parent, ROOT / "tests"]
    return any(list(base.glob(name)) for base in bases)


def test_every_file_the_docs_name_exists():
    problems = []
    for doc in DOCS:
        text = read_doc(doc)
        for m in re.finditer(r"(?<![\w./<>-])((?:[\w.<>*-]+/)*[\w<>*-]+\.(?:py|md|json|jsonl|toml|csv|png))(?![\w/-])", text):
            if not exists(m.group(1), doc):
                problems.append(f"{doc}:{line_of(text, m.start())}: no file {m.group(1)}")
    assert not problems, "\n".join(problems)


@functools.cache
def defined_names(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def test_every_test_the_docs_cite_exists():
    """`file.py::test_name`, and `::other_test` after it for the same file."""
    problems = []
    for doc in DOCS:
        text, current = read_doc(doc), None
        for m in re.finditer(r"((?:tests/)?test_\w+\.py)?::(test_\w+)", text):
            if m.group(1):
                current = next((p for p in TEST_FILES if p.name == Path(m.group(1)).name), None)
                if current is None:
                    problems.append(f"{doc}:{line_of(text, m.start())}: no test file {m.group(1)}")
                    continue
            if current is not None and m.group(2) not in defined_names(current):
                problems.append(f"{doc}:{line_of(text, m.start())}: {current.name} has no {m.group(2)}")
    assert not problems, "\n".join(problems)


def test_every_hostile_trick_and_answer_the_threat_model_names_exists():
    from tests.support import hostile, hostile_functions
    text, problems = read_doc("docs/threat-model.md"), []
    for m in re.finditer(r"hostile ((?:`\w+`(?:, )?)+)", text):
        problems += [f"docs/threat-model.md:{line_of(text, m.start())}: no hostile trick {n!r} (tests/support/hostile.py)"
                     for n in re.findall(r"`(\w+)`", m.group(1)) if n not in hostile.TRICKS]
    answers = {**hostile_functions.ANSWERS, **hostile_functions.DIRECT_ONLY}
    for line, cells in table(text, "### Cheat a function task's trial"):
        listed = re.search(r"::\w+ \(((?:`\w+`(?:, )?)+)\)", cells[-1])
        names = re.findall(r"`(\w+)`", listed.group(1) if listed else cells[-1]) \
            if listed or re.fullmatch(r"(?:`\w+`(?: \([^()]*\))?(?:, )?)+", cells[-1]) else []
        problems += [f"docs/threat-model.md:{line}: no hostile answer {n!r} (tests/support/hostile_functions.py)"
                     for n in names if n not in answers]
    assert not problems, "\n".join(problems)


def test_the_changelog_names_the_current_split_version():
    """A change to the default sets (build_tasks.py --manifest) is said in CHANGELOG.md, by its version."""
    from ptenv.tasks import splits
    version = splits.split_version(splits.MANIFEST)
    assert version in read_doc("CHANGELOG.md"), \
        f"CHANGELOG.md does not name the split version {version} ({splits.MANIFEST.name}): say what changed under Split changes"


def definitions() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """What ptenv/ defines: each module's top-level names by the module's file name (`requests`),
    and each class's attributes by the class's name."""
    modules, classes = {}, {}
    for path in ROOT.joinpath("ptenv").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = modules.setdefault(path.stem, set())
        for node in tree.body:
            names |= bound_names(node)
            if isinstance(node, ast.ClassDef):
                members = classes.setdefault(node.name, set())
                members.update(*map(bound_names, node.body))
                members |= {a.attr for a in ast.walk(node) if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Store)
                            and isinstance(a.value, ast.Name) and a.value.id == "self"}
    return modules, classes


def bound_names(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


# The kernel's cgroup files the docs name, which read like `module.name` of ours (inside/memory.py).
CGROUP_FILES = {"memory.max", "memory.limit_in_bytes", "memory.swap", "memory.events", "memory.current",
                "memory.peak", "memory.stat", "memory.high", "memory.oom_control", "memory.usage_in_bytes",
                "memory.memsw", "memory.failcnt", "memory.max_usage_in_bytes"}


def test_every_function_and_class_the_docs_name_in_ptenv_exists():
    """`host/pool.py: Pool.take`, `requests.parse_cell_reply`, `Session.start`: the steps of a rollout
    in docs/map.md, and every other `module.name` or `Class.attribute` of ours the docs cite."""
    modules, classes = definitions()
    problems = []
    for doc in DOCS:
        text = read_doc(doc)
        for m in re.finditer(r"`?((?:\w+/)*(\w+)\.py)`?: `?([A-Z]\w*\.\w+|\w+)`?", text):
            path = next((p for p in (ROOT / "ptenv" / m.group(1), ROOT / m.group(1)) if p.exists()), None)
            if path is None or not path.is_relative_to(ROOT / "ptenv"):
                continue
            first, _, attribute = m.group(3).partition(".")
            if first not in modules[m.group(2)] or attribute and attribute not in classes.get(first, set()):
                problems.append(f"{doc}:{line_of(text, m.start())}: {m.group(1)} defines no {m.group(3)}")
        for m in re.finditer(r"`(\w+)\.(?!(?:py|json|md)`)(\w+)`", text):
            owner, name = m.groups()
            if m.group(0).strip("`") in CGROUP_FILES:
                continue
            known = classes.get(owner) if owner in classes else modules.get(owner)
            if known is not None and name not in known:
                problems.append(f"{doc}:{line_of(text, m.start())}: {owner} defines no {name}")
    assert not problems, "\n".join(problems)


@pytest.mark.v1
def test_the_readme_says_which_arguments_are_verifiers_04_taskset_fields():
    """On verifiers 0.4 (`-m v1`, in .venv-v1): the taskset's own fields and their defaults are the
    README's arguments but those it names, and the agent's turns are `max_turns`' default."""
    from ptenv.env.v1 import PyTorchEnvConfig, PyTorchTasksetConfig
    text = read_doc("README.md")
    sentence = re.search(r"On verifiers 0\.4 all arguments but (.*?) are taskset fields.*?`max_turns` is the agent's "
                         r"\((\d+)\)".replace(" ", r"\s+"), text, re.S)
    assert sentence, "README.md no longer says which arguments are verifiers 0.4's taskset fields"
    rows = {cells[0].strip("`"): cells[2] for _, cells in table(text, "### Environment Arguments")}
    named = set(rows) - {"**kwargs", *re.findall(r"`(\w+)`", sentence.group(1))}
    fields = {k: v.default for k, v in PyTorchTasksetConfig.model_fields.items() if k in PyTorchTasksetConfig.__annotations__}
    where = f"README.md:{line_of(text, sentence.start())}"
    assert named == set(fields), f"{where}: the taskset fields are {sorted(fields)}"
    assert {n: rows[n] for n in fields} == {n: as_argument(d) for n, d in fields.items()}, where
    assert int(sentence.group(2)) == PyTorchEnvConfig.model_fields["agent"].default.max_turns == int(rows["max_turns"].strip("`"))
