"""What a decoding step costs on the machine the engine runs on, measured by the engine.

A step of ``batch`` requests that verifies ``tokens`` tokens in all (each request's last
token and its draft) takes, to first order::

    seconds = fixed_s + per_request_s * batch + per_token_s * tokens

``fixed_s`` is what every step pays (reading the weights on a GPU, scheduling, sampling);
``per_request_s`` what each request adds whatever its draft (its KV cache, its bookkeeping);
``per_token_s`` what one more verified token adds, the price of a draft token. On a GPU
at small batches a verified token is almost free (``per_token_s`` is tiny beside
``fixed_s``); on a CPU it costs nearly as much as a decoded one. A model drafter's
autoregressive passes add ``drafter_pass_s`` each.

:class:`StepCostEstimator` fits the three terms to the steps an engine times, by least
squares with older steps weighing less (``halflife`` steps), kept non-negative, with a
prior profile as a few pseudo-steps so that the fit is defined from the first step and
data outweigh it within tens of steps. :class:`StepCostProfile` is the result, as
``agentspec serve --agentspec-cost-profile`` writes it and ``agentspec bench
--cost-profile`` reads it.

Pure Python and pydantic (a 3x3 solve needs no numpy).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, ValidationError

__all__ = ["FLAT_PROFILE", "StepCostEstimator", "StepCostProfile", "read_cost_profile"]


class StepCostProfile(BaseModel):
    """A step's cost curve: seconds as a linear function of requests and verified tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fixed_s: NonNegativeFloat = Field(description="Seconds every step pays.")
    per_request_s: NonNegativeFloat = Field(0.0, description="Seconds each request in the step adds.")
    per_token_s: NonNegativeFloat = Field(0.0, description="Seconds each verified token adds.")
    drafter_pass_s: NonNegativeFloat = Field(
        0.0, description="Seconds each autoregressive pass of a model drafter adds to a step."
    )
    #: Where the figures come from: timed steps of an engine, a roofline, or no knowledge.
    source: Literal["measured", "roofline", "flat"] = "measured"
    #: Steps the fit rests on (0 for a prior).
    steps: NonNegativeInt = 0

    def step_seconds(self, batch: float, tokens: float, drafter_passes: float = 0.0) -> float:
        """One step of ``batch`` requests verifying ``tokens`` tokens, with
        ``drafter_passes`` autoregressive passes of the model drafter."""
        return (
            self.fixed_s + self.per_request_s * batch + self.per_token_s * tokens + self.drafter_pass_s * drafter_passes
        )

    def write(self, path: str | Path) -> None:
        """Write the profile as JSON, atomically (a reader never sees half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)


#: No knowledge: a verified token costs nothing, so nothing is cut until steps are timed.
FLAT_PROFILE = StepCostProfile(fixed_s=1.0, source="flat")


def read_cost_profile(path: str | Path) -> StepCostProfile:
    """The profile in ``path``, or a :class:`ValueError` naming the file and what is wrong."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        return StepCostProfile.model_validate(raw)
    except OSError as exc:
        raise ValueError(f"cost profile {path}: cannot read it: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"cost profile {path}: not JSON: {exc}") from exc
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"cost profile {path}: {problems}") from exc


# Design points (batch, tokens) at which a prior enters the fit as pseudo-steps: they
# span all three terms, so the fit is never singular.
_PRIOR_POINTS = ((1.0, 1.0), (1.0, 9.0), (8.0, 8.0), (8.0, 40.0))
#: The flat prior's weight, in steps: it says nothing but that the fit exists.
_FLAT_PRIOR_WEIGHT = 0.01


class StepCostEstimator:
    """Fits :class:`StepCostProfile` to timed steps (module docstring).

    ``prior_weight``: how many steps the prior counts as, spread over a few design
    points; ``halflife``: steps after which a timed step weighs half. A step slower than
    ``outlier_factor`` times the current fit (a pause, a page fault storm) is taken as
    that bound once the fit rests on ``min_steps``.
    """

    def __init__(
        self,
        prior: StepCostProfile = FLAT_PROFILE,
        *,
        prior_weight: float = 4.0,
        halflife: float = 1024.0,
        min_steps: int = 16,
        outlier_factor: float = 4.0,
    ) -> None:
        if prior_weight <= 0 or halflife <= 0 or outlier_factor <= 1:
            raise ValueError("prior_weight and halflife must be positive, outlier_factor above 1")
        self.min_steps = min_steps
        self.outlier_factor = outlier_factor
        self._prior_weight = prior_weight
        self._decay = 0.5 ** (1.0 / halflife)
        # Weighted sums of x x^T, x y and y^2 over timed steps, x = (1, batch, tokens).
        self._xx = [[0.0] * 3 for _ in range(3)]
        self._xy = [0.0] * 3
        self._yy = 0.0
        self._set_prior(prior)
        self.steps = 0
        self._fit: tuple[float, float, float] = (prior.fixed_s, prior.per_request_s, prior.per_token_s)
        # Drafter passes: seconds of the drafter's call by passes run, smoothed.
        self._drafter: dict[int, float] = {}

    def _set_prior(self, prior: StepCostProfile) -> None:
        self.prior = prior
        self._prior_xx = [[0.0] * 3 for _ in range(3)]
        self._prior_xy = [0.0] * 3
        self._prior_yy = 0.0
        w = self._prior_weight / len(_PRIOR_POINTS)
        for batch, tokens in _PRIOR_POINTS:
            y = prior.step_seconds(batch, tokens)
            _accumulate(self._prior_xx, self._prior_xy, (1.0, batch, tokens), y, w)
            self._prior_yy += w * y * y

    def observe(self, batch: int, tokens: int, seconds: float) -> None:
        """A timed step of ``batch`` requests that verified ``tokens`` tokens."""
        if batch <= 0 or tokens < batch or not math.isfinite(seconds) or seconds <= 0:
            return
        if not self.steps and self.prior.source == "flat":
            # A flat prior knows no scale: it takes the first step's, and weighs only enough
            # to keep the fit defined while the steps timed cannot tell the terms apart.
            self._prior_weight = _FLAT_PRIOR_WEIGHT
            self._set_prior(self.prior.model_copy(update={"fixed_s": seconds}))
        if self.steps >= self.min_steps:
            seconds = min(seconds, self.outlier_factor * self.seconds(batch, tokens))
        d = self._decay
        for row in self._xx:
            row[:] = [v * d for v in row]
        self._xy = [v * d for v in self._xy]
        self._yy = self._yy * d + seconds * seconds
        _accumulate(self._xx, self._xy, (1.0, float(batch), float(tokens)), seconds, 1.0)
        self.steps += 1
        self._fit = self._solve()

    def observe_drafter(self, passes: int, seconds: float) -> None:
        """The model drafter's call in a step took ``seconds`` running ``passes`` passes
        beyond its first (which every step runs)."""
        if passes < 0 or not math.isfinite(seconds) or seconds < 0:
            return
        old = self._drafter.get(passes)
        self._drafter[passes] = seconds if old is None else old + 0.05 * (seconds - old)

    @property
    def drafter_pass_s(self) -> float:
        """Seconds one autoregressive drafter pass adds: the slope between the calls that
        ran none beyond the first and those that ran some (the prior's until both were seen)."""
        base = self._drafter.get(0)
        slopes = [(s - base) / n for n, s in self._drafter.items() if n > 0] if base is not None else []
        return max(0.0, sum(slopes) / len(slopes)) if slopes else self.prior.drafter_pass_s

    def seconds(self, batch: float, tokens: float) -> float:
        """The fitted time of a step (no drafter passes)."""
        a, b, c = self._fit
        return a + b * batch + c * tokens

    def profile(self) -> StepCostProfile:
        """The current fit (the prior itself while no step was timed)."""
        if not self.steps:
            return self.prior.model_copy(update={"drafter_pass_s": self.drafter_pass_s})
        a, b, c = self._fit
        return StepCostProfile(
            fixed_s=a,
            per_request_s=b,
            per_token_s=c,
            drafter_pass_s=self.drafter_pass_s,
            source="measured",
            steps=self.steps,
        )

    def _solve(self) -> tuple[float, float, float]:
        """Non-negative weighted least squares over timed and prior steps: the best of
        the unconstrained fits on each subset of the three terms that stays >= 0."""
        xx = [[self._xx[i][j] + self._prior_xx[i][j] for j in range(3)] for i in range(3)]
        xy = [self._xy[i] + self._prior_xy[i] for i in range(3)]
        yy = self._yy + self._prior_yy
        best: tuple[float, tuple[float, float, float]] | None = None
        for size in (3, 2, 1):
            for free in itertools.combinations(range(3), size):
                theta = _solve_subset(xx, xy, free)
                if theta is None or min(theta) < 0:
                    continue
                # Weighted squared error, from the sums alone.
                sse = yy - 2 * sum(t * v for t, v in zip(theta, xy, strict=True))
                sse += sum(theta[i] * xx[i][j] * theta[j] for i in range(3) for j in range(3))
                if best is None or sse < best[0] - 1e-18:
                    best = (sse, (theta[0] + 0.0, theta[1] + 0.0, theta[2] + 0.0))  # no -0.0
        return best[1] if best is not None else self._fit


def _accumulate(xx: list[list[float]], xy: list[float], x: tuple[float, float, float], y: float, w: float) -> None:
    for i in range(3):
        xy[i] += w * x[i] * y
        for j in range(3):
            xx[i][j] += w * x[i] * x[j]


def _solve_subset(xx: list[list[float]], xy: list[float], free: tuple[int, ...]) -> tuple[float, float, float] | None:
    """The least-squares coefficients with only the terms in ``free`` (the others 0), by
    Gaussian elimination with partial pivoting; None where singular."""
    n = len(free)
    m = [[xx[i][j] for j in free] + [xy[i]] for i in free]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col], strict=True)]
    theta = [0.0, 0.0, 0.0]
    for k, i in enumerate(free):
        theta[i] = m[k][n] / m[k][k]
    return (theta[0], theta[1], theta[2])
