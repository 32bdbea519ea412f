#!/usr/bin/env python
"""Issue 49's beam bars from one run's files (bench/2026-11-beam/run.sh writes them): throughput of our greedy and
beam against NeMo's, and our float32 best hypotheses against NeMo's `malsd_batch`.

    python scripts/compare_beam.py --ours-greedy G.json --ours-beam B.json --nemo N.json \
        --ours-ids DIR --nemo-ids F.json --out OUT.md

--ours-greedy, --ours-beam: `transcribe bench --folder ... [--beam N] --json` reports (their rows with graphs on,
else the eager ones); --nemo: scripts/nemo_beam_bench.py's JSON (greedy and beam runs) on the same files.
--ours-ids: the JSON outputs of `transcribe DIR --beam N -f json -o DIR`; --nemo-ids: nemo_beam_bench.py's JSON of
the same files with the beam run. Files are matched by name. Writes a Markdown summary (printed too) and, beside it,
the same as JSON with the names of the files that differ.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BARS = {"beam / our greedy": 0.8, "beam / NeMo's beam": 3.0, "agreement": 0.99}


def bench_rtfx(path: Path) -> tuple[float, dict]:
    """The RTFx of a bench report's graphs row (its largest batch), else its eager row, and the row."""
    rows = json.loads(path.read_text())["throughput"]
    row = max(rows, key=lambda r: (r["graphs"], r["batch"]))
    return row["rtfx"], row


def nemo_runs(path: Path) -> dict[str, dict]:
    return {r["run"]: r for r in json.loads(path.read_text())["runs"]}


def ours_ids(folder: Path) -> dict[str, list[int]]:
    """File name -> token ids, from the CLI's JSON outputs (one record a file)."""
    ids = {}
    for path in folder.rglob("*.json"):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line) if line.strip() else {}
            if "tokens" in record:
                ids[Path(record["path"]).name] = [t["id"] for t in record["tokens"]]
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours-greedy", type=Path)
    ap.add_argument("--ours-beam", type=Path)
    ap.add_argument("--nemo", type=Path)
    ap.add_argument("--ours-ids", type=Path)
    ap.add_argument("--nemo-ids", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    summary: dict = {}
    lines = ["# Beam search against NeMo 3.0 (issue 49)", ""]
    if args.ours_greedy and args.ours_beam and args.nemo:
        greedy, greedy_row = bench_rtfx(args.ours_greedy)
        beam, beam_row = bench_rtfx(args.ours_beam)
        nemo = nemo_runs(args.nemo)
        nemo_greedy, nemo_beam = (nemo.get(r, {}).get("rtfx") for r in ("greedy", "beam"))
        report = json.loads(args.ours_beam.read_text())
        summary["throughput"] = {
            "ours_greedy": greedy,
            "ours_beam": beam,
            "nemo_greedy": nemo_greedy,
            "nemo_beam": nemo_beam,
            "beam / our greedy": beam / greedy,
            "beam / NeMo's beam": beam / nemo_beam if nemo_beam else None,
            "graphs": beam_row["graphs"],
            "batch": beam_row["batch"],
        }
        lines += [
            f"{report['files']} files, {report['audio_seconds']:.0f} s of audio; {report['device']}, "
            f"{report['dtype']}, batch {beam_row['batch']}, graphs {'on' if beam_row['graphs'] else 'off'}; "
            f"beam {report.get('beam', 1)}; RTFx end to end (ours: `transcribe bench --folder`, median; "
            "NeMo: one timed `transcribe()` after a warm-up)",
            "",
            "| | ours | NeMo 3.0 | ours / NeMo |",
            "|---|---:|---:|---:|",
            f"| greedy | {greedy:.0f} | {_num(nemo_greedy)} | {_ratio(greedy, nemo_greedy)} |",
            f"| beam {report.get('beam', 1)} | {beam:.0f} | {_num(nemo_beam)} | {_ratio(beam, nemo_beam)} |",
            f"| beam / greedy | {beam / greedy:.2f} | {_ratio(nemo_beam, nemo_greedy)} | |",
            "",
        ]
    if args.ours_ids and args.nemo_ids:
        nemo = nemo_runs(args.nemo_ids)["beam"]["token_ids"]
        theirs = {Path(p).name: ids for p, ids in nemo.items()}
        ours = ours_ids(args.ours_ids)
        differ = sorted(name for name in theirs if ours.get(name) != theirs[name])
        share = 1 - len(differ) / len(theirs)
        summary["agreement"] = {"files": len(theirs), "same": len(theirs) - len(differ), "share": share}
        summary["differ"] = differ
        lines += [
            f"float32 best hypothesis: NeMo's `malsd_batch` token ids on {len(theirs) - len(differ)} of "
            f"{len(theirs)} files ({100 * share:.1f}%; the bar: {100 * BARS['agreement']:.0f}%)",
            "",
        ]
    checks = {
        name: value >= BARS[name]
        for name, value in [
            *summary.get("throughput", {}).items(),
            ("agreement", summary.get("agreement", {}).get("share")),
        ]
        if name in BARS and value is not None
    }
    summary["bars_met"] = checks
    lines += [f"- {name} >= {BARS[name]}: {'met' if ok else 'NOT met'}" for name, ok in checks.items()]
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(text, end="")


def _num(value: float | None) -> str:
    return f"{value:.0f}" if value else "-"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


if __name__ == "__main__":
    main()
