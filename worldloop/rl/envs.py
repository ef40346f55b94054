"""RL's environments and judge: what ``worldloop rl`` trains in, and what its reality checks measure against.

- :func:`training_env`: the imagined environment (the world model, judged, from a dataset's first frames and KIR's
  keyframes) or the real simulator (through the world model's VAE with rl.diagnostics.reality_through_codec);
- :func:`imagined_env`: the imagined environment alone (also the reality checks' and the fidelity gate's);
- :func:`load_rl_judge`: a judge deciding success at rl.judge_threshold when that is set;
- :func:`instruction_of`: a simulator task as the policy reads it.
"""

from __future__ import annotations

import torch

from worldloop.config import Config, ConfigError
from worldloop.envs.codec import CodecObservations
from worldloop.envs.imagined import ImaginedEnv, InitialStates, initial_states_from_dataset, initial_states_from_keyframes
from worldloop.rewards import load_judge
from worldloop.sims import make_env
from worldloop.sims.tasks import instruction, resolve_tasks, sim_tasks


def training_env(config: Config, imagined: bool, world_model, judge, dataset, keyframes: str | None, chosen: list[str] | None, device,
                 num_envs: int | None = None):  # fmt: skip
    """RL's training environment: the imagined one (from ``dataset``'s first frames and the ``keyframes``) or the real
    simulator (through the world model's VAE with rl.diagnostics.reality_through_codec), on the ``chosen`` simulator
    tasks (default: the dataset's, or sim.tasks/suite), ``num_envs`` of them (default: rl.num_groups x rl.group_size; under
    torchrun this rank's share). Returns it, its tasks as the policy reads them (instructions in imagination) and the
    same tasks as the simulator names them."""
    rl = config.rl
    num_envs = num_envs or rl.num_groups * rl.group_size
    if imagined:
        env = imagined_env(config, world_model, judge, dataset, keyframes, num_envs, rl.group_size, rl.max_steps, device)
        tasks = env.task_names if chosen is None else [instruction_of(task) for task in chosen]
        return env, tasks, chosen or sim_tasks(tasks)
    chosen = chosen or resolve_tasks(config.sim)
    return through_codec(make_env(config, num_envs, tasks=chosen), world_model, config), list(chosen), list(chosen)


def through_codec(env, world_model, config: Config):
    """``env`` as the policy sees it: with rl.diagnostics.reality_through_codec, its frames through ``world_model``'s VAE."""
    if not config.rl.diagnostics.reality_through_codec:
        return env
    if world_model.image_size != config.sim.image_size:  # its VAE would still run, on frames it never learned
        env.close()
        raise ConfigError(f"rl.diagnostics.reality_through_codec: the world model works at {world_model.image_size}x{world_model.image_size}, the simulator "
                          f"renders {config.sim.image_size}x{config.sim.image_size} (sim.image_size)")  # fmt: skip

    return CodecObservations(env, world_model.vae)


def load_rl_judge(spec: str, device, config: Config):
    """The judge of ``spec``, deciding success at rl.judge_threshold when that is set."""
    judge = load_judge(spec, device, config.reward)
    if isinstance(config.rl.judge_threshold, float):
        print(f"judge {spec}: threshold {config.rl.judge_threshold} (rl.judge_threshold) in place of its own {judge.threshold:.3f}")
        judge.threshold = config.rl.judge_threshold
    return judge


def imagined_env(config: Config, world_model, judge, dataset, keyframes: str | None, num_envs: int, group_size: int, max_steps: int, device, kir_ratio: float | None = None):
    """The imagined environment over the dataset's first frames (+ keyframes); without either it can only ``reset_to``."""
    if world_model is None or judge is None:
        raise ConfigError("the imagined environment needs --world-model and --judge")
    pools = [InitialStates.from_first_frames(torch.zeros(0, world_model.image_size, world_model.image_size, 3, dtype=torch.uint8), [])]
    if dataset is not None:
        if dataset.image_size != world_model.image_size:
            raise ConfigError(f"--dataset has {dataset.image_size}x{dataset.image_size} frames but the world model renders {world_model.image_size}x{world_model.image_size}")
        pools.append(initial_states_from_dataset(dataset))
    if keyframes:
        pools.append(initial_states_from_keyframes(keyframes))
    ratio = config.rl.kir_ratio if kir_ratio is None else kir_ratio
    return ImaginedEnv(world_model, judge, InitialStates.concat(*pools), num_envs, group_size, max_steps, kir_ratio=ratio, device=device,
                       success_chunks=config.rl.success_chunks)  # fmt: skip


def instruction_of(task: str) -> str:

    try:
        return instruction(task)
    except ValueError as error:
        raise ConfigError(f"--tasks: {error}") from None
