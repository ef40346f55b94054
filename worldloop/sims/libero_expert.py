"""Scripted pick-and-place experts for LIBERO-Spatial, LIBERO-Object and part of LIBERO-Goal, driven by the simulator's object poses.

Every LIBERO-Spatial task is "pick up the black bowl <somewhere> and place it on the plate": the
goal predicate ``(On <bowl> <plate>)`` names the bowl and the plate. The expert grasps the bowl's
rim from above on the side with the most free space (the gripper's fingers close along the radius,
so the wrist yaws 90 degrees for the +-x sides; a bowl in the cabinet's open drawer is grasped toward a front
corner of the drawer, the fingers half open), lifts it clear of whatever it stood on or in,
carries it over the plate while tracking where the held bowl actually is, lowers it and lets go.

LIBERO-Object's expert (:class:`ObjectExpert`) picks a grocery item into the basket; LIBERO-Goal's
(:class:`GoalExpert`) reuses the bowl's pick-and-place for the Goal tasks that move the bowl onto the plate, the
stove or the cabinet, the grocery item's for the cream cheese into the bowl and the wine bottle onto the cabinet,
and refuses the others by name.

Actions are LIBERO's 7-dim OSC_POSE deltas in [-1, 1]: xyz (x 0.05 m), rotation as a world-frame
axis-angle (x 0.5 rad), gripper (-1 open, +1 close). This module imports no torch: simulator worker
processes use it.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

POSITION_SCALE = 0.05
"""Metres of end-effector motion per unit of position action (OSC_POSE's output range)."""
ROTATION_SCALE = 0.5
"""Radians of rotation per unit of rotation action."""
RIM_RADIUS = 0.05
"""Distance from the bowl's centre to the point between the fingertips at the grasp (m)."""
GRASP_HEIGHT = 0.032
"""Height of the fingertips above the bowl's origin at the grasp (the rim is ~5.3 cm high)."""
CLEARANCE = 0.10
"""Height above the bowl's rim at which the gripper approaches and carries (m)."""
DROPPED = 0.04
"""The bowl has left the hand when it moved this far (m) from where it was held."""
OPEN, CLOSE = -1.0, 1.0

HIGHEST = 1.22
"""Highest travel height (world z, m): above it the arm reaches the far side of the table (the cabinet) only slowly."""
TABLE_HEIGHT = 0.9
"""World z of the table top in LIBERO's table scenes (m)."""
TRAVEL_HEIGHT = 1.12
"""Lowest height (world z, m) at which the gripper travels between objects: above the wooden cabinet's sides."""
OBSTACLE_RADII = {"wooden_cabinet": 0.17, "flat_stove": 0.12, "cookies": 0.08}
"""Rough horizontal extent (m) of the larger things next to a bowl; anything else counts 0.05."""


def obstacle_radius(name: str) -> float:
    return next((r for prefix, r in OBSTACLE_RADII.items() if name.startswith(prefix)), 0.05)


DRAWER_REACH = 0.2
"""A bowl closer than this (m, horizontally) to the wooden cabinet's centre lies in its open drawer (or on the cabinet)."""
DRAWER_CORNER = np.array([np.cos(np.radians(30)), np.sin(np.radians(30))])
"""Grasp direction (in the wooden cabinet's frame, up to signs) for a bowl in its top drawer: 30 degrees from across
the drawer toward its front, between the side wall and the front panel."""
DRAWER_OPENING = 0.02
"""How far (m) each finger stands open while reaching into the drawer (fully open: 0.04): the outer finger then
clears the drawer's walls by ~2 cm; the rim is 3 mm thick."""
CABINET_TOP = 0.2
"""A bowl lower than this (m) above the wooden cabinet's origin lies in its top drawer, not on the cabinet."""

SIDES = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
"""Directions (world xy) from the bowl's centre to the candidate grasp points."""


class _PoseExpert:
    """Moves the end effector toward a target position, the wrist toward ``target_rotation``, step by step."""

    phase: str
    phase_steps: int
    target_rotation: Rotation

    def _next(self, phase: str) -> None:
        self.phase, self.phase_steps = phase, 0

    def _reached(self, position: np.ndarray, target: np.ndarray, tolerance: float) -> bool:
        return bool(np.linalg.norm(np.asarray(target) - position) < tolerance)

    def _turned(self, rotation: Rotation) -> bool:
        return (self.target_rotation * rotation.inv()).magnitude() < 0.1

    def _action(self, eef: np.ndarray, rotation: Rotation, target: np.ndarray, gripper: float) -> np.ndarray:
        move = (np.asarray(target) - eef) / POSITION_SCALE * 1.5
        turn = (self.target_rotation * rotation.inv()).as_rotvec() / ROTATION_SCALE
        action = np.concatenate([np.clip(move, -1, 1), np.clip(turn, -1, 1), [gripper]])
        return action.astype(np.float32)


class SpatialExpert(_PoseExpert):
    """Closed-loop expert for one LIBERO-Spatial episode: call :meth:`get_action` with each observation.

    Phases: approach (above the grasp point at travel height, wrist turned), descend, close, lift, carry (the held
    bowl over the plate), lower, release. A descent blocked on one side tries the next; a bowl that slips out is
    grasped again."""

    def __init__(self, bowl: str, plate: str, obstacles: list[str]):
        self.bowl, self.plate, self.obstacles = bowl, plate, obstacles
        self.phase = "approach"
        self.phase_steps = 0
        self.side: np.ndarray | None = None
        self.sides: list[np.ndarray] = []  # grasp sides not tried yet, best first
        self.home_rotation: Rotation | None = None
        self.target_rotation: Rotation | None = None
        self.hold_offset: np.ndarray | None = None  # end effector minus bowl while held (world)
        self.lift_z = 0.0
        self.opening: float | None = None  # how far each finger stands open before the grasp (None: fully)

    @classmethod
    def for_env(cls, env) -> "SpatialExpert":
        """The expert for a LIBERO ``ControlEnv``'s goal ``(On bowl plate)``; other objects are obstacles."""
        goal = env.env.parsed_problem["goal_state"]
        if len(goal) != 1 or goal[0][0].lower() != "on":
            raise ValueError(f"the Spatial expert handles one (On object target) goal, got {goal}")
        _, bowl, plate = goal[0]
        names = list(env.env.objects_dict) + list(env.env.fixtures_dict)
        return cls(bowl, plate, [n for n in names if n not in (bowl, plate)])

    # ------------------------------------------------------------------------------------------

    def _rank_sides(self, observation: dict, positions: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Grasp sides, best first: by how far the rim point is from every other object's extent."""
        bowl = observation[f"{self.bowl}_pos"]
        centre = bowl[:2]
        cabinet = next((n for n in self.obstacles if n.startswith("wooden_cabinet") and n in positions), None)
        raised = bowl[2] > TABLE_HEIGHT + 0.08
        if cabinet is not None and raised and np.linalg.norm(centre - positions[cabinet][:2]) < DRAWER_REACH:
            if bowl[2] - positions[cabinet][2] < CABINET_TOP:
                # In the open top drawer, which slides out along the cabinet's -y axis. The open hand's outer finger
                # reaches ~10 cm from the bowl's centre: straight across the drawer (the cabinet's x axis) it grazes
                # the side wall, straight along it the front panel; toward a front corner it clears both. The corner
                # nearer the robot (at -x) first: the far side is at the edge of the arm's reach.
                yaw = Rotation.from_quat(observation["quaternions"][cabinet], scalar_first=True).as_euler("xyz")[2]
                corners = [DRAWER_CORNER * [1, -1], DRAWER_CORNER * [-1, -1]]
                sides = [Rotation.from_euler("z", yaw).apply([*corner, 0.0])[:2] for corner in corners]
                self.opening = DRAWER_OPENING
                return sorted(sides, key=lambda side: side[0])
            return [SIDES[0], SIDES[1]]  # on the cabinet: from +x, then -x
        others = [(positions[n][:2], obstacle_radius(n)) for n in self.obstacles + [self.plate] if n in positions]
        scores = [min((np.linalg.norm(centre + RIM_RADIUS * side - o) - radius for o, radius in others), default=1.0) for side in SIDES]
        return [SIDES[i] for i in sorted(range(len(SIDES)), key=lambda i: (-round(scores[i], 3), i))]

    def _use_side(self, side: np.ndarray) -> None:
        self.side = side
        # the fingers close along world y at the start: turn them to close along `side`, by at most 90 degrees either way
        yaw = np.pi / 2 - (np.pi - np.arctan2(side[1], side[0])) % np.pi
        self.target_rotation = Rotation.from_euler("z", yaw) * self.home_rotation

    def _destination(self, observation: dict) -> np.ndarray:
        """Where the bowl's origin (its bottom's centre) goes, 1.5 cm below the point of release: the plate's origin."""
        return observation[f"{self.plate}_pos"]

    def get_action(self, observation: dict) -> np.ndarray:
        """The (7,) float32 action for ``observation``: LIBERO's observation dict, plus ``"positions"`` and
        ``"quaternions"`` (wxyz), the world pose of every object and fixture (the obstacles)."""
        positions = observation["positions"]
        eef = observation["robot0_eef_pos"]
        rotation = Rotation.from_quat(observation["robot0_eef_quat"])  # robosuite quats are xyzw
        bowl = observation[f"{self.bowl}_pos"]
        plate = self._destination(observation)
        if self.home_rotation is None:
            self.home_rotation = rotation
            self.sides = self._rank_sides(observation, positions)
            self._use_side(self.sides.pop(0))
            self.lift_z = min(max(max(bowl[2], plate[2]) + GRASP_HEIGHT + CLEARANCE, TRAVEL_HEIGHT), HIGHEST)
        grasp = np.array([*(bowl[:2] + RIM_RADIUS * self.side), bowl[2] + GRASP_HEIGHT])
        gripper = OPEN if self.opening is None or self.phase not in ("approach", "descend") else self._half_open(observation)
        phase = self.phase
        if phase == "approach":  # above the grasp point at travel height, wrist turned
            target = np.array([grasp[0], grasp[1], self.lift_z])
            if self._reached(eef, target, 0.015) and self._turned(rotation) or self.phase_steps > 60:
                self._next("descend")
        elif phase == "descend":
            target = grasp
            blocked = self.phase_steps > 25 and eef[2] > grasp[2] + 0.02
            if blocked and self.sides:  # something is in the way on this side: try the next one
                self._use_side(self.sides.pop(0))
                self._next("approach")
            elif self._reached(eef, target, 0.008) or self.phase_steps > 40:
                self._next("close")
        elif phase == "close":
            target, gripper = grasp, CLOSE
            if self.phase_steps >= 10:
                self.hold_offset = eef - bowl
                self._next("lift")
        elif phase in ("lift", "carry", "lower") and self.phase_steps > 5 and np.linalg.norm(eef - bowl - self.hold_offset) > DROPPED:
            target = eef  # the bowl slipped out: open up and grasp again
            self._next("approach")
        elif phase == "lift":
            target, gripper = np.array([grasp[0], grasp[1], self.lift_z]), CLOSE
            if eef[2] > self.lift_z - 0.02 or self.phase_steps > 40:
                self._next("carry")
        elif phase == "carry":  # the held bowl's centre over the plate's
            offset = eef - bowl
            target, gripper = np.array([plate[0] + offset[0], plate[1] + offset[1], self.lift_z]), CLOSE
            if self._reached(eef[:2], target[:2], 0.01) or self.phase_steps > 80:
                self._next("lower")
        elif phase == "lower":
            offset = eef - bowl
            target, gripper = np.array([plate[0] + offset[0], plate[1] + offset[1], plate[2] + offset[2] + 0.015]), CLOSE
            if eef[2] < target[2] + 0.01 or self.phase_steps > 40:
                self._next("release")
        else:  # release, then back off upwards
            target = eef + [0, 0, 0.02] if self.phase_steps > 5 else eef
        self.phase_steps += 1
        return self._action(eef, rotation, target, gripper)

    def _half_open(self, observation: dict) -> float:
        """The gripper command that brings the fingers to ``self.opening``: robosuite moves the fingers' target a
        quarter of their travel per step while the command is +-1 and holds it at 0."""
        finger = observation["robot0_gripper_qpos"][0]
        return CLOSE if finger > self.opening + 0.003 else OPEN if finger < self.opening - 0.003 else 0.0


OBJECT_TRAVEL_HEIGHT = 0.30
"""World z (m) at which the gripper approaches an object on the floor of LIBERO-Object's scenes."""
BASKET_RIM = 0.141
"""Height (m) of the basket's rim above the floor."""
BASKET_FLOOR = 0.06
"""Height (m) above the floor at which the held object's bottom is let go inside the basket."""
GRASP_DEPTH = 0.045
"""How far (m) below an object's top the fingertips close (at most half its height)."""
TALL = 0.12
"""An object taller than this (m) is a light bottle or carton that tips over when the hand presses on its top."""
TALL_GRASP_DEPTH = 0.025
"""How far (m) below a tall object's top the fingertips close: the hand's underside, 3 cm above the point between
the fingertips, stays clear of the top; the finger pads reach 1.3 to 2.9 cm below it."""
OBJECT_COVERED = ("alphabet_soup", "cream_cheese", "salad_dressing", "bbq_sauce", "ketchup", "tomato_sauce", "butter", "milk",
                  "chocolate_pudding", "orange_juice")
"""Objects the LIBERO-Object expert picks: those of LIBERO-Object's ten tasks. A goal with any other object is refused by name."""


def collision_extent(env, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The lower and upper corners of object ``name``'s collision geometry, in its own frame."""
    import mujoco

    model, data = env.env.sim.model._model, env.env.sim.data._data
    body = env.env.obj_body_id[name]
    rotation, origin = data.xmat[body].reshape(3, 3), data.xpos[body]
    lows, highs = [], []
    for geom in range(model.ngeom):
        if model.body_rootid[model.geom_bodyid[geom]] != model.body_rootid[body] or not (model.geom_contype[geom] or model.geom_conaffinity[geom]):
            continue
        centre = rotation.T @ (data.geom_xpos[geom] - origin)
        box = model.geom_type[geom] == mujoco.mjtGeom.mjGEOM_BOX
        half = np.abs(rotation.T @ data.geom_xmat[geom].reshape(3, 3)) @ model.geom_size[geom] if box else np.full(3, model.geom_rbound[geom])
        lows.append(centre - half)
        highs.append(centre + half)
    return np.min(lows, 0), np.max(highs, 0)


class ObjectExpert(_PoseExpert):
    """Closed-loop expert for one LIBERO-Object episode: "pick up the <object> and place it in the basket".

    The goal ``(In <object> basket_1_contain_region)`` names both. The expert grasps the object from above at its
    centre, fingers closing across its narrower horizontal side, a few centimetres below its top (a tall bottle or
    carton 2.5 cm below it, by its cap or gable, so that the hand does not press on it and tip it over); lifts it until
    its bottom clears the basket's rim; carries it (the held object's centre, not the hand) over the basket's centre,
    lowers it inside and lets go. An object that slips out is grasped again. The object's extent comes from its
    collision geometry, in its own frame (the bottles and cans stand along their own y axis), its height along the
    axis that stands closest to vertical."""

    def __init__(self, target: str, basket: str, extent: tuple[np.ndarray, np.ndarray]):
        self.target, self.basket = target, basket
        self.rim, self.floor = BASKET_RIM, BASKET_FLOOR  # the heights the held object clears and is let go above
        self.low, self.high = extent  # the object's collision geometry's corners, in its own frame
        self.phase, self.phase_steps = "approach", 0
        self.depth: float | None = None  # how far below the object's top it is grasped: chosen at the first step
        self.hold_offset: np.ndarray | None = None
        self.carry_z = 0.0

    @classmethod
    def for_env(cls, env) -> "ObjectExpert":
        """The expert for a LIBERO ``ControlEnv``'s goal ``(In object basket_contain_region)``."""
        goal = env.env.parsed_problem["goal_state"]
        if len(goal) != 1 or goal[0][0].lower() != "in" or not goal[0][2].endswith("_contain_region"):
            raise ValueError(f"the Object expert handles one (In object basket_contain_region) goal, got {goal}")
        _, target, region = goal[0]
        if not target.startswith(OBJECT_COVERED):
            raise ValueError(f"the LIBERO-Object expert does not pick '{target}'; it covers {', '.join(OBJECT_COVERED)}")
        return cls(target, region.removesuffix("_contain_region"), collision_extent(env, target))

    def _destination(self, observation: dict) -> np.ndarray:
        """The point the held object's centre is carried over: the basket's origin."""
        return observation["positions"][self.basket]

    def get_action(self, observation: dict) -> np.ndarray:
        """The (7,) float32 action for ``observation`` (LIBERO's observation dict plus ``"positions"``)."""
        eef = observation["robot0_eef_pos"]
        rotation = Rotation.from_quat(observation["robot0_eef_quat"])
        orientation = Rotation.from_quat(observation[f"{self.target}_quat"])
        basket = self._destination(observation)
        size = self.high - self.low  # in the object's frame: a bottle stands along its own y axis
        vertical = int(np.argmax(np.abs(orientation.as_matrix()[2])))  # the object's axis closest to world z
        height = size[vertical]
        centre = observation[f"{self.target}_pos"] + orientation.apply((self.low + self.high) / 2)
        top = centre[2] + height / 2
        if self.depth is None:
            first, second = (axis for axis in range(3) if axis != vertical)
            across = orientation.apply(np.eye(3)[first if size[first] <= size[second] else second])  # the narrower side
            yaw = np.pi / 2 - (np.pi - np.arctan2(across[1], across[0])) % np.pi  # fingers close along world y at the start
            self.target_rotation = Rotation.from_euler("z", yaw) * rotation
            self.depth = TALL_GRASP_DEPTH if height > TALL else min(GRASP_DEPTH, height / 2)
            self.carry_z = self.rim + 0.04 + height - self.depth  # the held object's bottom 4 cm above the rim
        grasp = np.array([centre[0], centre[1], top - self.depth])
        gripper = OPEN
        phase = self.phase
        if phase == "approach":
            target = np.array([grasp[0], grasp[1], max(OBJECT_TRAVEL_HEIGHT, self.carry_z)])
            if self._reached(eef, target, 0.015) and self._turned(rotation) or self.phase_steps > 60:
                self._next("descend")
        elif phase == "descend":
            target = grasp
            if self._reached(eef, target, 0.008) or self.phase_steps > 40:
                self._next("close")
        elif phase == "close":
            target, gripper = grasp, CLOSE
            if self.phase_steps >= 10:
                self.hold_offset = eef - centre
                self._next("lift")
        elif phase in ("lift", "carry", "lower") and self.phase_steps > 5 and np.linalg.norm(eef - centre - self.hold_offset) > DROPPED:
            target = eef  # it slipped out: open up and grasp again
            self._next("approach")
        elif phase == "lift":
            target, gripper = np.array([grasp[0], grasp[1], self.carry_z]), CLOSE
            if eef[2] > self.carry_z - 0.02 or self.phase_steps > 40:
                self._next("carry")
        elif phase == "carry":  # the held object's centre over the basket's
            offset = eef - centre
            target, gripper = np.array([basket[0] + offset[0], basket[1] + offset[1], self.carry_z]), CLOSE
            if self._reached(eef[:2], target[:2], 0.01) or self.phase_steps > 80:
                self._next("lower")
        elif phase == "lower":  # the object's bottom 6 cm above the floor, inside the basket
            offset = eef - centre
            target, gripper = np.array([basket[0] + offset[0], basket[1] + offset[1], self.floor + height / 2 + offset[2]]), CLOSE
            if eef[2] < target[2] + 0.01 or self.phase_steps > 30:
                self._next("release")
        else:  # release, then back off upwards
            target = eef + [0, 0, 0.02] if self.phase_steps > 5 else eef
        self.phase_steps += 1
        return self._action(eef, rotation, target, gripper)


GOAL_BOWL = "akita_black_bowl_1"
"""The black bowl of LIBERO-Goal's kitchen scene."""
GOAL_BOWL_TARGETS = ("plate_1", "flat_stove_1_cook_region", "wooden_cabinet_1_top_side")
"""Where the LIBERO-Goal expert puts the bowl: the goals ``(On akita_black_bowl_1 <target>)`` it covers (tasks 8, 1
and 4). Opening a drawer, turning on the stove, pushing the plate, the bowl into the top drawer and the wine bottle
into the rack are refused by name."""
SURFACE_PROBE = 0.3
"""Height (m) above a region's site from which a ray, cast straight down, finds the surface the bowl stands on."""


GOAL_CHEESE = "cream_cheese_1"
"""The cream cheese of LIBERO-Goal's kitchen scene; the goal ``(On cream_cheese_1 akita_black_bowl_1)`` is task 6."""
GOAL_BOTTLE = "wine_bottle_1"
"""The wine bottle of LIBERO-Goal's kitchen scene; the goal ``(On wine_bottle_1 wooden_cabinet_1_top_side)`` is task 2."""
GOAL_CABINET_TOP = "wooden_cabinet_1_top_side"
"""The region on top of the wooden cabinet."""
DROP = 0.01
"""Height (m) above the surface it goes on (the bowl's floor, taken as its origin; the cabinet's top) at which the
held object's bottom is let go."""


class _PlaceExpert(ObjectExpert):
    """:class:`ObjectExpert` toward something other than a basket: the held object is carried with its bottom 4 cm
    above ``rim`` (world z) over ``destination`` (an object's name, followed as it moves, or a fixed point) and let go
    with its bottom ``DROP`` above ``floor``."""

    def __init__(self, target: str, destination: str | np.ndarray, extent: tuple[np.ndarray, np.ndarray], rim: float, floor: float):
        super().__init__(target, destination if isinstance(destination, str) else "", extent)
        self.point = None if isinstance(destination, str) else np.asarray(destination, dtype=np.float64)
        self.rim, self.floor = rim, floor + DROP

    def _destination(self, observation: dict) -> np.ndarray:
        return observation[f"{self.basket}_pos"] if self.point is None else self.point


class _BowlToRegionExpert(SpatialExpert):
    """:class:`SpatialExpert` whose destination is a fixed point on a fixture (the stove's burner, the cabinet's top)
    instead of a plate: the region site's centre, at the height of the surface under it."""

    def __init__(self, bowl: str, region: str, point: np.ndarray, obstacles: list[str]):
        super().__init__(bowl, region, obstacles)
        self.point = np.asarray(point, dtype=np.float64)

    def _destination(self, observation: dict) -> np.ndarray:
        return self.point


def surface_under(env, site: str) -> np.ndarray:
    """The first collision surface straight below ``site`` (a ray from ``SURFACE_PROBE`` above it, robot excluded)."""
    import mujoco

    model, data = env.env.sim.model._model, env.env.sim.data._data
    start = np.array(env.env.sim.data.get_site_xpos(site), dtype=np.float64) + [0, 0, SURFACE_PROBE]
    geom = np.array([-1], dtype=np.int32)
    collision = np.array([1, 0, 0, 0, 0, 0], dtype=np.uint8)  # geom group 0: robosuite's collision geoms
    distance = mujoco.mj_ray(model, data, start, np.array([0, 0, -1.0]), collision, 1, -1, geom)
    if distance < 0:
        raise ValueError(f"no surface under the region '{site}'")
    return start - [0, 0, distance]


class GoalExpert:
    """Closed-loop expert for the LIBERO-Goal tasks that put the black bowl on the plate, on the stove or on top of
    the cabinet (the goals ``(On akita_black_bowl_1 <target>)``, ``GOAL_BOWL_TARGETS``): :class:`SpatialExpert`'s
    grasp, lift, carry, lower and release, toward the plate's origin or a region's centre on its fixture; and the one
    that put the cream cheese in the bowl and the wine bottle on top of the cabinet (``(On cream_cheese_1
    akita_black_bowl_1)``, ``(On wine_bottle_1 wooden_cabinet_1_top_side)``): :class:`ObjectExpert`'s, the bowl or
    the cabinet's top for the basket. Any other goal is refused by name with a ValueError."""

    def __init__(self, expert: _PoseExpert):
        self.expert = expert

    @classmethod
    def for_env(cls, env) -> "GoalExpert":
        goal = env.env.parsed_problem["goal_state"]
        covered = ", ".join([f"(On {GOAL_BOWL} {target})" for target in GOAL_BOWL_TARGETS]
                            + [f"(On {GOAL_CHEESE} {GOAL_BOWL})", f"(On {GOAL_BOTTLE} {GOAL_CABINET_TOP})"])
        if len(goal) == 1 and [part.lower() for part in goal[0]] == ["on", GOAL_CHEESE, GOAL_BOWL]:
            bowl = env.env.sim.data.body_xpos[env.env.obj_body_id[GOAL_BOWL]]
            rim = bowl[2] + collision_extent(env, GOAL_BOWL)[1][2]  # the bowl stands upright: its frame's z is world z
            return cls(_PlaceExpert(GOAL_CHEESE, GOAL_BOWL, collision_extent(env, GOAL_CHEESE), rim, bowl[2]))
        if len(goal) == 1 and [part.lower() for part in goal[0]] == ["on", GOAL_BOTTLE, GOAL_CABINET_TOP]:
            top = surface_under(env, GOAL_CABINET_TOP)
            return cls(_PlaceExpert(GOAL_BOTTLE, top, collision_extent(env, GOAL_BOTTLE), top[2], top[2]))
        if len(goal) != 1 or [part.lower() for part in goal[0][:2]] != ["on", GOAL_BOWL] or goal[0][2] not in GOAL_BOWL_TARGETS:
            described = " ".join("(" + " ".join(predicate) + ")" for predicate in goal)
            raise ValueError(f"the LIBERO-Goal expert does not cover the goal {described}; it covers {covered}")
        _, bowl, target = goal[0]
        names = list(env.env.objects_dict) + list(env.env.fixtures_dict)
        obstacles = [n for n in names if n not in (bowl, target)]
        if target in env.env.objects_dict:
            return cls(SpatialExpert(bowl, target, obstacles))
        return cls(_BowlToRegionExpert(bowl, target, surface_under(env, target), obstacles))

    def get_action(self, observation: dict) -> np.ndarray:
        """The (7,) float32 action for ``observation`` (LIBERO's observation dict plus ``"positions"`` and ``"quaternions"``)."""
        return self.expert.get_action(observation)
