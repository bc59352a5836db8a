"""Why each failing leaf got its cause: `mhc-parity faults` with every attribution's scores kept.

    python bench/probes/cause_diagnosis.py --to out/cause-diagnosis.jsonl [--chip-terms] \
        faults --suite smoke --dtype float32 --faults '*gate_params_bf16' --out out/diagnosis

The kill matrix keeps one cause per row. Where a chip's rows name another cause than the CPU's
(issue 67), the reason lies in the scores the attribution compared, which the rows do not hold.
This wraps `attribute_candidate` and writes, per candidate and failing leaf, one JSON line: the
leaf's squared error in units of σ, the named cause, and for the best `--top` hypotheses, the
fault's own ones and the backend's own arithmetic: each one's score, the passing leaf that
contradicts it (its miss over that leaf's error), and its score beside the backend's own
arithmetic (every primitive at once). Text only, a few MB for the smoke suite: it comes back
from a device call. --chip-terms: judged as on a chip, on this CPU (`faults_with_chip_terms.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import math
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mhc_parity.harness.env import ensure_host_devices  # noqa: E402

ensure_host_devices()

from faults_with_chip_terms import in_this_process, judge_as_chip  # noqa: E402  (bench/, this script's folder)

from mhc_parity.harness.cli import main  # noqa: E402
from mhc_parity.harness.engine import case_judging, causes  # noqa: E402
from mhc_parity.harness.faults import model  # noqa: E402
from mhc_parity.harness.judging import attribution  # noqa: E402

BACKEND = "backend:"

# The fault being injected and the case being attributed, set by the wrappers below.
current = {"fault": "", "causes": (), "case": ""}


def _number(x: float) -> float | None:
    return round(float(x), 6) if math.isfinite(x) else None


def _contradiction(sums, names) -> tuple[str, float] | None:
    """The passing leaf whose error the hypotheses miss the most, relative to that error."""
    worst = None
    for leaf in sums.passing:
        ratio = sums.residual(names, leaf) / max(sums.total[leaf], 1.0)
        if worst is None or ratio > worst[1]:
            worst = (leaf, ratio)
    return None if worst is None else (worst[0], _number(worst[1]))


def leaf_table(candidate_errors, hypotheses, failing, found, top: int) -> list[dict]:
    """One record per failing leaf: its cause, the scores the attribution compared."""
    valued = [h for h in hypotheses if not h.by_size]
    sums = attribution._Scores(candidate_errors, valued, failing)
    backend = [h.name for h in valued if h.name.startswith(BACKEND)]
    whole = max(backend, key=lambda n: n.count("+"), default=None)  # every primitive at once
    records = []
    for leaf in failing:
        if leaf not in sums.total:
            continue
        scores = {h.name: sums.score((h.name,), leaf) for h in valued}
        ranked = sorted(scores, key=lambda n: -scores[n] if math.isfinite(scores[n]) else math.inf)
        own = [n for n in scores if any(fnmatch.fnmatchcase(n, p) for p in current["causes"])]
        shown = dict.fromkeys([*ranked[:top], *own, *backend])
        table = []
        for name in shown:
            entry = {
                "name": name,
                "score": _number(scores[name]),
                "norm": _number(sums.hypotheses[name].norms.get(leaf, math.nan)),
                "contradicted_by": _contradiction(sums, (name,)),
            }
            if whole and name != whole and sums.hypotheses[name].family != sums.hypotheses[whole].family:
                entry["with_backend"] = _number(sums.score((name, whole), leaf))
            table.append(entry)
        named = found[leaf]
        records.append(
            {
                "fault": current["fault"],
                "case": current["case"],
                "leaf": leaf,
                "total": _number(sums.total[leaf]),
                "elements": int(candidate_errors[leaf].size),
                "cause_id": named.cause_id,
                "explained": _number(named.explained),
                "passing": {p: _number(sums.total[p]) for p in sums.passing},
                "hypotheses": table,
            }
        )
    return records


def install(to: pathlib.Path, top: int) -> None:
    """Wrap the fault injection, the case's attribution and each candidate's, writing to `to`."""
    stream = to.open("w")
    injected, annotate, attribute = (
        model.Perturbation.injected,
        case_judging.annotate_causes,
        causes.attribute_candidate,
    )

    @contextlib.contextmanager
    def injected_named(self):
        current.update(fault=self.name, causes=self.causes)
        with injected(self) as fault:
            yield fault
        current.update(fault="", causes=())

    def annotate_named(rows, case, *args, **kwargs):
        current["case"] = case.name
        return annotate(rows, case, *args, **kwargs)

    def attribute_kept(candidate_errors, hypotheses, failing, fitted=()):
        found = attribute(candidate_errors, hypotheses, failing, fitted)
        candidate = sys._getframe(1).f_locals.get("candidate", "")
        for record in leaf_table(candidate_errors, hypotheses, list(failing), found, top):
            stream.write(json.dumps({"candidate": candidate, **record}) + "\n")
        stream.flush()
        return found

    model.Perturbation.injected = injected_named
    case_judging.annotate_causes = annotate_named  # the name the rows are judged by there
    causes.attribute_candidate = attribute_kept  # called by its module name inside annotate_causes


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--to", type=pathlib.Path, required=True, help="the JSON-lines file to write")
    parser.add_argument("--top", type=int, default=8, help="the best hypotheses kept per leaf")
    parser.add_argument("--chip-terms", action="store_true", help="judged with the chip's terms, paths off the host")
    options, cli_args = parser.parse_known_args()
    if options.chip_terms:
        judge_as_chip()
    options.to.parent.mkdir(parents=True, exist_ok=True)
    install(options.to, options.top)
    sys.exit(main(in_this_process(cli_args)))
