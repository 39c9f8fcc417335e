"""Static checks of docker/Dockerfile.{cpu,gpu}, .dockerignore and docker/README.md.

No Docker engine runs on the dev machines, so the images are never built here. These
tests catch what would otherwise surface only at `docker build`/`docker run` time: a COPY
of a missing or .dockerignored file, an entrypoint that is not our console script, a CMD
naming a subcommand or option the CLI lacks, a health check that does not compile or
probes another port, a root final user, and drift from scripts/install.sh / pyproject.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from gateway.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"cpu": ROOT / "docker" / "Dockerfile.cpu", "gpu": ROOT / "docker" / "Dockerfile.gpu"}
README = ROOT / "docker" / "README.md"
KNOWN = {
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "MAINTAINER",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
}


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comment and empty lines dropped (also inside a
    continuation, as Docker does), backslash-continued lines joined. Heredocs are not supported, and
    refused, so a parse never silently misreads one."""
    instructions, pending = [], ""
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, args = full.partition(" ")
            assert "<<" not in args or word.upper() != "RUN", f"heredoc not supported: {full}"
            instructions.append((word.upper(), args.strip()))
    assert not pending, "the file ends inside a line continuation"
    return instructions


def split_flags(args: str) -> tuple[dict[str, str], list[str]]:
    """`--from=x --chown=a b c` -> ({'from': 'x', 'chown': 'a'}, ['b', 'c']); JSON form too."""
    words = json.loads(args) if args.startswith("[") else shlex.split(args)
    flags = {}
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    return flags, words


def json_array(args: str) -> list[str]:
    """Exec form only: a shell-form ENTRYPOINT would run under /bin/sh and drop signals,
    so Ctrl-C / `docker stop` would not reach rmgate's shutdown of Serve and the engines."""
    value = json.loads(args)
    assert isinstance(value, list) and value and all(isinstance(v, str) for v in value), args
    return value


def dockerignore_excludes(rel: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides;
    `*` stays inside one path element, `**` spans any number, `!` re-includes."""
    excluded = False
    parts = rel.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        regex = "".join(
            ".*"
            if tok == "**"
            else "[^/]*"
            if tok == "*"
            else "[^/]"
            if tok == "?"
            else re.escape(tok)
            for tok in re.split(r"(\*\*|\*|\?)", pattern)
            if tok
        )
        regex = regex.replace(".*/", "(.*/)?")  # `**/x` also matches a top-level x
        if any(re.fullmatch(regex, c) for c in candidates):
            excluded = not negate
    return excluded


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(params=sorted(DOCKERFILES))
def image(request):
    return request.param, parse_dockerfile(DOCKERFILES[request.param].read_text())


def values(instructions, name):
    return [args for word, args in instructions if word == name]


def test_known_instructions_and_stages(image):
    _, ins = image
    assert all(word in KNOWN for word, _ in ins), [w for w, _ in ins if w not in KNOWN]
    assert next(w for w, _ in ins if w != "ARG") == "FROM"
    froms = values(ins, "FROM")
    stages = {m.group(1).lower() for f in froms[:-1] if (m := re.search(r"\bAS\s+(\S+)$", f, re.I))}
    assert len(stages) == len(froms) - 1, "in a multi-stage build every earlier stage is named"
    for word, args in ins:
        if word in ("COPY", "ADD") and "from" in split_flags(args)[0]:
            assert split_flags(args)[0]["from"].lower() in stages


def test_copy_sources_exist_and_are_in_the_context(image):
    _, ins = image
    copies = [args for word, args in ins if word in ("COPY", "ADD")]
    assert copies
    for args in copies:
        flags, words = split_flags(args)
        if "from" in flags:
            continue
        *sources, dest = words
        assert sources, args
        for source in sources:
            matches = sorted(ROOT.glob(source))
            assert matches, f"COPY source {source!r} does not exist in the build context"
            for path in matches:
                rel = path.relative_to(ROOT).as_posix()
                assert not dockerignore_excludes(rel), f"{rel} is excluded by .dockerignore"
                if path.is_dir():  # Docker copies a directory's contents, not the directory
                    assert sources == [source] and Path(dest).name == path.name, args
        if len(sources) > 1:
            assert dest.endswith("/"), f"several sources need a directory destination: {args}"


def test_runs_as_a_created_non_root_user_from_app(image):
    _, ins = image
    words = [w for w, _ in ins]
    last_user = max(i for i, w in enumerate(words) if w == "USER")
    assert all(i < last_user for i, w in enumerate(words) if w == "RUN"), (
        "a RUN after the final USER would run without root, or the user is set too early"
    )
    user = ins[last_user][1].split(":")[0]
    assert user not in ("root", "0")
    assert any(re.search(rf"useradd\b.*\b{re.escape(user)}\b", r) for r in values(ins, "RUN"))
    # `rmgate serve` resolves relative model_path against the working directory.
    assert values(ins, "WORKDIR")[-1] == "/app"


def test_entrypoint_and_cmd_are_the_rmgate_cli(image):
    _, ins = image
    entrypoint = json_array(values(ins, "ENTRYPOINT")[-1])
    cmd = json_array(values(ins, "CMD")[-1])
    assert entrypoint == ["rmgate"]
    assert pyproject()["project"]["scripts"]["rmgate"] == "gateway.cli.main:main"
    result = CliRunner().invoke(app, [cmd[0], "--help"])
    assert result.exit_code == 0, result.output
    command = typer.main.get_command(app).commands[cmd[0]]
    options = {opt for param in command.params for opt in param.opts}
    assert {w for w in cmd if w.startswith("--")} <= options, cmd


def test_healthcheck_and_ports(image):
    _, ins = image
    cmd = json_array(values(ins, "CMD")[-1])
    port = cmd[cmd.index("--port") + 1]
    assert values(ins, "EXPOSE") == [port]
    checks = values(ins, "HEALTHCHECK")
    assert len(checks) == 1
    _, probe = checks[0].split(" CMD ", 1) if " CMD " in checks[0] else ("", checks[0][4:])
    probe = json_array(probe.strip())
    assert probe[0] in ("python", "python3") and probe[1] == "-c"
    compile(probe[2], "HEALTHCHECK", "exec")
    assert f"http://127.0.0.1:{port}/health" in probe[2]


def test_environment(image):
    name, ins = image
    env = {}
    for args in values(ins, "ENV"):
        env.update(w.split("=", 1) for w in shlex.split(args))
    assert env["HF_HUB_OFFLINE"] == "1" and env["RAY_USAGE_STATS_ENABLED"] == "0"
    if name == "gpu":
        assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
        assert values(ins, "FROM") == ["vllm/vllm-openai:v0.24.0"]


def test_install_facts_match_pyproject_and_install_script():
    """The images install what scripts/install.sh and pyproject say, so they cannot drift."""
    extras = pyproject()["project"]["optional-dependencies"]
    cpu_runs = " ".join(values(parse_dockerfile(DOCKERFILES["cpu"].read_text()), "RUN"))
    gpu_runs = " ".join(values(parse_dockerfile(DOCKERFILES["gpu"].read_text()), "RUN"))
    torch_pin = next(r for r in extras["cpu"] if r.startswith("torch=="))
    assert f"install {torch_pin} --index-url https://download.pytorch.org/whl/cpu" in cpu_runs
    assert 'install ".[cpu]"' in cpu_runs  # the runtime extra only: no dev tools
    removed = re.search(
        r"pip uninstall -q -y ([\w ]+?) 2>", (ROOT / "scripts" / "install.sh").read_text()
    ).group(1)
    assert f"uninstall -y {removed}" in cpu_runs
    for requirement in extras["server"] + pyproject()["project"]["dependencies"]:
        assert f'"{requirement}"' in gpu_runs, requirement
    assert "install --no-deps ." in gpu_runs
    installs = [step for step in gpu_runs.split("&&") if "pip install" in step]
    assert not any("vllm" in step for step in installs), "the base image's vLLM stays as is"


def test_readme_documents_build_and_run():
    text = README.read_text()
    for name, path in DOCKERFILES.items():
        ins = parse_dockerfile(path.read_text())
        config = json_array(values(ins, "CMD")[-1])[1]
        port = values(ins, "EXPOSE")[0]
        assert f"docker build -f docker/{path.name} -t rmgate:{name} ." in text
        runs = [
            line
            for line in text.splitlines()
            if line.startswith("docker run") and line.endswith(f" rmgate:{name}")
        ]
        assert len(runs) == 1, f"one `docker run ... rmgate:{name}` line"
        assert f":{config}:ro" in runs[0], "the CMD's config path is the documented mount"
        assert f"127.0.0.1:{port}:{port}" in runs[0]
    assert "configs/gpu.yaml" in text and "--gpus all" in text
