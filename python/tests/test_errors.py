"""Bad arguments and bad files raise clear exceptions: bytescale.Error carrying the library's message
(naming the argument or the file, and what would be right), TypeError for a wrong Python type."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import bytescale

OK = dict(ranks=4, capacity=1024, model="tiny", hardware="cpu", tp=1)
LENGTHS = [300, 2500, 700, 120, 900]


def raises(fragment, fn, *args, **kwargs):
    with pytest.raises(bytescale.Error) as e:
        fn(*args, **kwargs)
    assert fragment in str(e.value), str(e.value)
    return str(e.value)


def test_library_messages_become_exceptions():
    msg = raises("unknown policy 'bogus'", bytescale.plan, LENGTHS, policy="bogus", **OK)
    assert "balance" in msg  # the message lists the policies
    # the comparison words of `bytescale plan` are refused with the reason, not as unknown names
    for word in ("all", "own", "peers", "balance,elastic"):
        raises(f"policy: '{word}': bytescale.plan makes one plan", bytescale.plan, LENGTHS, policy=word, **OK)
    raises("ranks: 0 is out of range [1, 1048576]", bytescale.plan, LENGTHS, **{**OK, "ranks": 0})
    raises("ranks: 2000000 is out of range", bytescale.plan, LENGTHS, **{**OK, "ranks": 2000000})
    raises("capacity: 0 is out of range [1, 16777216]", bytescale.plan, LENGTHS, **{**OK, "capacity": 0})
    raises("pp: 0 is out of range [1, 1024]", bytescale.plan, LENGTHS, pp=0, **OK)
    raises("tp: 3000 is out of range", bytescale.plan, LENGTHS, **{**OK, "tp": 3000})
    raises("lengths[2] is 0: every length must be >= 1", bytescale.plan, [5, 6, 0, 7], **OK)
    raises("lengths[0] is -5", bytescale.plan, np.array([-5]), **OK)
    raises("unknown model \"gpt-9\"", bytescale.plan, LENGTHS, **{**OK, "model": "gpt-9"})
    raises("hardware", bytescale.plan, LENGTHS, **{**OK, "hardware": "./no-such-profile.json"})
    raises("context: 0 must be >= 1", bytescale.plan, LENGTHS, context=0, **OK)
    raises("ranks: 1180591620717411303424 is out of range", bytescale.plan, LENGTHS, **{**OK, "ranks": 2**70})
    raises("model has no effect with cost=", bytescale.plan, LENGTHS, ranks=4, capacity=1024, model="tiny",
           cost=bytescale.CostModel("tiny", "cpu", tp=1, ranks=4, capacity=1024))
    # the planner's own refusal: a sequence no ring of 4 ranks holds without offloading
    raises("a sequence of 100000 tokens needs 98 ranks of capacity 1024; only 4 given", bytescale.plan, [100000],
           offload=False, **OK)
    raises("dist", bytescale.sample_lengths, "zipf:2", tokens=1000)
    raises("tokens: 0 is out of range", bytescale.sample_lengths, tokens=0)


def test_error_is_the_librarys_message_exactly():
    with pytest.raises(bytescale.Error) as e:
        bytescale.plan(LENGTHS, policy="bogus", **OK)
    assert str(e.value).startswith("policy: unknown policy 'bogus' (policies: static, naive")
    assert isinstance(e.value, Exception) and not isinstance(e.value, TypeError)


def test_wrong_python_types_are_type_errors():
    for bad in ([1.5, 2.0], ["a", "b"], [[1, 2], [3, 4]], 7, [True, False]):
        with pytest.raises(TypeError, match="lengths"):
            bytescale.plan(bad, **OK)
    with pytest.raises(TypeError, match="ranks must be an integer"):
        bytescale.plan(LENGTHS, **{**OK, "ranks": "4"})
    with pytest.raises(TypeError, match="ranks must be an integer"):
        bytescale.plan(LENGTHS, **{**OK, "ranks": 4.0})
    with pytest.raises(TypeError, match="capacity must be an integer"):
        bytescale.plan(LENGTHS, **{**OK, "capacity": True})
    with pytest.raises(TypeError, match="offload must be True or False"):
        bytescale.plan(LENGTHS, offload="yes", **OK)
    with pytest.raises(TypeError, match="policy must be a string"):
        bytescale.plan(LENGTHS, policy=3, **OK)
    with pytest.raises(TypeError, match="cost must be a CostModel"):
        bytescale.plan(LENGTHS, ranks=4, capacity=1024, cost=3)
    with pytest.raises(TypeError):
        bytescale.Plan()
    # numpy integer types are integers
    p = bytescale.plan(np.array(LENGTHS, dtype=np.uint16), ranks=np.int64(4), capacity=np.int32(1024),
                       model="tiny", hardware="cpu", tp=1)
    assert p.n_tokens == sum(LENGTHS)


def test_bad_files(tmp_path):
    missing = tmp_path / "none.json"
    raises(str(missing), bytescale.read_plan, missing)
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "n_ranks": 4,\n "pp": 1 "capacity": 5}')
    msg = raises(f"{bad}:2:", bytescale.read_plan, bad)
    assert "invalid JSON" in msg
    p = bytescale.plan(LENGTHS, **OK)
    good = tmp_path / "good.json"
    p.write(good)
    d = json.loads(good.read_text())
    d["items"][0]["ranks"] = [70]
    bad.write_text(json.dumps(d))
    raises("items[0].ranks[0]: rank 70 out of range [0, 4)", bytescale.read_plan, bad)
    d = json.loads(good.read_text())
    del d["items"][-1]
    bad.write_text(json.dumps(d))
    raises("are in no item", bytescale.read_plan, bad)
    raises(str(tmp_path / "no-dir" / "p.json"), p.write, tmp_path / "no-dir" / "p.json")
    raises("cost.json", bytescale.CostModel.load, tmp_path / "cost.json")


def test_bad_plan_and_simulation_arguments():
    p = bytescale.plan(LENGTHS, **OK)
    raises("rank: 9 is out of range [0, 4)", p.schedule, 9)
    raises("rank: -5 is out of range [0, 4)", p.chunk_arrays, -5)
    raises("gpus: 6 devices of tp 1 x pp 1 make 6 HDP ranks; the plan has 4", bytescale.simulate, p, model="tiny",
           hardware="cpu", tp=1, gpus=6)
    raises("gpus: 0 must be >= 1", bytescale.simulate, p, gpus=0)
    raises("tp: 0 is out of range", bytescale.simulate, p, tp=0)
    with pytest.raises(TypeError, match="planning arguments with a plan"):
        bytescale.simulate(p, ranks=4)


def test_a_missing_library_says_where_to_point(tmp_path):
    env = dict(os.environ, BYTESCALE_LIB=str(tmp_path / "libbytescale.so.0"))
    r = subprocess.run([sys.executable, "-c", "import bytescale"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "BYTESCALE_LIB=" in r.stderr and "no such file" in r.stderr


def test_negative_ranks_and_lengths_below_one_raise_everywhere():
    """The edges are refused the same way in every function: a rank outside [0, n_ranks) (negative
    ones too: -1 is no "every rank" sentinel, nor Python's last element), a length < 1, a count < 1,
    a ratio outside [0, 1], all raise bytescale.Error naming the argument; a wrong type is a
    TypeError (a float is never truncated to an integer)."""
    p = bytescale.plan(LENGTHS, **OK)
    for r in (-1, -5, 4, 2**40):
        raises(f"rank: {r} is out of range [0, 4)", p.chunks, r)
        raises(f"rank: {r} is out of range [0, 4)", p.chunk_arrays, r)
        raises(f"rank: {r} is out of range [0, 4)", p.schedule, r)
    with pytest.raises(TypeError, match="rank must be an integer"):
        p.chunks(None)
    with pytest.raises(TypeError, match="rank must be an integer"):
        p.chunks(1.0)
    assert len(p.chunk_arrays(None).rank) == sum(len(p.chunks(r)) for r in range(4))  # None: every rank

    cm = bytescale.CostModel("tiny", "cpu", tp=1, ranks=4, capacity=1024)
    assert cm.item_time([1]) > 0 and cm.item_time(np.array([300, 200])) > cm.item_time([300])
    raises("segments[0] is 0: every length must be >= 1", cm.item_time, [0])
    raises("segments[0] is -5: every length must be >= 1", cm.item_time, [-5])
    raises("segments[2] is 0", cm.item_time, np.array([5, 6, 0], dtype=np.int32))
    raises("segments: 0 lengths", cm.item_time, [])
    raises("ranks: 0 is out of range", cm.item_time, [5], ranks=0)
    raises("ranks: -1 is out of range", cm.item_time, [5], ranks=-1)
    raises("offload: -0.5 is out of range [0, 1]", cm.item_time, [5], offload=-0.5)
    raises("offload: nan is out of range", cm.item_time, [5], offload=float("nan"))
    with pytest.raises(TypeError, match="segments must be integers"):
        cm.item_time([1.5])
    with pytest.raises(TypeError, match="one-dimensional"):
        cm.item_time([[1, 2]])
    with pytest.raises(TypeError, match="offload must be a number"):
        cm.item_time([5], offload="half")
    for kw, says in (({"ranks": -1}, "ranks: -1 is out of range"), ({"capacity": 0}, "capacity: 0 is out of range"),
                     ({"tp": -2}, "tp: -2 is out of range"), ({"pp": 0}, "pp: 0 is out of range")):
        raises(says, bytescale.CostModel, "tiny", "cpu", **kw)

    for kw, says in (({"ranks": -1}, "ranks: -1 is out of range"), ({"capacity": -1}, "capacity: -1 is out of range"),
                     ({"context": -1}, "context: -1 must be >= 1"), ({"pp": -1}, "pp: -1 is out of range"),
                     ({"tp": -1}, "tp: -1 is out of range")):
        raises(says, bytescale.plan, LENGTHS, **{**OK, **kw})
    raises("lengths[1] is -3: every length must be >= 1", bytescale.plan, [4, -3], **OK)
    raises("tokens: -1 is out of range", bytescale.sample_lengths, tokens=-1)
    raises("context: -1 is out of range", bytescale.sample_lengths, tokens=1000, context=-1)

    s = bytescale.simulate(p, model="tiny", hardware="cpu", tp=1)
    raises("gpus: -1 must be >= 1", bytescale.simulate, p, gpus=-1)
    raises("max_ranks: 0 must be >= 1", s.trace, "unused.json", max_ranks=0)
    raises("max_ranks: -1 must be >= 1", s.trace, "unused.json", max_ranks=-1)


def test_every_public_function_is_documented_and_typed():
    """help(bytescale.plan) and the rest say what each argument is and what comes back: every public
    function and method has a docstring and type hints on its arguments and its result."""
    import inspect
    missing = []
    publics = [getattr(bytescale, n) for n in bytescale.__all__ if callable(getattr(bytescale, n))]
    for obj in publics:
        members = [obj]
        if inspect.isclass(obj):
            if not obj.__doc__:
                missing.append(f"{obj.__name__}: no docstring")
            members = [m for n, m in vars(obj).items()
                       if (not n.startswith("_") or n == "__init__") and (inspect.isfunction(m) or
                                                                            isinstance(m, (property, classmethod)))]
        for m in members:
            f = m.fget if isinstance(m, property) else m.__func__ if isinstance(m, classmethod) else m
            if not inspect.isfunction(f):
                continue  # namedtuples and the like
            name = f.__qualname__
            if f.__name__ != "__init__" and not (f.__doc__ or "").strip():
                missing.append(f"{name}: no docstring")
            sig = inspect.signature(f)
            for pname, prm in sig.parameters.items():
                if pname not in ("self", "cls") and prm.annotation is inspect.Parameter.empty:
                    missing.append(f"{name}: no type hint on {pname}")
            if sig.return_annotation is inspect.Signature.empty:
                missing.append(f"{name}: no return type hint")
    assert not missing, "\n".join(missing)
    text = inspect.getdoc(bytescale.plan)
    for arg in ("lengths", "ranks", "capacity", "policy", "offload", "context", "pp", "cost", "bytescale.Error"):
        assert arg in text, arg
