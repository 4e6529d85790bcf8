"""The ranking claim: Spearman's correlation of the predicted and measured step times over the layouts,
against the chance that a random order reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.lab.training.step_time import StepTimeCheck, run_step_time_check
from shardlib.lab.verdict import measure_until, timing_claim


@dataclass(frozen=True)
class RankingVerdict:
    """The ranking claim as one line: Spearman's correlation of predicted and measured step times over
    ``n`` layouts against ``floor``, the floor a random order reaches with probability ``chance`` at most."""

    n: int
    rho: float
    floor: float
    chance: float
    attempt: int
    fastest_predicted: str
    fastest_measured: str

    @property
    def held(self) -> bool:
        return self.rho >= self.floor

    @property
    def line(self) -> str:
        verdict = "as predicted" if self.held else "not shown this time"
        fastest = ("the same fastest layout" if self.fastest_predicted == self.fastest_measured else
                   f"fastest predicted {self.fastest_predicted}, measured {self.fastest_measured}")
        return (f"ranking {self.n} layouts by step time: predicted order against measured, Spearman "
                f"{self.rho:+.2f} (a random order reaches {self.floor:.2f} {self.chance:.1%} of the time); "
                f"{fastest}: {verdict}")

    @property
    def how_measured(self) -> str:
        return (f"passes when Spearman's correlation is at least {self.floor:.2f}, the smallest value a random "
                f"order of {self.n} layouts reaches at most 5 % of the time ({self.chance:.1%}); a run spoiled by "
                f"other work is measured again once (attempt {self.attempt} of at most 2 kept), so luck passes "
                f"at most about {1 - (1 - self.chance) ** 2:.0%} of the time")


@dataclass(frozen=True)
class RankingCheck:
    """``run_ranking_check``'s result: the step-time check kept and its ``verdicts`` (one line each)."""

    check: StepTimeCheck
    verdicts: tuple[RankingVerdict, ...]

    @property
    def held(self) -> bool:
        return all(v.held for v in self.verdicts)


def run_ranking_check(ranks, attempts: int = 2, chance: float = 0.05, **kwargs) -> RankingCheck:
    """``run_step_time_check(ranks, **kwargs)`` (``toy_prediction.RANKED_4``'s seven layouts unless
    ``layouts`` is given), measured again while Spearman's correlation of predicted and measured step times
    stays under the floor a random order reaches with probability ``chance`` (``floor_for_chance``); when
    strict a claim that never held raises (``lab.verdict.timing_claim``)."""
    from shardlib.predict.training.toy_prediction import RANKED_4, chance_of_correlation, floor_for_chance

    if not 0 < chance < 1:
        raise ValueError(f"chance is a probability between 0 and 1, got {chance}")
    kwargs.setdefault("layouts", RANKED_4)
    n = len(kwargs["layouts"])
    floor = floor_for_chance(n, chance)
    check, attempt = measure_until(lambda: run_step_time_check(ranks, **kwargs),
                                   lambda c: c.rank_correlation >= floor, attempts)
    v = RankingVerdict(n, check.rank_correlation, floor, chance_of_correlation(floor, n), attempt,
                       check.by_predicted[0], check.by_measured[0])
    timing_claim(v.held, f"the predicted step times rank {n} layouts as the measured ones do (Spearman at least "
                 f"{floor:+.2f})", check.table(), attempt)
    return RankingCheck(check, (v,))
