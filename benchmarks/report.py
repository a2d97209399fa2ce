"""What a run produces besides its JSON: the markdown tables, the plot, and the comparison of two runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.names import CONTENDERS, FAMILIES, FASTCHECK, TITLES

# ----------------------------------------------------------------------------- formatting


def seconds_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 0.1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 100:
        return f"{seconds:.3g} s"
    return f"{seconds:.0f} s"


def cell(record: dict) -> str:
    """One contender's time, with its ratio to the fastcheck baseline."""
    status = record["status"]
    if status == "ok":
        text = seconds_text(record["seconds"])
    elif status == "over_cap":
        mark = "~" if record["estimate"] == "estimate" else ">"
        text = f"{mark}{seconds_text(record['seconds'])} (over cap)"
    elif status == "skipped":
        how = record.get("how") or ""
        return "skipped (over cap)" if "over the cap" in how else "skipped (out of reach)" if "out of reach" in how \
            else "skipped"
    elif status == "error":
        return "ERROR"
    else:
        return status
    if record.get("ratio") is not None:
        text += f" (×{record['ratio']:.3g})"
    return text


def _memory(record: dict) -> str:
    value = record.get("peak_rss_mib")
    if record["status"] != "ok" or value is None:
        return "-"
    device = record.get("peak_device_mib")
    return f"{value:.0f}" + (f" / {device:.0f}" if device is not None else "")


def _verdict(result: dict) -> str:
    summary = result["fastcheck"]
    if summary.get("raised"):
        return "raised"
    if result["family"] == "corpus":
        if "agreements" not in summary:
            return "-"
        return f"{summary['agreements']}/{summary['cases']} agree"
    if "ok" not in summary:
        return "-"
    return "ok" if summary["ok"] == result["expected_ok"] else "WRONG"


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.2g}%"


def _shape(result: dict) -> str:
    return f"{result['n']} → {result['m']}"


# ----------------------------------------------------------------------------- markdown


def markdown(record: dict) -> str:
    settings, versions = record["settings"], record["versions"]
    commit = (record.get("git_commit") or "unknown")[:10]
    machine = record["machine"]
    lines = [
        "# fastcheck benchmarks",
        "",
        f"{record['timestamp']} · preset `{settings['preset']}` · {settings['repeats']} repeat(s) · "
        f"cap {settings['cap_seconds']:.0f} s per contender per problem · device: {record['device']['used']} · "
        f"commit {commit} · TF {versions['tensorflow']}, TFP {versions['tensorflow_probability']}, "
        f"numpy {versions['numpy']}, Python {versions['python']} · {machine['cpu']} × {machine['cpus_usable']} · "
        f"total wall time {record['wall_seconds']:.0f} s",
        "",
        "## Time",
        "",
        "Seconds, median of the repeats (cold: a fresh function object each repeat; warm: a second check of it). "
        "`(×k)`: contender time / fastcheck time in this run -- compute_gradient, the element loop and hand-batched "
        "cold against fastcheck cold, hand-batched warm against fastcheck warm -- so k > 1 means fastcheck was k times "
        "faster. `~`: projected from a partial run (over the cap); `>`: stopped by the hard limit.",
        "",
        "| problem | n → m | fastcheck path · mode | verdict | " + " | ".join(TITLES[c] for c in CONTENDERS) + " |",
        "|---|---|---|---|" + "---|" * len(CONTENDERS),
    ]
    for result in record["results"]:
        path = result["fastcheck"].get("path", "-")
        if result["family"] != "corpus" and result["fastcheck"].get("mode"):
            path += f" · {result['fastcheck']['mode']}"
        if result["fastcheck"].get("warm_path"):
            path += f" (warm: {result['fastcheck']['warm_path']})"
        row = [result["label"], _shape(result), path, _verdict(result)]
        row += [cell(result["contenders"][c]) for c in CONTENDERS]
        lines.append("| " + " | ".join(row) + " |")

    lines += [
        "",
        "## Peak memory",
        "",
        f"MiB of resident-set growth during the measurement ({record['memory_method']}); "
        "max over repeats; `host / device` with a GPU device.",
        "",
        "| problem | " + " | ".join(TITLES[c] for c in CONTENDERS) + " |",
        "|---|" + "---|" * len(CONTENDERS),
    ]
    for result in record["results"]:
        lines.append("| " + " | ".join([result["label"]] + [_memory(result["contenders"][c]) for c in CONTENDERS]) + " |")

    dense = [r for r in record["results"] if r.get("flop_rate")]
    if dense:
        lines += [
            "",
            "## Dense: FLOP rate of the batched evaluation",
            "",
            "2n · (2 · 64 · n) FLOPs of perturbed evaluations, divided by the time of fastcheck's batched sweep "
            "(`report.timings[\"numerical\"]`, warm), by fastcheck's whole warm check (which also covers the autodiff "
            "Jacobian and the comparison) and by the hand-batched warm run, against a plain float64 matmul "
            "[min(2n, 4096), n] @ [n, 64] in this run (the faster of XLA and TF's kernel).",
            "",
            "| problem | sweep GFLOP | matmul GFLOP/s | fastcheck sweep GFLOP/s | fraction | fastcheck whole check GFLOP/s | fraction "
            "| hand-batched warm GFLOP/s | fraction |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for result in dense:
            rate = result["flop_rate"]
            fc, hb, sweep = rate.get("fastcheck_warm"), rate.get("hand_batched_warm"), rate.get("fastcheck_sweep")
            lines.append(
                f"| {result['label']} | {rate['sweep_gflop']:.3g} | {rate['matmul']['gflops']:.3g} | "
                + (f"**{sweep['gflops']:.3g}** | **{_percent(sweep['fraction'])}**" if sweep else "- | -") + " | "
                + (f"{fc['gflops']:.3g} | {_percent(fc['fraction'])}" if fc else "- | -") + " | "
                + (f"{hb['gflops']:.3g} | {_percent(hb['fraction'])}" if hb else "- | -") + " |"
            )

    fast = [r for r in record["results"] if r.get("fast")]
    if fast:
        lines += [
            "",
            "## Fast mode at scale",
            "",
            "float32 inputs of 1e6-1e7 elements; fastcheck with default settings except where noted (mode=\"auto\" picks "
            "random projections, 4 probes). Reference: the work such a check cannot avoid, done eagerly by hand -- "
            "8 forward calls (2k, k = 4 probes), one VJP (`tape.gradient` with `output_gradients`), one JVP "
            "(`ForwardAccumulator`). compute_gradient and the element loop are out of reach at these sizes (skipped).",
            "",
            "| problem | elements | fastcheck mode · path | verdict | fastcheck cold | fastcheck warm | reference | "
            "cold / reference | warm / reference | localised region |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for result in fast:
            summary, contenders = result["fast"], result["contenders"]
            region = "-"
            if "defect" in summary:
                rows = summary["defect"]["rows"]
                found = "; ".join(f"{r['input']}[{tuple(r['first'])} .. {tuple(r['last'])}]" for r in summary["regions"])
                where = ("inside" if summary.get("region_inside_defect") else "overlapping"
                         if summary.get("region_overlaps_defect") else "NOT in")
                worst = "; ".join(str(tuple(r["worst_element"])) for r in summary["regions"] if r.get("worst_element"))
                region = (f"{found or 'none'}: {where} the defect rows {rows[0]}..{rows[1]}; worst element {worst or '-'} "
                          f"{'in' if summary.get('worst_element_in_defect') else 'NOT in'} them; "
                          f"{'caught' if summary['caught'] else 'NOT caught'}")
            ratio = {key: f"{summary[key]:.3g}" if summary.get(key) is not None else "-"
                     for key in ("fastcheck_cold_over_reference", "fastcheck_warm_over_reference")}
            lines.append(
                f"| {result['label']} | {result['n']:.3g} | {summary.get('mode')} · {summary.get('path')} | "
                f"{summary.get('verdict')} | {_short(contenders['fastcheck_cold'])} | {_short(contenders['fastcheck_warm'])} | "
                f"{_short(contenders['reference'])} | {ratio['fastcheck_cold_over_reference']} | "
                f"{ratio['fastcheck_warm_over_reference']} | {region} |"
            )

    findings = findings_lines(record)
    if findings:
        lines += ["", "## Findings", ""] + [f"- {line}" for line in findings]
    return "\n".join(lines) + "\n"


def findings_lines(record: dict) -> list[str]:
    """Where fastcheck lost to compute_gradient, failed, raised or disagreed; what was skipped."""
    lines = []
    for result in record["results"]:
        label, summary, contenders = result["label"], result["fastcheck"], result["contenders"]
        cg = contenders["compute_gradient"]
        for name in FASTCHECK:
            fc = contenders[name]
            if fc["status"] == "error":
                lines.append(f"{label}: {TITLES[name]} raised {fc['error']}")
            elif fc["status"] == "ok" and cg["seconds"] is not None and fc["seconds"] > cg["seconds"] \
                    and cg["status"] in ("ok", "over_cap"):
                context = (f"paths: {summary.get('path')}" if result["family"] == "corpus"
                           else "fastcheck notes: " + "; ".join(summary.get("notes", [])))
                lines.append(f"{label}: {TITLES[name]} ({seconds_text(fc['seconds'])}) slower than "
                             f"tf.test.compute_gradient ({_short(cg)}); {context}")
        if result["family"] == "corpus":
            for item in summary.get("disagreements", []):
                expected = "correct" if item["correct"] else "wrong"
                lines.append(f"{label}: case {item['case']} ({expected} gradient) got report.ok={item['report_ok']}"
                             + (f"; problems: {item['problems']}" if item["problems"] else ""))
            for item in summary.get("errors", []):
                lines.append(f"{label}: fastcheck raised on case {item['case']}: {item['error']}")
            for name in ("compute_gradient", "loop"):
                errors = contenders[name].get("facts", {}).get("errors", [])
                if errors:
                    lines.append(f"{label}: {TITLES[name]} failed on {len(errors)} case(s): "
                                 + ", ".join(e["case"] for e in errors[:8]) + (" ..." if len(errors) > 8 else ""))
        elif summary.get("ok") is False and result.get("expected_ok", True):
            lines.append(f"{label}: fastcheck judged a correct gradient wrong; problems: {summary.get('problems')}; "
                         f"notes: {summary.get('notes')}")
        elif summary.get("ok") is True and not result.get("expected_ok", True):
            lines.append(f"{label}: fastcheck passed a deliberately wrong gradient; notes: {summary.get('notes')}")
        for name in CONTENDERS:
            item = contenders[name]
            if item["status"] == "error" and name not in FASTCHECK:
                lines.append(f"{label}: {TITLES[name]} raised {item['error']}")
        for note in result.get("notes", []):
            lines.append(f"{label}: {note}")
    for skipped in record.get("skipped_problems", []):
        lines.append(f"{skipped['family']}: not run ({skipped['reason']})")
    return lines


# ----------------------------------------------------------------------------- plot


def plot(record: dict, path: Path) -> Path | None:
    """Time vs problem size per contender, log-log, one panel per family; hollow markers are estimates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    families = [f for f in FAMILIES if any(r["family"] == f for r in record["results"])]
    if not families:
        return None
    columns = min(3, len(families))
    rows = math.ceil(len(families) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 4.0 * rows), squeeze=False)
    colors = dict(zip(CONTENDERS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for axis, family in zip(axes.flat, families):
        results = sorted((r for r in record["results"] if r["family"] == family), key=lambda r: r["size"])
        for name in CONTENDERS:
            measured = [(r["size"], r["contenders"][name]["seconds"]) for r in results
                        if r["contenders"][name]["status"] == "ok"]
            estimated = [(r["size"], r["contenders"][name]["seconds"]) for r in results
                         if r["contenders"][name]["status"] == "over_cap"]
            style = "--" if name.endswith("cold") else "-"
            if measured:
                axis.plot(*zip(*measured), style, marker="o", color=colors[name], label=TITLES[name])
            if estimated:
                axis.plot(*zip(*estimated), linestyle="none", marker="o", markerfacecolor="none",
                          color=colors[name], label=None if measured else f"{TITLES[name]} (estimate)")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels overlap
        axis.set_title(family)
        axis.set_xlabel("cases" if family == "corpus" else "checked input elements n")
        axis.set_ylabel("seconds")
        axis.grid(True, which="both", alpha=0.3)
    for axis in list(axes.flat)[len(families):]:
        axis.set_visible(False)
    handles, labels = [], []
    for axis in axes.flat:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    figure.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), frameon=False)
    figure.suptitle(f"fastcheck benchmarks {record['timestamp']} ({record['settings']['preset']}; "
                    "hollow: over-cap estimate)")
    figure.tight_layout(rect=(0, 0.07, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


# ----------------------------------------------------------------------------- compare


def _index(record: dict) -> dict:
    # Files from before a contender existed (e.g. "reference") simply lack it.
    return {(r["label"], name): (r, r["contenders"][name]) for r in record["results"] for name in CONTENDERS
            if name in r["contenders"]}


def compare(old: dict, new: dict, threshold: float = 1.25) -> tuple[str, int]:
    """Per (problem, contender): new / old seconds, flagged beyond ``threshold``.

    Returns the text and the number of *fastcheck* regressions: a fastcheck
    time ratio above the threshold, a fastcheck measurement that now errors or
    runs over the cap, or a correct gradient that fastcheck now judges wrong.
    Ratios of other contenders are printed and flagged, but only fastcheck's
    count (they are the baseline, not the product).
    """
    before, after = _index(old), _index(new)
    lines = [
        f"old: {old.get('timestamp')} commit {(old.get('git_commit') or '?')[:10]} ({old['settings']['preset']})",
        f"new: {new.get('timestamp')} commit {(new.get('git_commit') or '?')[:10]} ({new['settings']['preset']})",
    ]
    if old.get("machine", {}).get("cpu") != new.get("machine", {}).get("cpu") or \
            old.get("device", {}).get("used") != new.get("device", {}).get("used"):
        lines.append("warning: different machine or device; ratios compare hardware as well as code")
    lines += ["", f"{'problem':<24} {'contender':<26} {'old':>10} {'new':>10} {'new/old':>8}  flag"]
    regressions = 0
    keys = list(after) + [k for k in before if k not in after]
    old_labels = {label for label, _ in before}
    new_labels = {label for label, _ in after}
    for key in keys:
        label, name = key
        if label not in old_labels or label not in new_labels:
            if name == CONTENDERS[0]:
                lines.append(f"{label:<24} {'(problem only in ' + ('new' if label in new_labels else 'old') + ')':<26}")
            continue
        if key not in before or key not in after:
            where = "new" if key in after else "old"
            lines.append(f"{label:<24} {TITLES[name]:<26} {'':>10} {'':>10} {'':>8}  only in {where}")
            continue
        (old_result, o), (new_result, n) = before[key], after[key]
        flag, ratio = "", None
        if o["status"] in ("n/a",) and n["status"] in ("n/a",):
            continue
        if o["seconds"] and n["seconds"]:
            ratio = n["seconds"] / o["seconds"]
            if ratio > threshold:
                flag = "REGRESSION"
            elif ratio < 1.0 / threshold:
                flag = "improved"
            if "over_cap" in (o["status"], n["status"]) and flag:
                flag += " (estimate)"
        if o["status"] == "ok" and n["status"] in ("error", "over_cap", "skipped"):
            flag = f"REGRESSION (now {n['status']})"
        elif o["status"] != n["status"] and not flag:
            flag = f"status {o['status']} -> {n['status']}"
        if name == "fastcheck_cold" and old_result["fastcheck"].get("ok") and new_result["fastcheck"].get("ok") is False \
                and new_result.get("expected_ok", True):
            flag = (flag + "; " if flag else "") + "REGRESSION (verdict: correct gradient now judged wrong)"
        if name in FASTCHECK and "REGRESSION" in flag:
            regressions += 1
        lines.append(f"{label:<24} {TITLES[name]:<26} {_short(o):>10} {_short(n):>10} "
                     f"{(f'{ratio:.2f}' if ratio is not None else '-'):>8}  {flag}")
    lines += ["", f"threshold {threshold:g}: {regressions} fastcheck regression(s)"]
    return "\n".join(lines), regressions


def _short(record: dict) -> str:
    if record["seconds"] is None:
        return record["status"]
    prefix = {"estimate": "~", "lower bound": ">"}.get(record.get("estimate"), "")
    return prefix + seconds_text(record["seconds"])


def load(path) -> dict:
    return json.loads(Path(path).read_text())
