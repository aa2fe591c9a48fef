"""Round-by-round tables of a report (``rounds.md``): each cell against a reference cell
on the same seed, and how much each run's accuracy swings over the second half of its
rounds.

Why: a paper's cell is the best of its rounds, which rewards a curve that swings up. Two
methods whose best figures are a few tenths apart may differ much more round by round;
with one seed's partition and the same clients drawn each round (the seeded sampler), a
round-by-round comparison is paired and says which leads how often. These tables make
the figures that ``docs/results.md`` quotes ("above in 21 of the 100 rounds") a command
anyone can rerun, not a one-off script.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, Protocol

GLOBAL = "global_accuracy"


class RunResult(Protocol):
    """What these tables read of a report's run (``run_records.RunResult``; a protocol, so
    that the report imports this module and not the other way round)."""

    experiment: str
    cell: str
    seed: int
    document: dict[str, Any]

    def series(self, metric: str, answered: bool = False) -> tuple[list[int], list[float]]: ...


#: ``--personal``: which per-round personal figure a report shows in its P columns and
#: curves -> (the round field, its short name, what it is).
PERSONAL_FIGURES = {
    "all": ("personal_accuracy", "P", "over every client, weighted by test samples"),
    "sampled": (
        "personal_accuracy_sampled", "P (trained clients)",
        "P sampled: the personal accuracy over the clients that had trained at least once "
        "by that round (the all-client P includes never-sampled clients)",
    ),
    "client-mean": (
        "personal_accuracy_client_mean", "P per client",
        "P per client: the unweighted mean of the clients' personal accuracies",
    ),
    "worst": ("personal_accuracy_worst", "P worst client",
              "P worst client: the lowest client's personal accuracy in the round"),
    "bottom-decile": (
        "personal_accuracy_bottom_decile", "P bottom 10%",
        "P bottom 10%: the mean personal accuracy of the lowest tenth of the clients",
    ),
}  # fmt: skip


def personal_metric(personal: str) -> str:
    """The per-round personal figure a report shows (a key of :data:`PERSONAL_FIGURES`)."""
    return PERSONAL_FIGURES[personal][0]


def personal_note(personal: str) -> str:
    """What a report's P is, under its tables where it is not the all-client figure."""
    return PERSONAL_FIGURES[personal][2]


def _personal_name(personal: str) -> str:
    return PERSONAL_FIGURES[personal][1]


def _shown(cell: str) -> str:
    """A cell folder name as the report's tables show it (``run_records.CELL_SEPARATOR``)."""
    return cell.replace("__", " ")


def paired(reference: RunResult, other: RunResult, metric: str) -> list[tuple[int, float, float]]:
    """(round, reference's value, other's value) for every round both evaluated."""
    theirs = dict(zip(*other.series(metric), strict=True))
    return [(k, v, theirs[k]) for k, v in zip(*reference.series(metric), strict=True)
            if k in theirs]  # fmt: skip


def same_data_and_clients(reference: RunResult, other: RunResult) -> str:
    """Whether the pairing holds: the same data (``run.data_digest``) and the same clients
    drawn in each round both recorded (``sampled_clients``). Records that lack either say
    what is not known rather than pass for a match."""
    digests = [r.document.get("run", {}).get("data_digest") for r in (reference, other)]
    if None not in digests and digests[0] != digests[1]:
        return "no: other data"
    drawn = [{rec["round"]: rec.get("sampled_clients") for rec in r.document["rounds"]}
             for r in (reference, other)]  # fmt: skip
    common = [k for k in drawn[0] if k in drawn[1]
              and drawn[0][k] is not None and drawn[1][k] is not None]  # fmt: skip
    differ = sum(sorted(drawn[0][k]) != sorted(drawn[1][k]) for k in common)
    if differ:
        return f"no: other clients in {differ} of {len(common)} rounds"
    if None in digests and not common:
        return "not recorded"
    if None in digests:
        return "same clients; data not recorded"
    return "same data; clients not recorded" if not common else "yes"


def _above(pairs: Sequence[tuple[int, float, float]]) -> tuple[str, str]:
    """``N/M`` rounds where the reference is strictly above, and the mean difference in
    points (reference − other)."""
    if not pairs:
        return "–", "–"
    above = sum(mine > theirs for _, mine, theirs in pairs)
    mean = 100 * statistics.fmean(mine - theirs for _, mine, theirs in pairs)
    return f"{above}/{len(pairs)}", f"{mean:+.2f}"


def configured_half(run: RunResult) -> int | None:
    """Half the rounds ``run`` was configured for (rounded up): rounds up to it are the
    first half; ``None`` where the record does not say a number of rounds above one."""
    total = run.document.get("config", {}).get("num-server-rounds")
    if not isinstance(total, int) or isinstance(total, bool) or total < 2:
        return None
    return math.ceil(total / 2)


def _halves(pairs: Sequence[tuple[int, float, float]], half: int | None) -> str:
    """The mean difference in points (reference − other) over the rounds of each half,
    ``first / second``: an option whose effect fades (a head left stale early, say) shows
    it here, where the whole run's mean blurs it."""
    if half is None or not pairs:
        return "–"
    parts = [[mine - theirs for k, mine, theirs in pairs if (k <= half) == first]
             for first in (True, False)]  # fmt: skip
    return " / ".join(f"{100 * statistics.fmean(p):+.2f}" if p else "–" for p in parts)


def changes_correlation(pairs: Sequence[tuple[int, float, float]]) -> str:
    """Pearson correlation of the two runs' changes from one evaluated round to the next
    (consecutive rounds only): near 1, they rise and fall in the same rounds, so their
    swings come from what the rounds share (the clients drawn), not from either method."""
    steps = [(b[1] - a[1], b[2] - a[2]) for a, b in zip(pairs, pairs[1:], strict=False)
             if b[0] == a[0] + 1]  # fmt: skip
    if len(steps) < 3:
        return "–"
    mine, theirs = zip(*steps, strict=True)
    spread = statistics.pstdev(mine) * statistics.pstdev(theirs)
    if spread == 0:
        return "–"
    mean_mine, mean_theirs = statistics.fmean(mine), statistics.fmean(theirs)
    covariance = statistics.fmean((a - mean_mine) * (b - mean_theirs) for a, b in steps)
    return f"{covariance / spread:.2f}"


def reference_for(run: RunResult, references: Sequence[RunResult]) -> RunResult | None:
    """The reference run ``run`` is compared with: the one of its experiment and seed, else
    one of another experiment on its seed whose pairing with it holds (the same data and
    the same clients each round: a variant run apart, say), else none."""
    same_seed = [r for r in references if r.seed == run.seed]
    own = [r for r in same_seed if r.experiment == run.experiment]
    if own:
        return own[0]
    return next((r for r in same_seed if same_data_and_clients(r, run) == "yes"), None)


def versus_table(results: Sequence[RunResult], reference: str, personal: str = "all") -> str:
    """Each cell against ``reference`` (a cell name) on the same seed (of its experiment,
    or of another whose pairing holds, named in the cell column): rounds where the
    reference is above and the mean difference, for G and P, whether the pairing holds,
    and how their round-to-round changes correlate (G). Empty when no other cell ran on a
    seed of ``reference``'s."""
    metric = personal_metric(personal)
    rows = []
    references = [r for r in results if r.cell == reference]
    for run in results:
        mine = None if run.cell == reference else reference_for(run, references)
        if mine is None:
            continue
        g_pairs, p_pairs = paired(mine, run, GLOBAL), paired(mine, run, metric)
        g_above, g_mean = _above(g_pairs)
        p_above, p_mean = _above(p_pairs)
        half = configured_half(mine)
        cell = _shown(run.cell)
        if mine.experiment != run.experiment:
            cell += f" (against {mine.experiment}'s)"
        rows.append(f"| {run.experiment} | {run.seed} | {cell} | "
                    f"{same_data_and_clients(mine, run)} | {g_above} | {g_mean} | "
                    f"{_halves(g_pairs, half)} | {p_above} | {p_mean} | "
                    f"{_halves(p_pairs, half)} | {changes_correlation(g_pairs)} |")  # fmt: skip
    if not rows:
        return ""
    p_name = _personal_name(personal)
    return "\n".join([
        f"### Round by round against {reference}",
        "",
        f"Rounds where {reference}'s accuracy is above the cell's, of the rounds both "
        f"evaluated, and the mean difference in points ({reference} − cell); "
        "*same data and clients*: the pairing holds (data digest, clients drawn each "
        "round); *by half*: the mean difference over the first and the second half of "
        f"{reference}'s configured rounds (1-50 / 51-100 of 100 rounds, say); *G changes "
        "corr.*: correlation of the two runs' round-to-round changes of G (near 1: they "
        "rise and fall in the same rounds).",
        "",
        f"| experiment | seed | cell | same data and clients | G: {reference} above | "
        f"G: mean diff | G: by half | {p_name}: {reference} above | {p_name}: mean diff | "
        f"{p_name}: by half | G changes corr. |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ])  # fmt: skip


def _spread(values: Sequence[float]) -> str:
    """``median / lowest / std`` in percent of a run's values (sample std, as the
    tables' ``± std``; none of one value)."""
    if not values:
        return "–"
    points = [100 * v for v in values]
    spread = f"{statistics.stdev(points):.2f}" if len(points) > 1 else "–"
    return f"{statistics.median(points):.2f} / {min(points):.2f} / {spread}"


def second_half_table(results: Sequence[RunResult], personal: str = "all") -> str:
    """How much each run swings once it has settled: median, lowest and std of G and P
    over the rounds after half its configured rounds (rounds 51-100 of 100), and how
    closely P's round-to-round changes follow G's there. A personal prediction that adds
    the global head's logits (FedReG's head_g(z) + head_p(z)) moves with the global
    model, for the clients not drawn too: the swings of G that the drawn clients cause
    reach every client's P (FedRoD's prediction has the same form, but its
    balanced-softmax global head hardly swings)."""
    metric = personal_metric(personal)
    rows = []
    for run in results:
        half = configured_half(run)
        total = run.document.get("config", {}).get("num-server-rounds")
        late = {m: {k: v for k, v in zip(*run.series(m), strict=True) if k > (half or 0)}
                for m in (GLOBAL, metric)}  # fmt: skip
        both = [(k, g, late[metric][k]) for k, g in late[GLOBAL].items() if k in late[metric]]
        rows.append(f"| {run.experiment} | {run.seed} | {_shown(run.cell)} | "
                    f"{'all' if half is None else f'{half + 1}-{total}'} | "
                    f"{_spread(list(late[GLOBAL].values()))} | "
                    f"{_spread(list(late[metric].values()))} | "
                    f"{changes_correlation(both)} |")  # fmt: skip
    p_name = _personal_name(personal)
    return "\n".join([
        "### The second half of the rounds",
        "",
        "Median / lowest / std (points) of each run's per-round accuracy over the rounds "
        "after half its configured rounds: the best figure of a run that swings says "
        f"less about a round picked at random. *{p_name} follows G*: correlation of "
        f"the round-to-round changes of {p_name} and G over those rounds (1.00 where "
        f"{p_name} is G; near 1 for a personal prediction that moves with the global "
        "model).",
        "",
        f"| experiment | seed | cell | rounds | G: median / lowest / std | "
        f"{p_name}: median / lowest / std | {p_name} follows G |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ])  # fmt: skip


def rounds_report(results: Sequence[RunResult], reference: str, personal: str = "all") -> str:
    """``rounds.md``: the table against ``reference`` (when it ran) and the second-half
    table."""
    ran = any(r.cell == reference for r in results)
    versus = versus_table(results, reference, personal) or (
        f"No other cell ran on a seed of {reference}'s: nothing to compare round by round."
        if ran else f"No run of {reference} to compare the cells with round by round."
    )  # fmt: skip
    return f"{versus}\n\n{second_half_table(results, personal)}\n"
