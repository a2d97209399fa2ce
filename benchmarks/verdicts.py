"""``python -m benchmarks verdicts`` (also ``fastcheck bench verdicts``): who gets the corpus right.

Over every case of ``benchmarks.corpus.CASES`` and every dtype in ``case.dtypes``,
side by side:

``fastcheck``
    ``fastcheck.check_gradients(case.f, case.make_inputs(dtype))`` with default
    settings; the verdict is ``report.ok``.
``compute_gradient (torch-style)`` and ``compute_gradient (JAX-style)``
    ``tf.test.compute_gradient(f, inputs)`` (one call per case and dtype, shared
    by both), judged element by element with the rule the peers use,
    ``|theoretical - numerical| <= atol + rtol * |numerical|``:

    * torch ``gradcheck``: atol = 1e-5, rtol = 1e-3 in every dtype; a NaN
      anywhere fails (``torch.allclose``, ``equal_nan=False``);
    * JAX ``check_grads``: atol = rtol = ``default_gradient_tolerance`` of the
      dtype (2e-3 float32, 1e-5 float64); NaN on both sides at the same place
      counts as equal (``np.testing.assert_allclose``, ``equal_nan=True``).

A wrong case that fails is *caught*, a wrong case that passes a *miss*, a correct
case that fails a *false alarm* (except an undecidable verdict on a case listed
``unresolvable`` in that dtype: no step resolves a 1% error there).  A contender that raises (compute_gradient on a
function it cannot handle, or fastcheck) is recorded as an *error* and counts as a
failed check for its verdict (so a raise on a wrong case counts as caught, on a
correct case as a false alarm; the error column says how many there were).

Writes ``verdicts.json`` and ``verdicts.md`` to ``--out`` (default
``benchmarks/results``) and prints the summary and the list of cases each
contender got wrong.  Exits 1 when fastcheck raised, missed a wrong case or
raised a false alarm, else 0.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
DTYPES = ("float32", "float64")
# (atol, rtol) per dtype; "equal_nan" as the peer's comparison treats NaN.
RULES = {
    "torch": {"title": "compute_gradient (torch-style)", "equal_nan": False,
              "tolerances": {"float32": (1e-5, 1e-3), "float64": (1e-5, 1e-3)},
              "source": "torch.autograd.gradcheck defaults atol=1e-5, rtol=1e-3 (torch.allclose, equal_nan=False)"},
    "jax": {"title": "compute_gradient (JAX-style)", "equal_nan": True,
            "tolerances": {"float32": (2e-3, 2e-3), "float64": (1e-5, 1e-5)},
            "source": "jax check_grads: atol=rtol=default_gradient_tolerance (2e-3 float32, 1e-5 float64; "
                      "np.testing.assert_allclose, equal_nan=True)"},
}
CONTENDERS = ("fastcheck", "torch", "jax")
TITLES = {"fastcheck": "fastcheck (defaults)", **{k: v["title"] for k, v in RULES.items()}}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks verdicts",
        description="Verdicts of fastcheck and of tf.test.compute_gradient judged with torch's and JAX's "
        "tolerances on every case of benchmarks.corpus.CASES, per dtype.",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default {RESULTS})")
    parser.add_argument("--cases", default=None, metavar="NAME[,NAME]", help="only these corpus cases")
    parser.add_argument("--dtypes", default=",".join(DTYPES), metavar="DTYPE[,DTYPE]",
                        help="only these dtypes (default float32,float64; a case runs only in its own dtypes)")
    return parser


# ----------------------------------------------------------------------------- judging


def judge(theoretical, numerical, atol: float, rtol: float, equal_nan: bool) -> dict:
    """Element-wise ``|t - n| <= atol + rtol * |n|`` over every input's Jacobian block."""
    import numpy as np

    failing, total, worst = 0, 0, 0.0
    for t, n in zip(theoretical, numerical):
        t = np.asarray(t, dtype=np.float64)
        n = np.asarray(n, dtype=np.float64)
        close = np.isclose(t, n, rtol=rtol, atol=atol, equal_nan=equal_nan)
        failing += int(np.sum(~close))
        total += int(close.size)
        with np.errstate(invalid="ignore", over="ignore"):
            ratio = np.abs(t - n) / (atol + rtol * np.abs(n))
        ratio = np.where(close, np.minimum(np.nan_to_num(ratio, nan=0.0), 1.0), np.nan_to_num(ratio, nan=np.inf))
        if ratio.size:
            worst = max(worst, float(np.max(ratio)))
    return {"ok": failing == 0, "failing_elements": failing, "elements": total, "worst_ratio": worst}


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300] if text else ''}"


def _outcome(correct: bool, failed: bool) -> str:
    if correct:
        return "false alarm" if failed else "pass"
    return "caught" if failed else "miss"


def run_case(case, dtype_name: str) -> dict:
    """fastcheck and compute_gradient on one case in one dtype."""
    import numpy as np
    import tensorflow as tf

    import fastcheck
    from benchmarks.contenders import _for_compute_gradient

    dtype = tf.as_dtype(dtype_name)
    entry = {"case": case.name, "dtype": dtype_name, "correct": bool(case.correct), "category": case.category}

    start = time.perf_counter()
    try:
        report = fastcheck.check_gradients(case.f, case.make_inputs(dtype))
    except Exception as error:  # noqa: BLE001 -- recorded: a raise is a failed check
        fc = {"failed": True, "error": _first_line(error)}
    else:
        fc = {"failed": not report.ok, "ok": bool(report.ok), "verdict": report.verdict, "mode": report.mode,
              "path": report.path, "max_abs_error": float(report.max_abs_error), "problems": list(report.problems)}
    fc["seconds"] = time.perf_counter() - start
    fc["outcome"] = _outcome(case.correct, fc["failed"])
    if dtype_name in case.unresolvable and fc.get("verdict") == "undecidable":
        fc["outcome"] = "undecidable (no step resolves 1%)"  # the case's own statement: neither a pass nor an alarm
    entry["fastcheck"] = fc

    start = time.perf_counter()
    try:
        f, xs = _for_compute_gradient(case.f, case.make_inputs(dtype))
        theoretical, numerical = tf.test.compute_gradient(f, xs)
    except Exception as error:  # noqa: BLE001 -- recorded: a raise is a failed check for both rules
        seconds = time.perf_counter() - start
        entry["compute_gradient"] = {"seconds": seconds, "error": _first_line(error)}
        for rule in RULES:
            entry[rule] = {"failed": True, "error": entry["compute_gradient"]["error"],
                           "outcome": _outcome(case.correct, True)}
        return entry
    seconds = time.perf_counter() - start
    diffs = [float(np.max(np.abs(np.asarray(t, np.float64) - np.asarray(n, np.float64)), initial=0.0))
             for t, n in zip(theoretical, numerical)]
    entry["compute_gradient"] = {"seconds": seconds, "max_abs_diff": max(diffs, default=0.0)}
    for rule, spec in RULES.items():
        atol, rtol = spec["tolerances"][dtype_name]
        verdict = judge(theoretical, numerical, atol, rtol, spec["equal_nan"])
        verdict.update(failed=not verdict["ok"], atol=atol, rtol=rtol, outcome=_outcome(case.correct, not verdict["ok"]))
        entry[rule] = verdict
    return entry


# ----------------------------------------------------------------------------- summary and output


def summarise(entries: list, dtypes) -> tuple[dict, dict]:
    """(summary[dtype][contender], wrong[contender] = cases it got wrong or raised on)."""
    summary, wrong = {}, {name: [] for name in CONTENDERS}
    for dtype in dtypes:
        rows = [e for e in entries if e["dtype"] == dtype]
        if not rows:
            continue
        summary[dtype] = {}
        for name in CONTENDERS:
            total_wrong = sum(not e["correct"] for e in rows)
            total_correct = sum(e["correct"] for e in rows)
            summary[dtype][name] = {
                "caught": sum(e[name]["outcome"] == "caught" for e in rows),
                "wrong": total_wrong,
                "false_alarms": sum(e[name]["outcome"] == "false alarm" for e in rows),
                "correct": total_correct,
                "misses": sum(e[name]["outcome"] == "miss" for e in rows),
                "errors": sum("error" in e[name] for e in rows),
            }
    for e in entries:
        for name in CONTENDERS:
            item = e[name]
            if item["outcome"] in ("miss", "false alarm") or "error" in item:
                kind = item["outcome"] + (" (error)" if "error" in item else "")
                detail = item.get("error") or _detail(name, item)
                wrong[name].append({"case": e["case"], "dtype": e["dtype"], "kind": kind, "category": e["category"],
                                    "detail": detail})
    return summary, wrong


def _detail(name: str, item: dict) -> str:
    if name == "fastcheck":
        text = f"verdict {item.get('verdict')}, max abs error {item.get('max_abs_error', 0):.3g}, {item.get('path')}"
        return text + (f"; {'; '.join(item['problems'])[:160]}" if item.get("problems") else "")
    return (f"{item['failing_elements']}/{item['elements']} elements outside atol={item['atol']:g}, "
            f"rtol={item['rtol']:g}; worst error / allowed = {item['worst_ratio']:.3g}")


def summary_markdown(record: dict) -> str:
    lines = [
        "| dtype | contender | wrong caught / total wrong | false alarms / total correct | misses | errors |",
        "|---|---|---|---|---|---|",
    ]
    for dtype, by_name in record["summary"].items():
        for name in CONTENDERS:
            s = by_name[name]
            lines.append(f"| {dtype} | {TITLES[name]} | {s['caught']} / {s['wrong']} | "
                         f"{s['false_alarms']} / {s['correct']} | {s['misses']} | {s['errors']} |")
    lines += ["", "### Cases each contender got wrong (or raised on)", ""]
    for name in CONTENDERS:
        items = record["wrong"][name]
        lines.append(f"**{TITLES[name]}**: {len(items) or 'none'}")
        if items:
            lines += ["", "| case | dtype | kind | category | detail |", "|---|---|---|---|---|"]
            lines += [f"| {i['case']} | {i['dtype']} | {i['kind']} | {i['category']} | {i['detail'].replace('|', chr(92) + '|')} |"
                      for i in items]
        lines.append("")
    return "\n".join(lines)


def markdown(record: dict) -> str:
    versions = record["versions"]
    lines = [
        "# fastcheck verdicts on the corpus",
        "",
        f"{record['timestamp']} · {record['cases_run']} case-dtype checks ({len(record['case_names'])} cases) · "
        f"TF {versions['tensorflow']}, TFP {versions['tensorflow_probability']}, Python {versions['python']} · "
        f"total wall time {record['wall_seconds']:.0f} s (fastcheck {record['seconds']['fastcheck']:.1f} s, "
        f"compute_gradient {record['seconds']['compute_gradient']:.1f} s)",
        "",
        "fastcheck: `check_gradients(case.f, case.make_inputs(dtype)).ok` with default settings. compute_gradient: "
        "`tf.test.compute_gradient(f, inputs)` judged element-wise with `|theoretical - numerical| <= atol + rtol * "
        "|numerical|`: " + "; ".join(f"{spec['title']}: {spec['source']}" for spec in RULES.values())
        + ". A raise counts as a failed check (and as an error).",
        "",
        "## Summary",
        "",
        summary_markdown(record),
        "## Every case",
        "",
        "| case | dtype | correct | category | fastcheck | torch-style | JAX-style |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in record["cases"]:
        cells = []
        for name in CONTENDERS:
            item = e[name]
            mark = item["outcome"] + (" (error)" if "error" in item else "")
            cells.append(mark.upper() if item["outcome"] in ("miss", "false alarm") else mark)
        lines.append(f"| {e['case']} | {e['dtype']} | {e['correct']} | {e['category']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _versions() -> dict:
    import importlib.metadata
    import platform

    import numpy as np
    import tensorflow as tf

    def version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "tensorflow": tf.__version__,
            "tensorflow_probability": version("tensorflow-probability"), "numpy": np.__version__,
            "fastcheck": version("fastcheck")}


def main(argv=None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    if not dtypes or any(d not in DTYPES for d in dtypes):
        print(f"--dtypes: choose among {', '.join(DTYPES)}", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads
    import tensorflow as tf

    from benchmarks.problems import load_corpus

    cases, reason = load_corpus()
    if cases is None:
        print(f"no corpus: {reason}", file=sys.stderr)
        return 2
    if args.cases:
        wanted = [name.strip() for name in args.cases.split(",") if name.strip()]
        known = {case.name for case in cases}
        unknown = [name for name in wanted if name not in known]
        if unknown:
            print(f"unknown case(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
        cases = [case for case in cases if case.name in wanted]

    started = time.perf_counter()
    stamp = _dt.datetime.now(_dt.timezone.utc)
    logger, level = tf.get_logger(), tf.get_logger().level
    logger.setLevel("ERROR")
    entries = []
    try:
        for case in cases:
            own = [tf.as_dtype(d).name for d in getattr(case, "dtypes", DTYPES)]
            for dtype in dtypes:
                if dtype not in own:
                    continue
                entry = run_case(case, dtype)
                entries.append(entry)
                marks = "  ".join(f"{name}: {entry[name]['outcome']}{' (error)' if 'error' in entry[name] else ''}"
                                  for name in CONTENDERS)
                print(f"{case.name:<32} {dtype:<8} {'correct' if case.correct else 'wrong':<8} {marks}", flush=True)
    finally:
        logger.setLevel(level)
    summary, wrong = summarise(entries, dtypes)
    record = {
        "schema": 1,
        "timestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": ["python", "-m", "benchmarks", "verdicts", *(argv or [])],
        "settings": {"cases": args.cases, "dtypes": list(dtypes)},
        "rules": {name: {"atol_rtol": spec["tolerances"], "equal_nan": spec["equal_nan"], "source": spec["source"]}
                  for name, spec in RULES.items()},
        "versions": _versions(),
        "case_names": [case.name for case in cases],
        "cases_run": len(entries),
        "summary": summary,
        "wrong": wrong,
        "cases": entries,
        "seconds": {"fastcheck": sum(e["fastcheck"]["seconds"] for e in entries),
                    "compute_gradient": sum(e["compute_gradient"]["seconds"] for e in entries)},
        "wall_seconds": time.perf_counter() - started,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (("verdicts.json", json.dumps(record, indent=1)), ("verdicts.md", markdown(record))):
        path = args.out / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        written.append(path)
    print()
    print(summary_markdown(record))
    print("wrote " + ", ".join(str(p) for p in written))
    print(f"total wall time {record['wall_seconds']:.1f} s")
    fastcheck_wrong = wrong["fastcheck"]
    for item in fastcheck_wrong:
        print(f"FASTCHECK {item['kind'].upper()}: {item['case']} ({item['dtype']}): {item['detail']}")
    return 1 if fastcheck_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
