"""verl's agent loop on agentspec engines: what a verl user sets, and a one-group check.

A verl (0.9) trainer takes the adapter through two config keys (hydra overrides)::

    +actor_rollout_ref.rollout.agent.agent_loop_manager_class=agentspec_rl.verl.AgentspecAgentLoopManager
    +actor_rollout_ref.rollout.custom.agentspec.backends=[http://gpu1:8001,http://gpu2:8001]
    +actor_rollout_ref.rollout.custom.agentspec.model=my-policy

(``AgentspecAgentLoopManagerV0`` with ``trainer.use_v1=false``.) ``--print-config`` prints
them for your engines; without it, the script runs one GRPO group of ``--n`` samples through
the adapter's server manager, as verl's agent loops call it, and shows that the group ran on
one engine::

    agentspec serve MODEL --served-model-name my-policy --port 8001   # one per GPU
    python examples/rl/verl_agent_loop.py --backends http://localhost:8001 --model my-policy

Needs agentspec-rl (``pip install -e ./integrations/rl``); running the group also needs verl
(its ``TokenOutput`` is what comes back). ``--help`` and ``--print-config`` need neither verl
nor a server.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid

MANAGER = "agentspec_rl.verl.AgentspecAgentLoopManager"


def overrides(backends: list[str], model: str) -> list[str]:
    """The hydra overrides that put a verl trainer's rollouts on agentspec engines."""
    return [
        f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER}",
        f"+actor_rollout_ref.rollout.custom.agentspec.backends=[{','.join(backends)}]",
        f"+actor_rollout_ref.rollout.custom.agentspec.model={model}",
    ]


async def one_group(backends: list[str], model: str, prompt: list[int], n: int, max_tokens: int) -> None:
    from agentspec_rl.verl import AgentspecServerClient, RolloutDefaults

    client = AgentspecServerClient(backends, model, defaults=RolloutDefaults(response_length=max_tokens))
    group = str(uuid.uuid4())  # verl's uid of one prompt
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}

    async def sample(i: int) -> tuple[str, int, float]:
        # What the adapter's workers do around every agent loop: the trajectory's group.
        async with client.trajectory(group, step=0):
            out = await client.generate(uuid.uuid4().hex, prompt_ids=prompt, sampling_params=dict(sampling, seed=i))
        return out.extra_fields["agentspec_backend"], len(out.token_ids), sum(out.log_probs or ())

    results = await asyncio.gather(*(sample(i) for i in range(n)))
    for i, (backend, tokens, logprob) in enumerate(results):
        print(f"sample {i}: {tokens} tokens, log-probability {logprob:.2f}, on {backend}")
    print(f"group {group}: {len({b for b, _, _ in results})} engine(s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", required=True, help="agentspec serve base URLs")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--print-config", action="store_true", help="print verl's overrides and stop")
    parser.add_argument("--n", type=int, default=4, help="samples in the group (rollout.n)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt", type=int, nargs="+", default=[17, 230, 54, 999, 12, 7, 401, 33], help="token ids")
    args = parser.parse_args()
    if args.print_config:
        print(" \\\n  ".join(["python -m verl.trainer.main_ppo", *overrides(args.backends, args.model), "..."]))
        return
    asyncio.run(one_group(args.backends, args.model, args.prompt, args.n, args.max_tokens))


if __name__ == "__main__":
    main()
