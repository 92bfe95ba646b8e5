"""GRPO with SkyRL (skyrl >= 0.4, Python >= 3.12) on agentspec engines.

1. Start the engines, one per GPU or replica, with the routes SkyRL's weight sync calls
   (vLLM's development routes, NCCL weight transfer, SkyRL's worker extension)::

       VLLM_SERVER_DEV_MODE=1 agentspec serve Qwen/Qwen2.5-1.5B-Instruct --port 8001 \\
           --weight-transfer-config '{"backend": "nccl"}' \\
           --worker-extension-cls \\
           skyrl.backends.skyrl_train.inference_servers.new_inference_worker_wrap.NewInferenceWorkerWrap

2. See the SkyRL settings that point its generator at them::

       python examples/rl/skyrl_external_engines.py --engines http://gpu1:8001 http://gpu2:8001 --print-overrides

3. Train: everything after the options is SkyRL's own configuration::

       python examples/rl/skyrl_external_engines.py --engines http://gpu1:8001 http://gpu2:8001 \\
           trainer.policy.model.path=Qwen/Qwen2.5-1.5B-Instruct trainer.placement.colocate_all=false \\
           generator.n_samples_per_prompt=8 data.train_data="['~/data/gsm8k/train.parquet']"

The trainer's generator then runs every trajectory as an agentspec session, the
``n_samples_per_prompt`` trajectories of a prompt as one group pinned to one engine, and
each weight sync announces a new policy version to every engine (agentspec_rl.skyrl).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agentspec_rl.skyrl import skyrl_overrides, with_agentspec


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description="SkyRL GRPO training on agentspec engines (SkyRL options follow ours).",
        epilog="Example: --engines http://gpu1:8001 http://gpu2:8001 trainer.policy.model.path=MODEL ...",
    )
    parser.add_argument("--engines", nargs="+", required=True, help="agentspec serve base URLs")
    parser.add_argument("--served-model-name", help="the engines' --served-model-name, if not the policy path")
    parser.add_argument("--router", help="a router in front of the engines (else SkyRL starts vllm-router)")
    parser.add_argument("--run-id", help="scopes this run's session and group ids (random when omitted)")
    parser.add_argument(
        "--keep-old-outputs", action="store_true", help="older policies' outputs keep drafting after a weight sync"
    )
    parser.add_argument("--print-overrides", action="store_true", help="print SkyRL's settings and exit")
    return parser.parse_known_args(argv)


def main(argv: list[str]) -> None:
    args, skyrl_args = parse_args(argv)
    overrides = skyrl_overrides(args.engines, served_model_name=args.served_model_name, proxy_url=args.router)
    if args.print_overrides:
        print("\n".join(overrides))
        return
    try:
        import ray
        from skyrl.train.config import SkyRLTrainConfig
        from skyrl.train.entrypoints.main_base import BasePPOExp
        from skyrl.train.utils.utils import initialize_ray, validate_cfg
    except ImportError as exc:
        sys.exit(f"training needs SkyRL with its trainer: pip install 'skyrl[fsdp]>=0.4' ({exc})")

    settings: dict[str, Any] = {"keep_old_outputs": args.keep_old_outputs}
    if args.run_id:
        settings["run_id"] = args.run_id

    class AgentspecExp(BasePPOExp):
        def get_inference_client(self) -> Any:
            return with_agentspec(super().get_inference_client(), **settings)

    @ray.remote(num_cpus=1)
    def run(cfg: Any) -> None:
        AgentspecExp(cfg).run()

    cfg = SkyRLTrainConfig.from_cli_overrides([*overrides, *skyrl_args])
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(run.remote(cfg))


if __name__ == "__main__":
    main(sys.argv[1:])
