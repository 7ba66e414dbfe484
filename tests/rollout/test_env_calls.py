"""EnvCalls (arlopti.rollout.env_calls): batches counted in the episodes' order, and the stop rule applied as the
failures come in only where the round's end would stop the run too."""

from __future__ import annotations

import random

import pytest

from arlopti.rollout.env_calls import CallResult, EnvCall, EnvCalls, InProcessEnvs
from arlopti.tasks.env import EnvError


class Scripted:
    """A runner whose calls give the results it was handed, in the order it is told (``order``: (job, call)
    pairs; default: the jobs' order); records how many it gave before being closed."""

    def __init__(self, outcomes: dict, order=None):
        self.outcomes, self.order, self.given, self.closed = outcomes, order, 0, False

    def stream(self, jobs, timeout_s):
        order = self.order or [(j, k) for j, job in enumerate(jobs) for k in range(len(job))]
        try:
            for j, k in order:
                self.given += 1
                yield j, k, self.outcomes[j, k]
        finally:
            self.closed = True


def fail(error="RuntimeError: no", gone=False):
    return CallResult(error=error, detail=f"Traceback...\n{error}", gone=gone)


OK = CallResult(value=("r", False, None))


def jobs_of(n: int, what="step", calls=1):
    return [[EnvCall(i, what, ("t",), 0, what) for _ in range(calls)] for i in range(n)]


def test_a_batch_is_counted_in_the_episodes_order_whatever_order_its_calls_finish():
    outcomes = {(0, 0): fail("ValueError: first"), (1, 0): fail("KeyError: second"), (2, 0): OK}
    calls = EnvCalls("E", 1.0, max_error_frac=1.0, runner=Scripted(outcomes, order=[(2, 0), (1, 0), (0, 0)]))
    results, _ = calls.run(jobs_of(3))
    assert [r[0] for r in results] == [outcomes[0, 0], outcomes[1, 0], OK]
    r = calls.round
    assert (r.calls, r.errors, r.by_name["step"], r.failed_by_name["step"]) == (3, 2, 3, 2)
    assert r.first_error.endswith("ValueError: first")  # episode 0's, though it finished last


def test_every_episode_gone_stops_the_batch_at_once_naming_the_call():
    """All four episodes' processes die on their step (nothing can follow): the rule is certain at the fourth
    failure, with no later call made (the round's end would say the same: 4 of 4 > 0.5)."""
    outcomes = {(i, 0): fail("EnvWorkerDied: E.step: ... exited with code 3", gone=True) for i in range(4)}
    runner = Scripted(outcomes)
    calls = EnvCalls("E", 1.0, max_error_frac=0.5, runner=runner)
    with pytest.raises(EnvError, match=r"the environment E: step failed on 4 of its 4 calls over the last 1 rollout "
                                       r"round\(s\) \(the last one so far.*First error of step: EnvWorkerDied: "
                                       r"E.step: \.\.\. exited with code 3"):
        calls.run(jobs_of(4), more=lambda name: 2.0 if name == "step" else 0.0)
    assert runner.given == 4 and runner.closed


def test_failures_later_calls_could_still_outweigh_wait_for_them_then_stop_once_none_can():
    outcomes = {(i, 0): fail() for i in range(4)}  # raised: the episodes go on, two more steps each
    runner = Scripted(outcomes)
    calls = EnvCalls("E", 1.0, max_error_frac=0.5, runner=runner)
    results, _ = calls.run(jobs_of(4), more=lambda name: 2.0 if name == "step" else 0.0)
    assert all(not r[0].ok for r in results) and runner.given == 4  # 4 failures of at most 4 + 8 calls
    calls.check(lambda name: 4.0 * 2)  # between turns, the same bound: not certain
    with pytest.raises(EnvError, match=r"step failed on 4 of its 4 calls"):
        calls.check(lambda name: 3.0)  # 4 of at most 7 calls: over the limit whatever comes


def test_a_fatal_batch_ends_at_its_first_failure():
    outcomes = {(0, 0): OK, (1, 0): fail("ValueError: bad row"), (2, 0): OK}
    runner = Scripted(outcomes)
    calls = EnvCalls("E", 1.0, runner=runner)
    results, _ = calls.run(jobs_of(3, "reset"), fatal=True)
    assert [r[0] for r in results] == [OK, outcomes[1, 0], None] and runner.closed and runner.given == 2


@pytest.mark.parametrize("seed", range(40))
def test_an_early_stop_is_one_the_round_s_end_would_make(seed):
    """Random rounds of 3 batches (episodes answering, raising or dying; an episode makes one call per later
    batch while its process lives, so ``more = batches left`` is a true bound): wherever the rule stops early,
    the same outcomes counted to the round's end stop it too."""
    rng = random.Random(seed)
    frac = rng.choice([0.0, 0.25, 0.5, 0.75])
    plan, alive = [], rng.randint(1, 6)
    for b in range(3):
        outcomes = {(i, 0): rng.choice([OK, fail(), fail(gone=True)]) for i in range(alive)}
        alive -= sum(r.gone for r in outcomes.values())
        plan.append((outcomes, 2 - b, alive))

    calls = EnvCalls("E", 1.0, max_error_frac=frac)
    try:
        for outcomes, left, after in plan:
            calls.runner = Scripted(outcomes)
            calls.run(jobs_of(len(outcomes)), more=lambda name, left=left: float(left))
            calls.check(lambda name, left=left, after=after: float(left * after))
        stopped_early = False
    except EnvError:
        stopped_early = True
    at_end = EnvCalls("E", 1.0, max_error_frac=frac)
    for outcomes, _, _ in plan:
        for r in outcomes.values():
            at_end.count(r, what="step")
    try:
        at_end.end_round()
        stops_at_end = False
    except EnvError:
        stops_at_end = True
    assert stops_at_end or not stopped_early


def test_in_process_calls_keep_one_instance_and_put_the_trainer_s_random_back():
    class Env:
        def reset(self, row):
            self.n = random.randint(0, 10 ** 9)
            return None

        def step(self, text):
            self.n += 1
            return str(self.n), False, None

    runner = InProcessEnvs(Env, text=True)
    runner.open([0, 1])
    random.seed(123)
    state = random.getstate()
    jobs = [[EnvCall(k, "reset", ({},), 7, "reset"), EnvCall(k, "step", ("t",), 8, "step")] for k in (0, 1)]
    got = [r.value for _, _, r in runner.stream(jobs, timeout_s=10)]
    assert random.getstate() == state
    assert got[0] is None and got[1] == got[3] and int(got[1][0]) == random.Random(7).randint(0, 10 ** 9) + 1
