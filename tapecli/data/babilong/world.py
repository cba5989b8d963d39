"""bAbI's world simulator for tasks qa1-qa5, written after facebookarchive/bAbI-tasks (the Lua generator: `World.lua`,
`actions.lua`, `stringify.lua`, `tasks/worlds/world_basic.txt`, `tasks/{WhereIsActor,WhereIsObject,WhereWasObject,
IsDir,WhoWhatGave}.lua`), with the sentences of the released v1.2 data that BABILong hides in its haystacks.

`story(task, rng)` simulates one story and returns a `Story`: the facts (sentences) up to one question, the question,
its one-word answer and the indices of its supporting facts. As BABILong splits a bAbI story with several questions
into one sample per question (keeping the facts, dropping the earlier questions), the question is drawn uniformly
from the story's five (qa4: its one).

The world (world_basic.txt): six locations (bathroom, bedroom, garden, hallway, kitchen, office); the gettable objects
apple, football and milk; the actors Daniel, John, Mary and Sandra. Actors start at random locations, which the reader
is never told. The actions and when they are valid (actions.lua):

- move(actor, location): the actor is not already there (`Teleport`).
- get(actor, object): the object lies at the actor's location (`Get`; an object someone holds cannot be taken).
- drop(actor, object): the actor holds it (`Drop`); it then lies where the actor is.
- give(actor, object, recipient): the actor holds it, the recipient is another actor at the same location (`Give`).

Each clause is drawn as the Lua `Clause.sample_valid` draws it: uniformly among the valid (actor, arguments) of the
action chosen. The reader knows an actor's location from the actor's last move in the story; an object's location
from who holds it (and where that actor is known to be) or where it was dropped (knowledge in `Knowledge.lua`). A
question is only asked about what the story has told.

The tasks (their Lua files, and where tape departs from them):

- qa1, single supporting fact (`WhereIsActor`): two moves, then "Where is ACTOR?" about an actor whose location is
  known, five times. Answer: the location; support: the actor's last move.
- qa2, two supporting facts (`WhereIsObject`): a random action (get, drop or move, each 1/3) per line; after more than
  two lines since the last question, with probability 1/2, "Where is the OBJECT?" about an object whose location is
  known. The Lua code asks only about held objects; the released data (and tape) also ask about dropped ones,
  supported by the drop and the dropper's last move ("Mary dropped the football. ... Where is the football? garden
  12 6"). Support: the get (or give, or drop) and the holder's last move.
- qa3, three supporting facts (`WhereWasObject`): qa2's actions; the question "Where was the OBJECT before the
  LOCATION?" about an object the reader has seen in at least two places, asks for the place before the last (the
  Lua code's last two entries of the object's history). An object's history restarts when it moves with an actor
  whose location the reader does not know (the Lua code leaves this open: "TODO Need to resolve is_in for held
  objects").
- qa4, two-argument relations (`IsDir`): three of the six locations on a line running north or east; the two facts
  "The A is north of the B." (or the same relation from the other side, "The B is south of the A."), in random
  order; one of four questions about one of the two relations ("What is north of the B?", "What is the A north
  of?", and their opposites), as `EvalDir` renders them.
- qa5, three-argument relations (`WhoWhatGave`): a random action (get, give or move, each 1/3) per line; the released
  data's actors Bill, Fred, Jeff and Mary (the Lua world has John, Mary, Sandra and Daniel; BABILong's scoring lists
  the released names). After a give, when more than two lines have passed since the last question, a question about
  that give: "What did A give to R?", "Who gave the O to R?", "Who did A give the O to?", "Who received the O?",
  "Who gave the O?" (the Lua code's three plus the released data's other two). The Lua code shuffles the lines since
  the last question before asking, which can put a give before the get it needs; tape keeps the story in order and
  lets zero to two more non-give lines follow the give before its question (as BABILong's examples read). With no
  give in between, "latest give" is always the question's give.

Sentences are those of the released v1.2 data: moves "moved to / went to / journeyed to / travelled to / went back to
the L." (the Lua templates lack "went back to"), gets "got / took / picked up / grabbed the O there.", drops "dropped /
put down / discarded / left the O.", gives "gave / passed / handed the O to R." (the Lua template reads "A gave R the
O"), relations "The A is north/south/east/west of the B." Each sentence's wording is drawn uniformly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tapecli.errors import TapeError

TASKS = ("qa1", "qa2", "qa3", "qa4", "qa5")
LOCATIONS = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
OBJECTS = ("apple", "football", "milk")
OBJECT_START = {"apple": "kitchen", "football": "garden", "milk": "kitchen"}  # world_basic.txt
ACTORS = ("Daniel", "John", "Mary", "Sandra")
GIVE_ACTORS = ("Bill", "Fred", "Jeff", "Mary")
QUESTIONS_PER_STORY = 5

MOVE = ("{a} moved to the {l}.", "{a} went to the {l}.", "{a} journeyed to the {l}.", "{a} travelled to the {l}.",
        "{a} went back to the {l}.")
GET = ("{a} got the {o} there.", "{a} took the {o} there.", "{a} picked up the {o} there.",
       "{a} grabbed the {o} there.")
DROP = ("{a} dropped the {o}.", "{a} put down the {o}.", "{a} discarded the {o}.", "{a} left the {o}.")
GIVE = ("{a} gave the {o} to {r}.", "{a} passed the {o} to {r}.", "{a} handed the {o} to {r}.")
DIRECTION_NAMES = {"n": "north", "s": "south", "e": "east", "w": "west"}
OPPOSITE = {"n": "s", "s": "n", "e": "w", "w": "e"}
GIVE_QUESTIONS = (("What did {a} give to {r}?", "o"), ("Who gave the {o} to {r}?", "a"),
                  ("Who did {a} give the {o} to?", "r"), ("Who received the {o}?", "r"), ("Who gave the {o}?", "a"))


def resolve_tasks(spec: str, option: str = "--tasks") -> list[str]:
    """`all` or comma-separated qa1..qa5, checked; one line naming `option` otherwise."""
    from tapecli import commas

    names = list(TASKS) if spec.strip() == "all" else commas.split(spec, option)
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise TapeError(f"{option}: unknown task {', '.join(unknown) or repr(spec)}; known: all, {', '.join(TASKS)}")
    return list(dict.fromkeys(names))


@dataclass
class Story:
    """One BABILong sample's bAbI part: the facts before its question, the question, the answer, the supporting
    facts (indices into `facts`)."""

    task: str
    facts: list[str]
    question: str
    answer: str
    support: list[int] = field(default_factory=list)


@dataclass
class _Clause:
    action: str  # move, get, drop, give
    actor: str
    arg: str  # the location or the object
    recipient: str | None = None


class World:
    """The true state (where every actor is, who holds or where lies every object) and the reader's knowledge (what
    the story has told), updated clause by clause."""

    def __init__(self, actors: tuple[str, ...], rng: random.Random) -> None:
        self.actors, self.rng = actors, rng
        self.location = {a: rng.choice(LOCATIONS) for a in actors}
        self.holder: dict[str, str | None] = dict.fromkeys(OBJECTS)  # the actor holding it, or None
        self.lies = dict(OBJECT_START)  # where an object no one holds lies
        self.facts: list[str] = []
        self.known_move: dict[str, int] = {}  # actor -> index of the fact that placed it (its last move)
        # object -> ("held", actor, fact) | ("at", location, drop fact, dropper's move fact) | None (unknown)
        self.known: dict[str, tuple | None] = dict.fromkeys(OBJECTS)
        self.history: dict[str, list[tuple[str, int]]] = {o: [] for o in OBJECTS}  # places seen, with their facts

    # -- the actions and their validity (actions.lua) --------------------------------------------------------------
    def valid(self, action: str) -> list[_Clause]:
        actors = self.actors
        if action == "move":
            return [_Clause("move", a, loc) for a in actors for loc in LOCATIONS if self.location[a] != loc]
        if action == "get":
            return [_Clause("get", a, o) for a in actors for o in OBJECTS
                    if self.holder[o] is None and self.lies[o] == self.location[a]]
        if action == "drop":
            return [_Clause("drop", a, o) for a in actors for o in OBJECTS if self.holder[o] == a]
        return [_Clause("give", a, o, r) for a in actors for o in OBJECTS for r in actors
                if self.holder[o] == a and r != a and self.location[r] == self.location[a]]

    def sample(self, actions: tuple[str, ...]) -> _Clause:
        """A random action (uniform over `actions`), then a valid clause of it (uniform); another action while the
        drawn one has none (the Lua `while not clause`)."""
        while True:
            options = self.valid(self.rng.choice(actions))
            if options:
                return self.rng.choice(options)

    def perform(self, clause: _Clause) -> int:
        """Apply a clause to the world and to the reader's knowledge; returns the index of its fact."""
        rng, index = self.rng, len(self.facts)
        a, arg = clause.actor, clause.arg
        if clause.action == "move":
            self.facts.append(rng.choice(MOVE).format(a=a, l=arg))
            self.location[a] = arg
            self.known_move[a] = index
            for o in OBJECTS:  # what the actor carries moves along
                if self.holder[o] == a:
                    self._seen(o, arg, index)
        elif clause.action == "get":
            self.facts.append(rng.choice(GET).format(a=a, o=arg))
            self.holder[arg] = a
            self.known[arg] = ("held", a, index)
            self._carried_by(arg, a, index)
        elif clause.action == "drop":
            self.facts.append(rng.choice(DROP).format(a=a, o=arg))
            self.holder[arg], self.lies[arg] = None, self.location[a]
            move = self.known_move.get(a)
            self.known[arg] = ("at", self.location[a], index, move) if move is not None else None
            if move is None:
                self.history[arg] = []
        else:
            r = clause.recipient
            self.facts.append(rng.choice(GIVE).format(a=a, o=arg, r=r))
            self.holder[arg] = r
            self.known[arg] = ("held", r, index)
            self._carried_by(arg, r, index)
        return index

    def _carried_by(self, o: str, actor: str, index: int) -> None:
        """The object is now with `actor`: seen at the actor's known place, or its history restarts."""
        if actor in self.known_move:
            self._seen(o, self.location[actor], index)
        else:
            self.history[o] = []

    def _seen(self, o: str, place: str, index: int) -> None:
        if not self.history[o] or self.history[o][-1][0] != place:
            self.history[o].append((place, index))

    # -- what the reader knows -------------------------------------------------------------------------------------
    def object_place(self, o: str) -> tuple[str, list[int]] | None:
        """(location, supporting facts) of an object as the story tells it, or None."""
        known = self.known[o]
        if known is None:
            return None
        if known[0] == "held":
            holder, fact = known[1], known[2]
            if holder not in self.known_move:
                return None
            return self.location[holder], sorted({fact, self.known_move[holder]})
        return known[1], sorted({known[2], known[3]})


def story(task: str, rng: random.Random) -> Story:
    """One sample of `task` (qa1-qa5): see the module docstring."""
    if task == "qa4":
        return _directions(rng)
    asked = rng.randrange(QUESTIONS_PER_STORY)
    world = World(GIVE_ACTORS if task == "qa5" else ACTORS, rng)
    make = {"qa1": _where_is_actor, "qa2": _where_is_object, "qa3": _where_was_object, "qa5": _who_what_gave}[task]
    for number, (question, answer, support) in enumerate(make(world)):
        if number == asked:
            return Story(task, list(world.facts), question, answer, support)
    raise AssertionError("unreachable: every generator asks five questions")


def _where_is_actor(world: World):
    """WhereIsActor.lua: two moves, then a question, five times."""
    while True:
        for _ in range(2):
            world.perform(world.sample(("move",)))
        actor = world.rng.choice(sorted(world.known_move))
        yield f"Where is {actor}?", world.location[actor], [world.known_move[actor]]


def _where_is_object(world: World):
    """WhereIsObject.lua, asking about dropped objects too (see the module docstring)."""
    since = 0
    while True:
        world.perform(world.sample(("get", "drop", "move")))
        since += 1
        if since > 2 and world.rng.randrange(2) == 0:
            known = [o for o in OBJECTS if world.object_place(o) is not None]
            if known:
                o = world.rng.choice(known)
                place, support = world.object_place(o)
                yield f"Where is the {o}?", place, support
                since = 0


def _where_was_object(world: World):
    """WhereWasObject.lua: the place before the object's last place."""
    since = 0
    while True:
        world.perform(world.sample(("get", "drop", "move")))
        since += 1
        if since > 2 and world.rng.randrange(2) == 0:
            known = [o for o in OBJECTS if len(world.history[o]) > 1]
            if known:
                o = world.rng.choice(known)
                (before, fact_before), (last, fact_last) = world.history[o][-2:]
                yield f"Where was the {o} before the {last}?", before, sorted({fact_before, fact_last})
                since = 0


def _who_what_gave(world: World):
    """WhoWhatGave.lua, in story order (see the module docstring)."""
    since = 0
    while True:
        clause = world.sample(("get", "give", "move"))
        index = world.perform(clause)
        since += 1
        if since > 2 and clause.action == "give":
            for _ in range(world.rng.randrange(3)):
                world.perform(world.sample(("get", "move")))
            template, slot = world.rng.choice(GIVE_QUESTIONS)
            names = {"a": clause.actor, "o": clause.arg, "r": clause.recipient}
            yield template.format(**names), names[slot], [index]
            since = 0


def _directions(rng: random.Random) -> Story:
    """IsDir.lua: three locations on a line, two relations, one question."""
    first, second, third = rng.sample(LOCATIONS, 3)
    d = rng.choice(("n", "e"))

    def relation(a: str, b: str) -> str:  # "a is d of b", or the same from b's side
        if rng.randrange(2) == 0:
            return f"The {a} is {DIRECTION_NAMES[d]} of the {b}."
        return f"The {b} is {DIRECTION_NAMES[OPPOSITE[d]]} of the {a}."

    facts = [relation(first, second), relation(second, third)]
    swapped = rng.randrange(2) == 1
    if swapped:
        facts.reverse()
    ask = rng.choice((d, OPPOSITE[d]))
    # The asked relation "second is `ask` of other": other = third when asking d, first when asking the opposite.
    other, fact = (third, 1) if ask == d else (first, 0)
    support = [1 - fact if swapped else fact]
    templates = [(f"What is {DIRECTION_NAMES[ask]} of the {other}?", second),
                 (f"What is {DIRECTION_NAMES[OPPOSITE[ask]]} of the {second}?", other),
                 (f"What is the {second} {DIRECTION_NAMES[ask]} of?", other),
                 (f"What is the {other} {DIRECTION_NAMES[OPPOSITE[ask]]} of?", second)]
    question, answer = rng.choice(templates)
    return Story("qa4", facts, question, answer, support)
