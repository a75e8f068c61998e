"""run.py's report: the figures of repeated epochs summarized and paired with the ceiling's, the
markdown table of one run, and each issue #28 target met or missed, with where a peer beat this
library (pure functions of run.py's results)."""

from __future__ import annotations

import numpy as np
from contenders import LABELS  # noqa: E402

FRACTIONS = (0.1, 0.5, 0.9)
TIMED_FRACTION = 0.9  # timed in --resume-pairs pairs with fresh starts (the target: within 1.2x of a fresh start)
PEERS = ("b_handwritten", "c_hf_datasets")  # measured --peer-repeat times


def ratio_interval(resumed: list[float], fresh: list[float], level: float = 0.9, rounds: int = 2000) -> list[float]:
    """A bootstrap interval (``level``, percentiles) for median(resumed) / median(fresh): the
    pairs are drawn again with replacement ``rounds`` times (seeded: the same samples give the
    same interval). Five pairs give a wide one; see --resume-pairs."""
    resumed_a, fresh_a = np.asarray(resumed, dtype=float), np.asarray(fresh, dtype=float)
    draws = np.random.default_rng(0).integers(0, len(resumed_a), size=(rounds, len(resumed_a)))
    ratios = np.median(resumed_a[draws], axis=1) / np.median(fresh_a[draws], axis=1)
    tail = 50 * (1 - level)
    return [float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail))]


def _paired(mine: list[dict], theirs: list[dict], key: str) -> list[float]:
    return [m[key] / t[key] for m, t in zip(mine, theirs)]


def paired_ratios(per: dict, epochs: dict[str, list[dict]], untouched: dict[str, list[dict]]) -> None:
    """Each contender's rows/s over the ceiling's, touched over touched and untouched over
    untouched, and its main-thread CPU per batch over the ideal feeder's: paired by round (the
    ratio measured next to it), the median and the range of the rounds' ratios."""
    for name, res in per.items():
        pairs = [("vs_ceiling", epochs[name], epochs.get("a_ceiling", []), "rows_per_s")]
        pairs.append(("vs_ceiling_untouched", untouched.get(name, []), untouched.get("a_ceiling", []), "rows_per_s"))
        if name not in ("a_ceiling", "i_ideal_feeder"):
            pairs.append(("cpu_vs_ideal", epochs[name], epochs.get("i_ideal_feeder", []), "cpu_us_per_batch"))
        for key, mine, theirs, figure in pairs:
            ratios = _paired(mine, theirs, figure)
            if ratios:
                res[key] = float(np.median(ratios))
                res[f"{key}_range"] = [float(min(ratios)), float(max(ratios))]


PEAKS = ("peak_rss_mib", "peak_pss_mib", "high_water_rss_mib")


def summarize(epochs: list[dict]) -> dict:
    """The median of every figure over repeated epochs (peak memory, where sampled: the maximum)."""
    out = {key: float(np.median([e[key] for e in epochs])) for key in epochs[0] if isinstance(epochs[0][key], (int, float))}
    for key in PEAKS:
        if all(key in e for e in epochs):
            out[key] = max(e[key] for e in epochs)
    return out


def peaks(epoch: dict) -> dict:
    """The peak-memory figures of one epoch run with the memory sampler."""
    return {key: epoch[key] for key in PEAKS}


def _fmt_resume(entry: dict | None, key: str) -> str:
    if not entry:
        return "—"
    if key == "ttfb":
        return f"{entry['first_batch_s']:.2f}"
    return f"{entry['duplicated']}/{entry['lost']}"


def _ratio(res: dict, key: str) -> str:
    if key not in res:
        return "—"
    low, high = res.get(f"{key}_range", (res[key], res[key]))
    return f"{res[key]:.2f} ({low:.2f}–{high:.2f})" if high > low else f"{res[key]:.2f}"


def table(results: dict) -> str:
    """The markdown table: rows/s with every batch read (``touched``) unless the column says
    untouched; the training loop's main-thread CPU per batch, read included."""
    head = (
        "| contender | columns | rows/s | untouched rows/s | MB/s | vs (a) | untouched vs (a) | main-thread CPU µs/batch | "
        "page faults/batch | epoch s | CPU s | peak PSS MiB | first batch s | resume 10/50/90% first batch s | dup/lost 10% | 50% | 90% |"
    )
    lines = [head, "|" + "---|" * 17]
    for colset, per in results["measurements"].items():
        for name, res in per.items():
            e, r, u = res["epoch"], res["resumes"], res.get("untouched")
            ttfbs = "/".join(_fmt_resume(r.get(str(f)), "ttfb") for f in FRACTIONS) if r else "—"
            dups = [_fmt_resume(r.get(str(f)), "dup") for f in FRACTIONS]
            mbs = e["rows_per_s"] * results["row_bytes"][colset] / 1e6
            reads_in_main = name != "a_ceiling"  # the ceiling reads in its own processes
            cpu = f"{e['cpu_us_per_batch']:,.0f}" if reads_in_main and "cpu_us_per_batch" in e else "—"
            faults = f"{e['faults_per_batch']:,.1f}" if reads_in_main and "faults_per_batch" in e else "—"
            bare = f"{u['rows_per_s']:,.0f}" if u else "—"
            lines.append(
                f"| {LABELS[name]} | {colset} | {e['rows_per_s']:,.0f} | {bare} | {mbs:,.0f} | "
                f"{_ratio(res, 'vs_ceiling')} | {_ratio(res, 'vs_ceiling_untouched')} | {cpu} | {faults} | {e['epoch_s']:.1f} | {e['cpu_s']:.1f} | "
                f"{e['peak_pss_mib']:,.0f} | {e['first_batch_s']:.2f} | {ttfbs} | {' | '.join(dups)} |"
            )
    for colset, per in results["measurements"].items():
        ideal = per.get("i_ideal_feeder")
        for name, res in per.items():
            if ideal and "cpu_vs_ideal" in res:
                e, i = res["epoch"], ideal["epoch"]
                bare = f"; untouched {res['untouched']['cpu_us_per_batch']:,.0f} µs" if "untouched" in res else ""
                lines.append(
                    f"\n{LABELS[name]}, {colset}: main-thread CPU per batch (read included) / the ideal feeder's = "
                    f"{_ratio(res, 'cpu_vs_ideal')} ({e['cpu_us_per_batch']:,.0f} against {i['cpu_us_per_batch']:,.0f} µs, "
                    f"medians; from the first batch on {e['cpu_us_per_batch_after_first']:,.0f} against "
                    f"{i['cpu_us_per_batch_after_first']:,.0f} µs{bare}; page faults per batch {e['faults_per_batch']:.1f} "
                    f"against {i['faults_per_batch']:.1f})"
                )
    for colset, per in results["measurements"].items():
        for name, res in per.items():
            timed = res["resumes"].get(str(TIMED_FRACTION))
            if timed and "vs_fresh" in timed:
                lines.append(
                    f"\n{LABELS[name]}, {colset}: first batch after resuming at {TIMED_FRACTION:.0%} / fresh start = "
                    f"{timed['vs_fresh']:.2f} (medians of {len(timed['first_batch_samples'])} resumes, "
                    f"{1000 * timed['first_batch_s']:.0f} ms, and the fresh starts paired with them, "
                    f"{1000 * float(np.median(timed['fresh_first_batch_samples'])):.0f} ms; median of the pairs' ratios "
                    f"{timed['vs_fresh_pairwise']:.2f}; {_interval(timed)})"
                )
    fixed = results.get("fixed_costs")
    if fixed:
        bare, loader = fixed["x_bare_processes"], fixed["x_bare_dataloader"]
        lines.append(
            f"\nAn epoch with nothing to read (medians): the ceiling's bare processes {bare['epoch_s']:.3f} s, a bare torch "
            f"DataLoader with the same workers {loader['epoch_s']:.3f} s (first item {loader['first_batch_s']:.3f} s): "
            f"{loader['epoch_s'] - bare['epoch_s']:+.3f} s per epoch for any DataLoader-based contender"
        )
        for colset, per in results["measurements"].items():
            if "a_ceiling" in per and "d_this_library" in per:
                gap = per["d_this_library"]["epoch"]["epoch_s"] - per["a_ceiling"]["epoch"]["epoch_s"]
                lines.append(f"\n(d) epoch minus (a) epoch, {colset}: {gap:+.3f} s (medians)")
    rss = results.get("rss_scaling")
    if rss:
        labels = (("peak_pss_mib", "peak PSS of the tree"), ("peak_rss_mib", "peak RSS of the tree"), ("high_water_rss_mib", "per-process peak RSS, summed"))
        for key, label in labels:
            a, b = rss["1x"][key], rss["4x"][key]
            lines.append(f"\n(d) {label} (all columns, median of runs): {a:,.0f} MiB on 1x the data, {b:,.0f} MiB on 4x ({b / a:.2f}x)")
    return "\n".join(lines)


def _interval(timed: dict) -> str:
    low, high = timed["vs_fresh_interval"]
    return f"90% bootstrap interval {low:.2f}–{high:.2f} over {len(timed['first_batch_samples'])} pairs"


# issue #28's targets (issue #5's, with every batch read)
THROUGHPUT_TARGETS = {"numeric": 0.9, "text": 0.85}  # (d)'s rows/s over the ceiling's, every batch read by both
UNTOUCHED_TARGETS = {"numeric": 0.9, "text": 0.9}  # the same, nobody reading the batches
CPU_TARGET = 1.2  # (d)'s main-thread CPU per batch (read included) over the ideal feeder's
RESUME_TARGET = 1.2  # (d)'s first batch after resuming at 90% over a fresh start's
MEMORY_TARGET = 1.1  # (d)'s peak PSS on 4x the data over 1x


def _peer_wins(colset: str, per: dict) -> list[str]:
    """The cells where a peer ((b) or (c)) did better than (d): rows/s, first batch (fresh and
    resumed), peak PSS."""
    ours, wins = per["d_this_library"], []
    for peer in [p for p in PEERS if p in per]:
        theirs = per[peer]
        cells = [
            ("rows/s", ours["epoch"]["rows_per_s"], theirs["epoch"]["rows_per_s"], True),
            ("first batch s", ours["epoch"]["first_batch_s"], theirs["epoch"]["first_batch_s"], False),
            ("peak PSS MiB", ours["epoch"]["peak_pss_mib"], theirs["epoch"]["peak_pss_mib"], False),
        ]
        for fraction in FRACTIONS:
            mine, other = ours["resumes"].get(str(fraction)), theirs["resumes"].get(str(fraction))
            if mine and other:
                cells.append((f"first batch s after resuming at {fraction:.0%}", mine["first_batch_s"], other["first_batch_s"], False))
        for name, mine, other, higher_wins in cells:
            if (other > mine) if higher_wins else (other < mine):
                form = ".3f" if name.startswith("first batch") else ",.0f"
                wins.append(f"{LABELS[peer]}, {colset}, {name}: {other:{form}} against (d)'s {mine:{form}}")
    return wins


def target_lines(results: dict) -> list[str]:
    """Each of issue #28's targets with what this run measured, for (d) and, where it ran, (e)
    (the same loader with reader threads), and where a peer beat (d). "rows/s" is with every batch
    read (by the training loop, and by the ceiling in its own processes); "untouched rows/s" with
    nobody reading them."""
    lines, wins = [], []
    for mode, prefix in (("d_this_library", ""), ("e_reader_threads", "(e) reader threads, ")):
        for colset, per in results["measurements"].items():
            if mode in per:
                lines += _contender_lines(colset, per, per[mode], prefix)
    for colset, per in results["measurements"].items():
        if "d_this_library" in per:
            wins += _peer_wins(colset, per)
    rss = results.get("rss_scaling")
    if rss:
        ratio = rss["4x"]["peak_pss_mib"] / rss["1x"]["peak_pss_mib"]
        lines.append(f"{'met' if ratio <= MEMORY_TARGET else 'MISSED'}: peak PSS on 4x the data <= {MEMORY_TARGET}x that on 1x: {ratio:.2f}x")
    if any("d_this_library" in per and any(peer in per for peer in PEERS) for per in results["measurements"].values()):
        lines.append("faster than (b) and (c) everywhere: " + ("yes" if not wins else "no; a peer did better in: " + "; ".join(wins)))
    return lines


def _contender_lines(colset: str, per: dict, ours: dict, prefix: str) -> list[str]:
    lines = []
    target = THROUGHPUT_TARGETS.get(colset)
    if target is not None and "vs_ceiling" in ours:
        ratio = ours["vs_ceiling"]
        lines.append(f"{'met' if ratio >= target else 'MISSED'}: {prefix}{colset} rows/s >= {target:.2f}x the ceiling's: {ratio:.2f}x")
    target = UNTOUCHED_TARGETS.get(colset)
    if target is not None and "vs_ceiling_untouched" in ours:
        ratio = ours["vs_ceiling_untouched"]
        lines.append(f"{'met' if ratio >= target else 'MISSED'}: {prefix}{colset} untouched rows/s >= {target:.2f}x the untouched ceiling's: {ratio:.2f}x")
    ideal = per.get("i_ideal_feeder")
    if ideal and "cpu_vs_ideal" in ours:
        ratio = ours["cpu_vs_ideal"]
        lines.append(
            f"{'met' if ratio <= CPU_TARGET else 'MISSED'}: {prefix}{colset} main-thread CPU per batch <= {CPU_TARGET}x the ideal feeder's: "
            f"{ratio:.2f}x ({ours['epoch']['cpu_us_per_batch']:,.0f} against {ideal['epoch']['cpu_us_per_batch']:,.0f} µs)"
        )
    timed = ours["resumes"].get(str(TIMED_FRACTION))
    if timed and "vs_fresh" in timed:
        ratio = timed["vs_fresh"]
        lines.append(
            f"{'met' if ratio <= RESUME_TARGET else 'MISSED'}: {prefix}{colset} first batch after resuming at {TIMED_FRACTION:.0%} "
            f"<= {RESUME_TARGET}x a fresh start's: {ratio:.2f}x ({_interval(timed)})"
        )
    if ours["resumes"]:
        bad = {f: (r["duplicated"], r["lost"]) for f, r in ours["resumes"].items() if r["duplicated"] or r["lost"]}
        lines.append(f"{'MISSED' if bad else 'met'}: {prefix}{colset} 0 rows duplicated and 0 lost across the resumes" + (f": {bad}" if bad else ""))
    return lines
