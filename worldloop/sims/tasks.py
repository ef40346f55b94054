"""Task names, suites and the English instruction of each task, as each simulator says them.

A simulator supplies its tasks as a :class:`TaskTable` (its class's ``task_table``, registered with the class in
:data:`worldloop.utils.registry.SIMULATORS`): their names, named suites, instructions, cameras and where an
evaluation's episode e starts. The functions below ask the tables, so a simulator a user registers plugs in like the
built-in two:

- Meta-World's suites come from its own registry (``metaworld.env_dict``), so MT10/MT50 are exactly the benchmark's
  task lists; their instructions are ours: short imperative sentences a person would say to the robot;
- LIBERO's tasks are named ``<suite>-<index>`` (``libero_spatial-4``: task 4 of LIBERO-Spatial in the benchmark's
  order); their instructions are LIBERO's own (the ``[libero]`` extra).
"""

from __future__ import annotations

import difflib

from metaworld.env_dict import ALL_V3_ENVIRONMENTS, MT10_V3, MT50_V3

from worldloop.sims.configuration import LIBERO_CAMERAS, LIBERO_SUITES, LIBERO_TASKS, METAWORLD_CAMERAS, task_table, task_tables

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


class TaskTable:
    """A simulator's tasks as worldloop reads them. A simulator class offers one as ``task_table``; a subclass gives
    ``name``, ``suites``, ``cameras`` and :meth:`instructions`, and may refine the rest."""

    name = "simulator"
    """What error messages call the simulator ('Meta-World')."""
    suites: dict[str, list[str]] = {}
    """Named suites (lower case) -> their task names, in order."""
    cameras: tuple[str, ...] = ()
    """The cameras sim.camera may name, the default first (empty: unchecked)."""

    def instructions(self) -> dict[str, str]:
        """Every task's English instruction, by task name, in the table's order."""
        raise NotImplementedError

    def canonical(self, name: str) -> str | None:
        """The table's name for ``name``, or None when it is not one of its tasks."""
        return name if name in self.instructions() else None

    def claims(self, name: str) -> bool:
        """Whether an unknown ``name`` looks like one of this simulator's (its error message then explains it)."""
        return False

    def unknown(self, name: str) -> str:
        """The error message for a name none of its tasks has."""
        known = list(self.instructions())
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"known tasks: {', '.join(known)}"
        return f"unknown {self.name} task '{name}'; {hint}"

    def instruction(self, task: str) -> str:
        return self.instructions()[task]

    def eval_seed(self, task: str, episode: int, seed_offset: int) -> int:
        """The initial-state seed of an evaluation's ``episode`` of ``task``: apart for every task and episode."""
        return seed_offset + 1000 * list(self.instructions()).index(task) + episode


class MetaWorldTasks(TaskTable):
    name, suites, cameras = "Meta-World", {"mt10": SUITE_TASKS["mt10"], "mt50": SUITE_TASKS["mt50"]}, METAWORLD_CAMERAS

    def instructions(self) -> dict[str, str]:
        return INSTRUCTIONS

    def canonical(self, name: str) -> str | None:
        if name in ALL_V3_ENVIRONMENTS:
            return name
        return f"{name}-v3" if f"{name}-v3" in ALL_V3_ENVIRONMENTS else None

    def claims(self, name: str) -> bool:
        return not name.startswith("libero")

    def unknown(self, name: str) -> str:
        close = difflib.get_close_matches(name, ALL_TASKS, n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"known tasks: {', '.join(ALL_TASKS)}"
        return f"unknown Meta-World task '{name}'; {hint}"

    def eval_seed(self, task: str, episode: int, seed_offset: int) -> int:
        return seed_offset + 1000 * ALL_TASKS.index(task) + episode


class LiberoTasks(TaskTable):
    name, suites, cameras = "LIBERO", LIBERO_TASKS, LIBERO_CAMERAS

    def instructions(self) -> dict[str, str]:
        """LIBERO's own instructions where the extra is installed (importing it takes seconds), else none."""
        from worldloop.sims.libero_setup import libero_available

        return {task: self.instruction(task) for tasks in LIBERO_TASKS.values() for task in tasks} if libero_available() else {}

    def canonical(self, name: str) -> str | None:
        return name if is_libero_task(name) else None

    def claims(self, name: str) -> bool:
        return name.startswith("libero")

    def unknown(self, name: str) -> str:
        return f"unknown LIBERO task '{name}'; LIBERO tasks are <suite>-<0..9> with suite one of {', '.join(LIBERO_SUITES)}"

    def instruction(self, task: str) -> str:
        from worldloop.sims.libero_setup import libero_instruction

        return libero_instruction(task)

    def eval_seed(self, task: str, episode: int, seed_offset: int) -> int:
        return episode  # the standard protocol: episodes 0..49 start from the task's 50 fixed initial states in order


METAWORLD_TASKS, LIBERO_TASK_TABLE = MetaWorldTasks(), LiberoTasks()
"""The built-in simulators' tables (MetaWorldVecEnv.task_table, LiberoVecEnv.task_table)."""


def is_libero_task(name: str) -> bool:
    return any(name in tasks for tasks in LIBERO_TASKS.values())


def owner(name: str, backend: str | None = None) -> tuple[TaskTable, str]:
    """(the table of the simulator whose task ``name`` is, its canonical name): ``backend``'s when given, else the
    first registered simulator's that knows it; a clear error naming what is known otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"a task name must be a string, got {type(name).__name__}: {name!r}")
    tables = [task_table(backend)] if backend is not None else [table for _, table in task_tables()]
    for table in tables:
        canonical = table.canonical(name) if table is not None else None
        if canonical is not None:
            return table, canonical
    explaining = next((table for table in tables if table is not None and table.claims(name)), tables[0])
    if explaining is None:
        raise ValueError(f"sim.backend '{backend}' offers no task table (its class's task_table: worldloop.sims.tasks.TaskTable)")
    raise ValueError(explaining.unknown(name))


def check_task(name: str, backend: str | None = None) -> str:
    """The canonical task name for ``name`` ('drawer-open' or 'drawer-open-v3', 'libero_spatial-4'); a clear error if
    unknown. ``backend``: only that simulator's tasks."""
    return owner(name, backend)[1]


def suite_tasks(name: str, backend: str | None = None) -> list[str]:
    """The task names of suite ``name`` ('mt10', 'mt50', 'libero_spatial', ...; case-insensitive), of ``backend`` when given."""
    key = name.lower()
    tables = [table for table_name, table in task_tables() if backend is None or table_name == backend]
    if backend is not None and not tables and task_table(backend) is not None:
        tables = [task_table(backend)]
    for table in tables:
        if key in table.suites:
            return list(table.suites[key])
    known = [suite for table in tables for suite in table.suites]
    raise ValueError(f"unknown task suite '{name}'; allowed: {', '.join(known)}")


def instruction(task: str) -> str:
    """The English instruction for ``task`` (LIBERO's tasks need the ``[libero]`` extra)."""
    table, task = owner(task)
    return table.instruction(task)


def known_instructions() -> dict[str, str]:
    """Every task's instruction by task name, of every registered simulator (LIBERO's where the extra is installed)."""
    known: dict[str, str] = {}
    for _, table in task_tables():
        known.update(table.instructions())
    return known


def resolve_tasks(sim_config) -> list[str]:
    """The tasks a run uses: ``sim.tasks`` when set, else the whole ``sim.suite``, of the simulator sim.backend names
    (one without a task table: of any registered simulator)."""
    backend = sim_config.backend if task_table(sim_config.backend) is not None else None
    if sim_config.tasks:
        tasks = [check_task(t, backend) for t in sim_config.tasks]
        duplicates = sorted({t for t in tasks if tasks.count(t) > 1})
        if duplicates:
            raise ValueError(f"sim.tasks lists {', '.join(duplicates)} more than once")
        return tasks
    return suite_tasks(sim_config.suite, backend)


def sim_tasks(instructions: list[str]) -> list[str]:
    """Simulator task names of a dataset's instructions: the registered simulators' tables, one after another (Meta-World's
    first: LIBERO's, seconds to import, only for an instruction it lacks)."""
    from worldloop.config import ConfigError

    by_instruction: dict[str, str] = {}
    for _, table in task_tables():
        if all(text in by_instruction for text in instructions):
            break
        by_instruction.update({text: task for task, text in table.instructions().items() if text not in by_instruction})
    unknown = [text for text in instructions if text not in by_instruction]
    if unknown:
        raise ConfigError(f"instructions {unknown[:3]} are not simulator tasks: --policy rollouts need the simulator's tasks")
    return [by_instruction[text] for text in instructions]
