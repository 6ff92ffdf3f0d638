"""The engine: lanes, admission, the round loop and the row budget's inputs.

It loads the target and tokenizer, resolves the --spec-* knobs into the verify spec, plans the prefill and
verify graphs once, and then steps: admit waiting requests into free slots, run one prefill pass of at most
`prefill_rows` prompt rows (the step budget) for lanes still reading their prompt, run one verify round for
the lanes that decode, retire finished lanes. Where lanes decode and others read their prompt, the prefill pass and
the verify round are one pass (prefill_share.StepPlans), on a target that serves it.
It never names a stage or a drafter: what a round does is what the spec says. Every round gets the same declared
inputs (`ENGINE_INPUTS`): the pass's `Roster` (the lane table, the lanes held out of the pass, the queue's length),
the target and its state, the drafter the verify plan built (its `builds`) and its state, and the engine's
`RoundCosts`; applying the target layers the drafter declares it reads (its `taps`) is done here, once. Checking
and tokenizing a request into a lane is intake.py's; prompt checkpoints are keeper.py's, which gets the slot state's
handles and the chat renderer, not the engine.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from speclane.pipeline.framework.executor import Plan, StageTimes, plan
from speclane.pipeline.framework.graph import build_graph
from speclane.pipeline.framework.knobs import knob_value, place, resolve_knobs
from speclane.pipeline.framework.spec import SpecFile, load_spec
from speclane.pipeline.runtime import intake
from speclane.pipeline.runtime.checkpoints import CheckpointStore
from speclane.pipeline.runtime.keeper import EVERY_TOKENS, Keeper, SlotHandles
from speclane.pipeline.runtime.prefill_share import PrefillShare, StepPlans, check_budget
from speclane.pipeline.runtime.request import GenerateRequest, SpecKnobs
from speclane.stages.contract.costs import RoundCosts
from speclane.stages.contract.errors import RequestError, StageFailure
from speclane.stages.contract.events import DoneEvent
from speclane.stages.contract.lanes import Lane, LaneTable, Roster, spec_stats
from speclane.stages.contract.resources import Resources

log = logging.getLogger("speclane.engine")


def resolve_spec(spec: SpecFile, knobs: SpecKnobs) -> SpecFile:
    """Apply the --spec-* knobs to the verify spec, through what its stage kinds declare they take."""
    return resolve_knobs(spec, knobs.model_dump())


class Engine:
    def __init__(
        self,
        target,
        tokenizer,
        *,
        spec: str | Path | SpecFile = "verify",
        knobs: SpecKnobs | None = None,
        max_lanes: int = 4,
        max_len: int = 4096,
        max_queue: int = 256,
        prefill_spec="prefill",
        check_contracts: bool = False,
        prefill_rows: int | None = None,
        checkpoint_bytes: int = 512 << 20,
        snapshot_dir: str | Path | None = None,
        checkpoint_every: int = EVERY_TOKENS,
        checkpoint_host_bytes: int | None = None,
    ):
        """`prefill_rows`: the step budget of prompt rows (None: the prefill spec's chunk_rows). Each step runs one
        prefill pass of at most this many rows, then every decoding lane's round, so a long prompt delays the other
        lanes by one bounded pass a step, never by its whole prefill. `checkpoint_host_bytes`: host memory that
        checkpoints move to when `checkpoint_bytes` on the model's device is full (None: 0 on a CPU, where the two
        are one memory, else keeper.HOST_CHECKPOINT_BYTES)."""
        self.target, self.tokenizer = target, tokenizer
        self.max_len, self.max_queue = max_len, max_queue
        base = spec if isinstance(spec, SpecFile) else load_spec(spec)
        self.spec = resolve_spec(base, knobs or SpecKnobs())
        self.resources = Resources(target=target, tokenizer=tokenizer)
        device = str(target.device)
        self.verify = plan(build_graph(place(self.spec, device)), self.resources, check_contracts)
        self.drafter = drafter = self.verify.built.get("drafter")
        if drafter is not None and drafter.taps:  # the layers the drafter reads: every pass's taps
            target.tap(drafter.taps)
        self._prefill_spec = prefill_spec if isinstance(prefill_spec, SpecFile) else load_spec(prefill_spec)
        self._check_contracts, self._prefill_lanes = check_contracts, None
        self.set_prefill_rows(prefill_rows)
        self.round_costs = RoundCosts()  # the pass-cost probe and the drafter's times, for the measured draft plan
        self.lanes = LaneTable(max_lanes)
        self.state = target.new_state(max_lanes, max_len)
        self.drafter_state = drafter.new_state(max_lanes, max_len) if drafter is not None else None
        self.queue: collections.deque[Lane] = collections.deque()
        self.finished: list[Lane] = []
        self.retired: collections.deque[Lane] = collections.deque(maxlen=4096)  # recent ended lanes, for metrics
        self.times = StageTimes()  # verify rounds, per stage
        self.prefill_times = StageTimes()  # prefill passes, apart: prompts must not dilute round shares
        self.passes: collections.Counter[str] = collections.Counter()  # target passes run, by kind (stats)
        self.time_stages = False
        self._order = 0
        self.chat_tokens = intake.ChatTokens(tokenizer)  # a conversation as token ids (the chat template's)
        self.raise_errors = False  # tests: let a stage's exception propagate instead of ending its lanes
        self.draft_tokens = int(knob_value(self.spec, "draft_tokens") or 0)
        # Prompt checkpoints (pipeline/runtime/keeper.py): 0 bytes turns them off.
        handles = SlotHandles(target, self.state, drafter, self.drafter_state)
        self.keeper = Keeper(
            handles, self.chat_tokens, checkpoint_bytes, checkpoint_every, snapshot_dir, checkpoint_host_bytes
        )

    def set_prefill_rows(
        self, rows: int | None, lanes: int | None = None, share: RoundCosts | None = None, one_pass: bool = True
    ) -> None:
        """Plan the prefill pass with a step budget of `rows` prompt rows (None: the prefill spec's chunk) and at most
        `lanes` prompts a pass (None: as before, else the spec's), the prefill stage's knobs `prefill_rows` and
        `prefill_lanes`. The budget binds only while a lane decodes (`prefill_idle`: the whole chunk); with `share`, a
        pass-cost table, a budget short of the chunk is the fair one for each prompt being read while those outnumber
        the decoding lanes (prefill_share.py). So a prompt's chunking, and its bf16 rounding, can depend on the load.
        `one_pass`: a step where lanes decode runs its prompt rows in the decoders' pass, where the target serves it."""
        check_budget(rows, lanes)
        self._prefill_lanes = lanes or self._prefill_lanes
        self.prefill, self.prefill_rows = self._plan_prefill(rows)
        idle, idle_rows = self._plan_prefill(None)
        self.prefill_idle = idle if idle_rows > self.prefill_rows else self.prefill
        shares = share is not None and idle_rows > self.prefill_rows
        self.share = (
            PrefillShare(share, {self.prefill_rows: self.prefill, idle_rows: idle}, self._plan_prefill)
            if shares
            else None
        )
        self.steps = StepPlans.of(self) if one_pass else None

    def _plan_prefill(self, rows: int | None) -> tuple[Plan, int]:
        spec = resolve_knobs(self._prefill_spec, {"prefill_rows": rows, "prefill_lanes": self._prefill_lanes})
        the_plan = plan(build_graph(place(spec, str(self.target.device))), self.resources, self._check_contracts)
        return the_plan, int(knob_value(spec, "prefill_rows") or 0)

    @property
    def checkpoints(self) -> CheckpointStore | None:
        return self.keeper.store

    @checkpoints.setter
    def checkpoints(self, store: CheckpointStore | None) -> None:
        self.keeper.store = store

    def prompt_ids(self, req: GenerateRequest, chat: bool = False) -> list[int]:
        return intake.prompt_ids(self, req, chat)

    def apply_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return self.chat_tokens(messages)

    def prepare(self, req: GenerateRequest, chat: bool = False) -> Lane:
        """Tokenize and validate a request into a lane, touching no engine state (intake.py): a server calls this
        off its loop (a worker thread), so a huge or bad prompt never costs the running lanes a step. A request
        that `share_prompt`s is checkpointed one token short of its prompt's end, where a same-prompt lane restores."""
        lane = intake.prepare(self, req, chat)
        if req.share_prompt and self.checkpoints is not None:
            lane.checkpoint_at = tuple(sorted({*lane.checkpoint_at, len(lane.prompt_ids) - 1}))
        return lane

    def enqueue(self, lane: Lane) -> Lane:
        """Queue a prepared lane; it joins a free lane at the next step."""
        if len(self.queue) >= self.max_queue:
            raise RequestError(
                f"the queue is full ({self.max_queue} waiting); retry later", field="request", code="queue_full"
            )
        lane.order = self._order
        self._order += 1
        self.queue.append(lane)
        return lane

    def submit(self, req: GenerateRequest, chat: bool = False) -> Lane:
        """Validate and queue a request; it joins a free lane at the next step."""
        return self.enqueue(self.prepare(req, chat))

    def cancel(self, rid) -> bool:
        """End request `rid`, queued or running (a running lane ends at its step's retire); False if not here."""
        return intake.cancel(self, rid)

    def roster(self, held: frozenset[Lane] = frozenset()) -> Roster:
        """What a pass may take: the lane table but the `held` lanes, and how many requests wait for a slot."""
        return Roster(self.lanes, held, len(self.queue))

    def _run(self, the_plan: Plan, lanes: list[Lane], held: frozenset[Lane] = frozenset()) -> list:
        prefill = self.time_stages and knob_value(the_plan.graph.spec, "prefill_rows") is not None
        timer = (self.prefill_times if prefill else self.times) if self.time_stages else None
        inputs = {
            "lanes": self.roster(held),
            "target": self.target,
            "target_state": self.state,
            "drafter": self.drafter,
            "drafter_state": self.drafter_state,
            "round_costs": self.round_costs,
        }
        try:
            return the_plan.run(inputs, timer)["events"]
        except StageFailure as exc:  # one request's failure must not take down the others
            return self._isolate(the_plan, lanes, held, exc)

    def _isolate(self, the_plan: Plan, lanes: list[Lane], held: frozenset[Lane], exc: StageFailure) -> list:
        """A round raised. Before any state changed, rerun each lane alone (the others held out) so only the lanes
        that fail end, with an error; after (a commit or emit had run), the round's lanes cannot be resumed."""
        log.warning("round of '%s' failed for %d lane(s)", the_plan.graph.spec.name, len(lanes), exc_info=exc)
        if self.raise_errors:
            raise exc.cause
        took = lanes if exc.lanes is None else [lane for lane in lanes if lane in exc.lanes]  # the round's own
        if len(took) <= 1 or exc.state_touched:
            for lane in took:
                lane.finish_reason, lane.error = "error", str(exc)
            return []
        events = []
        for lane in took:
            events.extend(self._run(the_plan, [lane], held | {l for l in lanes if l is not lane}))
        return events

    def step(self) -> list:
        """Admit; prefill one chunk and run one verify round, in one pass where both run and the target serves it;
        retire finished lanes. Returns the events."""
        self._admit()
        events = self._one_pass()
        if events is None:
            prefilled, events = self._prefill()
            events += self._verify(sitting_out=prefilled)
        return events + self._retire(events)

    def _one_pass(self) -> list | None:
        """The decoding lanes' round with the step budget's prompt rows in its pass, or a prefill pass after it where
        they did not fit (prefill_share.StepPlans); None where a step is not one pass."""
        waiting, running = self.lanes.waiting_prefill(), self.lanes.running()
        if self.steps is None or not waiting or not running:
            return None
        rows = self.share.rows(len(waiting), len(running)) if self.share else self.prefill_rows
        before, read = self.keeper.before_prefill(waiting), [lane.kv_len for lane in waiting]
        events = self._run(self.steps.plan(rows, fair=self.share is not None), running + waiting)
        for lane, n in zip(waiting, before):
            self.keeper.after_prefill(lane, n)
        self.times.rounds += 1
        fits = [lane.kv_len for lane in waiting] != read
        self.passes["one_pass" if fits else "verify"] += 1
        return events + ([] if fits else self._prefill()[1])

    def _admit(self) -> None:
        """Queued requests take free slots: zeroed state, or the longest kept checkpoint of their prompt."""
        while self.queue and self.lanes.has_room():
            lane = self.queue.popleft()
            lane.slot = self.lanes.take_slot()
            self.state.reset(lane.slot)
            self.lanes.add(lane)
            self.keeper.restore(lane)

    def _prefill(self) -> tuple[list[Lane], list]:
        """One prefill pass for the lanes still reading their prompt: the lanes whose prompt it ended, the events."""
        waiting = self.lanes.waiting_prefill()
        if not waiting:
            return [], []
        before = self.keeper.before_prefill(waiting)
        decoding = len(self.lanes.running())
        the_plan = self.share.plan(len(waiting), decoding) if decoding and self.share else None
        events = self._run(the_plan or (self.prefill if decoding else self.prefill_idle), waiting)
        self.passes["prefill"] += 1
        for lane, n in zip(waiting, before):
            self.keeper.after_prefill(lane, n)  # the prompt's end, its shared head, every so many tokens
        return [lane for lane in waiting if lane.anchor >= 0], events

    def _verify(self, sitting_out: list[Lane]) -> list:
        """One verify round for every lane with an anchor but `sitting_out`: their prompt ended in this step's prefill,
        so their first token goes out now, not after a round of its own; they decode from the next step."""
        held = frozenset(sitting_out)
        running = self.roster(held).running()
        events = self._run(self.verify, running, held) if running else []
        self.times.rounds += bool(running)
        self.passes["verify"] += bool(running)
        return events

    def _retire(self, events: list) -> list[DoneEvent]:
        """Time first tokens; end finished lanes, freeing their slots; one DoneEvent per ended lane (queued too)."""
        now = time.perf_counter()
        for lane in filter(None, (self._lane(ev.rid) for ev in events if ev.index == 0)):
            lane.t_first = now
        for lane in [l for l in self.lanes.active.values() if l.finish_reason is not None]:
            if lane.finish_reason in ("stop", "length"):
                self.keeper.keep(lane)  # the answer's end: what a follow-up that quotes it starts from
            self.keeper.release(lane)
            self.lanes.release(lane)
            lane.t_done = now
            self.finished.append(lane)
        self.retired.extend(self.finished)
        done, self.finished = [lane.done_event() for lane in self.finished], []
        return done

    def _lane(self, rid) -> Lane | None:
        return next((lane for lane in self.lanes.active.values() if lane.rid == rid), None)

    def busy(self) -> bool:
        return bool(self.queue or self.lanes.active or self.finished)

    def generate(
        self, requests: Iterable[GenerateRequest], chat: bool = False, on_event: Callable[[Any], None] | None = None
    ) -> list[DoneEvent]:
        """Run requests to completion as concurrent lanes; results in input order."""
        return intake.run_all(self, requests, chat, on_event)

    def stats(self, lanes: list[Lane]) -> dict[str, Any]:
        return spec_stats(lanes, self.draft_tokens)
