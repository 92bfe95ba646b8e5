"""Training the EAGLE-3 head on the CPU (plain torch): the loop, its checkpoints and its result.

Each step takes examples until ``batch_tokens``, runs the target on them once (no grad),
and trains the head to match the target's next-token distribution over the draft
vocabulary (soft cross-entropy), pass by pass (:meth:`~agentspec.head.eagle3.Eagle3Head.unrolled`),
each token weighted as :mod:`agentspec.training.examples` says. A checkpoint every
``checkpoint_every`` steps holds the head, the optimizer and the data order, so a run
stopped midway resumes where it was under the same settings.
"""

from __future__ import annotations

import json
import random
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from agentspec.head.eagle3 import Eagle3Head, HeadShape, save_head
from agentspec.head.target import TargetModel, default_aux_layers
from agentspec.training.config import DrafterTrainingConfig
from agentspec.training.evaluate import HeldOutScore, score_head
from agentspec.training.examples import (
    Example,
    build_examples,
    index_hard_steps,
    load_corpus,
    tokenize_calls,
)

__all__ = ["TrainingError", "TrainingResult", "train_drafter"]

CHECKPOINT = "checkpoint.pt"


class TrainingError(ValueError):
    """A training input that cannot work (one line: what and where)."""


@dataclass
class TrainingResult:
    """What a run produced and how the head scores on held-out calls."""

    out: str
    steps: int
    resumed_from: int
    train_examples: int
    held_out_examples: int
    output_tokens: int
    hard_tokens: int
    tenants: list[str]
    final_loss: float
    untrained: HeldOutScore | None
    trained: HeldOutScore | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: Called after each step with (step, total steps, loss).
Progress = Callable[[int, int, float], None]
#: Called with a stage's name as preparation goes (tokenizing, indexing, ...).
Stage = Callable[[str], None]


def _held_out(trajectory_id: str, fraction: float) -> bool:
    # A stable split: the same calls are held out on every run and resume.
    return (zlib.crc32(trajectory_id.encode()) % 10_000) < fraction * 10_000


def _draft_vocabulary(examples: Sequence[Example], size: int, vocab: int, keep: Sequence[int]) -> torch.Tensor:
    """The ``size`` target ids seen most in the examples' weighted tokens (``keep`` always),
    sorted; ids never seen fill the rest in id order."""
    if size >= vocab:
        return torch.arange(vocab)
    counts: Counter[int] = Counter()
    for example in examples:
        counts.update(t for t, w in zip(example.ids, example.weights, strict=True) if w > 0)
    chosen = [t for t in keep if 0 <= t < vocab]
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if token not in chosen:
            chosen.append(token)
    taken = set(chosen)
    filler = (t for t in range(vocab) if t not in taken)
    while len(chosen) < size:
        chosen.append(next(filler))
    return torch.tensor(sorted(chosen[:size]), dtype=torch.long)


def _batches(examples: list[Example], batch_tokens: int, seed: int) -> Any:
    """Endless batches, epoch by epoch in a seeded order: ``(epoch, position, batch)``."""
    epoch = 0
    while True:
        order = list(range(len(examples)))
        random.Random(seed + epoch).shuffle(order)
        batch: list[Example] = []
        tokens = 0
        for position, i in enumerate(order):
            batch.append(examples[i])
            tokens += len(examples[i].ids)
            if tokens >= batch_tokens:
                yield epoch, position + 1, batch
                batch, tokens = [], 0
        if batch:
            yield epoch, len(order), batch
        epoch += 1


def _pad(batch: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids [B, T] (right-padded with 0) and each position's loss weight for the token two
    ahead of it, the one its first pass drafts (0 past the row's end)."""
    length = max(len(e.ids) for e in batch)
    ids = torch.zeros(len(batch), length, dtype=torch.long)
    weights = torch.zeros(len(batch), length)
    for row, example in enumerate(batch):
        n = len(example.ids)
        ids[row, :n] = torch.tensor(example.ids)
        if n > 2:
            weights[row, : n - 2] = torch.tensor(example.weights[2:])
    return ids, weights


def head_loss(
    head: Eagle3Head, target: TargetModel, ids: torch.Tensor, weights: torch.Tensor, passes: int
) -> torch.Tensor:
    """Weighted soft cross-entropy of each pass's draft against the target's distribution
    over the draft vocabulary for the same token; later passes weigh less (0.8 per pass)."""
    seen = target.run(ids, head.shape.aux_layers, head.draft_ids)
    weights = weights.to(target.device)
    logits = head.unrolled(seen.aux_states, seen.next_embeds, seen.cos, seen.sin, passes)
    # Position q drafts the token at q + 2, which the target's logits at q + 1 predict.
    teacher = torch.softmax(torch.cat([seen.draft_logits[:, 1:], seen.draft_logits[:, -1:]], dim=1), dim=-1)
    total = torch.zeros((), device=target.device)
    norm = 0.0
    for k, pass_logits in enumerate(logits):
        w = weights.clone()
        w[:, :k] = 0  # rows before pass k have no real input
        ce = -(teacher * F.log_softmax(pass_logits, dim=-1)).sum(-1)
        denominator = w.sum().clamp_min(1e-6)
        total = total + (0.8**k) * (ce * w).sum() / denominator
        norm += 0.8**k
    return total / norm


def _settings_differ(saved: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))


@dataclass
class _Prepared:
    """What a run trains on: the target, its tokenizer, and the examples."""

    target: TargetModel
    tokenizer: Any
    tenants: set[str]
    train: list[Example]
    held: list[Example]
    vocab: int
    aux_layers: tuple[int, ...]


def _prepare(config: DrafterTrainingConfig, say: Stage) -> _Prepared:
    """Read and check the corpus and the target, and make the examples."""
    say("reading the trajectories")
    corpus = load_corpus(config.data, config.tenant, config.all_tenants)
    if not any(t.turns for t in corpus.trajectories):
        where = f" of tenant {config.tenant!r}" if config.tenant is not None else ""
        raise TrainingError(f"no calls{where} in {', '.join(str(p) for p in config.data)}: nothing to train on")

    say("loading the target")
    from transformers import AutoConfig, AutoTokenizer

    try:
        target_config = AutoConfig.from_pretrained(str(config.target))
        tokenizer = AutoTokenizer.from_pretrained(str(config.target))
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainingError(f"{config.target}: not a model and tokenizer transformers can load ({first})") from e
    if getattr(target_config, "model_type", None) != "llama":
        raise TrainingError(
            f"{config.target}: an EAGLE-3 head is built here for Llama targets, got {target_config.model_type!r}"
        )
    vocab = int(target_config.vocab_size)
    if len(tokenizer) > vocab:
        raise TrainingError(
            f"{config.target}: its tokenizer has {len(tokenizer)} tokens but the model's vocabulary {vocab}:"
            " they are not one model's"
        )
    try:
        target = TargetModel(config.target, config.device)
    except (RuntimeError, AssertionError) as e:  # no such device, or torch's build lacks it
        raise TrainingError(f"--device {config.device}: {str(e).strip().splitlines()[0]}") from e
    aux_layers = config.aux_layers or default_aux_layers(target.num_layers)
    if any(not 0 < layer < target.num_layers for layer in aux_layers):
        raise TrainingError(f"aux_layers must lie in 1..{target.num_layers - 1}, got {list(aux_layers)}")

    say("tokenizing the calls")
    tokenized = [(t, tokenize_calls(tokenizer, t)) for t in corpus.trajectories if t.turns]
    say("finding the steps the index cannot draft")
    hard = index_hard_steps(tokenized, config.hard_below)
    train_calls = [c for c in tokenized if not _held_out(c[0].id, config.eval_fraction)]
    held_calls = [c for c in tokenized if _held_out(c[0].id, config.eval_fraction)]
    if not train_calls:
        raise TrainingError("every trajectory was held out for evaluation: lower --eval-fraction or add data")

    def examples(calls: list[tuple[Any, list[tuple[list[int], list[int]]]]]) -> list[Example]:
        return build_examples(
            calls,
            hard,
            context_tokens=config.context_tokens,
            max_tokens=config.max_tokens,
            easy_weight=config.easy_weight,
            prompt_weight=config.prompt_weight,
        )

    train, held = examples(train_calls), examples(held_calls)
    aux = tuple(aux_layers)
    return _Prepared(target, tokenizer, set(corpus.tenants), train, held, vocab, aux)


def _new_head(config: DrafterTrainingConfig, data: _Prepared) -> Eagle3Head:
    """A head for the target, its draft vocabulary the outputs' most frequent tokens, its
    output layer and final norm started from the target's."""
    target, tokenizer = data.target, data.tokenizer
    keep = [t for t in (tokenizer.eos_token_id, tokenizer.bos_token_id) if t is not None]
    draft_ids = _draft_vocabulary(data.train, config.draft_vocab, data.vocab, keep)
    c = target.config
    shape = HeadShape(
        hidden_size=int(c.hidden_size),
        intermediate_size=int(c.intermediate_size),
        num_attention_heads=int(c.num_attention_heads),
        num_key_value_heads=int(c.num_key_value_heads),
        head_dim=int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads),
        rms_norm_eps=float(c.rms_norm_eps),
        aux_layers=data.aux_layers,
        draft_vocab_size=len(draft_ids),
    )
    head = Eagle3Head(shape).to(target.device)
    with torch.no_grad():
        head.d2t.copy_((draft_ids - torch.arange(len(draft_ids))).to(target.device))
        # Start from the target's own output layer and final norm (its token space).
        head.lm_head.weight.copy_(target.output_weight()[draft_ids])
        head.norm.weight.copy_(target.model.get_decoder().norm.weight)
    return head


def _optimizer(head: Eagle3Head, config: DrafterTrainingConfig) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW with a warm-up and a linear decay to a tenth."""
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for name, p in head.named_parameters() if name != "lm_head.weight"]},
            # The output layer starts as the target's: it moves slower.
            {"params": [head.lm_head.weight], "lr": config.learning_rate * 0.1},
        ],
        lr=config.learning_rate,
        weight_decay=0.0,
    )
    warmup = max(1, config.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.1, 1 - s / config.steps)
    )
    return optimizer, schedule


def train_drafter(
    config: DrafterTrainingConfig,
    progress: Progress | None = None,
    stage: Stage | None = None,
) -> TrainingResult:
    """Train an EAGLE-3 head for ``config.target`` on ``config.data`` and write it to
    ``config.out`` (resuming a stopped run there under the same settings)."""
    say = stage or (lambda _: None)
    torch.manual_seed(config.seed)
    checkpoint_path = config.out / CHECKPOINT
    state: dict[str, Any] | None = None
    if checkpoint_path.exists():
        state = torch.load(checkpoint_path, weights_only=False, map_location="cpu")
        differ = _settings_differ(state["settings"], config.run_settings())
        if differ:
            raise TrainingError(
                f"{config.out} holds a run with other settings ({', '.join(differ)}): pass another --out,"
                " or remove it to start over"
            )

    data = _prepare(config, say)
    target, train, held = data.target, data.train, data.held
    head = _new_head(config, data)
    optimizer, schedule = _optimizer(head, config)

    untrained = score_head(head, target, held, config.passes) if held and state is None else None
    step, position_in_epoch, epoch = 0, 0, 0
    if state is not None:
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step, epoch, position_in_epoch = state["step"], state["epoch"], state["position"]
        untrained = HeldOutScore(**state["untrained"]) if state.get("untrained") else None
    resumed_from = step

    say("training")
    batches = _batches(train, config.batch_tokens, config.seed)
    pending = next(batches)
    if state is not None:
        # Skip what the stopped run had trained on (the same seeded order).
        while pending[:2] <= (epoch, position_in_epoch):
            pending = next(batches)
    loss_value = float("nan")
    config.out.mkdir(parents=True, exist_ok=True)
    while step < config.steps:
        epoch, position_in_epoch, batch = pending
        ids, weights = _pad(batch)
        loss = head_loss(head, target, ids, weights, config.passes)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        step += 1
        loss_value = float(loss.detach())
        if progress is not None:
            progress(step, config.steps, loss_value)
        if step % config.checkpoint_every == 0 or step == config.steps:
            _save_checkpoint(
                checkpoint_path, config, head, optimizer, schedule, step, epoch, position_in_epoch, untrained
            )
        pending = next(batches)

    trained = score_head(head, target, held, config.passes) if held else None
    result = TrainingResult(
        out=str(config.out),
        steps=step,
        resumed_from=resumed_from,
        train_examples=len(train),
        held_out_examples=len(held),
        output_tokens=sum(e.output_tokens for e in train),
        hard_tokens=sum(e.hard_tokens for e in train),
        tenants=sorted(data.tenants),
        final_loss=loss_value,
        untrained=untrained,
        trained=trained,
    )
    metadata = {
        "target": config.target.name,
        "tenants": sorted(data.tenants),
        "steps": step,
        "passes": config.passes,
        "trained_output_tokens": result.output_tokens,
        "held_out": asdict(trained) if trained else None,
    }
    save_head(head, target.config.to_dict(), config.out, metadata)
    data.tokenizer.save_pretrained(str(config.out))
    (config.out / "training.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result


def _save_checkpoint(
    path: Path,
    config: DrafterTrainingConfig,
    head: Eagle3Head,
    optimizer: torch.optim.Optimizer,
    schedule: Any,
    step: int,
    epoch: int,
    position: int,
    untrained: HeldOutScore | None,
) -> None:
    staging = path.with_suffix(".tmp")
    torch.save(
        {
            "settings": config.run_settings(),
            "head": head.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "step": step,
            "epoch": epoch,
            "position": position,
            "untrained": asdict(untrained) if untrained else None,
        },
        staging,
    )
    staging.replace(path)  # a stop mid-write leaves the last whole checkpoint
