"""Task names, suites and the English instruction of each task.

Meta-World's suites come from its own registry (``metaworld.env_dict``), so MT10/MT50 are exactly
the benchmark's task lists; their instructions are ours: short imperative sentences a person would
say to the robot. LIBERO's tasks are named ``<suite>-<index>`` (``libero_spatial-4``: task 4 of
LIBERO-Spatial in the benchmark's order); their instructions are LIBERO's own (the ``[libero]`` extra).
"""

from __future__ import annotations

import difflib

from metaworld.env_dict import ALL_V3_ENVIRONMENTS, MT10_V3, MT50_V3

from worldloop.sims.configuration import LIBERO_SUITES, LIBERO_TASKS
SUITE_TASKS: dict[str, list[str]] = {
    "mt10": list(MT10_V3.keys()),
    "mt50": list(MT50_V3.keys()),
    **LIBERO_TASKS,
}
"""Named task suites, in Meta-World's and LIBERO's order."""

ALL_TASKS: list[str] = list(ALL_V3_ENVIRONMENTS.keys())
"""Every Meta-World v3 task name."""

INSTRUCTIONS: dict[str, str] = {
    "assembly-v3": "put the ring on the peg",
    "basketball-v3": "dunk the ball into the basket",
    "bin-picking-v3": "move the cube from one bin to the other",
    "box-close-v3": "put the lid on the box",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "press the button behind the wall from the top",
    "button-press-v3": "press the button",
    "button-press-wall-v3": "press the button behind the wall",
    "coffee-button-v3": "press the button on the coffee machine",
    "coffee-pull-v3": "pull the mug away from the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "turn the dial",
    "disassemble-v3": "take the ring off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "lock the door by turning the lock down",
    "door-open-v3": "open the door",
    "door-unlock-v3": "unlock the door by turning the lock",
    "hand-insert-v3": "put the hand into the hole",
    "drawer-close-v3": "close the drawer",
    "drawer-open-v3": "open the drawer",
    "faucet-open-v3": "turn the faucet on",
    "faucet-close-v3": "turn the faucet off",
    "hammer-v3": "hammer the nail into the wall",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "pick-place-wall-v3": "pick up the puck and place it at the goal behind the wall",
    "pick-out-of-hole-v3": "pick the peg out of the hole",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "plate-slide-v3": "slide the plate into the goal",
    "plate-slide-side-v3": "slide the plate sideways into the goal",
    "plate-slide-back-v3": "slide the plate back out of the goal",
    "plate-slide-back-side-v3": "slide the plate sideways back out of the goal",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "peg-unplug-side-v3": "unplug the peg from the side",
    "soccer-v3": "kick the ball into the goal",
    "stick-push-v3": "grab the stick and push the box with it",
    "stick-pull-v3": "grab the stick and pull the box with it",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "push the puck around the wall to the goal",
    "push-back-v3": "push the puck back to the goal",
    "reach-v3": "reach the goal with the gripper",
    "reach-wall-v3": "reach over the wall to the goal",
    "shelf-place-v3": "place the puck on the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
}
"""One English instruction per Meta-World v3 task."""


def is_libero_task(name: str) -> bool:
    return any(name in tasks for tasks in LIBERO_TASKS.values())


def check_task(name: str) -> str:
    """The canonical task name for ``name`` ('drawer-open' or 'drawer-open-v3', 'libero_spatial-4'); a clear error if unknown."""
    if not isinstance(name, str):
        raise TypeError(f"a task name must be a string, got {type(name).__name__}: {name!r}")
    if is_libero_task(name):
        return name
    if name.startswith("libero"):
        raise ValueError(f"unknown LIBERO task '{name}'; LIBERO tasks are <suite>-<0..9> with suite one of {', '.join(LIBERO_SUITES)}")
    if name in ALL_V3_ENVIRONMENTS:
        return name
    if f"{name}-v3" in ALL_V3_ENVIRONMENTS:
        return f"{name}-v3"
    close = difflib.get_close_matches(name, ALL_TASKS, n=5, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"known tasks: {', '.join(ALL_TASKS)}"
    raise ValueError(f"unknown Meta-World task '{name}'; {hint}")


def suite_tasks(name: str) -> list[str]:
    """The task names of suite ``name`` ('mt10', 'mt50'; case-insensitive)."""
    key = name.lower()
    if key not in SUITE_TASKS:
        raise ValueError(f"unknown task suite '{name}'; allowed: {', '.join(SUITE_TASKS)}")
    return list(SUITE_TASKS[key])


def instruction(task: str) -> str:
    """The English instruction for ``task`` (LIBERO's tasks need the ``[libero]`` extra)."""
    task = check_task(task)
    if is_libero_task(task):
        from worldloop.sims.libero_setup import libero_instruction

        return libero_instruction(task)
    return INSTRUCTIONS[task]


def known_instructions() -> dict[str, str]:
    """Every task's instruction by task name: Meta-World's, and LIBERO's where the extra is installed."""
    from worldloop.sims.libero_setup import libero_available, libero_instruction

    known = dict(INSTRUCTIONS)
    if libero_available():
        known.update({task: libero_instruction(task) for tasks in LIBERO_TASKS.values() for task in tasks})
    return known


def resolve_tasks(sim_config) -> list[str]:
    """The tasks a run uses: ``sim.tasks`` when set, else the whole ``sim.suite``."""
    if sim_config.tasks:
        tasks = [check_task(t) for t in sim_config.tasks]
        duplicates = sorted({t for t in tasks if tasks.count(t) > 1})
        if duplicates:
            raise ValueError(f"sim.tasks lists {', '.join(duplicates)} more than once")
        return tasks
    return suite_tasks(sim_config.suite)


def sim_tasks(instructions: list[str]) -> list[str]:
    """Simulator task names of a dataset's instructions (Meta-World's instruction table, and LIBERO's)."""
    from worldloop.config import ConfigError

    by_instruction = {text: task for task, text in INSTRUCTIONS.items()}
    if any(text not in by_instruction for text in instructions):  # LIBERO's too (importing LIBERO takes seconds)
        by_instruction = {text: task for task, text in known_instructions().items()}
    unknown = [text for text in instructions if text not in by_instruction]
    if unknown:
        raise ConfigError(f"instructions {unknown[:3]} are not simulator tasks: --policy rollouts need the simulator's tasks")
    return [by_instruction[text] for text in instructions]
