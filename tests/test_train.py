import json
import math

import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from moses_rnn.cli import main
from moses_rnn.modelio import load_checkpoint, load_model
from moses_rnn.train import TrainConfig, train


def test_training_lowers_heldout_perplexity(tmp_path, example_table):
    cfg = TrainConfig(preset="tiny", max_steps=150, eval_every=150, valid_pairs=30, device="cpu")
    first = train(str(example_table), str(tmp_path / "a"), TrainConfig(**{**cfg.__dict__, "max_steps": 1}), progress=False)
    done = train(str(example_table), str(tmp_path / "b"), cfg, progress=False)
    assert done["valid_ppl"] < 0.6 * first["valid_ppl"]
    loaded = load_model(str(tmp_path / "b"))
    assert loaded.config.hidden == 32 and len(loaded.src_vocab) == loaded.config.src_vocab
    assert math.isfinite(loaded.meta["valid_ppl"])


def test_resume_continues_exactly(tmp_path, example_table):
    base = dict(preset="tiny", eval_every=10, valid_pairs=20, device="cpu", seed=7)
    train(str(example_table), str(tmp_path / "full"), TrainConfig(max_steps=40, **base), progress=False)
    train(str(example_table), str(tmp_path / "half"), TrainConfig(max_steps=20, **base), progress=False)
    assert load_checkpoint(str(tmp_path / "half"))["step"] == 20
    train(str(example_table), str(tmp_path / "half"), TrainConfig(max_steps=40, **base), resume=True, progress=False)
    a = load_checkpoint(str(tmp_path / "full"))["model"]
    b = load_checkpoint(str(tmp_path / "half"))["model"]
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k


def test_cli_train_and_model_dir_layout(tmp_path, example_table):
    out = tmp_path / "m"
    r = CliRunner().invoke(main, ["train", str(example_table), "-o", str(out), "--preset", "tiny", "--max-steps", "5",
                                  "--eval-every", "5", "--valid-pairs", "10", "--quiet", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "src.vocab", "tgt.vocab", "checkpoint.pt"}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model"]["arch"] == "encdec" and cfg["meta"]["step"] == 5
    assert set(load_file(str(out / "model.safetensors"))) == set(load_model(str(out)).model.state_dict())
    torch.load(str(out / "checkpoint.pt"), weights_only=True)  # no pickled code
