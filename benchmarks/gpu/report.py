"""Markdown tables from bench_paths.py results (runs anywhere; reads only JSON).

python -m benchmarks.gpu.report benchmarks/gpu/results/h200-2026-12-01-core-*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ORDER = (
    "offline_auto",
    "engine_auto",
    "rmgate_auto",
    "rmgate_direct",
    "engine_off",
    "rmgate_off",
    "least_loaded_off",
    "rmgate_serial",
)
LABEL = {
    "offline_auto": "offline `LLM` (batch-invariant)",
    "engine_auto": "engine direct (`auto` engine)",
    "rmgate_auto": "**rmgate `auto`**",
    "rmgate_direct": "**rmgate `auto`, `--direct-port`**",
    "engine_off": "engine direct (`off` engine)",
    "rmgate_off": "rmgate `off`",
    "least_loaded_off": "least-loaded proxy over `off`",
    "rmgate_serial": "rmgate `serialize`",
}


def fmt(x: Any, nd: int = 0) -> str:
    if x is None:
        return "–"
    return f"{x:,.{nd}f}"


def throughput_table(rep: dict[str, Any], kind: str) -> list[str]:
    """One table per concurrency of every ``throughput_<kind>[_<tag/label>]`` phase."""
    phases = {
        k: v
        for k, v in rep["phases"].items()
        if k == f"throughput_{kind}" or k.startswith(f"throughput_{kind}_")
    }
    anchor = (rep["phases"].get("anchors") or {}).get(kind) or {}
    out = []
    rows = [
        (k.removeprefix(f"throughput_{kind}").lstrip("_"), c, row)
        for k, ph in phases.items()
        for c, row in ph["paths"].items()
    ]
    for variant, c, row in rows:
        if not row:
            continue
        if anchor.get("req_per_s") and not variant:
            row = {
                "offline_auto": {
                    "req_per_s": anchor["req_per_s"],
                    "gen_tok_per_s": anchor.get("gen_tok_per_s"),
                    "gpu_util_pct": anchor.get("gpu_util_pct"),
                    "gateway_cpu_ms_per_req": None,
                    "loadgen_cpu_ms_per_req": None,
                    "p50_ms": None,
                    "req_per_s_rounds": [],
                },
                **row,
            }
        base = row.get("engine_auto", {}).get("req_per_s")
        ser = row.get("rmgate_serial", {}).get("req_per_s")
        tok = kind == "grm"
        out.append(
            f"\n{rep['size']} {'GRM (chat, 64 tokens)' if tok else 'DisRM (/classify)'}"
            + (f" ({variant})" if variant else "")
            + f", concurrency {c}\n"
        )
        out.append(
            "| path | req/s | rounds | "
            + ("gen tok/s | " if tok else "")
            + "× engine direct | × serialize | gateway CPU ms/req | load-gen CPU ms/req | GPU util % | p50 ms |"
        )
        out.append("|---|---|---|" + ("---|" if tok else "") + "---|---|---|---|---|---|")
        for p in ORDER:
            if p not in row:
                continue
            v = row[p]
            proxy = (
                v.get("proxy_cpu_ms_per_req")
                if p == "least_loaded_off"
                else v.get("gateway_cpu_ms_per_req")
            )
            rounds = "/".join(fmt(x) for x in v.get("req_per_s_rounds", []))
            out.append(
                f"| {LABEL[p]} | {fmt(v['req_per_s'])} | {rounds or '1 call'} | "
                + (f"{fmt(v.get('gen_tok_per_s'))} | " if tok else "")
                + f"{fmt(v['req_per_s'] / base, 2) if base else '–'} | "
                + f"{fmt(v['req_per_s'] / ser, 1) if ser else '–'} | {fmt(proxy, 2)} | "
                + f"{fmt(v.get('loadgen_cpu_ms_per_req'), 2)} | {fmt(v.get('gpu_util_pct'))} | {fmt(v.get('p50_ms'))} |"
            )
    return out


def framework_table(reps: list[dict[str, Any]]) -> list[str]:
    """Every DisRM throughput row of a run that has the framework anchor (``framework_rm``:
    a plain ``transformers`` forward of the same model, bucketed by length, same requests):
    the engines reached directly and rmgate, each × the anchor, and how many answers
    differ in bits from the run's first (the shipped engines')."""
    out = [
        (
            "\n| run | size | engines (variant) | c | framework req/s | engine direct req/s (× fw) "
            "| rmgate req/s (× fw) | differing bits | gateway CPU ms/req | GPU util % |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rep in reps:
        fw = (rep["phases"].get("framework_rm") or {}).get("req_per_s")
        if not fw:
            continue
        for key, ph in rep["phases"].items():
            if not (key == "throughput_rm" or key.startswith("throughput_rm_")):
                continue
            variant = key.removeprefix("throughput_rm").lstrip("_") or "shipped"
            for c, row in ph["paths"].items():
                eng = row.get("engine_auto") or row.get("engine_off")
                gw = row.get("rmgate_auto") or row.get("rmgate_off")
                if not eng and not gw:
                    continue
                bits = {str(x.get("differing_from_reference")) for x in (eng, gw) if x}
                out.append(
                    f"| {rep['layout']} | {rep['size']} | {variant} | {c} | {fmt(fw)} | "
                    + (f"{fmt(eng['req_per_s'])} ({eng['req_per_s'] / fw:.2f}×)" if eng else "–")
                    + " | "
                    + (f"{fmt(gw['req_per_s'])} ({gw['req_per_s'] / fw:.2f}×)" if gw else "–")
                    + " | "
                    + "/".join(sorted(bits))
                    + f" | {fmt((gw or {}).get('gateway_cpu_ms_per_req'), 2)} | "
                    + f"{fmt((gw or eng).get('gpu_util_pct'))} |"
                )
    return out


def replay_table(reps: list[dict[str, Any]]) -> list[str]:
    out = [
        "\n| size | requests (½ GRM 16 tok, ½ DisRM) | `auto` differing c=1 / 64 / 256 | `off` differing c=1 / 64 / 256 | errors |",
        "|---|---|---|---|---|",
    ]
    for rep in reps:
        r = rep["phases"].get("replay")
        if not r:
            continue
        a = " / ".join(str(x["differing_from_run1"]) for x in r["runs"]["auto"])
        o = " / ".join(str(x["differing_from_run1"]) for x in r["runs"]["off"])
        e = sum(x["errors"] + x["missing"] for m in r["runs"].values() for x in m)
        out.append(f"| {rep['size']} | {r['requests']} | **{a}** | {o} | {e} |")
    return out


def old_paths_table(reps: list[dict[str, Any]]) -> list[str]:
    out = [
        "\n| size | kind | this load generator → rmgate | old bench's httpx client → rmgate | this load generator → rmgate via Serve's Python proxy |",
        "|---|---|---|---|---|",
    ]
    for rep in reps:
        for kind, row in (rep["phases"].get("old_paths") or {}).items():
            g = lambda k: row.get(k, {})  # noqa: E731
            out.append(
                f"| {rep['size']} | {'DisRM' if kind == 'rm' else 'GRM'} | {fmt(g('loadgen_rmgate').get('req_per_s'))} "
                f"({fmt(g('loadgen_rmgate').get('loadgen_cpu_ms_per_req'), 2)} ms client CPU/req) | "
                f"{fmt(g('old_httpx_client_rmgate').get('req_per_s'))} ({fmt(g('old_httpx_client_rmgate').get('loadgen_cpu_ms_per_req'), 2)} ms) | "
                f"{fmt(g('loadgen_serve_proxy').get('req_per_s'))} (gateway {fmt(g('loadgen_serve_proxy').get('gateway_cpu_ms_per_req'), 2)} ms/req) |"
            )
    return out


def shared_table(reps: list[dict[str, Any]]) -> list[str]:
    out = [
        "\n| size | DisRM alone → with GRM load (req/s) | GRM alone → with DisRM load (req/s) | sum of shares | GPU util together % | gateway CPU ms/req alone (DisRM / GRM) |",
        "|---|---|---|---|---|---|",
    ]
    for rep in reps:
        s = rep["phases"].get("shared_gpu_auto")
        if not s:
            continue
        out.append(
            f"| {rep['size']} | {fmt(s['rm_alone']['req_per_s'])} → {fmt(s['rm_with_grm']['req_per_s'])} ({s['rm_ratio']:.2f}) | "
            f"{fmt(s['grm_alone']['req_per_s'])} → {fmt(s['grm_with_rm']['req_per_s'])} ({s['grm_ratio']:.2f}) | "
            f"{s['rm_ratio'] + s['grm_ratio']:.2f} | {fmt((s.get('together_gpu') or {}).get('gpu_util_pct'))} | "
            f"{fmt(s['rm_alone']['gateway_cpu_ms_per_req'], 2)} / {fmt(s['grm_alone']['gateway_cpu_ms_per_req'], 2)} |"
        )
    return out


def main() -> None:
    reps = [json.loads(Path(p).read_text()) for p in sys.argv[1:]]
    lines = []
    for rep in reps:
        st = [
            f"{m['id']}: {m['determinism']}"
            + (
                f" (self-test {m['selftest'][0]['identical']}/{m['selftest'][0]['total']})"
                if m.get("selftest") and m["selftest"][0]
                else ""
            )
            for m in rep.get("models", [])
        ]
        lines.append(f"\n### {rep['layout']}: up in {rep.get('startup_s')} s; {'; '.join(st)}")
        for kind in ("rm", "grm"):
            lines += throughput_table(rep, kind)
        if rep["skipped"]:
            lines.append(f"\nSkipped (deadline): {', '.join(rep['skipped'])}")
    if any("framework_rm" in rep["phases"] for rep in reps):
        lines.append("\n### Against the framework anchor")
        lines += framework_table(reps)
    lines.append("\n### Replay")
    lines += replay_table(reps)
    lines.append("\n### Old paths")
    lines += old_paths_table(reps)
    lines.append("\n### Shared GPU")
    lines += shared_table(reps)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
