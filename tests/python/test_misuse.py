"""Misuse of the recording API gets an error or a warning, never a silently
empty bundle. Run by ctest with the other binding tests (PYTHONPATH=BUILD/python)."""
import warnings

import pytest
import torch

import moerr


def ops_in_a_step():
    x = torch.randn(4, 4)
    return (x @ x).relu().sum()


def test_step_called_without_with_raises_and_shows_the_form(tmp_path):
    path = tmp_path / "plain.moerr"
    with pytest.raises(RuntimeError, match=r"with rec.step\(\):"):
        with moerr.record(path, mode="stats") as rec:
            rec.step()
            loss = ops_in_a_step()
            rec.outcome(loss=loss.item())  # the first call into the recording after it
    # The same misuse without any later call is caught when the recording closes.
    with pytest.raises(RuntimeError, match="records nothing"):
        with moerr.record(path, mode="stats", overwrite=True) as rec:
            rec.step()
            ops_in_a_step()
    # And by the next step.
    with moerr.record(path, mode="stats", overwrite=True) as rec:
        rec.step()
        with pytest.raises(RuntimeError, match="called on its own"):
            rec.step()
        with rec.step():
            ops_in_a_step()
    assert moerr.Bundle(path).steps == [0]


def test_steps_do_not_nest(tmp_path):
    with moerr.record(tmp_path / "n.moerr", mode="stats") as rec:
        with rec.step():
            ops_in_a_step()
            with pytest.raises(RuntimeError, match="steps do not nest"):
                rec.step()
    assert moerr.Bundle(tmp_path / "n.moerr").steps == [0]


def test_outcome_and_step_annotations_need_a_step(tmp_path):
    with moerr.record(tmp_path / "o.moerr", mode="stats") as rec:
        with pytest.raises(RuntimeError, match="outside a step"):
            rec.outcome(loss=1.0)
        with pytest.raises(RuntimeError, match="outside a step"):
            rec.annotate("lr", 1e-3, step=True)
        rec.annotate("run", {"lr": 1e-3})  # a bundle annotation needs none
        with rec.step():
            ops_in_a_step()
            rec.outcome(loss=1.0)
            rec.annotate("lr", 1e-3, step=True)
    bundle = moerr.Bundle(tmp_path / "o.moerr")
    assert bundle.annotation("run") == {"lr": 1e-3}
    assert bundle.annotation("lr", 0) == 1e-3


def test_routing_outside_a_step_is_ignored(tmp_path):
    logits = torch.randn(5, 6)
    weights, ids = torch.topk(torch.softmax(logits, -1), 2)
    moerr.routing(0, ids, weights, logits)  # no recording: nothing to do
    path = tmp_path / "r.moerr"
    with moerr.record(path, mode="stats") as rec:
        moerr.routing(1, ids, weights, logits)  # between steps (an evaluation pass, say)
        with rec.step():
            ops_in_a_step()
            moerr.routing(2, ids, weights, logits)
        moerr.routing(3, ids, weights, logits)
        rec.step()
        with pytest.raises(RuntimeError, match=r"with rec.step\(\):"):
            moerr.routing(4, ids, weights, logits)
    assert [r["layer"] for r in moerr.Bundle(path).routing(0)] == [2]


def test_an_existing_path_needs_overwrite(tmp_path):
    path = tmp_path / "mine.moerr"
    path.write_bytes(b"someone's file")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        with moerr.record(path):
            pass
    assert path.read_bytes() == b"someone's file"
    with moerr.record(path, mode="stats", overwrite=True) as rec:
        with rec.step():
            ops_in_a_step()
    assert moerr.Bundle(path).steps == [0]


def test_recordings_do_not_nest(tmp_path):
    outer, inner = tmp_path / "outer.moerr", tmp_path / "inner.moerr"
    with moerr.record(outer, mode="stats") as rec:
        with pytest.raises(RuntimeError, match="one recording at a time"):
            with moerr.record(inner, mode="stats"):
                pass
        with rec.step():
            ops_in_a_step()
    assert not inner.exists()
    assert moerr.Bundle(outer).steps == [0]
    with moerr.record(inner, mode="stats") as rec:  # once the first is closed, another may start
        with rec.step():
            ops_in_a_step()
    assert moerr.Bundle(inner).steps == [0]


def test_a_step_with_no_ops_warns(tmp_path):
    path = tmp_path / "idle.moerr"
    with moerr.record(path, mode="stats") as rec:
        with pytest.warns(moerr.RecordingWarning, match="step 0 recorded no ops"):
            with rec.step():
                pass
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a step with ops does not warn
            with rec.step():
                ops_in_a_step()
    bundle = moerr.Bundle(path)
    assert bundle.steps == [0, 1]
    assert bundle.ops(0) == [] and len(bundle.ops(1)) > 0


def test_a_bundle_with_no_complete_step_warns_when_written(tmp_path):
    with pytest.warns(moerr.RecordingWarning, match="holds no complete step: no `with rec.step\\(\\):` ran"):
        with moerr.record(tmp_path / "none.moerr", mode="stats"):
            ops_in_a_step()
    assert moerr.Bundle(tmp_path / "none.moerr").steps == []
    with pytest.warns(moerr.RecordingWarning, match=r"inside the window steps=\(5, 6\)"):
        with moerr.record(tmp_path / "w.moerr", mode="stats", steps=(5, 6)) as rec:
            for _ in range(2):
                with rec.step():
                    ops_in_a_step()
    with pytest.warns(moerr.RecordingWarning, match="no step was anomalous"):
        with moerr.record(tmp_path / "a.moerr", mode="stats", trigger="anomaly") as rec:
            with rec.step():
                rec.outcome(loss=ops_in_a_step().item())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one complete step: no warning
        with moerr.record(tmp_path / "one.moerr", mode="stats") as rec:
            with rec.step():
                ops_in_a_step()
