"""examples/torch_hdp_train.py runs: 2 spawned processes on gloo with rings (context above the
capacity), a JSON line per step with every rank's times, a checkpoint in the C engine's layout that
bytescale.torch reads back, and a resumed run that continues from it; --tp 2 and --pp 2 with flexsp
plans and a checkpoint passed between the two layouts; the errors for a wrong --resume and a policy
`bytescale train` does not run."""

import json

import pytest

torch = pytest.importorskip("torch")

import bytescale.torch as bt  # noqa: E402
from conftest import load_example  # noqa: E402
from test_torch_run import run_ranks, spawning_main  # noqa: E402
from test_torch_vs_c import corpus  # noqa: E402


def run(*args):
    """`python examples/torch_hdp_train.py ARGS`: its main() in this process, its --nproc ranks spawned
    from this process's server (spawning_main); an error fails the test."""
    assert spawning_main("torch_hdp_train", *args) == 0


def test_example_trains_checkpoints_and_resumes(tmp_path):
    data = corpus(tmp_path)
    common = ["--data", data, "--model", "tiny", "--context", "512", "--capacity", "256", "--tokens", "1K",
              "--lr", "3e-3", "--warmup", "2", "--nproc", "2", "--ckpt-dir", tmp_path / "ck",
              "--metrics", tmp_path / "m.jsonl"]
    run(*common, "--steps", "3", "--ckpt-every", "2")
    lines = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    assert all(x["loss"] > 0 and len(x["ranks"]) == 2 for x in lines)
    assert any(x["plan_rings"] > 0 for x in lines), "no ring: context above capacity should make rings"
    ck = bt.read_checkpoint(tmp_path / "ck" / "ckpt-000003.bin")
    assert ck.state["step"] == 3 and ck.state["adam_t"] == 3
    assert ck.floats("params").size == bt.LlamaConfig.named("tiny").n_params
    # continue from step 2's checkpoint to step 4: the metrics drop the lines past the checkpoint, and
    # the resumed run writes its own checkpoints (the first run's stay, as with `bytescale train`)
    run(*common, "--steps", "4", "--resume", tmp_path / "ck" / "ckpt-000002.bin")
    again = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [x["step"] for x in again] == [1, 2, 3, 4]
    assert again[2]["loss"] == pytest.approx(lines[2]["loss"], rel=1e-6)  # step 3 again, from the checkpoint
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["ckpt-000002.bin", "ckpt-000003.bin",
                                                                   "ckpt-000004.bin"]


def example_module():
    return load_example("torch_hdp_train")


def test_example_tp_pp_checkpoints_and_errors(tmp_path, capsys):
    """--tp 2 on 4 processes with flexsp plans (a2a items on each tp shard's heads), a checkpoint of
    the whole model after step 1, resumed with --pp 2 on 2 processes (one HDP rank: capacity raised
    to the context): step 2's loss again. A wrong --resume names the checkpoints there; a policy
    `bytescale train` does not run is refused with its reason."""
    data = corpus(tmp_path)
    common = ["--data", data, "--model", "tiny", "--context", "512", "--capacity", "256", "--tokens", "1K",
              "--lr", "3e-3", "--warmup", "1", "--ckpt-dir", tmp_path / "ck", "--metrics", tmp_path / "m.jsonl"]
    run(*common, "--steps", "2", "--ckpt-every", "1", "--nproc", "4", "--tp", "2", "--policy", "flexsp")
    first = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [len(x["ranks"]) for x in first] == [4, 4]
    # in a process of its own (run_ranks), whose output holds the ranks' (rank 0 names the layout)
    again = run_ranks(1, "torch_hdp_train", *common, "--steps", "2", "--nproc", "2", "--pp", "2", "--policy",
                      "flexsp", "--resume", tmp_path / "ck" / "ckpt-000001.bin", torchrun=False)
    assert "tp 1 x pp 2 x 1 HDP ranks" in again.stderr
    second = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [x["step"] for x in second] == [1, 2]
    assert second[1]["loss"] == pytest.approx(first[1]["loss"], rel=1e-5)
    # the two refusals come before any process starts: the example's main() in this process (a process
    # of its own would only add an import of torch)
    example = example_module()
    with pytest.raises(SystemExit) as bad:
        example.main([*map(str, common), "--resume", str(tmp_path / "ck" / "ckpt-1.bin")])
    assert f"--resume {tmp_path / 'ck' / 'ckpt-1.bin'}: no such file; {tmp_path / 'ck'} " \
           f"holds ckpt-000001.bin, ckpt-000002.bin" in str(bad.value), bad.value
    with pytest.raises(SystemExit) as bad:
        example.main(["--policy", "wlb"])
    assert bad.value.code == 2 and "--policy wlb: not one `bytescale train` runs: its delay queue" in \
        capsys.readouterr().err
