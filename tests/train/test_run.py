"""The run directory (fastattn.train.run): config.json read back as input that may be wrong
(every problem a ValueError naming the file), and a resume that takes the run's settings."""
import json
import os

import pytest

from fastattn.train.run import load_run, read_config, train_run

pytestmark = pytest.mark.usefixtures("single_thread")

PAIRS = [("one two three", "three two one"), ("four five", "five four"),
         ("six seven eight", "eight seven six"), ("two four six", "six four two")]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    train_run(PAIRS, out, tokenizer="word", steps=3, batch_tokens=64, valid=0, progress=False)
    return out


def copy_with_config(run_dir, tmp_path, content):
    import shutil
    out = tmp_path / "copy"
    shutil.copytree(run_dir, out)
    path = out / "config.json"
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return out


def edited(run_dir, **change):
    config = json.loads((run_dir / "config.json").read_text())
    config.update(change)
    for k in [k for k, v in change.items() if v is ...]:
        del config[k]
    return json.dumps(config)


BAD = {
    "deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "deep_object": ('{"a": ' * 50_000 + "1" + "}" * 50_000, "nested too deeply"),
    "model_only": ('{"model": "tiny"}', "not a fastattn train run's config: tokenizer, "
                                        "vocab_size, dropout"),
    "list": ("[1, 2]", "expected a JSON object"),
    "empty": ("", "the file is empty"),
    "blank": ("  \n", "the file is empty"),
    "latin1": ('{"model": "t\u00efny"}'.encode("latin-1"), "not UTF-8 text"),
    "not_json": ("{model: tiny}", "not valid JSON"),
    "twice": ('{"seed": 1, "seed": 2}', "the key 'seed' is given twice"),
}
BAD_VALUES = {
    "seed_text": (dict(seed="0"), "seed must be an int >= 0, got '0'"),
    "steps_zero": (dict(steps=0), "steps must be an int >= 1 or null, got 0"),
    "model_unknown": (dict(model="huge"), "model must be one of tiny, small, base"),
    "model_list": (dict(model=["tiny"]), "model must be one of"),
    "dropout": (dict(dropout=1.5), "dropout must be a number in [0, 1)"),
    "lr_negative": (dict(lr=-1), "lr must be a number > 0 or null"),
    "lr_nan": (dict(lr=float("nan")), "lr must be a number > 0"),
    "schedule": (dict(schedule="linear"), "schedule must be one of inverse_sqrt"),
    "both": (dict(steps=3, epochs=2), "steps and epochs are both given"),
    "bool_seed": (dict(seed=True), "seed must be an int"),
    "missing_seed": (dict(seed=...), "seed missing"),
}


@pytest.mark.parametrize("name", list(BAD) + list(BAD_VALUES))
def test_a_bad_config_is_a_value_error_naming_the_file(run_dir, tmp_path, name):
    if name in BAD:
        content, message = BAD[name]
    else:
        change, message = BAD_VALUES[name]
        content = edited(run_dir, **change)
    out = copy_with_config(run_dir, tmp_path, content)
    where = str(out / "config.json")
    for read in (read_config, load_run):
        with pytest.raises(ValueError) as info:
            read(out)
        assert str(info.value).startswith(where + ": "), str(info.value)
        assert message in str(info.value)
    with pytest.raises(ValueError, match="^" + where):
        train_run(PAIRS, out, resume=True, progress=False)


def test_a_config_directory_and_a_missing_config(run_dir, tmp_path):
    import shutil
    out = tmp_path / "copy"
    shutil.copytree(run_dir, out)
    os.remove(out / "config.json")
    os.mkdir(out / "config.json")
    with pytest.raises(ValueError, match=r"config.json: not a run's config.json \(a directory\)"):
        load_run(out)
    os.rmdir(out / "config.json")
    with pytest.raises(FileNotFoundError, match="config.json"):
        read_config(out)


def test_a_config_written_before_the_newer_settings_reads_with_their_old_values(run_dir,
                                                                                tmp_path):
    old = edited(run_dir, schedule=..., clip_norm=..., eval_every=..., exact_sample=...,
                 patience=..., checkpoint_every=..., requested_vocab_size=..., warmup=None,
                 unknown_key="kept")
    config = read_config(copy_with_config(run_dir, tmp_path, old))
    assert (config["schedule"], config["clip_norm"], config["eval_every"]) == \
        ("inverse_sqrt", 1.0, 200)
    assert config["warmup"] is None and config["unknown_key"] == "kept"


def test_resume_takes_the_runs_settings_and_refuses_others(tmp_path):
    out = tmp_path / "run"
    kw = dict(tokenizer="word", batch_tokens=64, valid=0.25, seed=3, dropout=0.0,
              eval_every=2, progress=False)
    train_run(PAIRS, out, steps=4, **kw)
    run, history = train_run(PAIRS, out, steps=6, resume=True, progress=False)
    assert [r["step"] for r in history.steps] == list(range(1, 7))
    config = read_config(out)
    assert (config["steps"], config["seed"], config["batch_tokens"]) == (6, 3, 64)
    whole, whole_history = train_run(PAIRS, tmp_path / "whole", steps=6, **kw)
    assert whole_history.losses == history.losses          # the same run, bit for bit
    assert (out / "model.safetensors").read_bytes() == \
        (tmp_path / "whole" / "model.safetensors").read_bytes()
    with pytest.raises(ValueError) as info:
        train_run(PAIRS, out, resume=True, seed=4, model="small", clip_norm=0,
                  tokenizer="word", batch_tokens=64, progress=False)
    message = str(info.value)
    assert message.startswith(str(out / "config.json"))
    for words in ("seed=3, not 4 (--seed)", "model='tiny', not 'small' (--model)",
                  "clip_norm=1.0, not None (--clip-norm)"):
        assert words in message
    assert "tokenizer" not in message and "batch_tokens" not in message    # equal: fine
    # the adjustable ones are applied and kept
    train_run(PAIRS, out, resume=True, steps=8, eval_every=4, exact_sample=1, progress=False)
    config = read_config(out)
    assert (config["steps"], config["eval_every"], config["exact_sample"]) == (8, 4, 1)


def test_patience_without_held_out_pairs_is_refused(tmp_path):
    with pytest.raises(ValueError, match="patience .* needs valid_pairs"):
        train_run(PAIRS, tmp_path / "run", tokenizer="word", steps=2, batch_tokens=64, valid=0,
                  patience=2, progress=False)
