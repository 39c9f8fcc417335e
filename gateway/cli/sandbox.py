"""``rmgate sandbox``: check this host's code sandbox, or serve it as a Sandbox Fusion
``/run_code`` service."""

from __future__ import annotations

import asyncio

import typer

sandbox_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="The code sandbox of code_tests rules: check it here, or serve it.",
)


@sandbox_app.command("check")
def check() -> None:
    """Run a real submission in this host's bwrap sandbox; print its identity, or the fix
    (exit 2) when it cannot run."""
    from gateway.core.config.code_rules import CodeTestsRule
    from gateway.sandbox.errors import SandboxUnavailable
    from gateway.sandbox.runner import CodeSandboxes

    sandboxes = CodeSandboxes({"check": CodeTestsRule()})
    try:
        asyncio.run(sandboxes.probe())
    except SandboxUnavailable as exc:
        typer.echo(f"rmgate: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"the code sandbox runs here: {sandboxes.identity('check')}")


@sandbox_app.command("serve")
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
    port: int = typer.Option(8080, help="Port to bind."),
    concurrency: int = typer.Option(4, min=1, help="Runs at once; the rest wait."),
) -> None:
    """Serve this host's sandbox as Sandbox Fusion's ``POST /run_code`` (Python), for a
    gateway's ``sandbox: {type: sandbox_fusion, url: http://host:port}``."""
    import uvicorn

    from gateway.sandbox.fusion_server import fusion_app

    uvicorn.run(fusion_app(concurrency), host=host, port=port, log_level="warning")
