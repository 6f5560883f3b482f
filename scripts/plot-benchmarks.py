#!/usr/bin/env python3
"""Draws the plots BENCHMARKS.md shows from the data the benches write.

Each `make bench-*` writes its tables as CSV into docs/benchmarks/data/ (e2e/src/bench_data.rs);
this script turns each file present into an SVG in docs/benchmarks/. The SVGs are reproducible
(no dates, a fixed hash salt, text as paths), so `--check` can tell whether the committed plots
are the ones the committed data draws. Run through scripts/plots.sh, which pins matplotlib.

    plot-benchmarks.py [--data DIR] [--out DIR] [--check]
"""

import argparse
import csv
import filecmp
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ARM_COLOURS = {
    "without": "#c0392b",
    "with": "#1f77b4",
    "with-spaces": "#2ca02c",
    "with-mirror": "#9467bd",
    "nochurn": "#7f7f7f",
    "empty": "#000000",
    "holdfast": "#1f77b4",
    "bare": "#7f7f7f",
    "patch": "#ff7f0e",
    "none": "#000000",
    "policy": "#2ca02c",
    "policy-floor": "#98df8a",
    "skopeo": "#7f7f7f",
}


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def number(value):
    return float(value) if value not in ("", None) else None


def colour(arm):
    return ARM_COLOURS.get(arm, None)


def save(fig, out, name):
    fig.tight_layout()
    fig.savefig(out / f"{name}.svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)


def pinning(data, out):
    """Registry requests and failed syncs over time, without holdfast, with it and with its mirror
    (upstream requests solid, the mirror's dashed), the (upstream) outage shaded."""
    series = defaultdict(list)
    for r in rows(data / "pinning.csv"):
        series[r["arm"]].append(r)
    fig, (requests, failed) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    for arm, samples in series.items():
        t = [float(s["t_s"]) / 60 for s in samples]
        # An arm with a mirror (a `mirror_requests` column, written since the with-mirror arm, set).
        mirrored = all(s.get("mirror_requests") not in ("", None) for s in samples)
        label = f"{arm}: upstream" if mirrored else arm
        requests.plot(t, [max(int(s["requests"]), 1) for s in samples], label=label, color=colour(arm))
        if mirrored:
            mirror = [max(int(s["mirror_requests"]), 1) for s in samples]
            requests.plot(t, mirror, label=f"{arm}: mirror", color=colour(arm), linestyle="--")
        failed.plot(t, [int(s["failed_syncs"]) for s in samples], label=arm, color=colour(arm))
    # The outage: from the first sample with the registry down to the next one up (every arm
    # stops its (upstream) registry at the same point of its run).
    samples = next(iter(series.values()), [])
    down = [float(s["t_s"]) / 60 for s in samples if s["registry_up"] == "false"]
    for ax in (requests, failed):
        if down:
            ax.axvspan(min(down), max(down), color="#f4d03f", alpha=0.3, label="registry down")
        ax.grid(True, alpha=0.3)
    requests.set_yscale("log")
    requests.set_ylabel("registry requests (cumulative)")
    failed.set_ylabel("failed syncs (cumulative)")
    failed.set_xlabel("minutes since the Apps were created")
    requests.set_title("bench-pinning: Apps reconciled by the real kapp-controller")
    requests.legend()
    save(fig, out, "pinning")


def deletion(data, out):
    """Org deletion time against N, per kpack pair: medians, min–max, the two floors."""
    cells = defaultdict(list)
    for r in rows(data / "deletion.csv"):
        cells[(r["pair"], r["arm"], int(r["apps"]))].append(float(r["deletion_s"]))
    pairs = sorted({pair for pair, _, _ in cells})
    fig, axes = plt.subplots(1, len(pairs), sharey=True, figsize=(5 * len(pairs), 4.5), squeeze=False)
    for ax, pair in zip(axes[0], pairs):
        arms = sorted({arm for p, arm, _ in cells if p == pair and arm != "empty"})
        for i, arm in enumerate(arms):
            points = sorted((apps, v) for (p, a, apps), v in cells.items() if p == pair and a == arm)
            # Side by side around each N, so the error bars do not hide each other.
            offset = 1 + (i - (len(arms) - 1) / 2) * 0.06
            x = [apps * offset for apps, _ in points]
            medians = [statistics.median(v) for _, v in points]
            low = [m - min(v) for m, (_, v) in zip(medians, points)]
            high = [max(v) - m for m, (_, v) in zip(medians, points)]
            style = "--" if arm == "nochurn" else "-"
            label = "nochurn (floor: no build loop)" if arm == "nochurn" else arm
            ax.errorbar(x, medians, yerr=[low, high], fmt="o" + style, capsize=3, label=label, color=colour(arm))
        empty = cells.get((pair, "empty", 0))
        if empty:
            ax.axhline(statistics.median(empty), color=colour("empty"), linestyle=":", label="empty org (floor)")
        ax.set_xscale("log")
        ns = sorted({apps for p, arm, apps in cells if p == pair and arm != "empty"})
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlabel("apps in the org (N)")
        ax.set_title(f"kpack {pair}, Korifi v0.18.0")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("org deletion, s (median, min–max)")
    save(fig, out, "deletion")


def deletion_timeline(data, out):
    """Objects of the org alive after the delete, with and without holdfast (one run each)."""
    runs = defaultdict(list)
    for r in rows(data / "deletion-timeline.csv"):
        runs[(r["pair"], int(r["apps"]), r["arm"])].append(r)
    # The newest pair and the largest N up to 10 that both arms ran.
    candidates = sorted(
        {(pair, apps) for pair, apps, arm in runs if (pair, apps, "without") in runs and (pair, apps, "with") in runs},
        key=lambda c: (c[0], c[1] <= 10, c[1]),
    )
    if not candidates:
        return
    pair, apps = candidates[-1]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for arm in ("without", "with", "with-spaces"):
        samples = runs.get((pair, apps, arm))
        if not samples:
            continue
        t = [float(s["t_s"]) for s in samples]
        ax.plot(t, [int(s["objects"]) for s in samples], label=f"{arm}: all objects", color=colour(arm))
        ax.plot(
            t,
            [int(s["builds_and_build_pods"]) for s in samples],
            label=f"{arm}: Builds and build pods",
            color=colour(arm),
            linestyle="--",
        )
    ax.set_xlabel("seconds after the CFOrg delete")
    ax.set_ylabel("objects alive")
    ax.set_title(f"bench-deletion: an org of {apps} apps, kpack {pair}, Korifi v0.18.0")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, out, "deletion-timeline")


def apiserver(data, out):
    """App CREATE through the real kube-apiserver per arm: writes/s, p50 and p99 by concurrency."""
    table = [r for r in rows(data / "apiserver.csv") if r["request"] == "App CREATE"]
    arms = list(dict.fromkeys(r["arm"] for r in table))
    concurrencies = sorted({int(r["concurrency"]) for r in table})
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    width = 0.8 / max(len(arms), 1)
    for ax, (field, label) in zip(
        axes, (("writes_per_s", "writes/s"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"))
    ):
        for i, arm in enumerate(arms):
            values = {int(r["concurrency"]): float(r[field]) for r in table if r["arm"] == arm}
            ax.bar(
                [c + i * width for c in range(len(concurrencies))],
                [values.get(c, 0) for c in concurrencies],
                width,
                label=arm,
                color=colour(arm),
            )
        ax.set_xticks([c + width * (len(arms) - 1) / 2 for c in range(len(concurrencies))])
        ax.set_xticklabels([f"conc {c}" for c in concurrencies])
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("bench-apiserver: App CREATE through the real kube-apiserver")
    save(fig, out, "apiserver")


def scale(data, out):
    """Memory of both binaries against the objects in the cluster."""
    table = rows(data / "scale.csv")
    x = [max(int(r["objects"]), 1) for r in table]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for component, c in (("webhook", "#1f77b4"), ("controller", "#ff7f0e")):
        ax.plot(x, [float(r[f"{component}_rss_mib"]) for r in table], "o-", color=c, label=f"{component} RSS")
        ax.plot(x, [float(r[f"{component}_peak_rss_mib"]) for r in table], "s--", color=c, label=f"{component} peak RSS")
    ax.set_xscale("log")
    ax.set_xticks(x, [f"{int(r['objects']):,}" for r in table])
    ax.minorticks_off()
    ax.set_xlabel("objects in the cluster (0 drawn at 1)")
    ax.set_ylabel("MiB")
    ax.set_title("bench-scale: memory against the cluster's size")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, out, "scale")


def mirror(data, out):
    """Copy throughput per round, holdfast's copier against skopeo."""
    table = rows(data / "mirror.csv")
    rounds = sorted({int(r["round"]) for r in table})
    tools = list(dict.fromkeys(r["tool"] for r in table))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(tools), 1)
    for i, tool in enumerate(tools):
        speeds = {int(r["round"]): float(r["mib_per_s"]) for r in table if r["tool"] == tool}
        median = statistics.median(speeds.values())
        ax.bar(
            [r + i * width for r in range(len(rounds))],
            [speeds.get(r, 0) for r in rounds],
            width,
            label=f"{tool} (median {median:.0f} MiB/s)",
            color=colour(tool),
        )
    ax.set_xticks([r + width * (len(tools) - 1) / 2 for r in range(len(rounds))])
    ax.set_xticklabels([f"round {r}" for r in rounds])
    ax.set_ylabel("MiB/s")
    ax.set_title("bench-mirror: copy between two local registries")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, out, "mirror")


def admission(data, out):
    """Admissions/s and p99 over TLS by concurrency, holdfast against the bare server."""
    table = [r for r in rows(data / "admission.csv") if r["server"] in ("holdfast", "bare")]
    fig, (rate, p99) = plt.subplots(1, 2, figsize=(10, 4))
    for server in ("holdfast", "bare"):
        points = sorted((int(r["concurrency"]), r) for r in table if r["server"] == server)
        x = [c for c, _ in points]
        rate.plot(x, [float(r["admissions_per_s"]) for _, r in points], "o-", label=server, color=colour(server))
        p99.plot(x, [float(r["p99_ms"]) for _, r in points], "o-", label=server, color=colour(server))
    concurrencies = sorted({int(r["concurrency"]) for r in table})
    for ax, label in ((rate, "admissions/s"), (p99, "p99 ms")):
        ax.set_xscale("log")
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.minorticks_off()
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("bench-admission: the handler over TLS on loopback")
    save(fig, out, "admission")


PLOTS = {
    "pinning.csv": pinning,
    "deletion.csv": deletion,
    "deletion-timeline.csv": deletion_timeline,
    "apiserver.csv": apiserver,
    "scale.csv": scale,
    "mirror.csv": mirror,
    "admission.csv": admission,
}


def draw(data, out):
    drawn = []
    for name, plot in PLOTS.items():
        if (data / name).exists():
            plot(data, out)
            drawn.append(name)
    return drawn


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO / "docs/benchmarks/data")
    parser.add_argument("--out", type=Path, default=REPO / "docs/benchmarks")
    parser.add_argument("--check", action="store_true", help="fail unless --out holds what the data draws")
    args = parser.parse_args()
    plt.rcParams["svg.hashsalt"] = "holdfast"
    plt.rcParams["svg.fonttype"] = "path"
    if not args.check:
        args.out.mkdir(parents=True, exist_ok=True)
        for name in draw(args.data, args.out):
            print(f"plots: {args.out / name.replace('.csv', '.svg')} from {args.data / name}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        drawn = draw(args.data, Path(tmp))
        stale = [
            name.replace(".csv", ".svg")
            for name in drawn
            if not (args.out / name.replace(".csv", ".svg")).exists()
            or not filecmp.cmp(Path(tmp) / name.replace(".csv", ".svg"), args.out / name.replace(".csv", ".svg"), shallow=False)
        ]
    orphans = sorted(
        svg.name for svg in args.out.glob("*.svg") if svg.name.replace(".svg", ".csv") not in drawn
    )
    if orphans:
        print(f"plots: {', '.join(orphans)} in {args.out} have no data in {args.data}", file=sys.stderr)
        return 1
    if stale:
        print(f"plots: {', '.join(stale)} in {args.out} are not what {args.data} draws; run make plots", file=sys.stderr)
        return 1
    print(f"plots: the {len(drawn)} plots in {args.out} are what {args.data} draws")
    return 0


if __name__ == "__main__":
    sys.exit(main())
