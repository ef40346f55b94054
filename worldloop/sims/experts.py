"""Scripted experts: Meta-World's per-task policies, made imperfect on purpose.

A clean expert solves almost every MT10 episode. Datasets for a world model and a success judge
also need failures and near-misses, so a *noisy* episode adds Gaussian action noise (a new draw every
step) and, with
some probability, one perturbation: either a burst of uniform random actions or a stretch in
which the gripper is held in the wrong state (open when the expert closes it, and the reverse)
while the arm follows the expert. After the perturbation the expert resumes from wherever the
scene now is; late perturbations leave no time to recover.

Everything random about an episode is fixed up front by :class:`ExpertPlan` (drawn from one
seed), so an episode is reproducible from (task, simulator seed, plan).

This module imports no torch: simulator worker processes use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

PerturbKind = Literal["random", "gripper"]


@dataclass(frozen=True)
class ExpertPlan:
    """How the scripted expert behaves in one episode."""

    noise_std: float = 0.0
    """Std of the Gaussian noise added to every action."""
    perturb_start: int = -1
    """Step (0-based action index) at which the perturbation starts; -1: no perturbation."""
    perturb_length: int = 0
    """Steps the perturbation lasts."""
    perturb_kind: PerturbKind = "random"
    """'random': uniform random actions; 'gripper': expert arm motion with the gripper command inverted."""
    seed: int = 0
    """Seed of the noise and of the random actions."""

    @property
    def is_clean(self) -> bool:
        return self.noise_std == 0 and self.perturb_start < 0


PERTURB_START = (10, 120)
"""Earliest and latest step (0-based action index) at which a perturbation may start (late ones leave no time to
recover: failures and near-misses)."""
GRIPPER_PERTURB_FRACTION = 0.5
"""Fraction of perturbations that hold the gripper in the wrong state (open when the expert closes it, and the
reverse) while the arm follows the expert; the others are a burst of uniform random actions."""


def plan_episode(expert_config, noisy: bool, seed: int, perturb_start: tuple[int, int] = PERTURB_START) -> ExpertPlan:
    """Draw an episode's plan from ``seed``: clean (no noise, no perturbation) unless ``noisy``; a perturbation
    starts at a step drawn in ``perturb_start`` (both ends included)."""
    if not noisy:
        return ExpertPlan(seed=seed)
    rng = np.random.default_rng([seed, 7919])
    start, length, kind = -1, 0, "random"
    if expert_config.perturb_steps > 0 and rng.random() < expert_config.perturb_prob:
        start = int(rng.integers(perturb_start[0], perturb_start[1] + 1))
        length = expert_config.perturb_steps
        kind = "gripper" if rng.random() < GRIPPER_PERTURB_FRACTION else "random"
    return ExpertPlan(noise_std=expert_config.action_noise, perturb_start=start,
                      perturb_length=length, perturb_kind=kind, seed=seed)


class ScriptedExpert:
    """A scripted policy for one task, following one :class:`ExpertPlan`: Meta-World's own unless
    ``policy`` (anything with ``get_action(observation)``) is given."""

    def __init__(self, task: str, plan: ExpertPlan, policy=None):
        if policy is None:
            from metaworld.policies import ENV_POLICY_MAP

            if task not in ENV_POLICY_MAP:
                raise ValueError(f"Meta-World has no scripted policy for task '{task}'")
            policy = ENV_POLICY_MAP[task]()
        self.policy = policy
        self.plan = plan
        self.rng = np.random.default_rng([plan.seed, 104729])

    def act(self, observation: np.ndarray, step: int) -> np.ndarray:
        """The float32 action in [-1, 1] (Meta-World: (4,)) for ``observation`` (Meta-World: 39-d) at episode step ``step``."""
        plan = self.plan
        action = np.asarray(self.policy.get_action(observation), dtype=np.float64)
        perturbing = plan.perturb_start >= 0 and plan.perturb_start <= step < plan.perturb_start + plan.perturb_length
        if perturbing and plan.perturb_kind == "random":
            action = self.rng.uniform(-1.0, 1.0, size=action.shape)
        else:
            if perturbing:  # plan.perturb_kind == "gripper": hold the gripper in the wrong state
                action[-1] = -1.0 if action[-1] > 0 else 1.0
            if plan.noise_std > 0:
                action = action + self.rng.normal(0.0, plan.noise_std, size=action.shape)
        return np.clip(action, -1.0, 1.0).astype(np.float32)
