"""Plan checks (check.py, docs/torch.md "Plan checks") and idle ranks' gradients, on 2 and 3 processes.

Bad cases (ranks given different plans, a plan for 4 ranks on 2 processes, for 1 rank on 2, ranks
passed that do not cover the plan, a layout's HDP dimension that does not fit): every rank raises the
same PlanCheckError before any message of the step, and every process then goes on (a correct step on
the same process group) and exits; spawn's join returning is the proof that none hangs, the process
group's timeout bounds a regression. Idle ranks: a user's own loop where a rank runs no micro-batch
(every p.grad None) gets zeros from all_reduce_gradients, and the step (the trainer's too) equals the
same plan on one process.
"""

import pytest

torch = pytest.importorskip("torch")

import bytescale.torch as bt  # noqa: E402
from bytescale.torch import launch  # noqa: E402

from test_torch_step import rel, synthetic_source  # noqa: E402

TIMEOUT_S = 120.0  # the process group's: a collective left waiting fails the test instead of hanging it


def docs_of_length(doc_len, at_least, n):
    return [i for i in range(len(doc_len)) if doc_len[i] >= at_least][:n]


def plan_of(source, world, docs, lengths, items, ulysses=()):
    """A hand-made StepPlan of sequences [0, lengths[k]) of docs[k] with its labelled count."""
    starts = [0] * len(docs)
    labelled = bt.labelled_tokens(bt.Batch(docs, starts, lengths), source)
    return bt.StepPlan(world, list(docs), starts, list(lengths), items, labelled=labelled, ulysses=list(ulysses))


def two_rank_plan(source, doc_len, length=60):
    """A ring of both ranks and a pack on each: every rank has messages to send in this plan."""
    d = docs_of_length(doc_len, 100, 3)
    return plan_of(source, 2, d, [length, 30, 40],
                   [((0, 1), ((0, 0, length),)), ((1,), ((1, 0, 30),)), ((0,), ((2, 0, 40),))])


def three_rank_plan(source, doc_len, extra):
    """A ring of 3 ranks and a pack on rank 1 of 20 + extra tokens."""
    d = docs_of_length(doc_len, 100, 2)
    return plan_of(source, 3, d, [70, 20 + extra], [((0, 1, 2), ((0, 0, 70),)), ((1,), ((1, 0, 20 + extra),))])


def good_step(rank, world, source, doc_len):
    """A correct step after an error: the process group still works (no abort, no rank desynchronised)."""
    d = docs_of_length(doc_len, 100, world)
    plan = plan_of(source, world, d, [50] * world, [((r,), ((r, 0, 50),)) for r in range(world)])
    model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=torch.float64).init_weights(seed=3)
    return bt.HDPTrainer(model).step(plan, bt.microbatches(plan, rank, source), apply=False).loss


def bad_case_worker(rank, world, case):
    """Run `case` on this rank; returns (the PlanCheckError's message or None, a good step's loss)."""
    torch.manual_seed(0)
    source, doc_len = synthetic_source()
    model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=torch.float64).init_weights(seed=3)
    trainer = bt.HDPTrainer(model)
    kw, rank_arg = {}, rank
    if case == "different":  # rank 1's sequence is longer: other sizes, other messages
        plan = two_rank_plan(source, doc_len, 60 + (rank == 1) * 17) if world == 2 else \
            three_rank_plan(source, doc_len, rank == 1)
    elif case == "four_on_two":  # planned by the C planner for 4 ranks, broadcast as the docs say
        batch = bt.Batch(docs_of_length(doc_len, 300, 4), [0] * 4, [300, 250, 40, 30])
        plan = bt.broadcast_plan(bt.plan_step(batch, source, ranks=4, capacity=100, policy="balance")
                                 if rank == 0 else None)
    elif case == "one_on_two":
        batch = bt.Batch(docs_of_length(doc_len, 100, 3), [0] * 3, [60, 30, 40])
        plan = bt.broadcast_plan(bt.plan_step(batch, source, ranks=1, capacity=200, policy="balance")
                                 if rank == 0 else None)
    elif case == "same_rank":  # every process passes rank 0
        plan, rank_arg = two_rank_plan(source, doc_len), 0
    elif case == "hdp_misfit":  # a layout of HDP dimension 1 (TP 2), but a plan for 2 ranks
        plan, kw = two_rank_plan(source, doc_len), {"hdp": 1}
    elif case == "hdp_differs":
        plan, kw = two_rank_plan(source, doc_len), {"hdp": 2 if rank == 0 else 1}
    elif case == "labelled":  # a denominator one short of what the micro-batches hold
        plan = two_rank_plan(source, doc_len)
        plan.labelled -= 1
    message = None
    try:
        if case == "different_trainer":  # a list microbatches() did not check: HDPTrainer.step checks
            plan = two_rank_plan(source, doc_len, 60 + (rank == 1) * 17)
            trainer.step(plan, list(bt.microbatches(plan, rank, source, check=False)))
        else:
            mbs = bt.microbatches(plan, rank_arg, source, **kw)
            trainer.step(plan, mbs)
    except bt.PlanCheckError as e:
        message = str(e)
    return message, good_step(rank, world, source, doc_len)


# the bad cases on 2 processes, run one after the other in one job (each followed by its good step, as
# it would be alone): a spawned job costs seconds of start-up, the cases a fraction of one
TWO_RANK_CASES = ("different", "different_trainer", "four_on_two", "one_on_two", "same_rank", "hdp_misfit",
                  "hdp_differs", "labelled")


def bad_cases_worker(rank, world, cases):
    return {case: bad_case_worker(rank, world, case) for case in cases}


@pytest.fixture(scope="module")
def two_rank_job():
    """Every rank's (message, good step's loss) of each of TWO_RANK_CASES, from one 2-process job."""
    results = launch.spawn(bad_cases_worker, 2, args=(TWO_RANK_CASES,), timeout_s=TIMEOUT_S)
    return {case: [r[case] for r in results] for case in TWO_RANK_CASES}


def checked_message(case, world, results):
    """Every rank's message; asserts they are one and the same, and that the processes went on."""
    messages = [m for m, _ in results]
    print(f"\n{case} on {world} processes, every rank prints:\n{messages[0]}")
    assert messages[0] is not None, f"{case}: no rank raised PlanCheckError"
    assert all(m == messages[0] for m in messages), messages
    assert all(loss == results[0][1] for _, loss in results)  # the good step after it: same loss everywhere
    return messages[0]


@pytest.fixture
def run_bad_case(two_rank_job):
    """run_bad_case(case): the checked message of `case` on 2 processes, from the shared job."""
    return lambda case: checked_message(case, 2, two_rank_job[case])


def fp(plan):
    return f"{bt.plan_fingerprint(plan) & (2**64 - 1):016x}"


def test_different_plans_two_ranks(run_bad_case):
    source, doc_len = synthetic_source()
    msg = run_bad_case("different")
    assert "run different plans" in msg
    assert f"rank 0: a plan of 2 ranks, 3 items, 130 tokens, fingerprint {fp(two_rank_plan(source, doc_len))}" in msg
    assert f"rank 1: a plan of 2 ranks, 3 items, 147 tokens, fingerprint " \
           f"{fp(two_rank_plan(source, doc_len, 77))}" in msg


def test_different_plans_three_ranks_names_the_odd_rank():
    msg = checked_message("different", 3, launch.spawn(bad_case_worker, 3, args=("different",), timeout_s=TIMEOUT_S))
    assert "ranks 0, 2: a plan of 3 ranks, 2 items, 90 tokens" in msg
    assert "rank 1: a plan of 3 ranks, 2 items, 91 tokens" in msg


def test_different_plans_through_the_trainer(run_bad_case):
    assert "run different plans" in run_bad_case("different_trainer")


def test_plan_for_four_ranks_on_two(run_bad_case):
    msg = run_bad_case("four_on_two")
    assert msg.startswith("bytescale.torch: the plan is for 4 ranks but the world has 2 processes: plan with "
                          "ranks=2"), msg


def test_plan_for_one_rank_on_two(run_bad_case):
    msg = run_bad_case("one_on_two")
    assert msg.startswith("bytescale.torch: the plan is for 1 rank but the world has 2 processes: plan with "
                          "ranks=2"), msg


def test_ranks_that_do_not_cover_the_plan(run_bad_case):
    msg = run_bad_case("same_rank")
    assert "process 1 runs plan rank 0" in msg and "process 0" not in msg, msg


def test_layout_hdp_dimension(run_bad_case):
    assert "the plan is for 2 ranks but the layout's HDP dimension is 1 (2 processes)" in run_bad_case("hdp_misfit")
    assert "different HDP dimensions (hdp=): rank 1: 1; rank 0: 2" in run_bad_case("hdp_differs")


def test_labelled_count_against_the_micro_batches(run_bad_case):
    """The loss's denominator must be the labelled rows every rank's micro-batches hold together."""
    source, doc_len = synthetic_source()
    plan = two_rank_plan(source, doc_len)
    msg = run_bad_case("labelled")
    assert f"the plan's labelled count (the loss's denominator) is {plan.labelled - 1}, but its micro-batches " \
           f"hold {plan.labelled} labelled tokens (rank 0: " in msg, msg


def test_plan_problems_name_the_sequence_and_both_values():
    """plan_problem, the check of the plan itself (the same on every rank, no collective)."""
    source, doc_len = synthetic_source()
    d = docs_of_length(doc_len, 100, 3)
    good = plan_of(source, 2, d, [60, 30, 40], [((0, 1), ((0, 0, 60),)), ((1,), ((1, 0, 30),)), ((0,), ((2, 0, 40),))])
    assert bt.plan_problem(good) is None
    cases = [
        (dict(seq_len=[67, 30, 40]), f"sequence 0 (document {d[0]}, tokens [0, 67)): the plan gives it 67 tokens, "
                                     f"its items' segments hold 60"),
        (dict(items=[((0, 1), ((0, 0, 60),)), ((1,), ((1, 0, 30),)), ((0,), ((2, 0, 40), (1, 20, 5)))]),
         f"sequence 1 (document {d[1]}, tokens [0, 30)): tokens [20, 25) are in two items' segments"),
        (dict(items=[((0, 1), ((0, 0, 20), (0, 30, 30))), ((1,), ((1, 0, 30),)), ((0,), ((2, 0, 40),))]),
         f"sequence 0 (document {d[0]}, tokens [0, 60)): tokens [20, 30) are in no item's segment"),
        (dict(items=[((0, 1), ((0, 0, 61),)), ((1,), ((1, 0, 30),)), ((0,), ((2, 0, 40),))]),
         "item 0: segment (0, 0, 61) lies outside sequence 0"),
        (dict(items=[((0, 2), ((0, 0, 60),)), ((1,), ((1, 0, 30),)), ((0,), ((2, 0, 40),))]),
         "item 0: ranks [0, 2]: distinct ranks of 0..1"),
        (dict(labelled=131), "the labelled count (the loss's denominator) is 131, but 130 tokens in 3 sequences "
                             "have between 127 and 130 labels"),
    ]
    for change, words in cases:
        p = plan_of(source, 2, d, [60, 30, 40], good.items)
        for k, v in change.items():
            setattr(p, k, v)
        assert words in (bt.plan_problem(p) or ""), (change, bt.plan_problem(p))


def test_batch_and_plan_lengths_are_checked_where_planned():
    """plan_step refuses a sequence past its document's end, StepPlan.from_plan a plan of other
    lengths than the batch: both name the sequence and both values (rank 0 raises; broadcast_plan
    carries it to every rank)."""
    import bytescale
    import numpy as np

    source, doc_len = synthetic_source()
    d = docs_of_length(doc_len, 100, 3)
    bad = bt.Batch(d, [0, 5, 0], [60, int(doc_len[d[1]]), 40])
    with pytest.raises(ValueError, match=rf"sequence 1 \(document {d[1]}, tokens \[5, {int(doc_len[d[1]]) + 5}\)\) "
                                         rf"runs past its document's end: it ends at token {int(doc_len[d[1]]) + 5}, "
                                         rf"the document has {int(doc_len[d[1]])}"):
        bt.plan_step(bad, source, ranks=2, capacity=512)
    batch = bt.Batch(d, [0] * 3, [60, 90, 40])
    p = bytescale.plan(np.array([60, 90, 40]) - np.array([0, 0, 7]), ranks=2, capacity=512, policy="balance",
                       model="tiny", hardware="cpu", tp=1, offload=False)
    with pytest.raises(ValueError, match=rf"sequence 2 of the batch \(document {d[2]}\) has 40 tokens, the plan 33"):
        bt.StepPlan.from_plan(p, batch, bt.labelled_tokens(batch, source))


def test_fingerprint_sees_every_field():
    """Any change of what a step executes changes the fingerprint; equal plans give equal ones."""
    source, doc_len = synthetic_source()
    base = two_rank_plan(source, doc_len)
    assert bt.plan_fingerprint(base) == bt.plan_fingerprint(two_rank_plan(source, doc_len))
    variants = []
    for field, value in [("n_ranks", 3), ("labelled", base.labelled - 1), ("seq_doc", [7] + base.seq_doc[1:]),
                         ("seq_start", [1] + base.seq_start[1:]), ("seq_len", [61] + base.seq_len[1:]),
                         ("items", [((1, 0),) + base.items[0][1:]] + base.items[1:]),
                         ("items", base.items[1:] + base.items[:1]),
                         ("items", [((0, 1), ((0, 0, 59),))] + base.items[1:]),
                         ("ulysses", [2, 0, 0])]:
        p = two_rank_plan(source, doc_len)
        setattr(p, field, value)
        variants.append(bt.plan_fingerprint(p))
    assert len(set(variants + [bt.plan_fingerprint(base)])) == len(variants) + 1


def test_one_process_world_check():
    """Without a process group the world is one process: a plan for 2 ranks is refused, unless the
    caller looks at a rank's share on purpose (check=False)."""
    source, doc_len = synthetic_source()
    plan = two_rank_plan(source, doc_len)
    with pytest.raises(bt.PlanCheckError, match="the plan is for 2 ranks but the world has 1 process"):
        bt.microbatches(plan, 0, source)
    assert [m.item for m in bt.microbatches(plan, 1, source, check=False)] == [0, 1]


# ---- idle ranks: zero gradients from the package -----------------------------------------------------

def idle_plans(source, doc_len, world):
    """Two steps: rank 1 runs nothing in the first, rank 0 nothing in the second; on one process (world
    1) every item is a pack of rank 0."""
    d = docs_of_length(doc_len, 100, 4)
    steps = [(d[:2], [60, 45], [((0,), ((0, 0, 60),)), ((0,), ((1, 0, 45),))]),
             (d[2:], [70, 20], [((1,), ((0, 0, 70), (1, 0, 20)))])]
    plans = []
    for docs, lengths, items in steps:
        if world == 1:
            items = [((0,), segs) for _, segs in items]
        plans.append(plan_of(source, world, docs, lengths, items))
    return plans


def idle_worker(rank, world):
    """A user's own loop (plain autograd, AdamW) and HDPTrainer on the idle plans; per step: whether
    this rank's gradients were None before the all-reduce, the summed gradients, then the parameters."""
    source, doc_len = synthetic_source()
    model = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=torch.float64).init_weights(seed=3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = {"none": [], "grads": [], "trainer": []}
    for plan in idle_plans(source, doc_len, world):
        opt.zero_grad(set_to_none=True)
        for mb in bt.microbatches(plan, rank, source):
            with bt.microbatch_context(mb):
                loss = model.loss_sum(mb.tokens, mb.targets, mb.pos) / plan.labelled
            loss.backward()
        out["none"].append(all(p.grad is None for p in model.parameters()))
        bt.all_reduce_gradients(model)
        out["grads"].append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
        opt.step()
    out["params"] = model.flat.detach().clone()
    tmodel = bt.Llama(bt.LlamaConfig.named("tiny"), dtype=torch.float64).init_weights(seed=3)
    trainer = bt.HDPTrainer(tmodel, lr=1e-2, warmup=1, schedule_steps=10)
    for plan in idle_plans(source, doc_len, world):
        out["trainer"].append(trainer.step(plan, bt.microbatches(plan, rank, source)).loss)
    out["trainer_params"] = tmodel.flat.detach().clone()
    return out


def test_idle_rank_gets_zero_gradients_and_the_one_process_step():
    ref = idle_worker(0, 1)
    got = launch.spawn(idle_worker, 2, timeout_s=TIMEOUT_S)
    assert got[1]["none"][0] and got[0]["none"][1], "the idle ranks should have run no micro-batch"
    assert not got[0]["none"][0] and not got[1]["none"][1]
    for r in got:
        for g, rg in zip(r["grads"], ref["grads"]):
            assert rel(g, rg) < 1e-12
        assert rel(r["params"], ref["params"]) < 1e-12
        assert r["trainer"] == pytest.approx(ref["trainer"], rel=1e-12)
        assert rel(r["trainer_params"], ref["trainer_params"]) < 1e-12
